"""Greedy decoding with a KV cache.

Each layer caches its (rotated) keys, its values and, appended to them, whatever the encoding aggregates
with the values (TAPE's per-token (C, S) state at that layer's input), plus the key positions for
position-dependent biases. Because every positional state is causal, a cached token's entries never change,
so a new token costs one token of work.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class LayerCache:
    keys: Tensor | None = None
    values: Tensor | None = None
    positions: Tensor | None = None

    def append(self, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if self.keys is None:
            self.keys, self.values, self.positions = k, v, positions
        else:
            self.keys = torch.cat((self.keys, k), dim=2)
            self.values = torch.cat((self.values, v), dim=2)
            self.positions = torch.cat((self.positions, positions), dim=1)
        return self.keys, self.values, self.positions


@dataclass
class KVCache:
    n_layers: int
    length: int = 0
    layers: list[LayerCache] = field(default_factory=list)

    def __post_init__(self):
        self.layers = [LayerCache() for _ in range(self.n_layers)]


def greedy_generate(model, prompt: Tensor, max_new_tokens: int, eos_id: int | None = None,
                    use_cache: bool = True) -> Tensor:
    was_training = model.training
    model.eval()
    try:
        tokens, out = prompt, []
        cache = model.new_cache() if use_cache else None
        step_input = prompt
        done = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
        for _ in range(max_new_tokens):
            logits = model(step_input, cache=cache) if use_cache else model(tokens)
            nxt = logits[:, -1].argmax(-1)
            if eos_id is not None:
                nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
                done |= nxt == eos_id
            out.append(nxt)
            tokens = torch.cat((tokens, nxt[:, None]), dim=1)
            step_input = nxt[:, None]
            if eos_id is not None and bool(done.all()):
                break
        new = torch.stack(out, dim=1) if out else prompt.new_zeros(prompt.shape[0], 0)
        if eos_id is not None and new.shape[1] < max_new_tokens:
            pad = new.new_full((new.shape[0], max_new_tokens - new.shape[1]), eos_id)
            new = torch.cat((new, pad), dim=1)
        return new
    finally:
        model.train(was_training)
