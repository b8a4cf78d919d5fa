"""Training examples for learning a RULER task from scratch (as ``PasskeyStream`` does for passkey).

A training row is ``prompt + answer + EOS`` with exactly ``length + 1`` tokens: the model reads the first
``length`` and predicts the next token at each position. Rows are drawn from ``train_seed(seed, batch, row)``
(a domain disjoint from evaluation's seeds) with the corpus haystack reading the corpus's training files;
depth is RULER's random placement unless given. ``loss="answer"`` keeps the loss on the answer and EOS only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from posbench.tasks.ruler.examples import make_example, train_seed
from posbench.tasks.ruler.kinds import RulerError

IGNORE_INDEX = -100          # posbench's (and PyTorch's) ignore index for targets without loss


def training_sequence(kind: str, tokenizer, length: int, seed: int, *, depth: float | Sequence[float] | None = None,
                      **params: Any) -> tuple[list[int], int]:
    """``(ids, loss_from)``: ``length + 1`` tokens (prompt, answer, EOS) and where the answer starts."""
    ex = make_example(kind, tokenizer, length, depth, seed, split="train", answer_room=True, **params)
    ids = ex.prompt_ids + ex.answer_ids + [tokenizer.eos_id]
    assert len(ids) == length + 1
    return ids, len(ex.prompt_ids)


def training_batch(kind: str, tokenizer, length: int, seed: int, batch_index: int, batch_size: int,
                   loss: str = "all", **params: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, targets)``, each ``[batch_size, length]``: inputs and next-token targets of batch
    ``batch_index`` (``IGNORE_INDEX`` before the answer with ``loss="answer"``)."""
    if loss not in ("all", "answer"):
        raise RulerError(f"loss must be all or answer, got {loss!r}")
    tokens = torch.empty((batch_size, length), dtype=torch.long)
    targets = torch.empty((batch_size, length), dtype=torch.long)
    for row in range(batch_size):
        ids, loss_from = training_sequence(kind, tokenizer, length, train_seed(seed, batch_index, row), **params)
        seq = torch.tensor(ids, dtype=torch.long)
        tokens[row], targets[row] = seq[:-1], seq[1:]
        if loss == "answer":
            targets[row, : loss_from - 1] = IGNORE_INDEX       # the last prompt token predicts the answer
    return tokens, targets
