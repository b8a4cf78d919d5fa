"""Passkey-retrieval prompts: the LongLoRA template exactly, and a token-based length x depth grid.

LongLoRA mode (``dvlab-research/LongLoRA: passkey_retrivial.py``, also used by VITA-Group/TAPE and,
with 2000 garbage repeats, by landmark attention): five lines joined with ``"\\n"`` -- the task
description, a garbage prefix, the information line with the key, a garbage suffix, and the question. The
garbage is the unit sentence repeated 5000 times, joined with single spaces; ``n_garbage`` is a
*character* budget; for the trial with seed ``s`` the legacy NumPy generator seeded with ``s`` draws the
prefix length from ``[0, n_garbage)`` and then the key from ``[1, 50000)``; prefix and suffix are both cut
from the start of the garbage. Length point ``i`` of ``max_tokens // interval`` uses
``n_garbage = int(3.75 * (i + 1) * interval // 1024 * 1024)`` characters (LongLoRA's 3.75 characters per
Llama token).

Grid mode: the same sentences, but assembled in token space so that every prompt has exactly ``length``
tokens and the information line starts after ``round(depth * filler)`` filler tokens (``depth`` 0: right
after the task description; 1: right before the question).

In both modes the answer is the key with the one leading space it has in running text (``" 12345"``): a
Llama SentencePiece tokenizer, which LongLoRA uses, encodes the bare key with that space as its dummy
prefix, so LongLoRA's "tokenize the answer, drop BOS" gives the same token string. A trial is correct when
the greedy continuation of exactly ``len(answer_ids)`` tokens equals the answer ids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

TASK_DESCRIPTION = ("There is an important info hidden inside a lot of irrelevant text. "
                    "Find it and memorize them. I will quiz you about the important information there.")
GARBAGE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
GARBAGE_REPEATS = 5000
QUESTION = "What is the pass key? The pass key is"
KEY_LOW, KEY_HIGH = 1, 50000            # numpy randint: [1, 50000)
CHARS_PER_TOKEN = 3.75


def information_line(key: int | str) -> str:
    return f"The pass key is {key}. Remember it. {key} is the pass key."


def answer_text(key: int | str) -> str:
    return f" {key}"


def garbage_inf(repeats: int = GARBAGE_REPEATS) -> str:
    return " ".join([GARBAGE] * repeats)


def longlora_prompt(n_garbage: int, seed: int, repeats: int = GARBAGE_REPEATS) -> tuple[str, str]:
    """``(prompt, key)`` exactly as LongLoRA's ``generate_prompt_landmark(n_garbage, seed)``."""
    rng = np.random.RandomState(seed)      # same stream as numpy.random.seed(seed) + numpy.random.randint
    n_prefix = int(rng.randint(0, n_garbage)) if n_garbage > 0 else 0
    n_suffix = n_garbage - n_prefix
    inf = garbage_inf(repeats)
    if len(inf) < n_garbage:
        raise ValueError(f"n_garbage={n_garbage} exceeds the {len(inf)} characters of garbage")
    key = int(rng.randint(KEY_LOW, KEY_HIGH))
    lines = [TASK_DESCRIPTION, inf[:n_prefix], information_line(key), inf[:n_suffix], QUESTION]
    return "\n".join(lines), str(key)


def longlora_n_garbage(point: int, interval: int) -> int:
    """Characters of garbage at length point ``point`` (0-based) with LongLoRA's ``--interval``."""
    return int(CHARS_PER_TOKEN * (point + 1) * interval // 1024 * 1024)


def longlora_points(max_tokens: int, interval: int) -> list[int]:
    """``n_garbage`` of each of the ``max_tokens // interval`` length points."""
    return [longlora_n_garbage(i, interval) for i in range(max_tokens // interval)]


# ------------------------------------------------------------------------------------------------------
# grid mode (token space)

@dataclass
class GridPrompt:
    prompt_ids: list[int]
    answer_ids: list[int]
    key: int
    depth: float                 # requested depth
    key_position: int            # token index where the information line starts
    actual_depth: float          # filler tokens before the key / all filler tokens


class GridBuilder:
    """Builds prompts of an exact token length with the key at a given depth, for one tokenizer."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.head = tokenizer.encode(TASK_DESCRIPTION + "\n")
        self.tail = tokenizer.encode("\n" + QUESTION)
        self._filler = tokenizer.encode(garbage_inf(64))

    def filler(self, n: int) -> list[int]:
        while len(self._filler) < n:
            self._filler = self.tok.encode(garbage_inf(2 * len(self._filler) // len(GARBAGE) + 64))
        return self._filler[:n]

    def fixed_tokens(self, key: int) -> int:
        return len(self.head) + len(self.tok.encode("\n" + information_line(key) + "\n")) + len(self.tail)

    def min_length(self) -> int:
        return self.fixed_tokens(KEY_HIGH - 1)

    def build(self, length: int, depth: float, key: int) -> GridPrompt:
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"depth must be in [0, 1], got {depth}")
        info = self.tok.encode("\n" + information_line(key) + "\n")
        n_fill = length - len(self.head) - len(info) - len(self.tail)
        if n_fill < 0:
            raise ValueError(f"a passkey prompt needs at least {self.min_length()} tokens, got {length}")
        n_pre = int(math.floor(depth * n_fill + 0.5))
        prompt = self.head + self.filler(n_pre) + info + self.filler(n_fill - n_pre) + self.tail
        assert len(prompt) == length
        return GridPrompt(prompt, self.tok.encode(answer_text(key)), key, depth, len(self.head) + n_pre,
                          n_pre / n_fill if n_fill else 0.0)


def trial_seed(base: int, length: int, depth_index: int, trial: int) -> int:
    """A fixed seed per grid cell and trial (independent of which other cells are evaluated)."""
    return (base * 1_000_003 + length * 7919 + depth_index * 104_729 + trial) % (2 ** 32)


def grid_key(seed: int) -> int:
    return int(np.random.RandomState(seed).randint(KEY_LOW, KEY_HIGH))
