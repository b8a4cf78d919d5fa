"""T5 relative bias (Raffel et al. 2020), causal: a learned scalar per head and distance bucket.

d = max(i - j, 0). Buckets 0..B/2-1 are exact distances; the other B/2 are log-spaced up to
``max_distance`` and clamp to B - 1 beyond it. B = 64 and max_distance = 128 as in the reference's
config (T5 itself used 32 buckets); one table per layer.

Initialisation and scale, option ``table_init``, each as a release has it:

- ``t5`` (the default: T5's own release, as the Hugging Face port ``T5PreTrainedModel._init_weights`` draws
  ``relative_attention_bias``): N(0, d_model^-1/2), no scale. A fresh model's bias is near zero (0.09 logits at
  d_model 128), so no distance starts with a random preference and a bucket training never reaches stays near
  zero; Adam moves an entry by about the learning rate per step, so the bias grows by about the summed learning
  rate over a run (0.33 at the perplexity ``small`` preset, 1.0 at ``study``).
- ``x-transformers`` (lucidrains/x-transformers, ``RelativePositionBias``): the table keeps ``nn.Embedding``'s
  own N(0, 1) init and the bias is the table entry times ``scale`` = sqrt(head dim), added to logits already
  scaled by 1 / sqrt(head dim). So a fresh model's bias has a standard deviation of sqrt(D) logits (5.7 at
  D = 32), and Adam moves the bias sqrt(D) times as far per step as under ``t5``: the bias can grow large within
  a short budget, but the init's draw must be unlearned first: at the perplexity ``small`` preset (300 steps)
  the trained tables are still their draw and the draw ranks the run. A bucket that training never reaches
  keeps its draw: in arithmetic, trained on distances up to 17, distances 18-33 read exact buckets that hold
  about +-sqrt(D) logits of noise at evaluation.

docs/studies/protocols.md ("T5's two inits by budget") measures both, and T5's init read through x-transformers'
scale (``table_init=t5`` with ``scale`` = sqrt(D), which no release pairs), at 300 and 900 steps.

(The TAPE reference draws the table from its model-wide N(0, 0.02) and has no scale; posbench did too before,
which left the bias near 0.1 logits for a whole 300-step run.) ``scale`` is kept in the state dict: a checkpoint
saved before it existed loads with scale 1, the bias it was trained with.

Every distance from ``max_distance`` on falls in the last bucket, so the bias is a lookup in a small
per-distance table: row d (d < max_distance) is the table row of bucket(d), row ``max_distance`` the last
bucket's. That table is gathered from the bucket table by autograd (gradients flow back to the buckets), and
the attention kernel reads it with one index per score: no sequence x sequence tensor of buckets.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posbench.model.bias import ScoreBias, read_table
from posbench.encodings.base import PositionalEncoding
from posbench.options import Added, Bound, OneOf, Option, OptionError, at_least


def causal_bucket(distance: Tensor, num_buckets: int, max_distance: int) -> Tensor:
    """Bucket of a non-negative distance (negative distances, i.e. future keys, go to bucket 0)."""
    distance = distance.clamp(min=0)
    exact = num_buckets // 2
    log_ratio = torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
    large = exact + (log_ratio * (num_buckets - exact)).to(torch.long)
    large = large.clamp(max=num_buckets - 1)
    return torch.where(distance < exact, distance, large)


def t5_bias(head: Tensor, q_pos: Tensor, k_pos: Tensor, by_distance: Tensor) -> Tensor:
    """``by_distance`` ``[max_distance + 1, H]``: the bias of distances 0..max_distance (and beyond)."""
    last = by_distance.shape[0] - 1
    return read_table(by_distance, torch.clamp(q_pos - k_pos, 0, last), head)


class T5Bias(PositionalEncoding):
    name = "t5"
    description = "T5 learned relative bias, causal, 64 log buckets up to distance 128"
    OPTIONS = {
        "num_buckets": Option(64, "distance buckets: the first half exact, the rest log-spaced", at_least(2)),
        "max_distance": Option(128, "where the log-spaced buckets end (> num_buckets / 2)", at_least(2)),
        "table_init": Option("t5", "the table's init and scale as a release has it: t5 (T5's own: "
                             "N(0, d_model^-1/2), times 1) or x-transformers (N(0, 1), times sqrt(head dim))",
                             OneOf(("t5", "x-transformers")), added=Added(2, "x-transformers")),
        "scale": Option(0.0, "the bias is the table entry times this (0: as table_init says)", Bound(low=0)),
    }

    @classmethod
    def check_options(cls, options):
        buckets, max_distance = options["num_buckets"], options["max_distance"]
        if max_distance <= buckets // 2:
            raise OptionError(f"encoding 't5' option max_distance={max_distance} is out of range: it must "
                              f"be > num_buckets / 2 ({buckets // 2}), where the log buckets start")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        buckets, max_distance = self.options["num_buckets"], self.options["max_distance"]
        self.tables = nn.ModuleList(nn.Embedding(buckets, self.n_heads) for _ in range(self.n_layers))
        self.register_buffer("distance_buckets", causal_bucket(torch.arange(max_distance + 1), buckets,
                                                               max_distance), persistent=False)
        released = math.sqrt(self.head_dim) if self.options["table_init"] == "x-transformers" else 1.0
        self.options["scale"] = float(self.options["scale"] or released)    # recorded as used
        self.register_buffer("scale", torch.tensor(self.options["scale"]))    # saved: see _load_from_state_dict

    def init_weights(self) -> None:
        if self.options["table_init"] == "t5":
            for table in self.tables:
                nn.init.normal_(table.weight, 0.0, self.d_model ** -0.5)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """A checkpoint from before ``scale`` existed was trained without one: it loads with scale 1. A checkpoint
        keeps the scale it was trained with (an x-transformers table loaded into a model configured with T5's
        own, by ``--init``), and the options record the scale that is read."""
        if prefix + "scale" not in state_dict:
            state_dict = {**state_dict, prefix + "scale": torch.tensor(1.0)}
        self.options["scale"] = float(state_dict[prefix + "scale"])
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def bias(self, layer: int, state, q, k, q_pos, k_pos) -> ScoreBias:
        table = self.tables[layer](self.distance_buckets) * self.scale
        return ScoreBias(t5_bias, (table,), relative=True)
