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
backward); compute in the dtype of the tensors, not the positions'. A learned table read per score goes through
``read_table`` (plain indexing, except on CUDA outside compiled code, where its backward is one ``index_add_``).

A bias that reads the positions only through ``q_pos - k_pos`` says so (``relative=True``); one that does so
while every query position is below some value (FIRE, below its L) gives that value (``relative_below``). Materialising it for
one row of consecutive query positions and one of consecutive key positions (the usual case: every row of the
batch shares positions 0..N-1, or a cache's offset) then evaluates ``fn`` once per distinct distance, Nq + Nk - 1
of them, and lays the values out as the Toeplitz matrix they form: the same ``fn`` on the same distances, so the
same values, at O(Nq + Nk) evaluations instead of O(Nq Nk) (KERPLE's logarithm, its gradient), the N x N part
being one copy forward and one windowed sum backward. Other positions, and code being compiled (where the
element-wise form fuses anyway, and a check of the positions' values would break the graph), take the
element-wise path. Positions are read on the host only on a CPU (on a GPU that is a synchronisation per call);
elsewhere the Toeplitz layout needs ``consecutive_positions``, which attention sets for the model's own positions
in an unpadded batch (FIRE's threshold check still reads the query positions).
Without it an element-wise T5 bias on an H200 took 615 ms a step at 16 x 1024 (RoPE 70): the backward of its
table read adds millions of gradients into 129 rows per head, which CUDA's indexing backward does one duplicate
at a time (pytorch/pytorch#41162).

Precision. A bias is computed in float32 at least, whatever autocast does: the model asks for it with autocast
off, and its tensors are read widened to float32 when they are narrower (a model cast to bfloat16), so that no
position, distance or bias value is rounded to bfloat16 (8 bits of mantissa: positions above 256, or ALiBi's
bias at distance 8,000, would be). Only the sum with the scores follows the attention's compute dtype.

Per-distance tables. A relative bias over shared consecutive positions (query i is key Nk - Nq + i, the
model's own positions) is one value per head and distance: ``distance_table`` evaluates ``fn`` once per
distance 0..Nk - 1 with ordinary autograd, and the attention kernel reads one entry per score
(``table_score_mod``, a single code object for every encoding: FlexAttention compiles it once per length;
the static decoding cache gathers one row per token). Gradients reach the encoding's tensors through the
table, so the kernel's backward adds each score's gradient into one of Nk entries per head instead of into
a handful of parameters shared by every score.
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
    relative_below: Tensor | None = None   # ... at least while every query position is below this ([1])
    consecutive_positions: bool = False    # its positions are known to be consecutive (the model's own)

    def wide_tensors(self) -> tuple[Tensor, ...]:
        """The tensors ``fn`` reads, floating ones narrower than float32 widened to it (a no-op otherwise)."""
        return tuple(wide(t) for t in self.tensors)

    def materialise(self, n_heads: int, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The bias ``[B or 1, H, Nq, Nk]`` for positions ``[B or 1, Nq]`` and ``[B or 1, Nk]``."""
        head = torch.arange(n_heads, device=q_pos.device).view(1, n_heads, 1, 1)
        if (self.relative or self.relative_below is not None) and q_pos.shape[0] == 1 and k_pos.shape[0] == 1 \
                and not torch.compiler.is_compiling() and (self.consecutive_positions or (
                    consecutive(q_pos[0]) and consecutive(k_pos[0]))) and self.relative_at(q_pos):
            return self.toeplitz(head, q_pos[0], k_pos[0])
        bias = self.fn(head, q_pos[:, None, :, None], k_pos[:, None, None, :], *self.wide_tensors())
        batch = max(q_pos.shape[0], k_pos.shape[0])
        return bias.expand(batch, n_heads, q_pos.shape[-1], k_pos.shape[-1])

    def relative_at(self, q_pos: Tensor) -> bool:
        """Whether ``fn(i, j) == fn(i - j, 0)`` for these query positions (read on the host)."""
        return self.relative or bool((q_pos.max() < self.relative_below.detach()).all())

    def toeplitz(self, head: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The bias ``[1, H, Nq, Nk]`` for consecutive positions ``[Nq]`` and ``[Nk]``: entry (i, j) has distance
        d0 + i - j, d0 = q_pos[0] - k_pos[0]. ``fn`` is evaluated once per distance, in descending order: value
        t = 0..Nq + Nk - 2 is distance d0 + Nq - 1 - t, so that entry (i, j) is value j - i + Nq - 1. Laid out
        without a strided copy: the Nq + Nk - 1 values repeated Nq times, read from offset Nq - 1 as rows of
        Nq + Nk - 2, start row i one value earlier than row i - 1 (its first Nk values are the row). Backward,
        the same steps in reverse: contiguous copies and a sum over the repeats."""
        nq, nk = q_pos.shape[0], k_pos.shape[0]
        distances = (q_pos[0] - k_pos[0]) + (nq - 1) - torch.arange(nq + nk - 1, device=q_pos.device)
        values = self.fn(head, distances.view(1, 1, 1, -1), torch.zeros_like(distances[:1]).view(1, 1, 1, 1),
                         *self.wide_tensors())[:, :, 0]               # [1, H or 1, Nq + Nk - 1]
        return ToeplitzLayout.apply(values, nq, nk).expand(1, head.shape[1], nq, nk)

    def distance_table(self, n_heads: int, n: int, device) -> Tensor:
        """``[H, n]``: the bias of every head at distances 0..n-1 (a relative bias only), evaluated once per
        distance with ordinary autograd; float32 at least."""
        if not self.relative:
            raise ValueError("a per-distance table needs a relative bias (relative=True)")
        distances = torch.arange(n, device=device)
        head = torch.arange(n_heads, device=device).view(n_heads, 1)
        values = self.fn(head, distances.view(1, n), torch.zeros_like(distances[:1]).view(1, 1), *self.wide_tensors())
        return values.expand(n_heads, n)

    def score_mod(self, q_pos: Tensor, k_pos: Tensor):
        """A FlexAttention ``score_mod`` adding the bias; query / key indices map to positions through
        ``q_pos`` / ``k_pos`` (``[B or 1, N]``)."""
        fn, tensors = self.fn, self.wide_tensors()
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


class ToeplitzLayout(torch.autograd.Function):
    """values ``[1, H, Nq + Nk - 1]`` -> ``[1, H, Nq, Nk]``, entry (i, j) = value j - i + Nq - 1: a view of the
    values repeated Nq times, read from offset Nq - 1 in rows of Nq + Nk - 2 (row i starts one value before row
    i - 1 and ends past the Nk it shows). Backward: the gradient written back through the same view, the
    entries it skips zeroed, summed over the repeats (one copy and one sum, where autograd through the view
    fills two buffers with zeros and copies twice)."""

    @staticmethod
    def forward(ctx, values: Tensor, nq: int, nk: int) -> Tensor:
        ctx.nq, ctx.nk = nq, nk
        if nq == 1:
            return values[:, :, None, :]
        return ToeplitzLayout.window(values.repeat(1, 1, nq), nq, nk)

    @staticmethod
    def window(repeated: Tensor, nq: int, nk: int) -> Tensor:
        width = nq + nk - 2
        return repeated[..., nq - 1:nq - 1 + nq * width].view(*repeated.shape[:-1], nq, width)[..., :nk]

    @staticmethod
    def backward(ctx, grad: Tensor):
        nq, nk = ctx.nq, ctx.nk
        if nq == 1:
            return grad[:, :, 0, :], None, None
        width = nq + nk - 2
        repeated = grad.new_empty(*grad.shape[:2], nq * (nq + nk - 1))
        rows = repeated[..., nq - 1:nq - 1 + nq * width].view(*grad.shape[:2], nq, width)
        rows[..., :nk].copy_(grad)
        rows[..., nk:].zero_()                      # what the view skips: zeros, summed with the rest
        repeated[..., :nq - 1].zero_()
        repeated[..., nq - 1 + nq * width:].zero_()
        return repeated.view(*grad.shape[:2], nq, nq + nk - 1).sum(2), None, None


class TableRead(torch.autograd.Function):
    """``table[row, col]`` (index tensors, broadcast together) whose backward adds the gradient into the table with
    one ``index_add_`` (atomic adds on CUDA, no host synchronisation). Indexing's own backward on CUDA sorts the
    indices and adds each run of equal ones one at a time (pytorch/pytorch#41162), and a bias evaluated per score
    reads millions of times from a table of a few dozen rows (FIRE's 33 segments, T5's 129 distances): on an H200
    that made FIRE 11.6x RoPE's step."""

    @staticmethod
    def forward(ctx, table: Tensor, row: Tensor, col: Tensor) -> Tensor:
        row, col = torch.broadcast_tensors(row, col)
        ctx.save_for_backward(row, col)
        ctx.table_shape = table.shape
        return table[row, col]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        row, col = ctx.saved_tensors
        rows, cols = ctx.table_shape
        flat = (row * cols).add_(col).reshape(-1)                   # one index-sized temporary
        summed = grad.new_zeros(rows * cols).index_add_(0, flat, grad.reshape(-1))
        return summed.view(rows, cols), None, None


def read_table(table: Tensor, row: Tensor, col: Tensor) -> Tensor:
    """``table[row, col]``: through ``TableRead`` on CUDA when the table needs a gradient (outside compiled code and
    functorch transforms, which read it as one gather, and unless deterministic algorithms are asked for: atomic
    adds come in no fixed order); plain indexing elsewhere, so a CPU computes exactly what it always has."""
    fast = not torch.compiler.is_compiling() and table.is_cuda and table.requires_grad and torch.is_grad_enabled() \
        and not torch.are_deterministic_algorithms_enabled() and not torch._C._are_functorch_transforms_active()
    return TableRead.apply(table, row, col) if fast else table[row, col]


def wide(t: Tensor) -> Tensor:
    """``t`` in float32 if it is a floating tensor narrower than that (bfloat16, float16); else ``t`` itself."""
    return t.float() if t.is_floating_point() and t.element_size() < 4 else t


def table_score_mod(table: Tensor, offset: int):
    """A ``score_mod`` reading a per-distance table ``[H, T]`` (``ScoreBias.distance_table``) for queries and keys
    at consecutive positions, query i at key ``offset + i``: distance ``offset + q_idx - kv_idx``, clamped into
    the table (entries outside it are masked keys or padded query rows). One gather per score."""
    last = table.shape[-1] - 1

    def read(score, b, h, q_idx, kv_idx):
        return score + table[h, torch.clamp(q_idx - kv_idx + offset, 0, last)]
    return read


def table_rows(table: Tensor, q_slots: Tensor, n_keys: int) -> Tensor:
    """The bias ``[1, H, Nq, Nk]`` of queries at key indices ``q_slots [Nq]`` over keys 0..Nk-1, read from a
    per-distance table ``[H, T]``: entry (i, j) is the table at distance ``q_slots[i] - j`` (clamped into it: the
    keys a query may not see read the last or first entry)."""
    distances = q_slots[:, None] - torch.arange(n_keys, device=q_slots.device)
    return table[:, distances.clamp(0, table.shape[-1] - 1)][None]


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
