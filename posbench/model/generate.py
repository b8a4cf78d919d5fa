"""Greedy decoding with a KV cache: a growing one (``KVCache``), and a static one for compiled decoding
(``StaticCache``, ``Decoder``).

Each layer caches its (rotated) keys, its values and, appended to them, whatever the encoding aggregates
with the values (TAPE's per-token state at that layer's input), plus the key positions for position-dependent
biases. A bias computed from q and k (CoPE, DAPE) is computed anew for the new queries against every cached
key. ``KVCache.memory`` is the encoding's own dict between calls (Abacus: each row's digit run at the last
token, so a digit continues the count of the number it extends). Because every positional state is causal, a cached token's entries never change, so a new token costs
one token of work. The buffers are allocated once for the whole generation (prompt + new tokens) and written
in place; a cache used past its capacity doubles it (amortised, never per token).

Compiled decoding (gpt-fast's pattern). A ``KVCache`` hands attention views ``[:end]`` whose shape changes
every token, so a compiled step would recompile (or run dynamic shapes) and CUDA graphs cannot apply. A
``StaticCache`` has buffers of one fixed capacity per layer (keys, values, key positions), allocated by the
first call (the prompt), and the next token's slot as a device tensor: a one-token step writes its key at that
slot (``index_copy_``), attends over every slot with the slots after it masked, reads a relative bias from the
layer's per-distance table (built once, by the prompt's call, not per token) and advances the slot in place,
so every step has the same shapes and reads no Python number that changes: ``Decoder`` compiles that step once
(``fullgraph``; ``mode="reduce-overhead"`` on CUDA captures it as a CUDA graph) and reuses it, and its cache,
for every token and every call of the same batch size and capacity. An empty slot's key position is
``UNWRITTEN``; a bias computed from q and k ignores such keys (CoPE counts no gate for them). A static cache is
for inference: its tables hold no gradient.

Padded batches (``posbench.model.padding``). A cache keeps its ``padding`` (which keys are real, each row's pad
count; None while no token was padded), so that later calls continue each row's positions and never see its
pads (a growing cache's key mask grows by one concatenation per call: a bool per row and token). Decoding takes
a left-padded prompt (``attention_mask``): the new tokens are real, so only the prompt's call carries a mask. A
static cache takes it in its first call only (its key mask is one buffer of its capacity, so the compiled step
keeps its shapes); a padded batch has its own cache in a ``Decoder`` and compiles one more step graph than an
unpadded one (the key mask and the per-row positions are part of it), each then reused for every call of its
kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from posbench.model.padding import CachePadding, PaddingError, extended

#: decoding checks whether every row has emitted EOS once per this many tokens (each check waits for the GPU)
EOS_CHECK_EVERY = 8
#: the key position of a static cache's empty slot (above every real position)
UNWRITTEN = 2**31 - 1
#: a static cache's capacity is rounded up to a multiple of this, so that calls of nearby lengths share one
#: compiled step
CAPACITY_STEP = 256


#: the key of a cache's ``memory`` that holds, as an int, how many tokens its maker will put in it (the prompt and
#: the new tokens: greedy decoding knows; absent otherwise). An encoding may read it (RandPE draws the positions of
#: the whole sequence at the first call).
PLANNED = "planned_length"


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
    consecutive: bool = True            # every key so far at the model's own positions (0, 1, 2, ...)
    padding: CachePadding | None = None     # which cached keys are real (None: every one)

    def __post_init__(self):
        self.layers = [LayerCache(self.capacity) for _ in range(self.n_layers)]

    def pad(self, mask: Tensor | None, n: int, trailing: bool) -> Tensor | None:
        """Record the next ``n`` tokens' mask (None: all real); the key mask ``[B, length + n]`` of the call that
        adds them, or None while no token is padded."""
        self.padding = extended(self.padding, self.length, mask, n, trailing)
        return self.padding.key_mask if self.padding is not None else None


class StaticLayerCache:
    """One layer's buffers in a ``StaticCache``: keys ``[B, H, C, D]``, values ``[B, H, C, Dv]``, key positions
    ``[B or 1, C]`` (``UNWRITTEN`` where empty) and the layer's per-distance bias table ``[H, C]`` (or None)."""

    def __init__(self, cache: "StaticCache"):
        self.cache = cache
        self.keys: Tensor | None = None
        self.values: Tensor | None = None
        self.positions: Tensor | None = None
        self.table: Tensor | None = None

    @property
    def ready(self) -> bool:
        """Whether the buffers exist (the first call allocates them; one-token steps need them)."""
        return self.keys is not None

    def append(self, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Several tokens (the prompt): written after the cached ones (their count read on the host); views of
        every cached key, as ``LayerCache.append``."""
        start, n = self.cache.length, k.shape[2]
        end = start + n
        if shared_rows(positions):
            positions = positions[:1]
        if self.keys is None:
            self._allocate(k, v, positions)
        if end > self.keys.shape[2]:
            raise ValueError(f"a static cache of capacity {self.keys.shape[2]} cannot hold {end} tokens")
        if positions.shape[0] > self.positions.shape[0]:
            raise ValueError("a static cache keeps the positions its first call had: one row for all, or one each")
        self.keys[:, :, start:end] = k
        self.values[:, :, start:end] = v
        self.positions[:, start:end] = positions
        return self.keys[:, :, :end], self.values[:, :, :end], self.positions[:, :end]

    def write_one(self, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One token per row at the cache's next slot (a device index: no host read); returns every slot's keys,
        values and key positions, and the slot ``[1]``."""
        slot = self.cache.position.view(1)
        if shared_rows(positions):
            positions = positions[:1]
        self.keys.index_copy_(2, slot, k.to(self.keys.dtype))
        self.values.index_copy_(2, slot, v.to(self.values.dtype))
        self.positions.index_copy_(1, slot, positions.expand(self.positions.shape[0], 1))
        return self.keys, self.values, self.positions, slot

    def _allocate(self, k: Tensor, v: Tensor, positions: Tensor) -> None:
        b, h, _, d = k.shape
        capacity = self.cache.capacity
        self.keys = k.new_zeros(b, h, capacity, d)
        self.values = v.new_zeros(b, h, capacity, v.shape[-1])
        self.positions = torch.full((positions.shape[0], capacity), UNWRITTEN, dtype=positions.dtype,
                                    device=positions.device)
        for buffer in (self.keys, self.values, self.positions):
            static_address(buffer)

    def set_table(self, table: Tensor) -> None:
        """The layer's per-distance table ``[H, >= C]`` for one-token steps (written into the same buffer when
        there is one, so a compiled step keeps reading it)."""
        table = table[:, :self.cache.capacity].detach()
        if self.table is not None and self.table.shape == table.shape and self.table.dtype == table.dtype:
            self.table.copy_(table)
        else:
            self.table = table.clone()
            static_address(self.table)

    def clear(self) -> None:
        if self.positions is not None:
            self.positions.fill_(UNWRITTEN)


class StaticCache:
    """A KV cache of fixed capacity for compiled decoding (see the module docstring). ``length`` reads the
    next slot from the device (a host sync; one-token steps never read it)."""

    def __init__(self, n_layers: int, capacity: int, device: torch.device | str):
        if capacity < 1:
            raise ValueError("a static cache needs a capacity of at least one token")
        self.capacity = capacity
        self.position = torch.zeros((), dtype=torch.long, device=device)   # the next token's slot
        static_address(self.position)
        self.layers = [StaticLayerCache(self) for _ in range(n_layers)]
        self.memory: dict[str, Tensor] = {}
        self.consecutive = True
        self.padding: CachePadding | None = None

    def pad(self, mask: Tensor | None, n: int, trailing: bool) -> Tensor | None:
        """The key mask ``[B, capacity]`` of a padded batch (None for an unpadded one). Its first call only may be
        padded, and every row must end with a real token there (the decoding steps follow it)."""
        if mask is None:
            return self.padding.key_mask if self.padding is not None else None
        if self.padding is not None or self.length != 0:
            raise PaddingError("a static cache takes a padded batch in its first call only (the prompt)")
        if trailing:
            raise PaddingError("attention_mask ends a row with a pad, and decoding would put the next token after "
                               "it: pad on the left to generate")
        key_mask = torch.ones(mask.shape[0], self.capacity, dtype=torch.bool, device=mask.device)
        key_mask[:, :n] = mask
        pads = (~mask).sum(dim=1)
        for buffer in (key_mask, pads):
            static_address(buffer)
        self.padding = CachePadding(key_mask, pads)
        return key_mask

    @property
    def length(self) -> int:
        return int(self.position)

    @property
    def ready(self) -> bool:
        return all(layer.ready for layer in self.layers)

    def next_positions(self, n: int) -> Tensor:
        """The model's own positions of the next ``n`` tokens ``[n]``, from the device slot."""
        return self.position + torch.arange(n, device=self.position.device)

    def advance(self, n: int) -> None:
        self.position.add_(n)

    def reset(self) -> None:
        """Empty, keeping the buffers (so a compiled step keeps its graph)."""
        self.position.zero_()
        self.memory.clear()
        self.consecutive = True
        self.padding = None
        for layer in self.layers:
            layer.clear()


def static_address(t: Tensor) -> None:
    """Tell the compiler that ``t`` keeps its address (a CUDA graph may then write into it in place)."""
    mark = getattr(torch._dynamo, "mark_static_address", None)
    if mark is not None and t.is_cuda:
        mark(t)


def next_token(model, token: Tensor, cache) -> Tensor:
    """One greedy step: the next token ``[B]`` after ``token [B, 1]`` (what ``Decoder`` compiles)."""
    return model(token, cache=cache)[:, -1].argmax(-1)


class Decoder:
    """Greedy decoding with a ``StaticCache``: the prompt in one eager call, then one step per token, compiled
    once when ``compile`` is set (True: ``torch.compile``'s defaults; a dict: its options, e.g.
    ``{"mode": "reduce-overhead"}`` for CUDA graphs or ``{"backend": ...}``). Caches are kept per batch size and
    capacity (rounded up to ``CAPACITY_STEP``) and reused, so repeated calls run the same compiled step."""

    def __init__(self, model, compile: bool | dict = False):
        self.model = model
        options = {} if compile is True else dict(compile or {})
        self.compiled = bool(compile)
        self.step = torch.compile(next_token, fullgraph=True, **options) if compile else next_token
        self.caches: dict[tuple[int, int, str, bool], StaticCache] = {}

    def cache_for(self, batch: int, capacity: int, device: torch.device, padded: bool = False) -> StaticCache:
        """A reset cache for this batch size and capacity; a padded batch has its own (its key positions are one
        row each, an unpadded batch's one row for all)."""
        capacity = -(-capacity // CAPACITY_STEP) * CAPACITY_STEP
        key = (batch, capacity, str(device), padded)
        if key not in self.caches:
            self.caches[key] = self.model.new_static_cache(capacity, device)
        cache = self.caches[key]
        cache.reset()
        return cache

    def prefill(self, prompt: Tensor, extra: int, attention_mask: Tensor | None = None) -> tuple[StaticCache, Tensor]:
        """A cache for the prompt and ``extra`` more tokens, and the first new token ``[B]``."""
        padded = attention_mask is not None and not bool(attention_mask.all())
        cache = self.cache_for(prompt.shape[0], prompt.shape[1] + extra, prompt.device, padded)
        cache.memory[PLANNED] = prompt.shape[1] + extra
        return cache, self.model(prompt, cache=cache, attention_mask=attention_mask)[:, -1].argmax(-1)

    def next(self, token: Tensor, cache: StaticCache) -> Tensor:
        """The token after ``token [B]`` (one compiled step). What the step returns, and what it left in the
        cache's ``memory`` for the encoding (Abacus's digit run), are outputs of a captured CUDA graph under
        ``reduce-overhead``, overwritten by its next replay: both are copied out before the next step."""
        if self.compiled and token.is_cuda:
            torch.compiler.cudagraph_mark_step_begin()
        out = self.step(self.model, token[:, None], cache).clone()
        for key, value in cache.memory.items():
            if isinstance(value, Tensor):
                cache.memory[key] = value.clone()
        return out

    @torch.no_grad()
    def generate(self, prompt: Tensor, max_new_tokens: int, eos_id: int | None = None,
                 attention_mask: Tensor | None = None) -> Tensor:
        was_training = self.model.training
        self.model.eval()
        try:
            b = prompt.shape[0]
            new = prompt.new_full((b, max_new_tokens), eos_id if eos_id is not None else 0)
            if max_new_tokens == 0:
                return new
            cache, nxt = self.prefill(prompt, max_new_tokens, attention_mask)
            done = torch.zeros(b, dtype=torch.bool, device=prompt.device)
            for step in range(max_new_tokens):
                if step > 0:
                    nxt = self.next(nxt, cache)
                if eos_id is not None:
                    nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
                    done |= nxt == eos_id
                new[:, step] = nxt
                if eos_id is not None and (step + 1) % EOS_CHECK_EVERY == 0 and bool(done.all()):
                    break
            return new
        finally:
            self.model.train(was_training)


def greedy_generate(model, prompt: Tensor, max_new_tokens: int, eos_id: int | None = None,
                    use_cache: bool = True, attention_mask: Tensor | None = None) -> Tensor:
    """Greedy decoding, ``[B, max_new_tokens]`` new tokens; ``attention_mask [B, N]``: a left-padded prompt (only
    the prompt's call carries it: a cache keeps it; without one the mask grows with the real new tokens)."""
    was_training = model.training
    model.eval()
    try:
        b = prompt.shape[0]
        new = prompt.new_full((b, max_new_tokens), eos_id if eos_id is not None else 0)
        cache = model.new_cache(prompt.shape[1] + max_new_tokens) if use_cache else None
        if isinstance(getattr(cache, "memory", None), dict):     # posbench's caches (not transformers')
            cache.memory[PLANNED] = prompt.shape[1] + max_new_tokens
        tokens, step_input, mask = prompt, prompt, attention_mask
        done = torch.zeros(b, dtype=torch.bool, device=prompt.device)
        for step in range(max_new_tokens):
            padded = {"attention_mask": mask} if mask is not None and (step == 0 or not use_cache) else {}
            logits = model(step_input, cache=cache, **padded) if use_cache else model(tokens, **padded)
            nxt = logits[:, -1].argmax(-1)
            if eos_id is not None:
                nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
                done |= nxt == eos_id
            new[:, step] = nxt
            step_input = nxt[:, None]
            if not use_cache:
                tokens = torch.cat((tokens, step_input), dim=1)
                if mask is not None:
                    mask = torch.cat((mask, torch.ones_like(mask[:, :1])), dim=1)
            if eos_id is not None and (step + 1) % EOS_CHECK_EVERY == 0 and bool(done.all()):
                break                                # the rest of `new` already holds eos_id
        return new
    finally:
        model.train(was_training)
