"""Attention backends: one function, several implementations, identical results.

``attend(q, k, v, bias, backend)``: q ``[B, H, Nq, D]``, k ``[B, H, Nk, D]``, v ``[B, H, Nk, Dv]`` (Dv may
exceed D: TAPE appends its state to the values), bias ``[B or 1, H, Nq, Nk]`` or None. Attention is causal
and bottom-right aligned: query i (the (Nk - Nq + i)-th token) sees keys 0..Nk - Nq + i, which is what a KV
cache needs. Scale 1/sqrt(D); softmax in float32 (at least) on the eager path.

- ``eager``: explicit scores and softmax; the reference every other backend is tested against.
- ``sdpa``: ``F.scaled_dot_product_attention`` (fused flash / memory-efficient kernels on GPU; the bias
  and the causal mask are folded into one float mask, since SDPA refuses both together).
- ``flex``: FlexAttention with the bias as a ``score_mod`` and a causal ``BlockMask``; compiled on CUDA.
  FlexAttention has no CPU backward, so it is valid on CPU for inference only.
- ``flash_attn``: the flash-attn package (CUDA, fp16/bf16, no bias); wide values are split into D-sized
  chunks, each aggregated with the same softmax.
- ``auto``: the fastest backend valid for the encoding, the device and whether gradients are needed.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from posbench.errors import UserError

BACKENDS: dict[str, Callable[..., Tensor]] = {}


class BackendError(UserError):
    """A backend that cannot run the requested attention; ``str()`` is one line."""


def backend(name: str):
    def register(fn):
        BACKENDS[name] = fn
        return fn
    return register


def causal_mask(nq: int, nk: int, device) -> Tensor:
    """Boolean ``[Nq, Nk]``: True where query i may attend key j (bottom-right aligned)."""
    return torch.ones(nq, nk, dtype=torch.bool, device=device).tril(diagonal=nk - nq)


@backend("eager")
def eager_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    dtype = torch.promote_types(q.dtype, torch.float32)      # float32 softmax for half types; float64 stays
    scores = (q @ k.transpose(-2, -1)).to(dtype) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias.to(dtype)
    scores = scores.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    return torch.softmax(scores, dim=-1).to(v.dtype) @ v


@backend("sdpa")
def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    nq, nk = q.shape[-2], k.shape[-2]
    if bias is None and nq == nk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if bias is None and nq == 1:
        return F.scaled_dot_product_attention(q, k, v)
    mask = causal_mask(nq, nk, q.device)
    if bias is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    float_mask = bias.to(q.dtype).masked_fill(~mask, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask)


_compiled_flex = None


@backend("flex")
def flex_attention_backend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    global _compiled_flex
    nq, nk, offset = q.shape[-2], k.shape[-2], k.shape[-2] - q.shape[-2]

    def causal(b, h, q_idx, kv_idx):
        return q_idx + offset >= kv_idx

    score_mod = None
    if bias is not None:
        batch_index = bias.shape[0] > 1

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + bias[b if batch_index else 0, h, q_idx, kv_idx]

    fn = flex_attention
    if q.is_cuda:
        _compiled_flex = _compiled_flex or torch.compile(flex_attention, dynamic=False)
        fn = _compiled_flex
    block_mask = create_block_mask(causal, None, None, nq, nk, device=q.device)
    return fn(q, k, v, score_mod=score_mod, block_mask=block_mask)


FLEX_AVAILABLE = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def flash_attn_available() -> bool:
    return importlib.util.find_spec("flash_attn") is not None and torch.cuda.is_available()


@backend("flash_attn")
def flash_attn_backend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    from flash_attn import flash_attn_func  # optional extra: pip install posbench[flash]

    if bias is not None:
        raise BackendError("flash_attn supports no logit bias")
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    d = q.shape[-1]
    chunks = [flash_attn_func(qt, kt, part.transpose(1, 2).contiguous(), causal=True)
              for part in v.split(d, dim=-1)]
    return torch.cat(chunks, dim=-1).transpose(1, 2)


def valid_backends(has_bias: bool, device: torch.device, needs_grad: bool) -> list[str]:
    """Backends that can run this attention; ``auto`` picks the first."""
    names = []
    if device.type == "cuda" and flash_attn_available() and not has_bias:
        names.append("flash_attn")
    names.append("sdpa")
    if FLEX_AVAILABLE and (device.type == "cuda" or not needs_grad):
        names.append("flex")
    names.append("eager")
    return names


def resolve_backend(name: str, has_bias: bool, device: torch.device, needs_grad: bool) -> str:
    valid = valid_backends(has_bias, device, needs_grad)
    if name == "auto":
        return valid[0]
    if name not in BACKENDS:
        raise BackendError(f"unknown attention backend '{name}'; valid: auto, {', '.join(sorted(BACKENDS))}")
    if name not in valid:
        why = "it needs flash-attn, CUDA and no logit bias" if name == "flash_attn" else \
              "FlexAttention has no backward on this device"
        raise BackendError(f"attention backend '{name}' cannot run here: {why}")
    return name


def attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, backend_name: str = "auto") -> Tensor:
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v) if t is not None)
    name = resolve_backend(backend_name, bias is not None, q.device, needs_grad)
    return BACKENDS[name](q, k, v, bias)
