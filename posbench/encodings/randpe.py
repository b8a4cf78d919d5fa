"""Randomised RoPE (Ruoss et al. 2023), as the TAPE reference's ``randrope``.

While training, the N positions of a sequence are ``sort(randperm(2 * max_seq_len)[:N])``: an ordered
random subset of a range twice the training length, then RoPE at those positions. If N exceeds that
range the positions are 0..N-1, as in the reference.

Deliberate choices, each an option:
- ``per_layer`` (default False): the reference draws new positions in every layer because each attention
  module owns its sampler; Ruoss et al. draw one ordered subset per sequence and use it everywhere. We
  follow the paper by default so every layer sees the same token order; set True for the reference.
- ``eval_random`` (default False): the reference also samples at evaluation, which makes its perplexity
  stochastic and is incompatible with a KV cache. We evaluate at 0..N-1; set True for the reference.
- ``range_factor`` (default 2): the sampling range as a multiple of ``max_seq_len``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posbench.encodings.base import rope_cos_sin
from posbench.options import Option, at_least, positive
from posbench.encodings.rope import RoPE, apply_rotary


class RandPE(RoPE):
    name = "randpe"
    description = "RoPE at sorted random positions drawn from 2x the training length"
    OPTIONS = {
        "theta": Option(10000.0, "the rotary base", positive()),
        "range_factor": Option(2, "positions are drawn from range_factor x max_seq_len", at_least(1)),
        "per_layer": Option(False, "new positions in every layer (the TAPE reference; default: one draw per pass)"),
        "eval_random": Option(False, "random positions at evaluation too (the reference; no KV cache then)"),
    }

    def sample_positions(self, positions: Tensor) -> Tensor:
        n = positions.shape[-1]
        span = self.options["range_factor"] * self.max_seq_len
        if not (self.training or self.options["eval_random"]) or n > span:
            return positions
        draw = torch.randperm(span, device=positions.device)[:n].sort().values
        return draw.expand_as(positions)

    def angles(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        return rope_cos_sin(self.sample_positions(positions), self.head_dim, self.options["theta"])

    def init_state(self, positions: Tensor, tokens: Tensor, memory):
        return positions, self.angles(positions)

    def rotate(self, layer: int, q: Tensor, k: Tensor, state) -> tuple[Tensor, Tensor]:
        positions, (cos, sin) = state
        if self.options["per_layer"] and layer > 0:
            cos, sin = self.angles(positions)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
