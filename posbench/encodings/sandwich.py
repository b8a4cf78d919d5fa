"""Sandwich (Chi, Fan, Rudnicky and Ramadge, ACL 2023, "Dissecting Transformer Length Extrapolation via the Lens
of Receptive Field Analysis", arXiv 2212.10356): a parameter-free relative logit bias from sinusoidal embeddings.

The paper expands the logit of two tokens with sinusoidal position embeddings p_m added to them, keeps only the
position-position term and uses it as a temporal bias: the inner product of two sinusoidal embeddings of
dimension d_bar (a sin and a cos per frequency) depends on the distance only,

    p_m . p_n = sum_{i=1}^{d_bar/2} cos((m - n) w_i),    w_i = base ** (-2 i / d_bar),  base = 10000,

and it is compressed per head with ALiBi's ratios, r_h = 8 h / H for h = 1..H (the paper's Sandwich section,
the inner-product equation and the compression that follows it):

    b_h(m, n) = (p_m . p_n - d_bar / 2) / r_h.

The authors released no code that we could find. Where the paper's text leaves a choice open, we take NVIDIA
NeMo's implementation (``nemo/collections/nlp/modules/common/megatron/position_embedding/
sandwich_relative_position_embedding.py``, the one public implementation we could read), and say so here:

- frequencies i = 1..d_bar/2 (the sum as written, not the 0-based i = 0..d_bar/2 - 1 of the original sinusoid);
- d_bar = the attention head size (NeMo passes ``kv_channels``, the per-head width): option ``d_bar=0``, the
  default, means that; any even d_bar can be set;
- d_bar / 2 (p_m . p_m, the bias at distance 0) is subtracted, so the bias is 0 on the diagonal and < 0 beyond,
  ALiBi's shape. A constant per head changes no attention weight (softmax ignores a constant added to a whole
  row), so this is a numerical choice, not a different model: in bfloat16 the bias near the diagonal, where
  attention concentrates, is small instead of about d_bar / 2 * H / 8;
- one bias for every layer, added to the scaled logits (after 1 / sqrt(D)); future keys are masked.

How it is evaluated. The bias depends on d = m - n only, so it is a lookup in a table of the distances
0..max_distance, computed once in float64 (``distance_table``), times the per-head factor 1 / r_h: two reads per
score, not a sum of d_bar / 2 cosines per score. Future keys (d < 0) read distance 0 (they are masked). A distance
beyond ``max_distance`` (2^20 by default) reads NaN, so a run past the table fails loudly (non-finite logits or
loss) instead of silently using a wrong bias. No parameters: nothing here is learned or saved.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from posbench.model.bias import ScoreBias
from posbench.encodings.base import PositionalEncoding
from posbench.options import Bound, Option, OptionError, at_least

#: distances per block of the table's construction (``distance_table``)
TABLE_BLOCK = 1024


def sandwich_bias(head: Tensor, q_pos: Tensor, k_pos: Tensor, table: Tensor, inverse_ratio: Tensor) -> Tensor:
    """The element-wise Sandwich bias: ``table`` [max_distance + 2] (p.p - d_bar / 2 at each distance, NaN last),
    ``inverse_ratio`` [H] (1 / r_h). Neither carries gradients."""
    last = table.shape[0] - 1
    return table[torch.clamp(q_pos - k_pos, 0, last)] * inverse_ratio[head]


def frequencies(d_bar: int, base: float) -> Tensor:
    """w_i = base^(-2 i / d_bar), i = 1..d_bar/2, float64."""
    return base ** (-2.0 * torch.arange(1, d_bar // 2 + 1, dtype=torch.float64) / d_bar)


@functools.lru_cache(maxsize=4)
def distance_table(d_bar: int, base: float, max_distance: int) -> Tensor:
    """float64 [max_distance + 2]: sum_i cos(d w_i) - d_bar / 2 for d = 0..max_distance, then NaN.

    Built in blocks of ``TABLE_BLOCK`` distances as one matrix product, from cos((a + r) w) = cos(a w) cos(r w) -
    sin(a w) sin(r w) with a the block's first distance and r the offset within it: float64 angles throughout
    (a float32 angle d w at d = 10^6 would be off by about 0.06 rad)."""
    w = frequencies(d_bar, base)
    blocks = -(-(max_distance + 1) // TABLE_BLOCK)
    starts = torch.arange(blocks, dtype=torch.float64)[:, None] * TABLE_BLOCK * w        # [blocks, d_bar / 2]
    offsets = torch.arange(TABLE_BLOCK, dtype=torch.float64)[:, None] * w               # [block, d_bar / 2]
    left = torch.cat((starts.cos(), -starts.sin()), dim=-1)
    right = torch.cat((offsets.cos(), offsets.sin()), dim=-1)
    table = (left @ right.T).flatten()[: max_distance + 1] - d_bar / 2
    return torch.cat((table, torch.tensor([math.nan], dtype=torch.float64)))


def inverse_ratios(n_heads: int) -> Tensor:
    """1 / r_h = H / (8 h), h = 1..H, float64."""
    return n_heads / (8.0 * torch.arange(1, n_heads + 1, dtype=torch.float64))


class Sandwich(PositionalEncoding):
    name = "sandwich"
    description = "parameter-free bias: inner product of sinusoidal embeddings, compressed per head (8h/H)"
    OPTIONS = {
        "d_bar": Option(0, "width of the sinusoidal embeddings, even (0: the head size)", at_least(0)),
        "base": Option(10000.0, "the sinusoids' base", Bound(low=1, low_strict=True)),
        "max_distance": Option(2 ** 20, "the longest distance in the bias table (past it the bias is NaN)",
                               at_least(1)),
    }

    @classmethod
    def check_options(cls, options):
        if options["d_bar"] % 2:
            raise OptionError(f"encoding 'sandwich' option d_bar={options['d_bar']} is out of range: it must "
                              f"be even (a sin and a cos per frequency), or 0 for the head size")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        o = self.options
        self.d_bar = o["d_bar"] or self.head_dim
        if self.d_bar % 2:
            raise OptionError(f"encoding 'sandwich' option d_bar=0 means the head size, {self.head_dim}, "
                              f"which is odd: set an even d_bar")
        table = distance_table(self.d_bar, o["base"], o["max_distance"])
        self.register_buffer("table", table.to(torch.float32), persistent=False)
        self.register_buffer("inverse_ratio", inverse_ratios(self.n_heads).to(torch.float32), persistent=False)

    def bias(self, layer: int, state, q, k, q_pos, k_pos) -> ScoreBias:
        return ScoreBias(sandwich_bias, (self.table, self.inverse_ratio), relative=True)
