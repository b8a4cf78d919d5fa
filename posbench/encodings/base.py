"""The positional-encoding contract.

An encoding is one ``PositionalEncoding`` subclass with a ``name``; defining the class registers it. The model
calls eight hooks, in this order, and knows nothing else about any encoding:

    pe.init_weights()                                   # once, when the model is built
    state = pe.init_state(positions, tokens, memory)    # once per forward pass
    x = pe.embed(x, state)                              # absolute encodings add to the embeddings
    for each layer l:
        q, k = pe.rotate(l, q, k, state)                # RoPE, xPos, TAPE transform q and k
        extra = pe.state_values(l, state)               # TAPE: tensors aggregated like values
        (a KV cache appends k and v: from here k holds every key the queries may see)
        bias = pe.bias(l, state, q, k, q_pos, k_pos)    # a logit bias: a ScoreBias, or a tensor from q and k
        ... attention over [v | extra] with the same weights, plus the bias ...
        state = pe.after_attention(l, state, aggregated_extra)
        state = pe.after_mlp(l, state, mlp_output)

The defaults put no position signal in and leave the state unchanged. Each encoding must put exactly one position
signal into the model (NoPE none).

The state. ``init_state`` sees the positions ``[B, N]`` (absolute: a KV cache's offset included) and the token ids
``[B, N]`` of the forward pass, and returns whatever the other hooks need (RoPE's cos / sin table, Abacus's digit
places, TAPE's per-token state; None if nothing). With a KV cache one forward pass sees only the new tokens:
``memory`` is a dict the cache keeps for the encoding between its calls (None without a cache), where it leaves
what the next tokens need (Abacus: each row's digit run at the last token).

A logit bias is returned by ``bias`` in one of two forms:

- a ``posbench.model.bias.ScoreBias`` (ALiBi, FIRE, T5, KERPLE, Sandwich): a function of (head, query position, key
  position) and the encoding's own tensors, written once; the attention backend evaluates it inside its kernel
  (FlexAttention on a GPU) or broadcasts it into a tensor (eager, SDPA);
- a tensor ``[B or 1, H, Nq, Nk]`` of at least float32, for a bias computed from the (rotated) queries ``[B, H, Nq,
  D]`` and every key they may see ``[B, H, Nk, D]`` (CoPE counts gates sigmoid(q_i . k_j), DAPE runs an MLP over
  every head's q_i . k_j and base bias). Causal and bottom-right aligned like attention: query i is the
  (Nk - Nq + i)-th key; entries right of the causal diagonal are ignored, and no value left of it may depend on
  them. In a one-token step over a static cache (``posbench.model.generate.StaticCache``: Nq = 1, k holds every
  slot) a key whose position is ``posbench.model.generate.UNWRITTEN`` is an empty slot: its entry is ignored, and
  no other may depend on it. Such a bias cannot live in a fused kernel, so the class says ``bias_from_qk = True``:
  attention then runs on a backend that takes a tensor (eager, or SDPA with a float mask), ``auto`` picks SDPA,
  and an explicit request for another (flex, flash_attn) is a one-line ``BackendError``, raised when a run is
  configured (``posbench.model.attention.check_encoding_backend``) and again at the first forward pass of a model
  built by hand.

Padded batches (``model(tokens, attention_mask=...)``, ``posbench.model.padding``): the positions count each row's
real tokens, so a row's real tokens sit where they sit alone; ``init_state`` sees the token id ``PAD_TOKEN`` (-1) at
a pad, which is no token (Abacus: not a digit); attention never lets a real query see a pad. Pads lie before or
after a row's real tokens, never between two, so a bias computed from q and k needs nothing more: a padded key's
entry is ignored, and no key between a real key and its query is a pad. Read positions from ``positions``; an
encoding that counts tokens itself counts the pads.

The model calls ``bias`` with autocast off, so that no position or bias is computed in bfloat16. Positions are
``[B or 1, Nq]`` and ``[B or 1, Nk]`` (one row when every row of the batch shares them).

The encoding owns its parameters: the model initialises its own weights (N(0, model.init_std), 0.02 by default) and
never the encoding's, which keep PyTorch's module defaults unless ``init_weights`` sets them as their authors release
them (docs/encodings.md, "Initialisation as released"; a table added to the token embeddings may be drawn like them:
``embedding_std`` is their std, set by the model before it calls ``init_weights``); ``init_weights`` also freezes
(``requires_grad_(False)``) any parameter that can never reach the loss (TAPE's last layer), so that optimizers skip
it and DistributedDataParallel needs no per-step search for unused parameters.

Options are declared once, in ``OPTIONS`` (``posbench.options.Option``: default, help, valid range); they are
checked when the encoding is built (``Configurable.resolve``, constraints between options in ``check_options``),
and every resolved option is recorded in the model's config. An option only a task can give (Abacus's
``digit_ids``) is declared ``Option(..., from_task=True)``; the run configuration fills it from
``Task.encoding_context()``. Hooks receive the layer as a Python int; keep them free of graph breaks (no Python
``random``, no ``.item()``) so that a compiled model is one graph for all layers.
"""

from __future__ import annotations

import difflib
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from posbench.model.bias import ScoreBias
from posbench.model.config import ModelConfig
from posbench.options import Configurable
from posbench.registry import ENCODINGS



__all__ = ["ENCODINGS", "HOOKS", "PositionalEncoding", "rope_cos_sin", "rotate_half"]

