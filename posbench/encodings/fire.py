"""FIRE (Li et al. 2024): a learned bias b_h(i, j) = MLP_h( psi(i - j) / psi(max(i, L)) ).

psi(x) = log(|c x| + 1) with c learned (init 0.1); L = |L_mult * init_L| with init_L fixed and the multiplier
learned (init 1.0); MLP 1 -> 32 -> H with ReLU; eps 1e-6 added to the denominator; one module per layer, as in
the reference. While i < L the normaliser is constant, so the bias depends on i - j only.

Initialisation as released (DAPE's repository, ``megatron/model/positional_embeddings.py`` class ``FIRE``, which
posbench's FIRE equals): the MLP keeps PyTorch's default ``nn.Linear`` init (the first layer's weights and biases
U(-1, 1), the second's U(-1/sqrt(32), 1/sqrt(32))), so a fresh bias spans about a logit; c = 0.1; init_L = half the
training length (that class stores ``init_L // 2`` of the length it is given; the TAPE reference's 512 at its
1,024-token training length is the same ratio). Option ``init_l``: 0 (the default) means max_seq_len / 2. (The
TAPE reference draws the MLP from its model-wide N(0, 0.02), which leaves the bias near 0.001 logits.)

How it is evaluated without a sequence x sequence tensor. The MLP has one input u, so it is piecewise linear
in u: hidden unit k is active on one side of its breakpoint t_k = -b1_k / w1_k, and between consecutive
breakpoints the set of active units is fixed. With the K breakpoints sorted, segment s (u above exactly s of
them) has

    MLP_h(u) = slope[s, h] * u + icpt[s, h],
    slope[s, h] = sum_k active[s, k] w1_k W2[h, k],   icpt[s, h] = b2_h + sum_k active[s, k] b1_k W2[h, k],

which is the MLP exactly (at a breakpoint the unit contributes zero either way). ``pieces()`` builds the
(K + 1) x H tables from the weights with ordinary autograd, so gradients reach every MLP weight; per score the
bias needs u, a count of the breakpoints below it, and two table lookups. Gradients reach c and L_mult
through u.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor, nn

from posbench.model.bias import ScoreBias, read_table
from posbench.encodings.base import PositionalEncoding
from posbench.options import Bound, Option, at_least, positive


def fire_bias(head: Tensor, q_pos: Tensor, k_pos: Tensor, c_num: Tensor, c_den: Tensor, threshold: Tensor,
              breaks: Tensor, slope: Tensor, icpt: Tensor, *, eps: float) -> Tensor:
    """The element-wise FIRE bias. ``c_num`` and ``c_den`` are two views of c (one read each), ``threshold``
    is L, all shape [1]; ``breaks`` the sorted breakpoints [K]; ``slope``/``icpt`` the [K + 1, H] pieces."""
    q = q_pos.to(slope.dtype)
    u = torch.log(torch.abs(c_num[0] * (q - k_pos.to(slope.dtype))) + 1) / \
        (torch.log(torch.abs(c_den[0] * torch.maximum(q, threshold[0])) + 1) + eps)
    if torch.compiler.is_compiling():           # inside a compiled kernel: element-wise comparisons only
        segment = (u > breaks[0]).to(torch.int64)
        for k in range(1, breaks.shape[0]):
            segment = segment + (u > breaks[k]).to(torch.int64)
    else:                                       # the same count (breakpoints below u) in one pass
        segment = torch.bucketize(u, breaks)
    return read_table(slope, segment, head) * u + read_table(icpt, segment, head)


class FIRELayer(nn.Module):
    def __init__(self, n_heads: int, hidden: int, c: float, init_l: float, eps: float):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, n_heads))
        self.c = nn.Parameter(torch.tensor(c))
        self.l_mult = nn.Parameter(torch.tensor(1.0))
        self.register_buffer("init_l", torch.tensor(init_l), persistent=False)
        self.eps = eps

    def pieces(self) -> tuple[Tensor, Tensor, Tensor]:
        """Sorted breakpoints [K] and the slope / intercept of each of the K + 1 segments, [K + 1, H], in the
        weights' dtype whatever autocast does (under bf16 autocast the products would be bf16, and the bias
        casts the positions to the slopes' dtype: above 256 they would be rounded)."""
        w1, b1 = self.mlp[0].weight[:, 0], self.mlp[0].bias
        w2, b2 = self.mlp[2].weight, self.mlp[2].bias
        k = w1.shape[0]
        with torch.no_grad():
            flat = w1 == 0                                        # constant units: active iff b1 > 0
            breaks = torch.where(flat, torch.inf, -b1 / torch.where(flat, torch.ones_like(w1), w1))
            order = breaks.argsort()
            rank = torch.empty_like(order)
            rank[order] = torch.arange(k, device=order.device)
            below = rank[None, :] < torch.arange(k + 1, device=rank.device)[:, None]   # [K + 1, K]
            active = torch.where(w1 > 0, below, torch.where(w1 < 0, ~below, b1 > 0)).to(w1.dtype)
        with torch.autocast(w1.device.type, enabled=False):     # float32: bf16 would round the positions
            slope = (active * w1) @ w2.T
            icpt = (active * b1) @ w2.T + b2
        return breaks[order].contiguous(), slope, icpt

    def score_bias(self) -> ScoreBias:
        breaks, slope, icpt = self.pieces()
        threshold = torch.abs(self.l_mult * self.init_l).view(1)
        return ScoreBias(partial(fire_bias, eps=self.eps),
                         (self.c.view(1), self.c.view(1), threshold, breaks, slope, icpt), relative_below=threshold)

    def mlp_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The definition, through the MLP itself (``[B, H, Nq, Nk]``): the reference the pieces are tested
        against."""
        q = q_pos.to(self.c.dtype)[:, :, None]
        k = k_pos.to(self.c.dtype)[:, None, :]
        threshold = torch.abs(self.l_mult * self.init_l)

        def psi(x: Tensor) -> Tensor:
            return torch.log(torch.abs(self.c * x) + 1)

        normalised = psi(q - k) / (psi(torch.maximum(q, threshold)) + self.eps)
        return self.mlp(normalised[..., None]).permute(0, 3, 1, 2)


class FIRE(PositionalEncoding):
    name = "fire"
    description = "functional interpolation: learned MLP bias of log-scaled, progressively normalised distance"
    OPTIONS = {
        "hidden": Option(32, "hidden width of the MLP 1 -> hidden -> heads", at_least(1)),
        # c = 0 would never move (psi's gradient in c is zero there)
        "c": Option(0.1, "initial c of psi(x) = log(|c x| + 1) (learned)", positive()),
        "init_l": Option(0.0, "the threshold L = |L_mult * init_l| below which the bias is relative (L_mult "
                              "learned from 1); 0: max_seq_len / 2", Bound(low=0)),
        "eps": Option(1e-6, "added to the normaliser psi(max(i, L))", Bound(low=0)),
    }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        o = self.options
        o["init_l"] = float(o["init_l"] or self.max_seq_len / 2)        # recorded as used
        self.layers = nn.ModuleList(
            FIRELayer(self.n_heads, o["hidden"], o["c"], o["init_l"], o["eps"]) for _ in range(self.n_layers))

    def bias(self, layer: int, state, q, k, q_pos, k_pos) -> ScoreBias:
        return self.layers[layer].score_bias()
