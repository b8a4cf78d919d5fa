"""Attention backends: one function, several implementations, identical results.

``attend(q, k, v, bias, backend, q_pos=..., k_pos=...)``: q ``[B, H, Nq, D]``, k ``[B, H, Nk, D]``, v
``[B, H, Nk, Dv]`` (Dv may exceed D: TAPE appends its state to the values). ``bias`` is None, a
``posbench.model.bias.ScoreBias`` (an element-wise function of head and positions; then ``q_pos [B or 1, Nq]`` and
``k_pos [B or 1, Nk]`` are required) or a tensor ``[B or 1, H, Nq, Nk]``. Attention is causal and
bottom-right aligned: query i (the (Nk - Nq + i)-th token) sees keys 0..Nk - Nq + i, which is what a KV cache
needs. Scale 1/sqrt(D); softmax in float32 (at least) on the eager path.

- ``eager``: explicit scores and softmax; the reference every other backend is tested against.
- ``sdpa``: ``F.scaled_dot_product_attention`` (fused flash / memory-efficient kernels on GPU); a bias is
  materialised and folded with the causal mask into one float mask (SDPA refuses both together). On a CPU,
  from two blocks of ``CAUSAL_BLOCK`` queries up, the queries go in blocks, each attending only the keys it
  may see (``posbench.model.query_blocks``): with a bias, always (the bias of each block's rows only, plain
  operations with a hand-written backward, so a learned bias gets its gradient without SDPA's math kernel);
  without one, when the values are wider than the keys (TAPE), which would leave the flash kernel for the
  math kernel over every score.
- ``sdpa_split``: SDPA once per D-wide slice of wide values, so that each call has equal q / k / v widths
  (the flash kernel's condition); the same softmax aggregates every slice.
- ``flex``: FlexAttention with a causal ``BlockMask``; a ``ScoreBias`` is evaluated inside the kernel as a
  ``score_mod`` (no sequence x sequence tensor, gradients to the encoding's tensors). Compiled on CUDA;
  FlexAttention has no CPU backward, so on CPU it is valid for inference only. Queries and keys are padded
  to a multiple of ``FLEX_BLOCK`` (the padded keys masked by the block mask, the padded query rows sliced
  off): FlexAttention's kernels return wrong values, or NaN gradients, at other lengths (pytorch/pytorch
  #159247, #153799), and posbench's batches come at any length.
- ``flash_attn``: the flash-attn package (CUDA, fp16/bf16, no bias); wide values split as ``sdpa_split``.
- ``auto``: the fastest backend valid for the bias, the device, the head size and whether gradients are needed.

A contextual bias (``contextual=True``: CoPE's and DAPE's, computed from q and k by the encoding) exists only
as a tensor that carries gradients to q and k; no fused kernel can take it, so it runs on ``sdpa`` (a float
mask), ``sdpa_split`` or ``eager`` (``CONTEXTUAL_BACKENDS``; ``auto`` picks ``sdpa``), and a request for
``flex`` or ``flash_attn`` is a one-line error: when the run is configured (``check_encoding_backend``), and
again if a model built by hand gets there.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import math
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from posbench.model.bias import ScoreBias, table_score_mod, tensor_score_mod
from posbench.errors import UserError
from posbench.model.config import BACKEND_NAMES
from posbench.model.padding import visible_mask
from posbench.model.query_blocks import CAUSAL_BLOCK, biased_query_blocks, causal_mask, causal_query_blocks

Bias = ScoreBias | Tensor | None
BACKENDS: dict[str, Callable[..., Tensor]] = {}

FLEX_AVAILABLE = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None
FLASH_ATTN_INSTALLED = importlib.util.find_spec("flash_attn") is not None
#: FlexAttention's default block size; every length it is given is padded to a multiple of it
FLEX_BLOCK = 128
#: FlexAttention's smallest head size on CUDA (``tl.dot`` needs 16)
FLEX_MIN_HEAD_DIM = 16
#: below this many queries (decoding) a bias is materialised for SDPA: a [B, H, Nq, Nk] sliver is cheap, and a
#: compiled flex kernel per cache length would recompile at every token
FLEX_MIN_QUERIES = 16
#: tile sizes for FlexAttention's Triton kernels on CUDA. Inductor's defaults are picked from the head size alone:
#: on an H100 (torch 2.11) its bf16 forward tile for head size 64, 128 x 128, asked for 240 KiB of shared memory
#: with a captured bias table (227 KiB is the limit), in training and in no-grad evaluation alike, and its backward
#: tiles overflow once the values are wider or the score_mod reads learnable tables. These fit (forward 128 x 64,
#: as Inductor's own head-size-128 tile; backward 32/64 with BLOCK_N1 % BLOCK_M1 == 0, BLOCK_M2 % BLOCK_N2 == 0).
#: ``POSBENCH_FLEX_OPTIONS`` (JSON) replaces them, for tuning on a new GPU.
FLEX_KERNEL_OPTIONS = {"fwd_BLOCK_M": 128, "fwd_BLOCK_N": 64,
                       "bwd_BLOCK_M1": 32, "bwd_BLOCK_N1": 64, "bwd_BLOCK_M2": 64, "bwd_BLOCK_N2": 32}
#: ``auto`` on CUDA hands a bias to SDPA as a materialised [heads, Nq, Nk] tensor up to this many scores per
#: layer, and evaluates it inside FlexAttention above. Measured on an H100 (bf16, 12 x 768, results/reference/
#: gpu-h100-2026-11-27): at 16 x 1024 (12.6M scores) flex took 86.9 ms (ALiBi), 297 (T5), 3,077 (FIRE) where
#: SDPA took 75.1, 114, 103 (2026-11-22): flex's backward into captured learnable tables is slow; at 1 x 8192
#: (805M scores) flex took 96.6 and 218 where SDPA took 168 and 1,648 (and FIRE ran out of memory). The crossover
#: between the two was not measured: 2^26 (256 MiB of float32 per layer) sits between them.
SDPA_BIAS_MAX_SCORES = 2 ** 26
#: the backends that take a bias computed from q and k (a tensor with gradients to q and k), fastest first
CONTEXTUAL_BACKENDS = ("sdpa", "sdpa_split", "eager")
CONTEXTUAL_WHY = (f"the encoding's logit bias is computed from the queries and keys, so it exists only as a "
                  f"tensor (valid: auto, {', '.join(CONTEXTUAL_BACKENDS)})")


class BackendError(UserError):
    """A backend that cannot run the requested attention; ``str()`` is one line."""


def backend(name: str):
    if name not in BACKEND_NAMES:       # ModelConfig's choices name every backend (model/config.py)
        raise ValueError(f"attention backend {name!r} is not in posbench.model.config.BACKEND_NAMES")

    def register(fn):
        BACKENDS[name] = fn
        return fn
    return register


def as_tensor(bias: Bias, q: Tensor, q_pos: Tensor | None, k_pos: Tensor | None) -> Tensor | None:
    """A materialised bias ``[B or 1, H, Nq, Nk]`` (or None)."""
    if isinstance(bias, ScoreBias):
        check_positions(bias, q_pos, k_pos)
        return bias.materialise(q.shape[1], q_pos, k_pos)
    return bias


def check_positions(bias: Bias, q_pos: Tensor | None, k_pos: Tensor | None) -> None:
    if isinstance(bias, ScoreBias) and (q_pos is None or k_pos is None):
        raise ValueError("a ScoreBias needs q_pos and k_pos")


@backend("eager")
def eager_attention(q: Tensor, k: Tensor, v: Tensor, bias: Bias, q_pos=None, k_pos=None, key_mask=None) -> Tensor:
    nq, nk = q.shape[-2], k.shape[-2]
    visible = causal_mask(nq, nk, q.device) if key_mask is None else visible_mask(nq, nk, q.device, key_mask)
    return masked_attention(q, k, v, as_tensor(bias, q, q_pos, k_pos), visible)


def masked_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, visible: Tensor) -> Tensor:
    """Explicit scores, plus the bias, keys where ``visible`` is False masked, softmax, values: scores, bias and
    softmax in float32 at least (a bias is never rounded to a half type)."""
    return softmax_weights(q, k, bias, visible).to(v.dtype) @ v


def softmax_weights(q: Tensor, k: Tensor, bias: Tensor | None, visible: Tensor) -> Tensor:
    """The weights ``masked_attention`` aggregates the values by ``[B, H, Nq, Nk]``, in float32 at least."""
    return torch.softmax(attention_logits(q, k, bias).masked_fill(~visible, float("-inf")), dim=-1)


def attention_logits(q: Tensor, k: Tensor, bias: Tensor | None) -> Tensor:
    """The attention logits ``q . k / sqrt(D)`` plus the bias (a tensor), in float32 at least (float32 softmax for
    half types; float64 stays; a bias is never rounded to a half type), before the causal mask."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    logits = (q @ k.transpose(-2, -1)).to(dtype) / math.sqrt(q.shape[-1])
    return logits + bias.to(dtype) if bias is not None else logits


