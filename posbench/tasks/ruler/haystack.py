"""Haystacks in token space: filler lines, the exact-length cut, needle slots, and the assembled prompt.

The context is a list of lines, each tokenised with its ``"\\n"`` (``encode(line + "\\n")``), so the prompt is
``head + lines + tail`` token for token and its text is RULER's ``template.format(context="\\n".join(lines))``.
Segments are tokenised separately, as ``posbench.evaluation.passkey.GridBuilder`` does: with a byte or a
byte-level BPE tokenizer the text is exactly RULER's; the token count is exact with any tokenizer.

Exact length: after the head, the tail and the needle lines, ``F = length - fixed`` tokens are filler.
Filler lines are taken in order until they reach ``F``; the last one is cut to fit (its first tokens, then its
newline), like LongLoRA's garbage cut, so a prompt has exactly ``length`` tokens.

Slots: a needle goes between filler lines; slot ``s`` is before filler line ``s`` (slot ``m``: after the last
line, right before the question). The depth of a slot is the filler tokens before it over ``F`` (0: right
after the task description, 1: right before the question). An explicit depth ``d`` takes the slot whose
boundary is nearest ``d * F`` (so within one filler line of it). Random placement follows RULER per haystack:
``uniform`` (noise and needle haystacks: distinct slots drawn uniformly among the lines,
``random.sample(range(num_haystack), n)``) or ``depths`` (RULER's essay rule, used for ``corpus``: distinct
depths drawn from the 40-point grid ``round(linspace(0, 100, 40))``, slot ``int(m * depth / 100)``).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from posbench.data import corpus
from posbench.tasks.ruler import templates
from posbench.tasks.ruler.kinds import RulerError
from posbench.tasks.ruler.values import draw_distinct

DEPTHS = [int(d) for d in np.round(np.linspace(0, 100, num=40, endpoint=True))]
CORPUS_SPLITS = {"eval": "validation", "train": "train"}
_FAKE_NEEDLES = ("special magic", "VAR ")        # corpus lines that could pass for a needle are skipped


# ---- filler sources ----------------------------------------------------------------------------------------

class NoiseFiller:
    """RULER's noise: the same line over and over."""

    rule = "uniform"
    describe = {"haystack": "noise", "unit": templates.NOISE}

    def __init__(self, tokenizer):
        self.unit = tokenizer.encode(templates.NOISE + "\n")

    def lines(self, need: int, rng: np.random.Generator) -> list[list[int]]:
        return [self.unit] * max(1, math.ceil(need / len(self.unit)))


class NeedleFiller:
    """RULER's ``needle`` haystack: every line a needle with a random key and value (none of ``taken``)."""

    rule = "uniform"

    def __init__(self, tokenizer, type_needle_k: str, type_needle_v: str, taken: set[str]):
        self.tok, self.type_k, self.type_v, self.taken = tokenizer, type_needle_k, type_needle_v, taken
        self.describe = {"haystack": "needle"}

    def lines(self, need: int, rng: np.random.Generator) -> list[list[int]]:
        out, total = [], 0
        while total < need or not out:
            texts = []
            for _ in range(32):
                key, = draw_distinct(self.type_k, 1, rng, self.taken)
                value, = draw_distinct(self.type_v, 1, rng, self.taken)
                texts.append(templates.NEEDLE.format(type_needle_v=self.type_v, key=key, value=value) + "\n")
            for ids in self.tok.encode_batch(texts):
                out.append(ids)
                total += len(ids)
        return out


