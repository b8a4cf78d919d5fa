"""A Llama-style decoder that carries a positional state next to the hidden states.

Pre-norm blocks (RMSNorm, attention, RMSNorm, SwiGLU MLP), no biases, untied embeddings, N(0, 0.02) init of the
model's own weights (the encoding's are its own: initialised as its authors release them, never overwritten here).
Everything positional goes through ``self.encoding`` (see ``encodings/base.py``); this file names no
encoding. Its options are ``ModelConfig`` (``model/config.py``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posbench.model.attention import attend, slot_attention
from posbench.model.bias import ScoreBias, table_rows
from posbench.model.config import ModelConfig
from posbench.model.generate import (Decoder, KVCache, LayerCache, StaticCache, StaticLayerCache, greedy_generate,
                                     shared_rows)
from posbench.model.padding import PAD_TOKEN, check_continuation, mask_positions, real_tokens
from posbench.registry import ENCODINGS       # the encodings register there; this module never imports them


def default_positions(n: int, device: torch.device, cache: Any, mask: Tensor | None = None) -> Tensor:
    """0..N-1, or after the cached tokens (a static cache's from its device slot: no host read); in a padded batch
    (``mask [B, N]`` of real tokens, or a cache that holds pads) each row's real tokens counted, ``[B, N]``."""
    if isinstance(cache, StaticCache):
        first = cache.next_positions(n)
    else:
        start = cache.length if cache is not None else 0
        first = torch.arange(start, start + n, device=device)
    padding = getattr(cache, "padding", None)
    if mask is None and padding is None:
        return first
    pads = padding.pads if padding is not None else 0
    if mask is None:
        return first[None, :] - pads[:, None]
    return mask_positions(mask, first[:1] - pads)


def cached_real(cache: Any, batch: int, device: torch.device) -> Tensor | None:
    """Whether each row has a real token in ``cache`` ``[B]`` (None without a cache; a host read of its length)."""
    if cache is None:
        return None
    padding = getattr(cache, "padding", None)
    if padding is not None:
        return padding.real_rows(cache.length)
    return torch.full((batch,), cache.length > 0, device=device)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.to(torch.promote_types(x.dtype, torch.float32))   # float32 at least (float64 stays)
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer, self.n_heads, self.head_dim, self.backend = layer, cfg.n_heads, cfg.head_dim, cfg.attention
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: Tensor, state: Any, positions: Tensor, pe, cache: LayerCache | None,
                aligned: bool = False, key_mask: Tensor | None = None):
        """``aligned``: the positions are the model's own (query i is key Nk - Nq + i at distance Nk - Nq + i - j
        from key j, padding aside: between two real tokens of a padded row too), so a relative bias can be read
        from a per-distance table. ``key_mask [B, >= Nk]``: which keys are real tokens (a padded batch)."""
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = pe.rotate(self.layer, q, k, state)
        extra = pe.state_values(self.layer, state)
        if extra is not None:                       # aggregated by the same attention weights as v
            v = torch.cat((v, extra.to(v.dtype)), dim=-1)
        if isinstance(cache, StaticLayerCache) and n == 1 and cache.ready:
            y = self.one_step(q, k, v, state, positions, pe, cache, aligned, key_mask)
        else:
            y = self.attend(q, k, v, state, positions, pe, cache, aligned, key_mask)
        y, aggregated = y[..., :self.head_dim], y[..., self.head_dim:]
        if extra is not None:
            state = pe.after_attention(self.layer, state, aggregated)
        return self.out(y.transpose(1, 2).reshape(b, n, -1)), state

    def attend(self, q: Tensor, k: Tensor, v: Tensor, state: Any, positions: Tensor, pe, cache,
               aligned: bool, key_mask: Tensor | None = None) -> Tensor:
        q_pos = k_pos = positions
        if cache is not None:
            k, v, k_pos = cache.append(k, v, positions)
        if key_mask is not None:
            key_mask = key_mask[:, :k.shape[2]]
        if shared_rows(q_pos) and shared_rows(k_pos):         # rows share their positions: one bias for all
            q_pos, k_pos = q_pos[:1], k_pos[:1]
        bias = layer_bias(pe, self.layer, state, q, k, q_pos, k_pos)
        if isinstance(cache, StaticLayerCache) and aligned and isinstance(bias, ScoreBias) and bias.relative:
            with torch.no_grad():                   # what the one-token steps read: built once, here
                cache.set_table(bias.distance_table(self.n_heads, cache.cache.capacity, q.device))
        return attend(q, k, v, bias, self.backend, q_pos=q_pos, k_pos=k_pos, contextual=isinstance(bias, Tensor),
                      aligned=aligned, key_mask=key_mask)

    def one_step(self, q: Tensor, k: Tensor, v: Tensor, state: Any, positions: Tensor, pe,
                 cache: StaticLayerCache, aligned: bool, key_mask: Tensor | None = None) -> Tensor:
        """One token against every slot of a static cache: the same shapes at every step, no host read."""
        k, v, k_pos, slot = cache.write_one(k, v, positions)
        q_pos = positions[:1] if shared_rows(positions) else positions
        if aligned and cache.table is not None:     # a relative ScoreBias: one row of its table
            bias = table_rows(cache.table, slot, k.shape[2])
        else:
            bias = layer_bias(pe, self.layer, state, q, k, q_pos, k_pos)
            if isinstance(bias, ScoreBias):
                bias = bias.materialise(self.n_heads, q_pos, k_pos)
        return slot_attention(q, k, v, bias, slot, key_mask)