def attention_weights(q: Tensor, k: Tensor, bias: Bias, q_pos: Tensor | None = None, k_pos: Tensor | None = None,
                      key_mask: Tensor | None = None) -> Tensor:
    """The attention weights of one call of ``attend`` with these arguments ``[B, H, Nq, Nk]``, in q's dtype: the
    eager backend's (every backend computes the same weights, up to rounding), zero on every key a query does not
    see (a later one, a pad). What a Hugging Face model returns for ``output_attentions=True``."""
    nq, nk = q.shape[-2], k.shape[-2]
    visible = causal_mask(nq, nk, q.device) if key_mask is None else visible_mask(nq, nk, q.device, key_mask)
    return softmax_weights(q, k, as_tensor(bias, q, q_pos, k_pos), visible).to(q.dtype)


def slot_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, q_slots: Tensor,
                   key_mask: Tensor | None = None) -> Tensor:
    """Queries at key indices ``q_slots [Nq]`` (a device tensor) over every slot of a static cache ``k [B, H, C,
    D]``: key j is visible to query i when j <= q_slots[i] (and, in a padded batch, ``key_mask [B, C]`` says it
    is a real token, or it is the query's own). The shapes never change with the slots, so one compiled graph
    serves every decoding step; explicit scores (gpt-fast decodes with the math path too)."""
    slots = torch.arange(k.shape[-2], device=k.device)
    visible = slots <= q_slots[:, None]
    if key_mask is not None:
        visible = visible & (key_mask[:, None, None, :] | (slots == q_slots[:, None]))
    return masked_attention(q, k, v, bias, visible)


