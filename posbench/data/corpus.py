"""The built-in text corpus: Python's own standard-library sources.

Every machine that runs posbench has them, so ``pretrain`` and ``perplexity`` work with no download
(the paper measures perplexity on a GitHub code set; the standard library is real code). The selection is
deterministic: every ``*.py`` file under ``sysconfig``'s ``stdlib`` directory except tests, generated
tables and bundled data (see ``EXCLUDED_DIRS``), each file one document, ordered by the SHA-256 of its
relative path (which mixes packages instead of walking them alphabetically). A document is held out when
the first byte of that digest is below ``HELD_OUT_BYTE`` (about 1 in 16 files). Because the files differ
between Python patch releases, the result records the Python version and the SHA-256 of the text that was
actually read.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

NAME = "stdlib"
EXCLUDED_DIRS = frozenset({
    "test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings",
    "pydoc_data", "ensurepip", "turtledemo", "lib2to3", "unittest",
})
EXCLUDED_PREFIXES = ("config-",)        # config-3.11-x86_64-linux-gnu (build files)
MAX_FILE_BYTES = 256_000                # a few generated files are larger than any hand-written module
HELD_OUT_BYTE = 16                      # digest[0] < 16 -> held out (1/16 of the files)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _path_digest(rel: str) -> bytes:
    return hashlib.sha256(rel.encode("utf-8")).digest()


@lru_cache(maxsize=4)
def stdlib_files(root: str | None = None) -> tuple[tuple[str, bool], ...]:
    """``(relative path, held_out)`` for every selected file, in the corpus order."""
    base = Path(root) if root else stdlib_root()
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in EXCLUDED_DIRS and not d.startswith(EXCLUDED_PREFIXES))
        for name in filenames:
            if not name.endswith(".py") or name.startswith("test_"):
                continue
            path = Path(dirpath) / name
            try:
                if path.stat().st_size > MAX_FILE_BYTES or path.stat().st_size == 0:
                    continue
            except OSError:
                continue
            found.append(path.relative_to(base).as_posix())
    found.sort(key=_path_digest)
    return tuple((rel, _path_digest(rel)[0] < HELD_OUT_BYTE) for rel in found)


def stdlib_documents(split: str = "train", root: str | None = None) -> Iterator[str]:
    """The texts of the selected files of ``split`` (``train`` or ``validation``), in corpus order."""
    base = Path(root) if root else stdlib_root()
    want_held_out = split != "train"
    for rel, held_out in stdlib_files(str(base)):
        if held_out != want_held_out:
            continue
        try:
            text = (base / rel).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip():
            yield text


def describe(root: str | None = None) -> dict:
    base = Path(root) if root else stdlib_root()
    files = stdlib_files(str(base))
    return {
        "name": NAME,
        "kind": "builtin",
        "description": "CPython standard-library *.py sources (tests, codec tables and bundled data excluded)",
        "python": platform.python_version(),
        "root": str(base),
        "files": len(files),
        "held_out_files": sum(h for _, h in files),
    }
