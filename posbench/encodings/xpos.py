"""xPos (Sun et al. 2022): RoPE whose pair f is also scaled by zeta_f ** ((i - j) / scale_base).

zeta_f = (2f + gamma * D) / ((1 + gamma) * D), gamma = 0.4, scale_base = 2048. Queries are multiplied by
zeta ** (power) and keys by zeta ** (-power) with power = (t - centre) / scale_base; the product depends
on i - j only. The reference centres at half its cache length, which moves when a longer sequence
arrives; we centre at ``max_seq_len // 2`` always, so a KV cache stays valid. The centre cancels in the
logits either way.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posbench.encodings.base import PositionalEncoding, rope_cos_sin
from posbench.options import Option, positive
from posbench.encodings.rope import apply_rotary


class XPos(PositionalEncoding):
    name = "xpos"
    description = "RoPE with an exponential decay per frequency (gamma 0.4, scale base 2048)"
    OPTIONS = {
        "theta": Option(10000.0, "the rotary base", positive()),
        "gamma": Option(0.4, "zeta_f = (2f + gamma D) / ((1 + gamma) D); 0 would make zeta_0 = 0", positive()),
        "scale_base": Option(2048.0, "the decay's length scale: zeta ** ((i - j) / scale_base)", positive()),
    }

    def zeta(self, device=None) -> Tensor:
        d, gamma = self.head_dim, self.options["gamma"]
        zeta = (torch.arange(0, d, 2, device=device, dtype=torch.float64) + gamma * d) / ((1 + gamma) * d)
        return torch.cat((zeta, zeta))

    def init_state(self, positions: Tensor, tokens: Tensor, memory):
        cos, sin = rope_cos_sin(positions, self.head_dim, self.options["theta"])
        power = (positions.to(torch.float64) - self.max_seq_len // 2) / self.options["scale_base"]
        scale = (self.zeta(positions.device) ** power[..., None]).to(torch.float32)  # [B, N, D]
        return cos, sin, scale

    def rotate(self, layer: int, q: Tensor, k: Tensor, state) -> tuple[Tensor, Tensor]:
        cos, sin, scale = state
        q = apply_rotary(q, cos, sin) * scale[:, None].to(q.dtype)
        k = apply_rotary(k, cos, sin) / scale[:, None].to(k.dtype)
        return q, k
