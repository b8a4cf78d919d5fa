"""Sandwich (Chi, Fan, Rudnicky and Ramadge, ACL 2023, "Dissecting Transformer Length Extrapolation via the Lens
of Receptive Field Analysis"): a parameter-free relative logit bias from sinusoidal position embeddings.

Of the expanded product of two sinusoidally embedded tokens, Sandwich keeps only the position-position term,
the inner product of the sinusoidal embeddings p_m = [sin(m w_0..), cos(m w_0..)] of dimension d_bar:

    p_i . p_j = sum_{k=0}^{d_bar/2 - 1} cos((i - j) w_k),    w_k = base ** (-2k / d_bar)

and compresses it per head with ALiBi's head-dependent ratios, ratio_h = 8h / H for h = 1..H:

    b_h(i, j) = (p_i . p_j - d_bar / 2) / ratio_h.

Choices the paper's equations leave open, as its own reference construction takes them (the appendix code that
builds the bias as ``pos_embs @ pos_embs.T / compression_ratio``, reproduced by attention-gym's
``mods/sandwich.py`` and its test; the authors released no repository): frequencies k = 0..d_bar/2 - 1 (the
standard sinusoid, w_0 = 1), base 10000, d_bar = 128 (independent of the head size), compression ratio
``arange(1, H + 1) * 8 / H``, the bias added to the scaled logits and the same bias in every layer.

One deliberate difference, which changes no attention weight: we subtract d_bar / 2, a constant per head, so the
bias is 0 at distance 0 and <= 0 beyond (ALiBi's shape; NeMo's Sandwich does the same). Softmax ignores a
constant added to every logit of a row, so outputs and gradients are those of the reference construction in
exact arithmetic; in low precision the bias near the diagonal, where attention concentrates, is small instead of
~d_bar / 2 * H / 8 (in bfloat16 the reference's 96 at distance 0 would be rounded to a multiple of 0.5).

How it is evaluated. The bias depends on d = i - j only, so it is a lookup in a table of distances 0..max_distance
computed once in float64 (as an inner product of sinusoid blocks, cos((Ba + r) w) = cos(Baw)cos(rw) -
sin(Baw)sin(rw)), times the per-head factor 1 / ratio_h: two reads per score, no sum of d_bar / 2 cosines per score
(and float64 angles: a float32 angle d * w_0 at d = 10^6 would be off by 0.06 rad). Future keys (d < 0) read
distance 0; they are masked. A distance beyond ``max_distance`` (2^20 by default) reads NaN, so a run past the
table fails loudly (a non-finite loss or logits) instead of silently using a wrong bias.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from posbench.bias import ScoreBias
from posbench.encodings.base import PositionalEncoding
from posbench.encodings.options import Bound, EncodingOptionError, at_least

#: rows of the sinusoid blocks the distance table is assembled from
TABLE_BLOCK = 1024


def sandwich_bias(head: Tensor, q_pos: Tensor, k_pos: Tensor, table: Tensor, inverse_ratio: Tensor) -> Tensor:
    """``table`` [max_distance + 2]: p.p - d_bar / 2 at each distance, NaN last; ``inverse_ratio`` [H]."""
    last = table.shape[0] - 1
    return table[torch.clamp(q_pos - k_pos, 0, last)] * inverse_ratio[head]


@functools.lru_cache(maxsize=4)
def distance_table(d_bar: int, base: float, max_distance: int) -> Tensor:
    """float64 [max_distance + 2]: sum_k cos(d w_k) - d_bar / 2 for d = 0..max_distance, then NaN."""
    freqs = base ** (-torch.arange(0, d_bar, 2, dtype=torch.float64) / d_bar)            # [d_bar / 2]
    blocks = -(-(max_distance + 1) // TABLE_BLOCK)
    offsets = torch.arange(blocks, dtype=torch.float64)[:, None] * TABLE_BLOCK * freqs    # [blocks, d_bar / 2]
    within = torch.arange(TABLE_BLOCK, dtype=torch.float64)[:, None] * freqs               # [B, d_bar / 2]
    left = torch.cat((offsets.cos(), -offsets.sin()), dim=-1)
    right = torch.cat((within.cos(), within.sin()), dim=-1)
    table = (left @ right.T).flatten()[: max_distance + 1] - d_bar / 2
    return torch.cat((table, torch.tensor([math.nan], dtype=torch.float64)))


def inverse_ratios(n_heads: int) -> Tensor:
    """1 / ratio_h = H / (8 h), h = 1..H."""
    return n_heads / (8.0 * torch.arange(1, n_heads + 1, dtype=torch.float64))


class Sandwich(PositionalEncoding):
    name = "sandwich"
    description = "parameter-free bias: inner product of sinusoidal embeddings, compressed per head (8h/H)"
    relative = True
    defaults = {"d_bar": 128, "base": 10000.0, "max_distance": 2 ** 20}
    limits = {"d_bar": at_least(2), "base": Bound(low=1, low_strict=True), "max_distance": at_least(1)}

    @classmethod
    def check_options(cls, options):
        if options["d_bar"] % 2:
            raise EncodingOptionError(f"encoding 'sandwich' option d_bar={options['d_bar']} is out of range: it must "
                                      f"be even (sin and cos pairs)")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        o = self.options
        table = distance_table(o["d_bar"], o["base"], o["max_distance"])
        self.register_buffer("table", table.to(torch.float32), persistent=False)
        self.register_buffer("inverse_ratio", inverse_ratios(self.n_heads).to(torch.float32), persistent=False)

    def score_bias(self, layer: int) -> ScoreBias:
        return ScoreBias(sandwich_bias, (self.table, self.inverse_ratio))
