"""Randomised RoPE (Ruoss et al., ACL 2023): RoPE at an ordered random subset of a range longer than any sequence
the model is tested on, in training and at evaluation alike.

A sequence's positions come from one sorted subset ``D = sort(randperm(span)[:n])`` of ``[0, span)``: the token at
position p is rotated by RoPE at position ``D[p]`` (for ordinary positions 0..N-1 the positions are ``D`` itself).
While training one draw serves the whole batch; at evaluation each sequence has its own (below). The span covers the longest evaluation, so that every position a test sequence reads
was seen in training (Ruoss et al.'s ``noise_max_length``, larger than the longest test; their only configuration
uses 2,048 for training at 40 tokens). If N exceeds the span the positions are 0..N-1, as the TAPE reference does.

The span is ``max(range_factor, eval_length_factor) x max_seq_len``, at least the longest evaluation:
``range_factor`` (default 2, the TAPE reference's 2 x its training length) and ``eval_length_factor``, which the task gives (its longest evaluation as a
multiple of the training length: 8 for perplexity's default 1-8x, 4 for passkey's 1-4x; 0 where a task does not
say, and then the range factor alone).

At evaluation the positions are random too (``eval_random``, default true), as in both releases (Ruoss et al.'s
``range_evaluation.py`` applies the same noisy model; the TAPE reference's ``randrope.py`` has no training check).
Each sequence gets its own draw, keyed on ``eval_seed`` (recorded with the options) and its tokens, causally: the
draw is made one position after another, position p from a number keyed on the seed and the tokens up to p (a
running hash), given the positions before it, by the law of the next element of a uniform sorted draw (so the
whole is still one uniform sorted draw of N). A token's position therefore depends on no later token, and neither
does any logit up to it: a perplexity is a product of p(x_i | x_<i) (the draw depends on the sequence's length N,
which every window of one evaluation length shares). An evaluation is repeatable, two windows of text get
independent draws (from their first differing token on), and a number never depends on how the windows are batched
or split between processes. A row of a padded batch draws as many positions as it has real tokens, as it would
alone. At the longest evaluation the draw takes every position of the span (the span is that length), in order:
what the model read in training, 0..N-1 itself.

With a KV cache (generation) the first call draws the positions of the whole sequence the cache was made for (the
prompt and the new tokens: ``posbench.model.generate.PLANNED``, which greedy decoding sets; else the prompt and
``DECODE_RESERVE`` more, as many as the span holds), the prompt's positions keyed as above and the rest on the prompt
alone, and keeps the draw in the cache's memory; later tokens read their positions from it. So a prompt and its
answer are one sorted draw of the sequence's length, as in training. A token past the draw takes the position after
the last one.

Options that differ from a release, each documented:
- ``per_layer`` (default False): both releases draw anew in every attention layer (each layer owns its sampler);
  Ruoss et al.'s paper describes one subset per sequence, which we follow by default so that every layer sees
  the same token order; set True for the releases' behaviour (training only: evaluation draws once).
- ``eval_random=false`` evaluates at 0..N-1 (what posbench did before issue 34; its CPU study version 1).
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

from posbench.encodings.base import rope_cos_sin
from posbench.model.generate import PLANNED
from posbench.model.padding import PAD_TOKEN
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
        "eval_seed": Option(0, "seed of the evaluation's draws (a token's position: this seed and the tokens up "
                               "to it)", at_least(0)),
    }

    deterministic_options = {"eval_random": False}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        factor = max(float(self.options["range_factor"]), float(self.options["eval_length_factor"]))
        self.span = int(round(factor * self.max_seq_len))

    def random(self) -> bool:
        return self.training or self.options["eval_random"]

    def training_draw(self, count: int, device: torch.device) -> Tensor:
        """A sorted random subset of ``[0, span)`` of ``count`` positions, from torch's generator on the device."""
        return torch.randperm(self.span, device=device)[:count].sort().values

    def evaluation_draw(self, tokens: Tensor, count: int) -> Tensor:
        """A sorted random subset of ``[0, span)`` of ``count`` positions for the sequence ``tokens`` (one row, its
        real tokens), drawn one position after another: position p from a uniform number keyed on ``eval_seed``
        and ``tokens[:p + 1]`` (a position past the tokens: on all of them and p), given the positions before it,
        by the law of the next element of a uniform sorted draw of ``count`` (so the whole is one such draw). A
        token's position, and with it every logit up to it, depends on no later token (on the host: a loop over
        the span)."""
        ids = tokens.detach().to("cpu", torch.int64).tolist()
        hasher = hashlib.blake2b(digest_size=8, key=str(self.options["eval_seed"]).encode())
        draw, last = [], -1
        for p in range(count):
            if p < len(ids):
                hasher.update(ids[p].to_bytes(8, "little", signed=True))
                digest = hasher.digest()
            else:                                      # reserved for generated tokens: keyed on the prompt
                beyond = hasher.copy()
                beyond.update(b"past" + p.to_bytes(8, "little"))
                digest = beyond.digest()
            u = (int.from_bytes(digest, "little") >> 11) / 2.0 ** 53
            slots, needed = self.span - last - 1, count - p
            # the gap g to the next position: P(g) = C(slots - g - 1, needed - 1) / C(slots, needed)
            gap, prob = 0, needed / slots
            cumulative = prob
            while u >= cumulative and gap < slots - needed:
                prob *= (slots - gap - needed) / (slots - gap - 1)
                gap += 1
                cumulative += prob
            last += gap + 1
            draw.append(last)
        return torch.tensor(draw, dtype=torch.long, device=tokens.device)

    def sample_positions(self, positions: Tensor, tokens: Tensor | None = None, memory: dict | None = None) -> Tensor:
        """The positions RoPE rotates by: each row's position p read from a sorted random draw, ``D[p]`` (positions
        unchanged when not random, or when a sequence is longer than the span)."""
        if not self.random():
            return positions
        if self.training:                              # one draw for the batch, as many positions as tokens
            n = positions.shape[-1]
            if n > self.span:
                return positions
            index = positions - positions.amin(dim=-1, keepdim=True)     # each row from 0 (a pad reads 0)
            return self.training_draw(n, positions.device)[index.clamp(max=n - 1)]
        if tokens is None:                             # no sequence to key the draw on: the reference's draw
            tokens = positions
        if memory is not None and DRAW in memory:      # a cached sequence's later tokens
            draw = memory[DRAW]
        else:
            real = (tokens != PAD_TOKEN).sum(dim=-1)
            planned = memory.get(PLANNED) if memory is not None else None
            rows = []
            for row in range(tokens.shape[0]):
                count = int(real[row]) if planned is None else int(planned) - (tokens.shape[-1] - int(real[row]))
                if memory is not None and planned is None:
                    count = min(count + DECODE_RESERVE, self.span)
                if count > self.span:
                    return positions
                rows.append(self.evaluation_draw(tokens[row][tokens[row] != PAD_TOKEN], max(count, 1)))
            width = max(len(r) for r in rows)
            draw = torch.stack([torch.cat((r, r[-1:] + torch.arange(1, width - len(r) + 1, device=r.device)))
                                for r in rows])                 # rows padded past their own draw (never read)
            if memory is not None:
                memory[DRAW] = draw
        index = positions.expand(draw.shape[0], -1).clamp(min=0)
        last = draw.shape[-1] - 1
        beyond = (index - last).clamp(min=0)                     # past the draw: one after another
        return draw.gather(-1, index.clamp(max=last)) + beyond

    def angles(self, positions: Tensor, tokens: Tensor | None = None, memory: dict | None = None
               ) -> tuple[Tensor, Tensor]:
        return rope_cos_sin(self.sample_positions(positions, tokens, memory), self.head_dim, self.options["theta"])

    def init_state(self, positions: Tensor, tokens: Tensor, memory):
        return positions, self.angles(positions, tokens, memory)

    def rotate(self, layer: int, q: Tensor, k: Tensor, state) -> tuple[Tensor, Tensor]:
        positions, (cos, sin) = state
        if self.options["per_layer"] and layer > 0 and self.training:
            cos, sin = self.angles(positions)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
