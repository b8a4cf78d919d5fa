"""Greedy decoding with a preallocated KV cache.

Each layer caches its (rotated) keys, its values and, appended to them, whatever the encoding aggregates
with the values (TAPE's per-token state at that layer's input), plus the key positions for position-dependent
biases. A bias computed from q and k (CoPE, DAPE) is computed anew for the new queries against every cached
key. ``KVCache.memory`` is the encoding's own dict between calls (Abacus: each row's digit run at the last
token, so a digit continues the count of the number it extends). Because every positional state is causal, a cached token's entries never change, so a new token costs
one token of work. The buffers are allocated once for the whole generation (prompt + new tokens) and written
in place; a cache used past its capacity doubles it (amortised, never per token).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

#: decoding checks whether every row has emitted EOS once per this many tokens (each check waits for the GPU)
EOS_CHECK_EVERY = 8


def shared_rows(positions: Tensor) -> bool:
    """Every row of ``positions [B, N]`` is the same row (one row, or rows expanded from one)."""
    return positions.shape[0] == 1 or positions.stride(0) == 0


@dataclass
class LayerCache:
    capacity: int = 0
    length: int = 0
    keys: Tensor | None = None          # [B, H, capacity, D]
    values: Tensor | None = None        # [B, H, capacity, Dv]
    positions: Tensor | None = None     # [B or 1, capacity]

    def append(self, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Write ``k``, ``v`` ``[B, H, n, *]`` and their positions ``[B, n]``; return views of everything cached."""
        n = k.shape[2]
        end = self.length + n
        if shared_rows(positions):                   # every row at the same positions: keep one row
            positions = positions[:1]
        if self.keys is None or end > self.keys.shape[2]:
            self._grow(k, v, positions, max(end, self.capacity, 2 * (self.keys.shape[2] if self.keys is not None
                                                                     else 0)))
        if positions.shape[0] > self.positions.shape[0]:   # per-row positions after shared ones: one row each
            self.positions = self.positions.expand(positions.shape[0], -1).clone()
        self.keys[:, :, self.length:end] = k
        self.values[:, :, self.length:end] = v
        self.positions[:, self.length:end] = positions
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end], self.positions[:, :end]

    def _grow(self, k: Tensor, v: Tensor, positions: Tensor, capacity: int) -> None:
        b, h, _, d = k.shape
        keys = k.new_empty(b, h, capacity, d)
        values = v.new_empty(b, h, capacity, v.shape[-1])
        rows = max(positions.shape[0], self.positions.shape[0] if self.positions is not None else 1)
        pos = positions.new_empty(rows, capacity)
        if self.keys is not None:
            keys[:, :, :self.length] = self.keys[:, :, :self.length]
            values[:, :, :self.length] = self.values[:, :, :self.length]
            pos[:, :self.length] = self.positions[:, :self.length].expand(pos.shape[0], -1)
        self.keys, self.values, self.positions = keys, values, pos


@dataclass
class KVCache:
    n_layers: int
    capacity: int = 0
    length: int = 0
    layers: list[LayerCache] = field(default_factory=list)
    memory: dict[str, Tensor] = field(default_factory=dict)     # the encoding's, between calls

    def __post_init__(self):
        self.layers = [LayerCache(self.capacity) for _ in range(self.n_layers)]


def greedy_generate(model, prompt: Tensor, max_new_tokens: int, eos_id: int | None = None,
                    use_cache: bool = True) -> Tensor:
    was_training = model.training
    model.eval()
    try:
        b = prompt.shape[0]
        new = prompt.new_full((b, max_new_tokens), eos_id if eos_id is not None else 0)
        cache = model.new_cache(prompt.shape[1] + max_new_tokens) if use_cache else None
        tokens, step_input = prompt, prompt
        done = torch.zeros(b, dtype=torch.bool, device=prompt.device)
        for step in range(max_new_tokens):
            logits = model(step_input, cache=cache) if use_cache else model(tokens)
            nxt = logits[:, -1].argmax(-1)
            if eos_id is not None:
                nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
                done |= nxt == eos_id
            new[:, step] = nxt
            step_input = nxt[:, None]
            if not use_cache:
                tokens = torch.cat((tokens, step_input), dim=1)
            if eos_id is not None and (step + 1) % EOS_CHECK_EVERY == 0 and bool(done.all()):
                break                                # the rest of `new` already holds eos_id
        return new
    finally:
        model.train(was_training)
