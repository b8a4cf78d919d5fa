"""Independent oracles for the arithmetic task: examples encoded one at a time from Python integers, and the
exact-match rule written as a loop. The task's vectorised encoder and scorer are tested against these."""

from __future__ import annotations

import torch

from posbench.data.batch import IGNORE_INDEX, Batch
from posbench.data.char import EOS, PAD
from posbench.tasks.arithmetic.task import TOKENIZER, format_example


def encode_examples(pairs: list[tuple[int, int]], length: int) -> Batch:
    """Inputs ``ids[:-1]``, targets ``ids[1:]`` masked up to and including ``=``, right-padded to ``length - 1``
    with PAD (ignored in the loss), one example at a time."""
    n = length - 1
    tokens = torch.full((len(pairs), n), PAD, dtype=torch.long)
    targets = torch.full((len(pairs), n), IGNORE_INDEX, dtype=torch.long)
    for row, (a, b) in enumerate(pairs):
        prompt, answer = format_example(a, b)
        ids = TOKENIZER.encode(prompt + answer, eos=True)
        if len(ids) > length:
            raise ValueError(f"example of {len(ids)} tokens exceeds the sequence length {length}")
        x, y = ids[:-1], ids[1:]
        eq = len(prompt) - 1                      # index of '=' in ids; targets from there on are answer + EOS
        tokens[row, :len(x)] = torch.tensor(x)
        targets[row, eq:len(y)] = torch.tensor(y[eq:])
    return Batch(tokens, targets)


def exact_match(predicted: list[int], target: list[int], eos_id: int = EOS) -> bool:
    """True if ``predicted`` up to and including its first EOS equals ``target`` (which ends with EOS)."""
    cut = predicted.index(eos_id) + 1 if eos_id in predicted else len(predicted)
    return list(predicted[:cut]) == list(target)
