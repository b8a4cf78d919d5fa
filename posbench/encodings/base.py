"""The positional-encoding contract.

An encoding is one ``PositionalEncoding`` subclass with a ``name``; defining the class registers it.
The model calls these hooks, in this order, and knows nothing else about any encoding:

    state = pe.init_state(positions)                    # once per forward pass; positions [B, N]
    x = pe.embed(x, state)                              # absolute encodings add to the embeddings
    for each layer l:
        q, k = pe.rotate(l, q, k, state)                # RoPE, xPos, TAPE transform q and k
        extra = pe.state_values(l, state)               # TAPE: tensors aggregated like values
        bias = pe.bias(l, q_pos, k_pos)                 # ALiBi, FIRE, T5 add to the logits
        ... attention over [v | extra] with the same weights ...
        state = pe.after_attention(l, state, aggregated_extra)
        state = pe.after_mlp(l, state, mlp_output)

Static encodings leave the state unchanged. Each encoding must put exactly one position signal into
the model (NoPE none). Options are declared in ``defaults``; every option is type-checked, has a default
and is recorded in the model's config.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from posbench.errors import UserError
from posbench.registry import Registry

ENCODINGS: Registry = Registry("encoding", entry_point_group="posbench.encodings")


class EncodingOptionError(UserError):
    """A bad encoding option; ``str()`` is one line."""


class PositionalEncoding(nn.Module):
    """Base class: subclass it, set ``name`` and override the hooks you need."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    #: logits are unchanged when every position is shifted by a constant (at eval)
    relative: ClassVar[bool] = False
    #: adds a bias to the attention logits (backends need a float mask or a score_mod)
    has_bias: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        ENCODINGS.add_subclass(cls)

    def __init__(self, n_layers: int, n_heads: int, head_dim: int, d_model: int, max_seq_len: int,
                 **options: Any):
        super().__init__()
        self.n_layers, self.n_heads, self.head_dim = n_layers, n_heads, head_dim
        self.d_model, self.max_seq_len = d_model, max_seq_len
        self.options = resolve_options(self.name, self.defaults, options)

    # ---- hooks (defaults: no positional signal, state unchanged) -------------------------------------
    def init_weights(self) -> None:
        """Called after the model's N(0, 0.02) init of every Linear/Embedding, for special inits."""

    def init_state(self, positions: Tensor) -> Any:
        """Build the positional state for token positions ``[B, N]`` (absolute, cache offset included)."""
        return None

    def embed(self, x: Tensor, state: Any) -> Tensor:
        return x

    def rotate(self, layer: int, q: Tensor, k: Tensor, state: Any) -> tuple[Tensor, Tensor]:
        """Transform queries and keys ``[B, H, N, D]``."""
        return q, k

    def bias(self, layer: int, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """Additive logit bias ``[B or 1, H, Nq, Nk]`` for query positions ``[B, Nq]`` and keys ``[B, Nk]``.
        The model passes ``[1, Nq]`` and ``[1, Nk]`` when every row has the same positions; the bias is
        then broadcast over the batch."""
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

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items())


def resolve_options(name: str, defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """Merge ``given`` over ``defaults``, refusing unknown keys and values of the wrong type."""
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        valid = ", ".join(sorted(defaults)) or "none"
        raise EncodingOptionError(f"encoding '{name}' has no option {', '.join(unknown)}; valid options: {valid}")
    resolved = dict(defaults)
    for key, value in given.items():
        resolved[key] = _coerce(name, key, value, defaults[key])
    return resolved


def _coerce(name: str, key: str, value: Any, default: Any) -> Any:
    if default is None or value is None:
        return value
    kind = type(default)
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in {"true", "false", "1", "0", "yes", "no"}:
            return value.lower() in {"true", "1", "yes"}
    elif kind in (int, float):
        if isinstance(value, bool):
            pass
        elif isinstance(value, (int, float)) and (kind is float or float(value).is_integer()):
            return kind(value)
        elif isinstance(value, str):
            try:
                return kind(value)
            except ValueError:
                pass
    elif isinstance(value, kind):
        return value
    raise EncodingOptionError(
        f"encoding '{name}' option {key}={value!r} must be of type {kind.__name__}")


def rotate_half(x: Tensor) -> Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last dimension (the half-split RoPE layout of Llama / GPT-NeoX)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """RoPE's table for positions ``[B, N]`` (integer or float): cos and sin of ``t * theta^(-2f/D)``,
    duplicated over the two halves, ``[B, N, D]`` float32. Computed in float64, so that the angle of a far
    position does not lose its fraction (float32 would round position 16384's angles by up to 1e-3 rad)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float64) / head_dim)
    angles = positions.to(torch.float64)[..., None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(torch.float32), angles.sin().to(torch.float32)
