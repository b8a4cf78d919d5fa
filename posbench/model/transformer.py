"""A Llama-style decoder that carries a positional state next to the hidden states.

By default: pre-norm blocks (RMSNorm, attention, RMSNorm, SwiGLU MLP), no biases, untied embeddings, N(0, 0.02)
init of the model's own weights (the encoding's are its own: initialised as its authors release them, never
overwritten here). Everything positional goes through ``self.encoding`` (see ``encodings/base.py``); this file
names no encoding. Its options are ``ModelConfig`` (``model/config.py``).

The same blocks also make the arithmetic releases' depth-recurrent class (docs/encodings.md, "Backbones"): post-norm
LayerNorm blocks with a GELU-gated MLP, the input embeddings normalised and injected (added) at the entry of each of
``recurrences`` passes through the blocks onto a random initial state, a gated MLP head, and the DeepNorm init.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posbench.model.attention import attend, attention_weights, slot_attention
from posbench.model.bias import ScoreBias, table_rows
from posbench.model.config import ModelConfig
from posbench.options import OptionError
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
        #: called as ``observer(q, k, bias, q_pos, k_pos)`` with what each attention call scores (the analysis of
        #: ``posbench analyze``, posbench.analysis.heads); None in training and evaluation
        self.observer = None
        #: a list to which each attention call appends its attention weights ``[B, H, Nq, Nk]``
        #: (``posbench.model.attention.attention_weights``: what a Hugging Face model's ``output_attentions``
        #: returns, posbench.hf.modeling); None (nothing computed) but while a caller asks for them
        self.weights: list[Tensor] | None = None

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
        if self.observer is not None:
            self.observer(q, k, bias, q_pos, k_pos)
        if self.weights is not None:
            self.weights.append(attention_weights(q, k, bias, q_pos, k_pos, key_mask))
        if isinstance(cache, StaticLayerCache) and aligned and isinstance(bias, ScoreBias) and bias.relative:
            with torch.no_grad():                   # what the one-token steps read: built once, here
                cache.set_table(bias.distance_table(self.n_heads, cache.cache.capacity, q.device))
        return attend(q, k, v, bias, self.backend, q_pos=q_pos, k_pos=k_pos, contextual=isinstance(bias, Tensor),
                      aligned=aligned, key_mask=key_mask)

    def one_step(self, q: Tensor, k: Tensor, v: Tensor, state: Any, positions: Tensor, pe,
                 cache: StaticLayerCache, aligned: bool, key_mask: Tensor | None = None) -> Tensor:
        """One token against every slot of a static cache: the same shapes at every step, no host read (posbench's
        compiled decoding, which never records ``weights``)."""
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


def make_norm(cfg: ModelConfig) -> nn.Module:
    """RMSNorm (the default) or LayerNorm (the depth-recurrent class's, with its bias)."""
    return RMSNorm(cfg.d_model, cfg.norm_eps) if cfg.norm == "rms" else nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU (SiLU) by default, GEGLU (exact GELU) with ``mlp = geglu``. The
    arithmetic releases' GLU splits one d_model -> 2 d_ff projection into (up, gate) halves: the same map."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.act = F.silu if cfg.mlp == "swiglu" else F.gelu
        self.gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.act(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer, self.post_norm = layer, cfg.norm_position == "post"
        self.attn_norm = make_norm(cfg)
        self.attn = Attention(cfg, layer)
        self.mlp_norm = make_norm(cfg)
        self.mlp = GatedMLP(cfg)

    def forward(self, x: Tensor, state: Any, positions: Tensor, pe, cache: LayerCache | None = None,
                aligned: bool = False, key_mask: Tensor | None = None):
        if self.post_norm:                          # norm(x + f(x)), the depth-recurrent class's
            h, state = self.attn(x, state, positions, pe, cache, aligned, key_mask)
            x = self.attn_norm(x + h)
            m = self.mlp(x)
            state = pe.after_mlp(self.layer, state, m)
            return self.mlp_norm(x + m), state
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
        if cfg.depth > 1 and encoding.one_pass:
            raise OptionError(f"encoding '{encoding.name}' runs on one pass of the blocks (its state after the last "
                              f"layer is discarded): model.recurrences and model.eval_recurrences must be 1 with it")
        cfg.encoding_options = self.encoding.options   # every resolved option, recorded (the same dict: an option
                                                       # a legacy checkpoint changes as it loads shows in the record)
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = make_norm(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.embedding_norm:
            self.embed_norm = make_norm(cfg)
        if cfg.head_mlp:
            self.head = GatedMLP(cfg)
        for module in self.own_modules():
            self._init_weights(module)
        self.encoding.embedding_std = cfg.embedding_std     # what a table added to the token embeddings is drawn like
        self.encoding.init_weights()        # its own inits; it freezes what can never reach the loss

    def own_modules(self):
        """The model's modules outside its encoding: the encoding owns (and initialises) its parameters."""
        encoding = {id(m) for m in self.encoding.modules()}
        return (m for m in self.modules() if id(m) not in encoding)

    def _init_weights(self, module: nn.Module) -> None:
        if self.config.init_scheme == "deepnorm":
            deepnorm_init(module, self.config, self.lm_head)
        elif isinstance(module, (nn.Linear, nn.Embedding)):
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
        if self.config.embedding_norm:
            x = self.embed_norm(x)
        x = self.recur(x, state, positions, cache, aligned, key_mask)
        if isinstance(cache, StaticCache):
            cache.advance(n)
        elif cache is not None:
            cache.length += n
        if self.config.head_mlp:
            x = self.head(x)
        return self.lm_head(self.norm(x))

    def recur(self, x: Tensor, state: Any, positions: Tensor, cache: Any, aligned: bool,
              key_mask: Tensor | None) -> Tensor:
        """The blocks, ``recurrences`` times in turn (``eval_recurrences`` outside training); with input injection
        each pass starts by adding the input embeddings to the state, which starts at zero or, while training, at
        N(0, state_std). A KV cache holds one layer per block and pass."""
        cfg = self.config
        passes = cfg.recurrences if self.training else (cfg.eval_recurrences or cfg.recurrences)
        injected = x if cfg.input_injection else None
        if injected is not None:
            x = torch.randn_like(x) * cfg.state_std if self.training and cfg.state_std > 0 else torch.zeros_like(x)
        for r in range(passes):
            if injected is not None:
                x = x + injected
            for i, block in enumerate(self.blocks):
                layer_cache = cache.layers[r * cfg.n_layers + i] if cache is not None else None
                x, state = block(x, state, positions, self.encoding, layer_cache, aligned, key_mask)
        return x

    def new_cache(self, capacity: int = 0) -> KVCache:
        """An empty KV cache; ``capacity`` (tokens) preallocates it (it grows by doubling if exceeded)."""
        return KVCache(self.config.n_layers * self.config.depth, capacity)

    def new_static_cache(self, capacity: int, device: torch.device | str | None = None) -> StaticCache:
        """A static cache of ``capacity`` tokens for compiled decoding (``posbench.model.generate``)."""
        device = device if device is not None else self.embed.weight.device
        return StaticCache(self.config.n_layers * self.config.depth, capacity, device)

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


def deepnorm_init(module: nn.Module, cfg: ModelConfig, lm_head: nn.Linear) -> None:
    """The arithmetic releases' ``init.type = deepnorm-straight`` (``_init_module`` of cramming/architectures/
    components.py): Xavier normal with gain (8 L)^-1/4, L the blocks times the training recurrences, on every linear
    map, computed on the release's own shapes (one d_model -> 2 d_ff projection for a gated MLP's gate and up; one
    d_model x d_model matrix each for queries, keys and values, the queries' and keys' at gain 1); embeddings
    N(0, d_model^-1/2); norms at one (and zero bias)."""
    gain = (8 * cfg.n_layers * cfg.recurrences) ** -0.25

    def xavier(weight: Tensor, fan_out: int, fan_in: int, g: float) -> None:
        nn.init.normal_(weight, 0.0, g * math.sqrt(2.0 / (fan_in + fan_out)))

    d = cfg.d_model
    if isinstance(module, Attention):
        q, k, v = module.qkv.weight.data.view(3, d, d)
        xavier(q, d, d, 1.0)
        xavier(k, d, d, 1.0)
        xavier(v, d, d, gain)
        xavier(module.out.weight, d, d, gain)
    elif isinstance(module, GatedMLP):
        xavier(module.gate.weight, 2 * cfg.d_ff, d, gain)
        xavier(module.up.weight, 2 * cfg.d_ff, d, gain)
        xavier(module.down.weight, d, cfg.d_ff, gain)
    elif module is lm_head:
        xavier(module.weight, cfg.vocab_size, d, gain)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, 0.0, d ** -0.5)
