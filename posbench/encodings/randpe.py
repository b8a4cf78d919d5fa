"""Randomised RoPE (Ruoss et al., ACL 2023): RoPE at an ordered random subset of a range longer than any sequence
the model is tested on, in training and at evaluation alike.

A forward pass draws one sorted subset ``D = sort(randperm(span)[:n])`` of ``[0, span)`` (shared by the rows of the
batch) and rotates the token at position p by RoPE at position ``D[p]``: for ordinary positions 0..N-1 the
positions are ``D`` itself. The span covers the longest evaluation, so that every position a test sequence reads
was seen in training (Ruoss et al.'s ``noise_max_length``, larger than the longest test; their only configuration
uses 2,048 for training at 40 tokens). If N exceeds the span the positions are 0..N-1, as the TAPE reference does.

The span is ``max(range_factor, eval_length_factor) x max_seq_len``: ``range_factor`` (default 2, the TAPE
reference's 2 x its training length) and ``eval_length_factor``, which the task gives (its longest evaluation as a
multiple of the training length: 8 for perplexity's default 1-8x, 4 for passkey's 1-4x; 0 where a task does not
say, and then the range factor alone).

At evaluation the positions are random too (``eval_random``, default true), as in both releases (Ruoss et al.'s
``range_evaluation.py`` applies the same noisy model; the TAPE reference's ``randrope.py`` has no training check).
They come from a generator of this module seeded with ``eval_seed`` (recorded with the options) and reset whenever
the model is put in eval mode, so an evaluation is repeatable and does not depend on how long the model trained.
Padded rows map each row's own positions through the same draw, so a padded row sees what it sees alone.

With a KV cache (generation) the first call draws ``D`` for its tokens and ``DECODE_RESERVE`` more (as many as the
span holds), keeps it in the cache's memory, and later tokens read their positions from it: the prompt and up to 64
generated tokens are one sorted draw, as one sequence of that length would be (passkey decodes at most 6). A token
past the reserve takes the position after the last one.

Options that differ from a release, each documented:
- ``per_layer`` (default False): both releases draw anew in every attention layer (each layer owns its sampler);
  Ruoss et al.'s paper describes one subset per sequence, which we follow by default so that every layer sees
  the same token order; set True for the releases' behaviour (training only: evaluation draws once).
- ``eval_random=false`` evaluates at 0..N-1 (posbench's behaviour before version 2 of its CPU study).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posbench.encodings.base import rope_cos_sin
from posbench.encodings.rope import RoPE, apply_rotary
from posbench.options import Option, at_least, positive

#: generated tokens a cached evaluation's draw reserves positions for, beyond its first call's tokens
DECODE_RESERVE = 64
DRAW = "randpe.draw"            # the key of a cached evaluation's draw in the KV cache's memory


class RandPE(RoPE):
    name = "randpe"
    description = "RoPE at sorted random positions from a range that covers the longest evaluation"
    OPTIONS = {
        "theta": Option(10000.0, "the rotary base", positive()),
        "range_factor": Option(2, "positions are drawn from at least range_factor x max_seq_len", at_least(1)),
        "eval_length_factor": Option(0.0, "the task's longest evaluation / max_seq_len (the span covers it; 0: "
                                          "none given)", at_least(0), from_task=True, task_optional=True),
        "per_layer": Option(False, "new positions in every layer while training (the releases; default: one draw "
                                   "per pass, as the paper describes)"),
        "eval_random": Option(True, "random positions at evaluation too (Ruoss et al.; false: 0..N-1)"),
        "eval_seed": Option(0, "seed of the evaluation's draws (reset each time the model enters eval mode)",
                            at_least(0)),
    }

    deterministic_options = {"eval_random": False}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        factor = max(float(self.options["range_factor"]), float(self.options["eval_length_factor"]))
        self.span = int(round(factor * self.max_seq_len))
        self.eval_generator = torch.Generator().manual_seed(self.options["eval_seed"])

    def train(self, mode: bool = True):
        if not mode:            # every evaluation starts from the same draws
            self.eval_generator.manual_seed(self.options["eval_seed"])
        return super().train(mode)

    def random(self) -> bool:
        return self.training or self.options["eval_random"]

    def draw(self, count: int, device: torch.device) -> Tensor:
        """A sorted random subset of ``[0, span)`` of ``count`` positions (training: torch's generator on the
        device; evaluation: this module's seeded generator)."""
        if self.training:
            return torch.randperm(self.span, device=device)[:count].sort().values
        return torch.randperm(self.span, generator=self.eval_generator)[:count].sort().values.to(device)

    def sample_positions(self, positions: Tensor, memory: dict | None = None) -> Tensor:
        """The positions RoPE rotates by: each position p read from a sorted random draw ``D[p]`` (positions
        unchanged when not random, or when a sequence is longer than the span)."""
        if not self.random():
            return positions
        if memory is None or self.training:           # one pass: a draw of as many positions as tokens
            n = positions.shape[-1]
            if n > self.span:
                return positions
            index = positions - positions.amin(dim=-1, keepdim=True)     # each row from 0 (a pad reads 0)
            return self.draw(n, positions.device)[index.clamp(max=n - 1)]
        draw = memory.get(DRAW)
        if draw is None:
            n = positions.shape[-1]
            if n > self.span:
                return positions
            draw = memory[DRAW] = self.draw(min(n + DECODE_RESERVE, self.span), positions.device)
        index = positions.clamp(min=0)
        beyond = (index - (draw.shape[0] - 1)).clamp(min=0)          # past the reserve: one after another
        return draw[index.clamp(max=draw.shape[0] - 1)] + beyond

    def angles(self, positions: Tensor, memory: dict | None = None) -> tuple[Tensor, Tensor]:
        return rope_cos_sin(self.sample_positions(positions, memory), self.head_dim, self.options["theta"])

    def init_state(self, positions: Tensor, tokens: Tensor, memory):
        return positions, self.angles(positions, memory)

    def rotate(self, layer: int, q: Tensor, k: Tensor, state) -> tuple[Tensor, Tensor]:
        positions, (cos, sin) = state
        if self.options["per_layer"] and layer > 0 and self.training:
            cos, sin = self.angles(positions)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