#: the hooks the model calls, in the order it calls them (docs/extending.md has one line on each)
HOOKS = ("init_weights", "init_state", "embed", "rotate", "bias", "state_values", "after_attention", "after_mlp")


class PositionalEncoding(Configurable, nn.Module):
    """Base class: subclass it, set ``name``, declare ``OPTIONS`` and override the hooks you need."""

    kind: ClassVar[str] = "encoding"
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: ``bias`` returns a tensor computed from q and k: attention runs on eager or SDPA only
    bias_from_qk: ClassVar[bool] = False
    #: the encoding runs on one pass of the blocks only (TAPE: the state after the last layer is discarded, so that
    #: layer's update is frozen and skipped, which a second pass would need): a model of more recurrences is refused
    one_pass: ClassVar[bool] = False
    #: the options only a task can give (set automatically: those declared ``Option(..., from_task=True)``)
    task_context: ClassVar[tuple[str, ...]] = ()
    #: the options a task may give (``Option(..., from_task=True, task_optional=True)``): kept at their default
    #: where it gives none
    task_hints: ClassVar[tuple[str, ...]] = ()
    #: options under which an evaluation pass is a function of its input alone; the contract checks (and the
    #: shared property tests) build the encoding with them. RandPE: ``{"eval_random": False}`` (its evaluation
    #: draws random positions in every pass, so no two passes agree; its own tests check that path)
    deterministic_options: ClassVar[dict[str, Any]] = {}
    #: the std of the model's N(0, std) token embeddings (``ModelConfig.init_std``), which the model sets before it
    #: calls ``init_weights``: an encoding adding a learned table to them draws it alike (Abacus, as released); an
    #: encoding built without a model keeps ModelConfig's default
    embedding_std: float = ModelConfig.init_std

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_hook_names(cls)
        cls.task_context = tuple(key for key, o in cls.OPTIONS.items() if o.from_task and not o.task_optional)
        cls.task_hints = tuple(key for key, o in cls.OPTIONS.items() if o.from_task and o.task_optional)
        ENCODINGS.add_subclass(cls)

    def __init__(self, n_layers: int, n_heads: int, head_dim: int, d_model: int, max_seq_len: int,
                 **options: Any):
        super().__init__()
        self.n_layers, self.n_heads, self.head_dim = n_layers, n_heads, head_dim
        self.d_model, self.max_seq_len = d_model, max_seq_len
        self.options = self.resolve(options)     # the one check, as ``posbench run`` makes it before it writes

    # ---- hooks (defaults: no positional signal, state unchanged) -------------------------------------
    def init_weights(self) -> None:
        """Called once the model is built: the encoding's own inits (the model never initialises the encoding's
        parameters; PyTorch's module defaults stand unless this sets them), and freezing the
        parameters that can never reach the loss (``requires_grad_(False)``; they stay in the state dict)."""

    def init_state(self, positions: Tensor, tokens: Tensor, memory: dict[str, Tensor] | None) -> Any:
        """The positional state for token positions ``[B, N]`` (absolute, cache offset included) and token ids
        ``[B, N]``. ``memory``: the KV cache's dict for this encoding, kept between cached calls (None without a
        cache); read what earlier calls left, write what later ones need."""
        return None

    def embed(self, x: Tensor, state: Any) -> Tensor:
        """The input of the first layer from the token embeddings ``[B, N, d_model]``."""
        return x

    def rotate(self, layer: int, q: Tensor, k: Tensor, state: Any) -> tuple[Tensor, Tensor]:
        """Transform queries and keys ``[B, H, N, D]``."""
        return q, k

    def bias(self, layer: int, state: Any, q: Tensor, k: Tensor, q_pos: Tensor,
             k_pos: Tensor) -> ScoreBias | Tensor | None:
        """This layer's logit bias: a ``ScoreBias``, or (``bias_from_qk``) a tensor ``[B or 1, H, Nq, Nk]`` computed
        from the queries ``[B, H, Nq, D]`` and every key they may see ``[B, H, Nk, D]``; None for none (see the
        module docstring)."""
        return None

    def state_values(self, layer: int, state: Any) -> Tensor | None:
        """Extra channels ``[B, H, N, E]`` aggregated by the attention weights together with the values."""
        return None

    def after_attention(self, layer: int, state: Any, aggregated: Tensor | None) -> Any:
        """The state, updated from the aggregated extra channels ``[B, H, N, E]``."""
        return state

    def after_mlp(self, layer: int, state: Any, mlp_out: Tensor) -> Any:
        """The state, updated from the MLP's output ``[B, N, d_model]``."""
        return state

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items())


def check_hook_names(cls: type) -> None:
    """Refuse a method that looks like a misspelled hook (``embedd``, ``init_weight``): the model would never call
    it, and the encoding would silently put no signal in (NoPE). A ``TypeError`` naming the hook it resembles."""
    known = set(dir(nn.Module)) | set(dir(PositionalEncoding))
    for attr, value in cls.__dict__.items():
        if attr.startswith("_") or attr in known or not callable(value):
            continue
        close = difflib.get_close_matches(attr, HOOKS, n=1, cutoff=0.8)
        if close:
            raise TypeError(f"encoding '{cls.__dict__.get('name', cls.__qualname__)}' defines {attr}(), which looks "
                            f"like the hook {close[0]}() misspelled: the model calls only {', '.join(HOOKS)}; "
                            f"rename it (or name a helper less like a hook)")


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