def low_precision(t: Tensor) -> bool:
    return t.is_floating_point() and t.element_size() < 4


@backend("sdpa")
def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, bias: Bias, q_pos=None, k_pos=None, key_mask=None) -> Tensor:
    nq, nk = q.shape[-2], k.shape[-2]
    if bias is not None and (q.device.type == "cpu" or low_precision(q)) and nq >= 2 * CAUSAL_BLOCK:
        check_positions(bias, q_pos, k_pos)
        return biased_query_blocks(q, k, v, bias, q_pos, k_pos, nq // CAUSAL_BLOCK, key_mask)
    if bias is not None and low_precision(q):   # SDPA takes a float mask in q's dtype only: the bias would be
        return eager_attention(q, k, v, bias, q_pos, k_pos, key_mask)   # rounded to bf16 (0.125 apart at 16..32)
    bias = as_tensor(bias, q, q_pos, k_pos)
    if bias is None and nq == nk and q.device.type == "cpu" and v.shape[-1] != q.shape[-1] and nq >= 2 * CAUSAL_BLOCK:
        return causal_query_blocks(q, k, v, min(8, nq // CAUSAL_BLOCK), key_mask)
    if key_mask is not None:                    # a padded batch: the real keys only (posbench.model.padding)
        visible = visible_mask(nq, nk, q.device, key_mask)
        if bias is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=visible)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype).masked_fill(~visible, float("-inf")))
    if bias is None and nq == nk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if bias is None and nq == 1:
        return F.scaled_dot_product_attention(q, k, v)
    mask = causal_mask(nq, nk, q.device)
    if bias is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    float_mask = bias.to(q.dtype).masked_fill(~mask, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask)


@backend("sdpa_split")
def sdpa_split_attention(q: Tensor, k: Tensor, v: Tensor, bias: Bias, q_pos=None, k_pos=None,
                         key_mask=None) -> Tensor:
    d = q.shape[-1]
    if v.shape[-1] == d or v.shape[-1] % d:
        return sdpa_attention(q, k, v, bias, q_pos, k_pos, key_mask)
    bias = as_tensor(bias, q, q_pos, k_pos)
    return torch.cat([sdpa_attention(q, k, part, bias, key_mask=key_mask) for part in v.split(d, dim=-1)], dim=-1)


