"""ALiBi (Press et al. 2022): logit bias -m_h * (i - j) for query i and key j.

Slopes: for a power-of-two head count H, m_h = 2 ** (-8h / H), h = 1..H. Otherwise take the slopes of the
largest power of two P < H, then every other slope of the 2P sequence until there are H (for H = 12:
2^-1..2^-8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5). The reference adds +m_h * j, which equals -m_h (i - j)
under the softmax; we add the distance form so the bias itself is shift-invariant.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posbench.model.bias import ScoreBias
from posbench.encodings.base import PositionalEncoding


def alibi_slopes(n_heads: int) -> list[float]:
    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    if math.log2(n_heads).is_integer():
        return power_of_two(n_heads)
    p = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(p) + power_of_two(2 * p)[0::2][: n_heads - p]


def alibi_bias(head: Tensor, q_pos: Tensor, k_pos: Tensor, slopes: Tensor) -> Tensor:
    return slopes[head] * (k_pos - q_pos).to(slopes.dtype)


class ALiBi(PositionalEncoding):
    name = "alibi"
    description = "linear distance penalty per head (Press et al. slopes)"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(self.n_heads)), persistent=False)

    def bias(self, layer: int, state, q, k, q_pos, k_pos) -> ScoreBias:
        return ScoreBias(alibi_bias, (self.slopes,), relative=True)
