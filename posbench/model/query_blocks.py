"""Causal attention on the CPU in query blocks: block [s, e) of the queries attends only the keys it may see,
[0, Nk - Nq + e), so the scores right of its diagonal block are never computed.

SDPA's CPU kernels skip those scores only for plain causal attention of equal q / k / v widths (``is_causal``);
a float mask (any logit bias) or wider values (TAPE) send them over every score. Here, per block:

- ``causal_query_blocks``: wider values, no bias: SDPA per block (its flash kernel needs equal widths only
  through ``is_causal``; the math kernel then sees a block's scores, not the whole square).
- ``biased_query_blocks``: a logit bias: the bias of the block's rows only (a ``ScoreBias`` is evaluated for
  them; a relative one as a Toeplitz block from one value per distance), added to the block's scores, the
  diagonal block masked, softmax, values; the backward written by hand (``BiasedBlocks``), returning each
  block's bias gradient, so gradients reach q, k, v and every tensor the bias reads without a square bias
  tensor for a ``ScoreBias``: SDPA computes a float mask's gradient only in its math kernel, over the whole
  square. Without gradients nothing is kept between blocks (long evaluations hold one block's scores).

Both are the same function as eager attention (``posbench.model.attention``), up to float rounding (tested in
tests/model/test_query_blocks.py against the definition in float64, every gradient included).

Measured on a 2-core AMD EPYC (torch 2.13 CPU), one layer's attention at 1 x 4 heads x 2048 tokens x 64,
forward and backward, fastest of 12: SDPA's causal flash kernel (no bias) 78-85 ms; with a bias as SDPA's
float mask 193 ms, 360 ms when the bias needs its gradient (the math kernel); in blocks of 128 queries here,
ALiBi 84-91 ms and KERPLE (learned, its gradient included) 102 ms. Blocks of 64, 192, 256 and 512 queries
were slower (64: per-call overhead; larger: more of each diagonal block is computed and masked).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from posbench.model.bias import ScoreBias
from posbench.model.padding import visible_mask

#: queries per block; below two blocks' worth of queries the square is small and one call is fastest
CAUSAL_BLOCK = 128


def block_edges(n: int, blocks: int) -> list[int]:
    """``blocks + 1`` edges splitting ``n`` queries into blocks of near-equal size."""
    return [round(i * n / blocks) for i in range(blocks + 1)]


def causal_mask(nq: int, nk: int, device) -> Tensor:
    """Boolean ``[Nq, Nk]``: True where query i may attend key j (bottom-right aligned)."""
    return torch.ones(nq, nk, dtype=torch.bool, device=device).tril(diagonal=nk - nq)


def causal_query_blocks(q: Tensor, k: Tensor, v: Tensor, blocks: int, key_mask: Tensor | None = None) -> Tensor:
    """Causal self-attention (Nq = Nk) with the queries in ``blocks`` row blocks, through SDPA; ``key_mask [B, Nk]``:
    the real keys of a padded batch (``posbench.model.padding``)."""
    n = q.shape[-2]
    edges = block_edges(n, blocks)
    if key_mask is None:
        parts = [F.scaled_dot_product_attention(q[..., :edges[1], :], k[..., :edges[1], :], v[..., :edges[1], :],
                                                is_causal=True)]
    else:
        parts = [F.scaled_dot_product_attention(q[..., :edges[1], :], k[..., :edges[1], :], v[..., :edges[1], :],
                                                attn_mask=visible_mask(n, n, q.device, key_mask, 0, edges[1])
                                                [..., :edges[1]])]
    for start, end in zip(edges[1:-1], edges[2:]):
        mask = causal_mask(end - start, end, q.device) if key_mask is None else \
            visible_mask(n, n, q.device, key_mask, start, end)[..., :end]
        parts.append(F.scaled_dot_product_attention(q[..., start:end, :], k[..., :end, :], v[..., :end, :],
                                                    attn_mask=mask))
    return torch.cat(parts, dim=-2)


def biased_query_blocks(q: Tensor, k: Tensor, v: Tensor, bias: ScoreBias | Tensor, q_pos: Tensor | None,
                        k_pos: Tensor | None, blocks: int, key_mask: Tensor | None = None) -> Tensor:
    """Causal, bottom-right aligned attention with a logit bias, the queries in ``blocks`` row blocks.
    ``bias``: a ``ScoreBias`` (with positions ``[B or 1, Nq]``, ``[B or 1, Nk]``) or a tensor
    ``[B or 1, H, Nq, Nk]``; ``key_mask [B, Nk]``: the real keys of a padded batch. Scores and softmax in float32
    at least, as eager attention."""
    nq, nk = q.shape[-2], k.shape[-2]
    edges = block_edges(nq, blocks)
    spans = list(zip(edges[:-1], edges[1:]))
    if isinstance(bias, Tensor):                # split once: one backward copy, not a square of zeros per block
        pieces = bias.split([end - start for start, end in spans], dim=-2)
        rows = (piece[..., :nk - nq + end] for piece, (_, end) in zip(pieces, spans))
        bias_grad = bias.requires_grad
    else:
        rows = (bias.materialise(q.shape[1], q_pos[:, start:end], k_pos[:, :nk - nq + end]) for start, end in spans)
        bias_grad = any(t.requires_grad for t in bias.tensors)
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q, k, v = (t.expand(*lead, *t.shape[-2:]) for t in (q, k, v))
    if torch.is_grad_enabled() and (bias_grad or any(t.requires_grad for t in (q, k, v))):
        return BiasedBlocks.apply(tuple(spans), key_mask, q, k, v, *rows)
    return block_forward(tuple(spans), q, k, v, rows, keep=None, key_mask=key_mask)   # each bias made when used

def block_scores(q: Tensor, k: Tensor, bias: Tensor, start: int, end: int, keys: int,
                 key_mask: Tensor | None = None) -> Tensor:
    """Block [start, end)'s attention weights over keys [0, keys): softmax(q k^T + bias) for queries ``q``
    already scaled by 1/sqrt(D), the diagonal block masked (and a padded batch's pads); float32 at least."""
    scores = (q[..., start:end, :] @ k[..., :keys, :].transpose(-2, -1)).to(torch.promote_types(q.dtype, torch.float32))
    scores.add_(bias)
    if key_mask is None:
        future = torch.ones(end - start, end - start, dtype=torch.bool, device=q.device).triu(1)
        scores[..., keys - (end - start):].masked_fill_(future, float("-inf"))
    else:
        visible = visible_mask(q.shape[-2], k.shape[-2], q.device, key_mask, start, end)[..., :keys]
        scores.masked_fill_(~visible, float("-inf"))
    return torch.softmax(scores, dim=-1)


def block_forward(spans: tuple[tuple[int, int], ...], q: Tensor, k: Tensor, v: Tensor, rows, keep: list | None,
                  key_mask: Tensor | None = None):
    """The output ``[B, H, Nq, Dv]`` for q, k, v of equal leading shapes; ``keep`` collects each block's
    weights (for the backward pass)."""
    nq, nk = q.shape[-2], k.shape[-2]
    q = q * (1.0 / math.sqrt(q.shape[-1]))
    out = v.new_empty(*q.shape[:-1], v.shape[-1])
    for (start, end), bias in zip(spans, rows):
        keys = nk - nq + end
        weights = block_scores(q, k, bias, start, end, keys, key_mask)
        out[..., start:end, :] = weights.to(v.dtype) @ v[..., :keys, :]
        if keep is not None:
            keep.append(weights)
    return out


class BiasedBlocks(torch.autograd.Function):
    """The blocks with a hand-written backward: each block's gradients are accumulated into q's, k's and v's
    in place (autograd through slices would add a zero-padded copy of k and v per block), and the bias gets the
    softmax's gradient dS of its own rows (unscaled: scores = q k^T / sqrt(D) + bias)."""

    @staticmethod
    def forward(ctx, spans, key_mask, q, k, v, *rows):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        weights: list[Tensor] = []
        out = block_forward(spans, q, k, v, rows, keep=weights, key_mask=key_mask)
        ctx.spans = spans
        ctx.bias_shapes = [(bias.shape, bias.dtype) for bias in rows]
        ctx.save_for_backward(q, k, v, out, *weights)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        with torch.autocast("cpu", enabled=False):      # in the weights' precision (float32 at least) throughout
            return BiasedBlocks.gradients(ctx, grad_out)

    @staticmethod
    def gradients(ctx, grad_out):
        q, k, v, out, *weights = ctx.saved_tensors
        (nq, d), nk, dv_width = q.shape[-2:], k.shape[-2], v.shape[-1]
        scale = 1.0 / math.sqrt(d)
        flat = weights[0].dtype                         # float32 at least, as the weights
        # three dimensions (batch x head first) so that the products accumulate in place (baddbmm_)
        q3, k3, v3 = (t.reshape(-1, *t.shape[-2:]) for t in (q, k, v))
        g3 = grad_out.reshape(-1, nq, dv_width).to(flat)
        dq, dk, dv = torch.zeros_like(q3, dtype=flat), torch.zeros_like(k3, dtype=flat), torch.zeros_like(v3, dtype=flat)
        # sum_j P_ij dP_ij = dO_i . O_i: the softmax's backward needs one number per query
        delta = (g3 * out.reshape(g3.shape).to(flat)).sum(-1, keepdim=True)
        q3, k3, v3 = q3.to(flat) * scale, k3.to(flat), v3.to(flat)
        grad_rows = []
        for (start, end), p, (shape, dtype), wants in zip(ctx.spans, weights, ctx.bias_shapes,
                                                          ctx.needs_input_grad[5:]):
            keys = nk - nq + end
            p3 = p.reshape(-1, end - start, keys)
            g = g3[:, start:end]
            dv[:, :keys].baddbmm_(p3.transpose(-2, -1), g)
            ds = torch.bmm(g, v3[:, :keys].transpose(-2, -1))
            ds.sub_(delta[:, start:end]).mul_(p3)                # dS = P (dP - rowsum(P dP))
            dq[:, start:end].baddbmm_(ds, k3[:, :keys], alpha=scale)
            dk[:, :keys].baddbmm_(ds.transpose(-2, -1), q3[:, start:end])
            grad_rows.append(ds.view(p.shape).sum_to_size(shape).to(dtype) if wants else None)
        return (None, None, dq.view(q.shape).to(q.dtype), dk.view(k.shape).to(k.dtype), dv.view(v.shape).to(v.dtype),
                *grad_rows)
