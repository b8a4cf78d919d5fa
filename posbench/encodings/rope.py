"""RoPE (Su et al. 2021) in the half-split layout of Llama / GPT-NeoX, as the TAPE reference code uses it.

q and k of the token at position t are rotated pairwise, pair f = (x_f, x_{f+D/2}) by the angle
t * theta^(-2f/D). The logit q_i . k_j then depends on i - j only.

Option ``random_offset`` (default off, as in the reference RoPE baseline): while training, add one random
integer k ~ U{0..2 * max_seq_len} to every position of the forward pass. The reference gives this offset to
TAPE only; turn it on here to remove that confound from a RoPE vs TAPE comparison.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posbench.encodings.base import PositionalEncoding, rope_cos_sin, rotate_half
from posbench.options import Option, positive


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x * cos + rotate_half(x) * sin`` with cos/sin ``[B, N, D]`` broadcast over heads."""
    return x * cos[:, None].to(x.dtype) + rotate_half(x) * sin[:, None].to(x.dtype)


def training_offset(module: torch.nn.Module, positions: Tensor, enabled: bool, max_seq_len: int) -> Tensor:
    """The reference's random shift: one k ~ U{0..2L} per forward pass while training. Drawn with torch's
    generator on the positions' device (no host sync, no graph break under ``torch.compile``)."""
    if enabled and module.training:
        return positions + torch.randint(0, 2 * max_seq_len + 1, (), device=positions.device)
    return positions


class RoPE(PositionalEncoding):
    name = "rope"
    description = "rotary embedding, half-split layout, theta 10000"
    OPTIONS = {
        "theta": Option(10000.0, "the rotary base", positive()),
        "scale": Option(1.0, "positions are divided by this (linear position interpolation)", positive()),
        "random_offset": Option(False, "while training, shift every position by one k ~ U{0..2 max_seq_len}"),
    }

    def positions_for(self, positions: Tensor) -> Tensor:
        """Positions actually rotated (subclasses randomise them)."""
        positions = training_offset(self, positions, self.options["random_offset"], self.max_seq_len)
        return positions.to(torch.float64) / self.options["scale"]

    def init_state(self, positions: Tensor, tokens: Tensor, memory) -> tuple[Tensor, Tensor]:
        return rope_cos_sin(self.positions_for(positions), self.head_dim, self.options["theta"])

    def rotate(self, layer: int, q: Tensor, k: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        cos, sin = state
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
