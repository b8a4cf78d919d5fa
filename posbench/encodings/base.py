"""The positional-encoding contract.

An encoding is one ``PositionalEncoding`` subclass with a ``name``; defining the class registers it.
The model calls these hooks, in this order, and knows nothing else about any encoding:

    state = pe.init_state(positions)                    # once per forward pass; positions [B, N]
    state = pe.read_tokens(tokens, state, memory)       # Abacus: a state that depends on the token ids
    x = pe.embed(x, state)                              # absolute encodings add to the embeddings
    for each layer l:
        q, k = pe.rotate(l, q, k, state)                # RoPE, xPos, TAPE transform q and k
        extra = pe.state_values(l, state)               # TAPE: tensors aggregated like values
        (a KV cache appends k and v: from here k holds every key the queries may see)
        bias = pe.context_bias(l, q, k, q_pos, k_pos)   # CoPE, DAPE: a logit bias computed from q and k,
            or pe.score_bias(l)                         # ALiBi, FIRE, T5: an element-wise logit bias
        ... attention over [v | extra] with the same weights, plus the bias ...
        state = pe.after_attention(l, state, aggregated_extra)
        state = pe.after_mlp(l, state, mlp_output)

A logit bias is a ``posbench.model.bias.ScoreBias``: a function of (head, query position, key position) and the
encoding's own tensors, written once; the attention backend evaluates it inside its kernel (FlexAttention on
a GPU) or broadcasts it into a tensor (eager, SDPA). ``bias(l, q_pos, k_pos)`` returns that tensor.

A contextual bias (``context_bias``) depends on the queries and keys themselves: CoPE counts gates
sigmoid(q_i . k_j), DAPE runs an MLP over every head's q_i . k_j and base bias. It is returned as the tensor
``[B, H, Nq, Nk]`` (causal and bottom-right aligned like attention: query i is the (Nk - Nq + i)-th key), so it
cannot live in a fused kernel: attention then runs on a backend that takes a tensor (eager, or SDPA with a
float mask), ``auto`` picks SDPA, and an explicit request for another (flex, flash_attn) is a one-line
``BackendError``, raised when a run is configured (``posbench.model.attention.check_encoding_backend``) and again at
the first forward pass of a model built by hand. The tensor is float32 at least, autocast or not. An
encoding defines ``score_bias`` or ``context_bias``, not both (``has_bias`` / ``has_context_bias`` say which).

Token ids. ``read_tokens(tokens, state, memory)`` sees the token ids ``[B, N]`` of the forward pass. With a KV
cache, one forward pass sees only the new tokens: ``memory`` is a dict the cache keeps for the encoding between
its calls (None without a cache), where it leaves what the next tokens need (Abacus: each row's digit run at
the last token). Options that only a task can give (Abacus's ``digit_ids``) are declared
``Option(..., from_task=True)``; the run configuration fills them from ``Task.encoding_context()``.

Static encodings leave the state unchanged. Each encoding must put exactly one position signal into
the model (NoPE none). Options are declared once, in ``OPTIONS`` (``posbench.options.Option``: default, help,
valid range); they are checked when the encoding is built (``Configurable.resolve``, constraints between
options in ``check_options``), and every resolved option is recorded in the model's config. Hooks receive the layer as a Python int; keep them free of graph breaks (no Python
``random``, no ``.item()``) so that a compiled model is one graph for all layers.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from posbench.model.bias import ScoreBias
from posbench.options import Configurable
from posbench.registry import Registry

ENCODINGS: Registry = Registry("encoding", entry_point_group="posbench.encodings")

__all__ = ["ENCODINGS", "PositionalEncoding", "rope_cos_sin", "rotate_half"]


class PositionalEncoding(Configurable, nn.Module):
    """Base class: subclass it, set ``name``, declare ``OPTIONS`` and override the hooks you need."""

    kind: ClassVar[str] = "encoding"
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: logits are unchanged when every position is shifted by a constant (at eval)
    relative: ClassVar[bool] = False
    #: adds a logit bias (set automatically: the class overrides ``score_bias``)
    has_bias: ClassVar[bool] = False
    #: adds a logit bias computed from q and k (set automatically: the class overrides ``context_bias``)
    has_context_bias: ClassVar[bool] = False
    #: the options only a task can give (set automatically: those declared ``Option(..., from_task=True)``)
    task_context: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.task_context = tuple(key for key, o in cls.OPTIONS.items() if o.from_task)
        cls.has_bias = cls.score_bias is not PositionalEncoding.score_bias
        cls.has_context_bias = cls.context_bias is not PositionalEncoding.context_bias
        if cls.has_bias and cls.has_context_bias:
            raise TypeError(f"encoding '{cls.name}' defines both score_bias and context_bias; define one")
        ENCODINGS.add_subclass(cls)

    def __init__(self, n_layers: int, n_heads: int, head_dim: int, d_model: int, max_seq_len: int,
                 **options: Any):
        super().__init__()
        self.n_layers, self.n_heads, self.head_dim = n_layers, n_heads, head_dim
        self.d_model, self.max_seq_len = d_model, max_seq_len
        self.options = self.resolve(options)     # the one check, as ``posbench run`` makes it before it writes

    # ---- hooks (defaults: no positional signal, state unchanged) -------------------------------------
    def init_weights(self) -> None:
        """Called after the model's N(0, 0.02) init of every Linear/Embedding, for special inits."""

    def init_state(self, positions: Tensor) -> Any:
        """Build the positional state for token positions ``[B, N]`` (absolute, cache offset included)."""
        return None

    def read_tokens(self, tokens: Tensor, state: Any, memory: dict[str, Tensor] | None) -> Any:
        """The state once the token ids ``[B, N]`` are known (Abacus). ``memory``: the KV cache's dict for this
        encoding, kept between cached calls (None without a cache); read what earlier calls left, write what
        later ones need."""
        return state

    def embed(self, x: Tensor, state: Any) -> Tensor:
        return x

    def rotate(self, layer: int, q: Tensor, k: Tensor, state: Any) -> tuple[Tensor, Tensor]:
        """Transform queries and keys ``[B, H, N, D]``."""
        return q, k

    def score_bias(self, layer: int) -> ScoreBias | None:
        """This layer's logit bias as an element-wise function (see ``posbench.model.bias``), or None."""
        return None

    def context_bias(self, layer: int, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """This layer's logit bias computed from the (rotated) queries ``[B, H, Nq, D]`` and every key they may
        see ``[B, H, Nk, D]`` (cached keys included; query i is the (Nk - Nq + i)-th key), as a tensor
        ``[B or 1, H, Nq, Nk]`` of at least float32; positions ``[B or 1, Nq]``, ``[B or 1, Nk]``. Entries right
        of the causal diagonal are ignored; no value left of it may depend on them. In a one-token step over a
        static cache (``posbench.model.generate.StaticCache``: Nq = 1, k holds every slot) a key whose position is
        ``posbench.model.generate.UNWRITTEN`` is an empty slot: its entry is ignored, and no other may depend on it."""
        return None

    def state_values(self, layer: int, state: Any) -> Tensor | None:
        """Extra channels ``[B, H, N, E]`` aggregated by the attention weights together with the values."""
        return None

    def after_attention(self, layer: int, state: Any, aggregated: Tensor | None) -> Any:
        return state

    def after_mlp(self, layer: int, state: Any, mlp_out: Tensor) -> Any:
        return state

    def unused_parameters(self) -> list[nn.Parameter]:
        """Parameters that can never reach the loss. The model freezes them (``requires_grad=False``) when it
        is built, so optimizers skip them and DistributedDataParallel needs no per-step search for unused
        parameters. They stay in the state dict (TAPE keeps its last layer's, so the parameter count is the
        paper's)."""
        return []

    # ---- derived ---------------------------------------------------------------------------------------
    def bias(self, layer: int, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """The layer's bias as a tensor ``[B or 1, H, Nq, Nk]`` for query positions ``[B or 1, Nq]`` and key
        positions ``[B or 1, Nk]`` (what eager attention and SDPA add to the logits)."""
        score_bias = self.score_bias(layer)
        return None if score_bias is None else score_bias.materialise(self.n_heads, q_pos, k_pos)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items())


def rotate_half(x: Tensor) -> Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last dimension (the half-split RoPE layout of Llama / GPT-NeoX)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_angles(positions: Tensor, head_dim: int, theta: float) -> Tensor:
    """``t * theta^(-2f/D)`` for f < D/2, ``[B, N, D/2]`` float64. Computed in float64, so that the angle of a
    far position does not lose its fraction (float32 would round position 16384's angles by up to 1e-3 rad)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float64) / head_dim)
    return positions.to(torch.float64)[..., None] * inv_freq


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """RoPE's table for positions ``[B, N]`` (integer or float): cos and sin of the angles, duplicated over the
    two halves, ``[B, N, D]`` float32."""
    angles = rope_angles(positions, head_dim, theta)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(torch.float32), angles.sin().to(torch.float32)
