"""FIRE (Li et al. 2024): a learned bias b_h(i, j) = MLP_h( psi(i - j) / psi(max(i, L)) ).

psi(x) = log(|c x| + 1) with c learned (init 0.1); L = |L_mult * init_L| with init_L = 512 fixed and the
multiplier learned (init 1.0); MLP 1 -> 32 -> H with ReLU; eps 1e-6 added to the denominator; one module per
layer, as in the reference. While i < L the normaliser is constant, so the bias depends on i - j only.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posbench.encodings.base import PositionalEncoding


class FIRELayer(nn.Module):
    def __init__(self, n_heads: int, hidden: int, c: float, init_l: float, eps: float):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, n_heads))
        self.c = nn.Parameter(torch.tensor(c))
        self.l_mult = nn.Parameter(torch.tensor(1.0))
        self.register_buffer("init_l", torch.tensor(init_l), persistent=False)
        self.eps = eps

    def psi(self, x: Tensor) -> Tensor:
        return torch.log(torch.abs(self.c * x) + 1)

    def forward(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        q = q_pos.to(self.c.dtype)[:, :, None]
        k = k_pos.to(self.c.dtype)[:, None, :]
        threshold = torch.abs(self.l_mult * self.init_l)
        normalised = self.psi(q - k) / (self.psi(torch.maximum(q, threshold)) + self.eps)  # [B, Nq, Nk]
        return self.mlp(normalised[..., None]).permute(0, 3, 1, 2)  # [B, H, Nq, Nk]


class FIRE(PositionalEncoding):
    name = "fire"
    description = "functional interpolation: learned MLP bias of log-scaled, progressively normalised distance"
    relative = True  # only while positions stay below L
    has_bias = True
    defaults = {"hidden": 32, "c": 0.1, "init_l": 512.0, "eps": 1e-6}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        o = self.options
        self.layers = nn.ModuleList(
            FIRELayer(self.n_heads, o["hidden"], o["c"], o["init_l"], o["eps"]) for _ in range(self.n_layers))

    def bias(self, layer: int, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return self.layers[layer](q_pos, k_pos)
