"""Loss by token position: where in a long window the loss turns.

A perplexity evaluation scores each token at some **position**: the 0-based index, in the forward pass, of
the query whose logits predict it (the number of tokens of context it had, less one; with a start token, the
start token is position 0). Positions at or beyond the training length are positions the model never trained on.

The sums are kept in fixed **log-spaced buckets**, 8 to an octave: bucket ``b`` holds the positions
``edges[b] <= p < edges[b + 1]`` with ``edges = 0, 1, 2, ..., then round(2 ** (k / 8))`` (every position
below 12 is a bucket of its own; beyond, each bucket is 9% wider than the last). For one evaluation length
``L`` that is about ``8 * log2(L) - 20`` buckets (68 at 2,048) instead of ``L`` numbers, fine enough for a curve
on a log axis. Each bucket records the summed negative log-likelihood (nats, float64) and the number of tokens
scored in it, so the buckets of several windows, evaluations or seeds add up, and the token-weighted mean over
the buckets is the evaluation's mean NLL: the log of its perplexity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

PER_OCTAVE = 8


def bucket_edges(length: int) -> list[int]:
    """The bucket edges for positions ``0 .. length - 1``: ``[0, 1, ..., length]`` log-spaced past 12 (see the
    module docstring); the last edge is ``length``."""
    if length < 1:
        raise ValueError(f"a window has at least one position, got {length}")
    edges = {0}
    k = 0
    while True:
        edge = int(round(2 ** (k / PER_OCTAVE)))
        if edge >= length:
            break
        edges.add(edge)
        k += 1
    return sorted(edges) + [length]


def bucket_index(length: int) -> Tensor:
    """For each position ``0 .. length - 1``, the index of its bucket (a long tensor of ``length``)."""
    edges = bucket_edges(length)
    index = torch.empty(length, dtype=torch.long)
    for b, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
        index[lo:hi] = b
    return index


@dataclass
class PositionLoss:
    """Summed NLL and token counts per position bucket of one evaluation length."""

    edges: list[int]
    nll_sum: list[float]
    tokens: list[int]

    @classmethod
    def empty(cls, length: int) -> PositionLoss:
        edges = bucket_edges(length)
        return cls(edges, [0.0] * (len(edges) - 1), [0] * (len(edges) - 1))

    def add(self, nll_sum: Tensor, tokens: Tensor) -> None:
        """Add per-bucket sums (float64) and counts, as ``accumulate`` returns them."""
        self.nll_sum = [a + float(b) for a, b in zip(self.nll_sum, nll_sum.tolist())]
        self.tokens = [a + int(b) for a, b in zip(self.tokens, tokens.tolist())]

    @property
    def mean_nll(self) -> list[float | None]:
        """Mean NLL per bucket (None for a bucket with no scored token)."""
        return [s / n if n else None for s, n in zip(self.nll_sum, self.tokens)]

    def total(self) -> tuple[float, int]:
        return math.fsum(self.nll_sum), sum(self.tokens)

    def to_dict(self) -> dict:
        return {"edges": self.edges, "nll_sum": self.nll_sum, "tokens": self.tokens}

    @classmethod
    def from_dict(cls, data: dict) -> PositionLoss:
        edges = [int(e) for e in data["edges"]]
        nll, tokens = [float(x) for x in data["nll_sum"]], [int(n) for n in data["tokens"]]
        if len(nll) != len(edges) - 1 or len(tokens) != len(nll):
            raise ValueError("a loss-by-position record needs one sum and one count per bucket")
        return cls(edges, nll, tokens)


def accumulate(losses: Tensor, mask: Tensor, index: Tensor, n_buckets: int) -> tuple[Tensor, Tensor]:
    """Per-bucket sums of ``losses`` [B, P] where ``mask`` [B, P] holds, with ``index`` [P] the bucket of each
    column (the column's position); float64 sums and int64 counts, on the host."""
    where = index.to(losses.device).expand_as(losses)[mask]
    sums = torch.zeros(n_buckets, dtype=torch.float64, device=losses.device)
    sums.index_add_(0, where, losses[mask].double())
    counts = torch.bincount(where, minlength=n_buckets)
    return sums.cpu(), counts.cpu()
