"""Logit biases stated once, as an element-wise function of (head, query position, key position).

An encoding with a logit bias returns a ``ScoreBias``: a function ``fn(head, q_pos, k_pos, *tensors)`` built
only from element-wise torch operations and indexing, plus the encoding's own tensors it reads (ALiBi's
slopes, T5's distance table, FIRE's pieces). The same function serves every attention backend:

- ``materialise(n_heads, q_pos, k_pos)`` calls it on broadcast index grids and returns the bias tensor
  ``[B or 1, H, Nq, Nk]`` that eager attention and SDPA add to the logits (CPU, and any backend that takes a
  mask);
- ``score_mod(q_pos, k_pos)`` wraps it as a FlexAttention ``score_mod``: evaluated per score inside the
  kernel, so no sequence x sequence tensor exists, with gradients reaching every tensor that requires them.

Rules for ``fn`` so that both work: element-wise operations and indexing only (no reductions, no Python
branches on values); read each gradient-carrying tensor in exactly one indexing expression (compiled
FlexAttention supports one gather per such tensor: pass a second view for a second use); give learnable
scalars shape ``[1]`` and read them as ``t[0]`` (0-d captured tensors with gradients fail in FlexAttention's
backward); compute in the dtype of the tensors, not the positions'.

A bias that reads the positions only through ``q_pos - k_pos`` says so (``relative=True``). Materialising it for
one row of consecutive query positions and one of consecutive key positions (the usual case: every row of the
batch shares positions 0..N-1, or a cache's offset) then evaluates ``fn`` once per distinct distance, Nq + Nk - 1
of them, and lays the values out as the Toeplitz matrix they form: the same ``fn`` on the same distances, so the
same values, at O(Nq + Nk) evaluations instead of O(Nq Nk) (KERPLE's logarithm, its gradient), the N x N part
being one copy forward and one windowed sum backward. Other positions, and code being compiled (where the
element-wise form fuses anyway, and a check of the positions' values would break the graph), take the
element-wise path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

BiasFn = Callable[..., Tensor]


@dataclass(frozen=True)
class ScoreBias:
    fn: BiasFn                          # fn(head, q_pos, k_pos, *tensors) -> bias, element-wise
    tensors: tuple[Tensor, ...] = ()
    relative: bool = False              # fn reads the positions only through q_pos - k_pos

    def materialise(self, n_heads: int, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The bias ``[B or 1, H, Nq, Nk]`` for positions ``[B or 1, Nq]`` and ``[B or 1, Nk]``."""
        head = torch.arange(n_heads, device=q_pos.device).view(1, n_heads, 1, 1)
        if self.relative and q_pos.shape[0] == 1 and k_pos.shape[0] == 1 and not torch.compiler.is_compiling() \
                and consecutive(q_pos[0]) and consecutive(k_pos[0]):
            return self.toeplitz(head, q_pos[0], k_pos[0])
        bias = self.fn(head, q_pos[:, None, :, None], k_pos[:, None, None, :], *self.tensors)
        batch = max(q_pos.shape[0], k_pos.shape[0])
        return bias.expand(batch, n_heads, q_pos.shape[-1], k_pos.shape[-1])

    def toeplitz(self, head: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The bias ``[1, H, Nq, Nk]`` for consecutive positions ``[Nq]`` and ``[Nk]``: entry (i, j) has distance
        d0 + i - j, d0 = q_pos[0] - k_pos[0]. ``fn`` is evaluated at the Nq + Nk - 1 distances d0 - (Nk - 1) + m,
        m = 0..Nq + Nk - 2, so that entry (i, j) is value m = i - j + Nk - 1: window i of Nk values, reversed."""
        nq, nk = q_pos.shape[0], k_pos.shape[0]
        distances = (q_pos[0] - k_pos[0]) - (nk - 1) + torch.arange(nq + nk - 1, device=q_pos.device)
        values = self.fn(head, distances.view(1, 1, 1, -1), torch.zeros_like(distances[:1]).view(1, 1, 1, 1),
                         *self.tensors)                               # [1, H or 1, 1, Nq + Nk - 1]
        bias = values.unfold(-1, nk, 1).flip(-1)[:, :, 0]             # [1, H or 1, Nq, Nk]
        return bias.expand(1, head.shape[1], nq, nk)

    def score_mod(self, q_pos: Tensor, k_pos: Tensor):
        """A FlexAttention ``score_mod`` adding the bias; query / key indices map to positions through
        ``q_pos`` / ``k_pos`` (``[B or 1, N]``)."""
        fn, tensors = self.fn, self.tensors
        if q_pos.shape[0] != k_pos.shape[0]:                  # one of them shared by every row
            batch = max(q_pos.shape[0], k_pos.shape[0])
            q_pos, k_pos = q_pos.expand(batch, -1), k_pos.expand(batch, -1)
        if q_pos.shape[0] == 1:
            q_row, k_row = q_pos[0], k_pos[0]

            def shared(score, b, h, q_idx, kv_idx):
                return score + fn(h, q_row[q_idx], k_row[kv_idx], *tensors)
            return shared

        def per_row(score, b, h, q_idx, kv_idx):
            return score + fn(h, q_pos[b, q_idx], k_pos[b, kv_idx], *tensors)
        return per_row


def consecutive(pos: Tensor) -> bool:
    """Whether positions ``[N]`` are p, p + 1, ..., p + N - 1 (read on the host: eager CPU materialisation only)."""
    return pos.shape[0] < 2 or (pos.device.type == "cpu" and bool((pos[1:] - pos[:-1] == 1).all()))


def tensor_score_mod(bias: Tensor):
    """A ``score_mod`` reading a materialised bias ``[B or 1, H, Nq, Nk]`` (a bias given as a tensor)."""
    if bias.shape[0] == 1:
        single = bias[0]

        def shared(score, b, h, q_idx, kv_idx):
            return score + single[h, q_idx, kv_idx]
        return shared

    def per_row(score, b, h, q_idx, kv_idx):
        return score + bias[b, h, q_idx, kv_idx]
    return per_row
