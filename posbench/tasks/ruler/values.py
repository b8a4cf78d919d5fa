"""RULER's keys and values: 7-digit numbers, ``adjective-noun`` words, UUIDs (``niah.py`` ``generate_random``).

``words`` draws from the same lists as RULER: the ``wonderwords`` package's adjective and noun lists, every
``adjective-noun`` pair equally likely (RULER: ``random.choice`` over the sorted set of all pairs). The lists
are read from the package's files (sorted, deduplicated), so the draw does not depend on their order.
All draws use a NumPy ``Generator``; values within one example are kept distinct (RULER does not check, and a
repeat would make an answer ambiguous).
"""

from __future__ import annotations

import hashlib
import uuid
from functools import lru_cache
from importlib import resources
from importlib.metadata import PackageNotFoundError, version

import numpy as np

from posbench.tasks.ruler.kinds import RulerError


@lru_cache(maxsize=1)
def word_lists() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(adjectives, nouns)`` of wonderwords, stripped, deduplicated and sorted."""
    try:
        assets = resources.files("wonderwords") / "assets"
        lists = [(assets / name).read_text(encoding="utf-8").splitlines()
                 for name in ("adjectivelist.txt", "nounlist.txt")]
    except (ModuleNotFoundError, FileNotFoundError):
        raise RulerError("RULER's word keys need the wonderwords package: pip install wonderwords") from None
    adjs, nouns = (tuple(sorted({w.rstrip() for w in words if w.strip()})) for words in lists)
    return adjs, nouns


def words_info() -> dict:
    """Which word lists ``words`` draws from (they differ between wonderwords releases: record them)."""
    adjs, nouns = word_lists()
    try:
        release = version("wonderwords")
    except PackageNotFoundError:      # pragma: no cover
        release = None
    digest = hashlib.sha256("\n".join(adjs + ("",) + nouns).encode("utf-8")).hexdigest()
    return {"source": "wonderwords", "version": release, "adjectives": len(adjs), "nouns": len(nouns),
            "sha256": digest}


def draw(kind: str, rng: np.random.Generator) -> str:
    if kind == "numbers":                              # random.randint(10**6, 10**7 - 1)
        return str(int(rng.integers(10 ** 6, 10 ** 7)))
    if kind == "words":
        adjs, nouns = word_lists()
        return f"{adjs[int(rng.integers(len(adjs)))]}-{nouns[int(rng.integers(len(nouns)))]}"
    if kind == "uuids":                                # uuid.UUID(int=random.getrandbits(128), version=4)
        hi, lo = (int(x) for x in rng.integers(0, 2 ** 64, size=2, dtype=np.uint64))
        return str(uuid.UUID(int=(hi << 64) | lo, version=4))
    raise RulerError(f"unknown needle type {kind!r}; use numbers, words or uuids")


def draw_distinct(kind: str, n: int, rng: np.random.Generator, taken: set[str]) -> list[str]:
    """``n`` new values of ``kind`` not in ``taken`` (which they are added to)."""
    out: list[str] = []
    for _ in range(100 * n + 100):
        if len(out) == n:
            break
        value = draw(kind, rng)
        if value not in taken:
            taken.add(value)
            out.append(value)
    if len(out) == n:
        return out
    raise RulerError(f"cannot draw {n} distinct {kind}")