class CorpusFiller:
    """Consecutive lines of the built-in corpus's ``split`` files, from a random file on; eval prompts read
    the held-out files, training prompts the training files. Blank lines, lines with non-ASCII characters (a
    cut never splits a character) and lines that could pass for a needle are skipped; trailing spaces go."""

    rule = "depths"

    def __init__(self, tokenizer, split: str):
        self.tok, self.split = tokenizer, CORPUS_SPLITS[split]
        self.root = corpus.stdlib_root()
        self.files = [rel for rel, held_out in corpus.stdlib_files(str(self.root))
                      if held_out == (self.split != "train")]
        if not self.files:
            raise RulerError(f"the built-in corpus has no {self.split} files here; use type_haystack=noise")
        self._cache: dict[int, list[list[int]]] = {}
        self.describe = {"haystack": "corpus", "corpus": corpus.describe(str(self.root)), "split": self.split}

    def _file_lines(self, index: int) -> list[list[int]]:
        if index not in self._cache:
            try:
                text = (Path(self.root) / self.files[index]).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                text = ""
            lines = [line.rstrip() + "\n" for line in text.splitlines()
                     if line.strip() and line.isascii() and not any(f in line for f in _FAKE_NEEDLES)]
            self._cache[index] = self.tok.encode_batch(lines) if lines else []
        return self._cache[index]

    def lines(self, need: int, rng: np.random.Generator) -> list[list[int]]:
        start = int(rng.integers(len(self.files)))
        out, total = [], 0
        for step in range(len(self.files)):
            for ids in self._file_lines((start + step) % len(self.files)):
                out.append(ids)
                total += len(ids)
                if total >= need and out:
                    return out
        if total < need:
            raise RulerError(f"the built-in corpus's {self.split} files hold fewer than {need} tokens")
        return out


# ---- exact length ------------------------------------------------------------------------------------------

def cut(lines: list[list[int]], budget: int, newline: list[int]) -> list[list[int]]:
    """The lines up to ``budget`` tokens exactly: the last one keeps its first tokens and its newline."""
    out, total = [], 0
    for ids in lines:
        if total >= budget:
            break
        room = budget - total
        if len(ids) > room:
            body = max(room - len(newline), 0)
            ids = ids[:body] + newline[: room - body]
        out.append(ids)
        total += len(ids)
    if total != budget:
        raise RulerError(f"the haystack is {budget - total} tokens short")
    return out


def boundaries(lines: list[list[int]]) -> list[int]:
    """Filler tokens before each slot: ``[0, len(line 0), ..., F]``."""
    out = [0]
    for ids in lines:
        out.append(out[-1] + len(ids))
    return out


# ---- slots ---------------------------------------------------------------------------------------------------

def nearest_slot(depth: float, bounds: list[int]) -> int:
    """The slot whose filler-token boundary is nearest ``depth * F`` (the earlier one on a tie)."""
    if not 0.0 <= depth <= 1.0:
        raise RulerError(f"depth must be in [0, 1], got {depth}")
    target = depth * bounds[-1]
    i = bisect_left(bounds, target)
    if i == len(bounds):
        return len(bounds) - 1
    if i > 0 and target - bounds[i - 1] <= bounds[i] - target:
        return i - 1
    return i


def random_slots(n: int, bounds: list[int], rng: np.random.Generator, rule: str) -> list[int]:
    """``n`` sorted slots drawn as RULER draws needle positions for the haystack's rule."""
    m = len(bounds) - 1
    if n == 0:
        return []
    if rule == "uniform":
        if m >= n:
            return sorted(int(s) for s in rng.choice(m, size=n, replace=False))
        return sorted(int(s) for s in rng.integers(0, m + 1, size=n))
    depths = rng.choice(DEPTHS, size=n, replace=n > len(DEPTHS))
    return sorted(int(m * int(d) / 100) for d in depths)


# ---- assembly ------------------------------------------------------------------------------------------------

@dataclass
class Assembled:
    ids: list[int]
    starts: list[int]               # token index of each inserted line, in the order given
    filler_before: list[int]        # filler tokens before each inserted line
    filler: int                     # F


def assemble(head: list[int], tail: list[int], inserted: list[list[int]], filler: list[list[int]],
             slots: list[int], keys: list[float]) -> Assembled:
    """``head``, the filler lines with line ``i`` of ``inserted`` in slot ``slots[i]`` (lines sharing a slot
    in the order of ``keys``), ``tail``."""
    by_slot: dict[int, list[int]] = {}
    for i in sorted(range(len(inserted)), key=lambda i: (slots[i], keys[i])):
        by_slot.setdefault(slots[i], []).append(i)
    ids = list(head)
    starts, before = [0] * len(inserted), [0] * len(inserted)
    seen = 0
    for s in range(len(filler) + 1):
        for i in by_slot.get(s, ()):
            starts[i], before[i] = len(ids), seen
            ids.extend(inserted[i])
        if s < len(filler):
            ids.extend(filler[s])
            seen += len(filler[s])
    ids.extend(tail)
    return Assembled(ids, starts, before, seen)
