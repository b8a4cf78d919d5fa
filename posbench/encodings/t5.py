"""T5 relative bias (Raffel et al. 2020), causal: a learned scalar per head and distance bucket.

d = max(i - j, 0). Buckets 0..B/2-1 are exact distances; the other B/2 are log-spaced up to
``max_distance`` and clamp to B - 1 beyond it. B = 64 and max_distance = 128 as in the reference's
config (T5 itself used 32 buckets); one table per layer, initialised N(0, 0.02).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posbench.encodings.base import PositionalEncoding


def causal_bucket(distance: Tensor, num_buckets: int, max_distance: int) -> Tensor:
    """Bucket of a non-negative distance (negative distances, i.e. future keys, go to bucket 0)."""
    distance = distance.clamp(min=0)
    exact = num_buckets // 2
    log_ratio = torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
    large = exact + (log_ratio * (num_buckets - exact)).to(torch.long)
    large = large.clamp(max=num_buckets - 1)
    return torch.where(distance < exact, distance, large)


class T5Bias(PositionalEncoding):
    name = "t5"
    description = "T5 learned relative bias, causal, 64 log buckets up to distance 128"
    relative = True
    has_bias = True
    defaults = {"num_buckets": 64, "max_distance": 128}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tables = nn.ModuleList(
            nn.Embedding(self.options["num_buckets"], self.n_heads) for _ in range(self.n_layers))

    def bias(self, layer: int, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        buckets = causal_bucket(q_pos[:, :, None] - k_pos[:, None, :],
                                self.options["num_buckets"], self.options["max_distance"])
        return self.tables[layer](buckets).permute(0, 3, 1, 2)  # [B, H, Nq, Nk]
