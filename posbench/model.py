"""A Llama-style decoder that carries a positional state next to the hidden states.

Pre-norm blocks (RMSNorm, attention, RMSNorm, SwiGLU MLP), no biases, untied embeddings, N(0, 0.02) init.
Everything positional goes through ``self.encoding`` (see ``encodings/base.py``); this file names no
encoding.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posbench.attention import BACKENDS, attend
from posbench.encodings import ENCODINGS
from posbench.generate import KVCache, LayerCache, greedy_generate, shared_rows
from posbench.options import OneOf, OptionError, at_least, check_fields, option, positive


@dataclass
class ModelConfig:
    """The model's options, each declared once (``posbench.options.option``) and checked alike from Python and
    from ``--set model.KEY=VALUE``; ``encoding_options`` are checked by the encoding when it is built."""

    vocab_size: int = option(256, "the vocabulary (set by the task)", at_least(1))
    d_model: int = option(128, "the width of the hidden states", at_least(1))
    n_layers: int = option(2, "decoder blocks", at_least(1))
    n_heads: int = option(4, "attention heads (d_model / n_heads must be even)", at_least(1))
    d_ff: int = option(0, "the SwiGLU MLP's width (0: 4 x d_model; the reference: 3072 for 768)", at_least(0))
    max_seq_len: int = option(256, "the training length (encodings that need it read it from here)", at_least(0))
    encoding: str = option("rope", "the positional encoding (posbench ls encodings)")
    encoding_options: dict[str, Any] = field(default_factory=dict)
    attention: str = option("auto", "the attention backend", OneOf(("auto", *sorted(BACKENDS))))
    norm_eps: float = option(1e-5, "RMSNorm's epsilon", positive())
    init_std: float = option(0.02, "the standard deviation of the N(0, std) initialisation", positive())

    def __post_init__(self):
        check_fields(self, "model")
        if self.d_ff <= 0:
            self.d_ff = 4 * self.d_model
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise OptionError(f"model: d_model {self.d_model} must split into {self.n_heads} heads of even size")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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

    def forward(self, x: Tensor, state: Any, positions: Tensor, pe, cache: LayerCache | None):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = pe.rotate(self.layer, q, k, state)
        extra = pe.state_values(self.layer, state)
        if extra is not None:                       # aggregated by the same attention weights as v
            v = torch.cat((v, extra.to(v.dtype)), dim=-1)
        q_pos = k_pos = positions
        if cache is not None:
            k, v, k_pos = cache.append(k, v, positions)
        if shared_rows(q_pos) and shared_rows(k_pos):         # rows share their positions: one bias for all
            q_pos, k_pos = q_pos[:1], k_pos[:1]
        if pe.has_context_bias:                     # computed from q and every key: a tensor
            bias = pe.context_bias(self.layer, q, k, q_pos, k_pos)
        else:
            bias = pe.score_bias(self.layer)
        y = attend(q, k, v, bias, self.backend, q_pos=q_pos, k_pos=k_pos, contextual=pe.has_context_bias)
        y, aggregated = y[..., :self.head_dim], y[..., self.head_dim:]
        if extra is not None:
            state = pe.after_attention(self.layer, state, aggregated)
        return self.out(y.transpose(1, 2).reshape(b, n, -1)), state


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

    def forward(self, x: Tensor, state: Any, positions: Tensor, pe, cache: LayerCache | None = None):
        h, state = self.attn(self.attn_norm(x), state, positions, pe, cache)
        x = x + h
        m = self.mlp(self.mlp_norm(x))
        state = pe.after_mlp(self.layer, state, m)   # TAPE's update is fed by the MLP output
        return x + m, state


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        encoding_cls = ENCODINGS.get(cfg.encoding)
        self.encoding = encoding_cls(cfg.n_layers, cfg.n_heads, cfg.head_dim, cfg.d_model, cfg.max_seq_len,
                                     **cfg.encoding_options)
        cfg.encoding_options = dict(self.encoding.options)   # record every resolved option
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)
        self.encoding.init_weights()
        for param in self.encoding.unused_parameters():   # never reach the loss: no gradient, no DDP hook
            param.requires_grad_(False)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens: Tensor, positions: Tensor | None = None, cache: KVCache | None = None) -> Tensor:
        """tokens ``[B, N]`` -> logits ``[B, N, vocab]``. ``positions``: ``[N]`` or ``[B, N]``; by default
        0..N-1, continuing after the cached tokens when a ``cache`` is given."""
        b, n = tokens.shape
        if positions is None:
            start = cache.length if cache is not None else 0
            positions = torch.arange(start, start + n, device=tokens.device)
        positions = positions.to(tokens.device).expand(b, n) if positions.dim() == 1 else positions
        state = self.encoding.init_state(positions)
        state = self.encoding.read_tokens(tokens, state, cache.memory if cache is not None else None)
        x = self.encoding.embed(self.embed(tokens), state)
        for i, block in enumerate(self.blocks):
            x, state = block(x, state, positions, self.encoding, cache.layers[i] if cache is not None else None)
        if cache is not None:
            cache.length += n
        return self.lm_head(self.norm(x))

    def new_cache(self, capacity: int = 0) -> KVCache:
        """An empty KV cache; ``capacity`` (tokens) preallocates it (it grows by doubling if exceeded)."""
        return KVCache(self.config.n_layers, capacity)

    @torch.no_grad()
    def generate(self, prompt: Tensor, max_new_tokens: int, eos_id: int | None = None,
                 use_cache: bool = True) -> Tensor:
        """Greedy decoding; returns ``[B, max_new_tokens]`` new tokens (after EOS: ``eos_id``)."""
        return greedy_generate(self, prompt, max_new_tokens, eos_id, use_cache)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