def padded(n: int) -> int:
    """``n`` rounded up to a multiple of ``FLEX_BLOCK``."""
    return -(-n // FLEX_BLOCK) * FLEX_BLOCK


@functools.lru_cache(maxsize=64)
def _cached_block_mask(nq: int, nk: int, device: str):
    return causal_block_mask(nq, nk, device)


def causal_mask_mod(nq: int, nk: int, key_mask: Tensor | None = None):
    """The causal ``mask_mod`` of ``nq`` queries over ``nk`` keys (bottom-right aligned), on the padded grid:
    padded keys are never seen; padded query rows see the real keys (their outputs are sliced off). With
    ``key_mask [B, Nk]`` (a padded batch, ``posbench.model.padding``) a query sees only real keys and its own."""
    offset = nk - nq

    def causal(b, h, q_idx, kv_idx):
        return (q_idx + offset >= kv_idx) & (kv_idx < nk)
    if key_mask is None:
        return causal
    real = pad_rows(key_mask, padded(nk), -1)          # False past the last key

    def causal_real(b, h, q_idx, kv_idx):
        return causal(b, h, q_idx, kv_idx) & (real[b, kv_idx] | (q_idx + offset == kv_idx))
    return causal_real


def causal_block_mask(nq: int, nk: int, device, key_mask: Tensor | None = None):
    """The ``BlockMask`` of ``causal_mask_mod``, built from block indices: which key blocks each query block sees
    whole (below the diagonal) and which in part (the diagonal's), from the blocks' first and last rows and keys,
    so nothing of size Nq x Nk is made (``create_block_mask`` evaluates the mask on every pair: N x N
    temporaries, +717 MiB at 8,192 tokens). The same block lists as ``create_block_mask``. With ``key_mask`` every
    block it sees is partial (a block may hold pads: its ``mask_mod`` decides)."""
    offset = nk - nq
    rows = torch.arange(0, padded(nq), FLEX_BLOCK, device=device)[:, None]      # each query block's first row
    keys = torch.arange(0, padded(nk), FLEX_BLOCK, device=device)[None, :]      # each key block's first key
    some = (keys <= rows + FLEX_BLOCK - 1 + offset) & (keys < nk)    # its first key seen by the block's last row
    whole = (keys + FLEX_BLOCK - 1 <= rows + offset) & (keys + FLEX_BLOCK - 1 < nk)   # its last key by the first
    if key_mask is not None:
        whole = torch.zeros_like(whole)
    partial = some & ~whole
    return BlockMask.from_kv_blocks(*block_lists(partial), *block_lists(whole), BLOCK_SIZE=FLEX_BLOCK,
                                    mask_mod=causal_mask_mod(nq, nk, key_mask), seq_lengths=(padded(nq), padded(nk)))


def block_lists(dense: Tensor) -> tuple[Tensor, Tensor]:
    """A ``[Q, K]`` block-level mask as FlexAttention's lists: the count of key blocks per query block ``[1, 1,
    Q]`` and their indices in ascending order first ``[1, 1, Q, K]`` (int32)."""
    count = dense.sum(-1, dtype=torch.int32)
    order = torch.argsort((~dense).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return count[None, None], order[None, None]


def pad_rows(x: Tensor, length: int, dim: int = -2) -> Tensor:
    """``x`` zero-padded along ``dim`` to ``length``."""
    missing = length - x.shape[dim]
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat((x, x.new_zeros(shape)), dim=dim)


def pad_positions(pos: Tensor, length: int) -> Tensor:
    """Positions ``[B or 1, N]`` extended to ``length`` by repeating the last one (a padded index then reads
    a valid entry of every table a ``score_mod`` gathers from)."""
    missing = length - pos.shape[-1]
    return pos if missing == 0 else torch.cat((pos, pos[:, -1:].expand(-1, missing)), dim=-1)


def bias_rows(bias: Bias, q_pos: Tensor | None, k_pos: Tensor | None) -> int:
    """The batch rows of ``bias`` once materialised for SDPA: a tensor's own; a ``ScoreBias`` has one per row of
    positions (1 for the model's own, shared positions)."""
    if isinstance(bias, Tensor):
        return bias.shape[0]
    if isinstance(bias, ScoreBias) and q_pos is not None and k_pos is not None:
        return max(q_pos.shape[0], k_pos.shape[0])
    return 1


def flex_kernel_options(dtype: torch.dtype | None = None, head_dim: int = 64) -> dict:
    """``POSBENCH_FLEX_OPTIONS`` when set; else ``FLEX_KERNEL_OPTIONS``, whose forward tile is for what was measured
    (float16 / bfloat16, head size up to 128): elsewhere Inductor's own forward tile stands."""
    text = os.environ.get("POSBENCH_FLEX_OPTIONS")
    if not text:
        measured = dtype in HALF_DTYPES and head_dim <= 128
        return {k: v for k, v in FLEX_KERNEL_OPTIONS.items() if measured or not k.startswith("fwd_")}
    try:
        options = json.loads(text)
    except ValueError:
        raise BackendError(f"POSBENCH_FLEX_OPTIONS is not JSON: {text!r}") from None
    if not isinstance(options, dict):
        raise BackendError("POSBENCH_FLEX_OPTIONS must be a JSON object of FlexAttention kernel options")
    return options


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    return torch.compile(flex_attention)


def flex_function(cuda: bool):
    """Compiled FlexAttention on CUDA; the plain function inside a compiled model (whose compilation captures
    it) and on a CPU (its eager reference: posbench never compiles FlexAttention for a CPU)."""
    return _compiled_flex() if cuda and not torch.compiler.is_compiling() else flex_attention


@backend("flex")
def flex_attention_backend(q: Tensor, k: Tensor, v: Tensor, bias: Bias, q_pos=None, k_pos=None,
                           aligned: bool = False, key_mask=None) -> Tensor:
    nq, nk = q.shape[-2], k.shape[-2]
    pq, pk = padded(nq), padded(nk)
    compiling = torch.compiler.is_compiling()
    if compiling or key_mask is not None:
        block_mask = causal_block_mask(nq, nk, q.device, key_mask)
    else:
        block_mask = _cached_block_mask(nq, nk, str(q.device))
    if isinstance(bias, ScoreBias) and bias.relative and aligned:    # one table read per score
        score_mod = table_score_mod(bias.distance_table(q.shape[1], nk, q.device), nk - nq)
    elif isinstance(bias, ScoreBias):
        score_mod = bias.score_mod(pad_positions(q_pos, pq), pad_positions(k_pos, pk))
    elif bias is not None:
        score_mod = tensor_score_mod(pad_rows(pad_rows(bias, pk, -1), pq, -2))
    else:
        score_mod = None
    options = flex_kernel_options(q.dtype, q.shape[-1]) if q.is_cuda else None
    fn = flex_function(q.is_cuda)
    out = fn(pad_rows(q, pq), pad_rows(k, pk), pad_rows(v, pk), score_mod=score_mod, block_mask=block_mask,
             kernel_options=options)
    return out[..., :nq, :]


def flash_attn_available() -> bool:
    return FLASH_ATTN_INSTALLED and torch.cuda.is_available()


@backend("flash_attn")
def flash_attn_backend(q: Tensor, k: Tensor, v: Tensor, bias: Bias, q_pos=None, k_pos=None, key_mask=None) -> Tensor:
    if bias is not None:
        raise BackendError("flash_attn supports no logit bias")
    if key_mask is not None:
        raise BackendError("flash_attn takes no padded batch (attention_mask): use sdpa or flex")
    from flash_attn import flash_attn_func  # optional extra: pip install posbench[flash]

    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    d = q.shape[-1]
    chunks = [flash_attn_func(qt, kt, part.transpose(1, 2).contiguous(), causal=True)
              for part in v.split(d, dim=-1)]
    return torch.cat(chunks, dim=-1).transpose(1, 2)


#: the dtypes flash_attn_func takes
HALF_DTYPES = (torch.float16, torch.bfloat16)


def valid_backends(has_bias: bool, device: torch.device, needs_grad: bool, head_dim: int = 64,
                   value_dim: int | None = None, n_queries: int | None = None, contextual: bool = False,
                   padded_batch: bool = False, dtype: torch.dtype | None = None,
                   scores: int | None = None) -> list[str]:
    """Backends that can run this attention, fastest first; ``auto`` picks the first. ``contextual``: the bias
    is a tensor computed from q and k (only backends that take a materialised bias); ``padded_batch``: a key mask
    (not flash_attn); ``dtype``: the tensors' (flash_attn takes float16 and bfloat16 only; None: not known);
    ``scores``: heads x queries x keys, a materialised bias's size per layer (None: not known, taken as large)."""
    if contextual:
        return list(CONTEXTUAL_BACKENDS)
    value_dim = head_dim if value_dim is None else value_dim
    cuda = device.type == "cuda"
    flex_ok = FLEX_AVAILABLE and (cuda or not needs_grad) and \
        (not cuda or min(head_dim, value_dim) >= FLEX_MIN_HEAD_DIM)
    names = []
    half = dtype is None or dtype in HALF_DTYPES
    if cuda and half and flash_attn_available() and not has_bias and not padded_batch:
        names.append("flash_attn")
    large = scores is None or scores > SDPA_BIAS_MAX_SCORES
    if cuda and has_bias and flex_ok and large and (n_queries is None or n_queries >= FLEX_MIN_QUERIES):
        names.append("flex")                          # the bias inside the kernel: no N x N tensor
    names += ["sdpa", "sdpa_split"]
    if flex_ok and "flex" not in names:
        names.append("flex")
    names.append("eager")
    return names


def resolve_backend(name: str, has_bias: bool, device: torch.device, needs_grad: bool, head_dim: int = 64,
                    value_dim: int | None = None, n_queries: int | None = None, contextual: bool = False,
                    padded_batch: bool = False, dtype: torch.dtype | None = None, scores: int | None = None) -> str:
    valid = valid_backends(has_bias, device, needs_grad, head_dim, value_dim, n_queries, contextual, padded_batch,
                           dtype, scores)
    if name == "auto":
        return valid[0]
    if name not in BACKENDS:
        raise BackendError(f"unknown attention backend '{name}'; valid: auto, {', '.join(sorted(BACKENDS))}")
    if name not in valid:
        if contextual:
            why = CONTEXTUAL_WHY
        elif name == "flash_attn":
            why = "it needs flash-attn, CUDA, float16 or bfloat16, no logit bias and no padded batch"
        elif device.type == "cuda":
            why = f"FlexAttention needs a head size of at least {FLEX_MIN_HEAD_DIM} on CUDA"
        else:
            why = "FlexAttention has no backward on this device"
        raise BackendError(f"attention backend '{name}' cannot run here: {why}")
    return name


def check_encoding_backend(name: str, encoding: str, contextual: bool) -> None:
    """Refuse, before anything runs, a backend that can never take this encoding's bias (a contextual bias on
    ``flex`` or ``flash_attn``); a one-line ``BackendError``."""
    if contextual and name != "auto" and name not in CONTEXTUAL_BACKENDS:
        raise BackendError(f"attention backend '{name}' cannot run encoding '{encoding}': {CONTEXTUAL_WHY}")


def attend(q: Tensor, k: Tensor, v: Tensor, bias: Bias = None, backend_name: str = "auto", *,
           q_pos: Tensor | None = None, k_pos: Tensor | None = None, contextual: bool = False,
           aligned: bool = False, key_mask: Tensor | None = None) -> Tensor:
    """``contextual``: ``bias`` is a tensor computed from q and k (see the module docstring). ``aligned``: the
    positions are consecutive and bottom-right aligned (query i at key Nk - Nq + i, the model's own positions),
    so FlexAttention reads a relative ``ScoreBias`` from a per-distance table, and the other backends materialise
    it as a Toeplitz matrix without reading the positions on the host (not in a padded batch, whose pads sit at
    position 0). ``key_mask [B, Nk]``: a padded batch's real keys (``posbench.model.padding``: a query sees the
    real keys only, a pad query also its own)."""
    needs_grad = torch.is_grad_enabled() and (
        any(t.requires_grad for t in (q, k, v)) or
        (isinstance(bias, Tensor) and bias.requires_grad) or
        (isinstance(bias, ScoreBias) and any(t.requires_grad for t in bias.tensors)))
    name = resolve_backend(backend_name, bias is not None, q.device, needs_grad, q.shape[-1], v.shape[-1],
                           q.shape[-2], contextual, key_mask is not None, q.dtype,
                           bias_rows(bias, q_pos, k_pos) * q.shape[1] * q.shape[-2] * k.shape[-2])
    if name == "flex":
        return flex_attention_backend(q, k, v, bias, q_pos, k_pos, aligned, key_mask)
    if aligned and key_mask is None and isinstance(bias, ScoreBias) and not torch.compiler.is_compiling():
        # laid out by distance without reading the positions (a padded row's are not consecutive: pads sit at 0)
        bias = dataclasses.replace(bias, consecutive_positions=True)
    return BACKENDS[name](q, k, v, bias, q_pos, k_pos, key_mask=key_mask)