def layer_bias(pe, layer: int, state: Any, q: Tensor, k: Tensor, q_pos: Tensor,
               k_pos: Tensor) -> ScoreBias | Tensor | None:
    """The encoding's logit bias for this layer, asked for with autocast off (float32: no position or bias in
    bf16)."""
    with torch.autocast(q.device.type, enabled=False):
        bias = pe.bias(layer, state, q, k, q_pos, k_pos)
    if isinstance(bias, Tensor) and not pe.bias_from_qk:
        raise TypeError(f"encoding '{pe.name}' returns its bias as a tensor: its class must say bias_from_qk = True "
                        f"(attention then runs on eager or SDPA)")
    return bias


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, layer)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: Tensor, state: Any, positions: Tensor, pe, cache: LayerCache | None = None,
                aligned: bool = False, key_mask: Tensor | None = None):
        h, state = self.attn(self.attn_norm(x), state, positions, pe, cache, aligned, key_mask)
        x = x + h
        m = self.mlp(self.mlp_norm(x))
        state = pe.after_mlp(self.layer, state, m)   # TAPE's update is fed by the MLP output
        return x + m, state


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, encoding: nn.Module | None = None):
        """``encoding``: a built positional encoding for this shape (default: ``cfg.encoding`` with its options,
        built from the registry)."""
        super().__init__()
        if encoding is None:
            encoding = ENCODINGS.get(cfg.encoding)(cfg.n_layers, cfg.n_heads, cfg.head_dim, cfg.d_model,
                                                   cfg.max_seq_len, **cfg.encoding_options)
        self.encoding = encoding
        cfg.encoding_options = self.encoding.options   # every resolved option, recorded (the same dict: an option
                                                       # a legacy checkpoint changes as it loads shows in the record)
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        for module in self.own_modules():
            self._init_weights(module)
        self.encoding.embedding_std = cfg.init_std     # what a table added to the token embeddings is drawn like
        self.encoding.init_weights()        # its own inits; it freezes what can never reach the loss

    def own_modules(self):
        """The model's modules outside its encoding: the encoding owns (and initialises) its parameters."""
        encoding = {id(m) for m in self.encoding.modules()}
        return (m for m in self.modules() if id(m) not in encoding)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens: Tensor, positions: Tensor | None = None, cache: KVCache | None = None,
                attention_mask: Tensor | None = None) -> Tensor:
        """tokens ``[B, N]`` -> logits ``[B, N, vocab]``. ``positions``: ``[N]`` or ``[B, N]``; by default
        0..N-1, continuing after the cached tokens when a ``cache`` is given. ``attention_mask [B, N]``: 1 for a
        real token, 0 for a pad (left or right of a row's real tokens; ``posbench.model.padding``): each row's
        real tokens then get the logits they get alone, and the positions count them; a cache keeps the mask."""
        b, n = tokens.shape
        mask, trailing = (None, False) if attention_mask is None else \
            real_tokens(attention_mask.to(tokens.device), b, n, cached_real(cache, b, tokens.device))
        padding = getattr(cache, "padding", None)
        check_continuation(padding, n)
        aligned = positions is None and getattr(cache, "consecutive", cache is None)
        if positions is None:
            positions = default_positions(n, tokens.device, cache, mask)
        elif hasattr(cache, "consecutive"):
            cache.consecutive = False
        positions = positions.to(tokens.device).expand(b, n) if positions.dim() == 1 else positions
        key_mask = cache.pad(mask, n, trailing) if cache is not None and (mask is not None or padding) else mask
        seen = tokens if mask is None else tokens.masked_fill(~mask, PAD_TOKEN)     # a pad is never a token
        state = self.encoding.init_state(positions, seen, cache.memory if cache is not None else None)
        x = self.encoding.embed(self.embed(tokens), state)
        for i, block in enumerate(self.blocks):
            x, state = block(x, state, positions, self.encoding, cache.layers[i] if cache is not None else None,
                             aligned, key_mask)
        if isinstance(cache, StaticCache):
            cache.advance(n)
        elif cache is not None:
            cache.length += n
        return self.lm_head(self.norm(x))

    def new_cache(self, capacity: int = 0) -> KVCache:
        """An empty KV cache; ``capacity`` (tokens) preallocates it (it grows by doubling if exceeded)."""
        return KVCache(self.config.n_layers, capacity)

    def new_static_cache(self, capacity: int, device: torch.device | str | None = None) -> StaticCache:
        """A static cache of ``capacity`` tokens for compiled decoding (``posbench.model.generate``)."""
        device = device if device is not None else self.embed.weight.device
        return StaticCache(self.config.n_layers, capacity, device)

    @torch.no_grad()
    def generate(self, prompt: Tensor, max_new_tokens: int, eos_id: int | None = None,
                 use_cache: bool = True, compile: bool | dict = False, attention_mask: Tensor | None = None) -> Tensor:
        """Greedy decoding; returns ``[B, max_new_tokens]`` new tokens (after EOS: ``eos_id``). ``compile``: decode
        with a static cache and one compiled step for every token (True, or ``torch.compile`` options such as
        ``{"mode": "reduce-overhead"}``); the compiled step is kept on the model for later calls.
        ``attention_mask [B, N]``: a left-padded prompt (0 for a pad): each row decodes as it would alone."""
        if not (compile and use_cache):
            return greedy_generate(self, prompt, max_new_tokens, eos_id, use_cache, attention_mask)
        key = repr(sorted(compile.items())) if isinstance(compile, dict) else "default"
        decoders = self.__dict__.setdefault("_decoders", {})
        if key not in decoders:
            decoders[key] = Decoder(self, compile)
        return decoders[key].generate(prompt, max_new_tokens, eos_id, attention_mask)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
