"""One RULER example at an exact token length and depth, from a seed; the seeds of evaluation and training.

``make_example(kind, tokenizer, length, depth, seed, **params)`` draws the keys, values and chains with a NumPy
generator seeded by ``seed``, then lays them into a haystack of exactly ``length`` prompt tokens. Evaluation
seeds (``eval_seed``) and training seeds (``train_seed``) come from disjoint NumPy ``SeedSequence`` domains, so
no training prompt is an evaluation prompt by construction of the seed, and every encoding evaluated with the
same base seed sees the same examples.
"""

from __future__ import annotations

import hashlib
import weakref
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from posbench.data import corpus
from posbench.tasks.ruler import kinds, niah, vt
from posbench.tasks.ruler.haystack import CorpusFiller, NoiseFiller, assemble, boundaries, cut
from posbench.tasks.ruler.values import words_info

EVAL_DOMAIN, TRAIN_DOMAIN = 0x52554C45, 0x5452414E          # "RULE", "TRAN"


@dataclass
class Example:
    kind: str
    prompt_ids: list[int]
    answer_ids: list[int]             # the tokens of ``answer_text`` (what training appends, before EOS)
    answers: list[str]                # RULER's ``outputs``: what string_match_all looks for
    answer_text: str
    meta: dict[str, Any] = field(default_factory=dict)


class _Builder:
    """Per-tokenizer caches: the newline tokens and the filler sources."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.newline = tokenizer.encode("\n")
        self._fillers: dict[tuple[str, str], Any] = {}

    def filler(self, haystack: str, split: str):
        key = (haystack, split if haystack == "corpus" else "")
        if key not in self._fillers:
            self._fillers[key] = CorpusFiller(self.tok, split) if haystack == "corpus" else NoiseFiller(self.tok)
        return self._fillers[key]


_BUILDERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _builder(tokenizer) -> _Builder:
    if tokenizer not in _BUILDERS:
        _BUILDERS[tokenizer] = _Builder(tokenizer)
    return _BUILDERS[tokenizer]


def _seed(domain: int, *parts: int) -> int:
    state = np.random.SeedSequence([domain, *[int(p) % 2 ** 63 for p in parts]]).generate_state(2, np.uint32)
    return int(state[0]) << 32 | int(state[1])


def kind_id(kind: str) -> int:
    return zlib.crc32(kind.encode("utf-8"))


def eval_seed(base: int, kind: str, length: int, depth_index: int, trial: int) -> int:
    """The seed of evaluation example ``trial`` of cell (``length``, depth number ``depth_index``)."""
    return _seed(EVAL_DOMAIN, base, kind_id(kind), length, depth_index, trial)


def train_seed(base: int, batch_index: int, row: int) -> int:
    """The seed of row ``row`` of training batch ``batch_index``."""
    return _seed(TRAIN_DOMAIN, base, batch_index, row)


def _parts(kind: str, tokenizer, params: dict, rng: np.random.Generator, split: str) -> dict:
    b = _builder(tokenizer)
    filler_for = lambda haystack: b.filler(haystack, split)          # noqa: E731
    if kinds.family(kind) == "niah":
        parts = niah.content(params, rng, tokenizer, filler_for)
        parts["head_ids"] = tokenizer.encode(parts["head"])
    else:
        build = lambda shot, length, g: _lay(b, shot, length, None, g).ids       # noqa: E731
        parts = vt.content(params, rng, tokenizer, filler_for, build)
    parts["family"], parts["kind"] = kinds.family(kind), kind
    return parts


def _lay(b: _Builder, parts: dict, length: int, depth, rng: np.random.Generator):
    head, tail = parts["head_ids"], b.tok.encode(parts["tail"])
    lines = b.tok.encode_batch([line + "\n" for line in parts["lines"]])
    budget = length - len(head) - len(tail) - sum(len(ids) for ids in lines)
    if budget < 0:
        raise kinds.RulerError(f"a {parts.get('kind', 'RULER')} prompt needs at least {length - budget} tokens "
                               f"with this tokenizer, got length {length}")
    filler = parts["filler"]
    units = cut(filler.lines(budget, rng), budget, b.newline)
    bounds = boundaries(units)
    if "shape" in parts:                                   # variable tracking
        slots, keys = vt.place(parts["shape"], depth, bounds, rng, filler.rule)
    else:
        slots, keys = niah.place(parts["roles"], depth, bounds, rng, filler.rule)
    done = assemble(head, tail, lines, units, slots, keys)
    done.head, done.tail, done.lines, done.units = len(head), len(tail), lines, len(units)
    return done


def data_spec(kind: str, **params: Any) -> dict[str, Any]:
    """What a task records under ``data``: the kind, its resolved parameters, the sources of its prompts and
    scores, and (when used) the word lists and the corpus."""
    resolved = kinds.resolve(kind, params)
    fam = kinds.family(kind)
    spec: dict[str, Any] = {
        "source": "synthetic (RULER)", "kind": kind, "params": resolved,
        "templates": "NVIDIA/RULER scripts/data/synthetic/constants.py (base template + answer_prefix)",
        "generator": f"NVIDIA/RULER scripts/data/synthetic/{'niah' if fam == 'niah' else 'variable_tracking'}.py",
        "metric": kinds.METRIC[fam], "tokens_to_generate": kinds.TOKENS_TO_GENERATE[fam]}
    if "words" in (resolved.get("type_needle_k"), resolved.get("type_needle_v")):
        spec["words"] = words_info()
    if resolved["type_haystack"] == "corpus":
        spec["corpus"] = corpus.describe()
    return spec


def make_example(kind: str, tokenizer, length: int, depth: float | Sequence[float] | None = None, seed: int = 0,
                 *, split: str = "eval", answer_room: bool = False, **params: Any) -> Example:
    """A RULER ``kind`` prompt of exactly ``length`` tokens (``answer_room``: ``length - len(answer_ids)``,
    so that prompt + answer is ``length`` tokens) with its answers, drawn from ``seed``.

    ``depth``: None (RULER's random placement), a number in [0, 1] (where the needles that hold answers /
    the first statement of the asked chain sit), or one depth per such needle / statement. ``split``:
    ``eval`` or ``train`` (only the corpus haystack differs: held-out or training files). ``params``
    override the kind's defaults (``kinds.KINDS``)."""
    if split not in ("eval", "train"):
        raise kinds.RulerError(f"split must be eval or train, got {split!r}")
    resolved = kinds.resolve(kind, params)
    if depth is not None:
        depth = float(depth) if np.isscalar(depth) else [float(d) for d in depth]
    rng = np.random.default_rng(seed)
    b = _builder(tokenizer)
    parts = _parts(kind, tokenizer, resolved, rng, split)
    answer_ids = tokenizer.encode(parts["answer_text"])
    done = _lay(b, parts, length - len(answer_ids) if answer_room else length, depth, rng)
    needles = []
    for i, text in enumerate(parts["lines"]):
        needles.append({"text": text, "role": parts["roles"][i], "start": done.starts[i],
                        "tokens": len(done.lines[i]), "filler_before": done.filler_before[i],
                        "depth": done.filler_before[i] / done.filler if done.filler else 0.0})
    meta = {"kind": kind, "family": parts["family"], "length": len(done.ids), "depth": depth, "seed": seed,
            "split": split, "params": resolved, "needles": needles, "filler_tokens": done.filler,
            "filler_lines": done.units, "head_tokens": done.head, "tail_tokens": done.tail,
            "haystack": dict(parts["filler"].describe),
            "prompt_sha256": hashlib.sha256(np.asarray(done.ids, dtype=np.int64).tobytes()).hexdigest()}
    for name in ("queries", "query", "chains", "fewshot"):
        if name in parts:
            meta[name] = parts[name]
    if "words" in (resolved.get("type_needle_k"), resolved.get("type_needle_v")):
        meta["words"] = words_info()
    return Example(kind, done.ids, answer_ids, list(parts["answers"]), parts["answer_text"], meta)
