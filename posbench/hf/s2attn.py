"""LongLoRA's shifted sparse attention (S²-Attn, Chen et al. 2024), as a transformers attention function.

While training, the sequence of N tokens is cut into groups of G = ``ratio`` x N tokens (LongLoRA: 1/4) and
every token attends causally within its group only. Half of the heads use groups shifted by G/2, so
information flows between neighbouring groups. At evaluation (``module.training`` False) attention is the
model's full causal attention (``sdpa``), as in LongLoRA.

It is registered in transformers' ``AttentionInterface`` under :data:`S2_ATTENTION` and selected with
``model.set_attn_implementation(S2_ATTENTION)``; no library function is replaced.

One deliberate difference from LongLoRA's code: it shifts the second half of the heads with ``roll(-G/2)``,
so its last group holds the last G/2 tokens followed by the first G/2 tokens, and under its causal mask the
first G/2 tokens of the sequence attend to the last G/2 (future tokens leak into the loss). Here the
wrapped-around group is masked into its two halves, so the shifted heads' groups are exactly
``[0, G/2), [G/2, 3G/2), ..., [N - G/2, N)`` and attention stays causal.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from posbench.hf.loading import HFModelError

S2_ATTENTION = "posbench_s2attn"
DEFAULT_GROUP_RATIO = 0.25


def group_size(n: int, ratio: float) -> int:
    size = int(n * ratio)
    if size < 2 or size % 2 or n % size:
        raise HFModelError(f"S²-Attn needs the sequence length ({n}) to split into groups of an even size "
                           f"{ratio:g} x {n} = {n * ratio:g}; use a length divisible by {round(2 / ratio)}")
    return size


def _grouped(x: Tensor, g: int) -> Tensor:
    """``[B, h, N, D] -> [B * N/G, h, G, D]``."""
    b, h, n, d = x.shape
    return x.view(b, h, n // g, g, d).transpose(1, 2).reshape(b * (n // g), h, g, d)


def _ungrouped(x: Tensor, b: int) -> Tensor:
    """``[B * N/G, h, G, D] -> [B, h, N, D]``."""
    bg, h, g, d = x.shape
    return x.view(b, bg // b, h, g, d).transpose(1, 2).reshape(b, h, (bg // b) * g, d)


def shifted_groups_mask(n: int, g: int, device) -> Tensor:
    """Boolean ``[N/G, 1, G, G]`` for the shifted heads (after rolling by -G/2): causal in every group, and the
    last group (the last G/2 tokens, then the first G/2) split into its two halves."""
    causal = torch.ones(g, g, dtype=torch.bool, device=device).tril()
    mask = causal.expand(n // g, 1, g, g).clone()
    half = g // 2
    mask[-1, 0, half:, :half] = False        # the sequence's first tokens must not see its last ones
    return mask


def s2_attention(q: Tensor, k: Tensor, v: Tensor, ratio: float = DEFAULT_GROUP_RATIO,
                 scaling: float | None = None, dropout: float = 0.0) -> Tensor:
    """S²-Attn on ``[B, H, N, D]`` (keys and values already one per query head) -> ``[B, H, N, Dv]``."""
    b, h, n, _ = q.shape
    g = group_size(n, ratio)
    half = h // 2
    plain = F.scaled_dot_product_attention(_grouped(q[:, :half], g), _grouped(k[:, :half], g),
                                           _grouped(v[:, :half], g), is_causal=True, scale=scaling,
                                           dropout_p=dropout)
    shifted = [t[:, half:].roll(-g // 2, dims=2) for t in (q, k, v)]
    mask = shifted_groups_mask(n, g, q.device).repeat(b, 1, 1, 1)
    moved = F.scaled_dot_product_attention(*(_grouped(t, g) for t in shifted), attn_mask=mask, scale=scaling,
                                           dropout_p=dropout)
    moved = _ungrouped(moved, b).roll(g // 2, dims=2)
    return torch.cat((_ungrouped(plain, b), moved), dim=1)


def s2_attention_forward(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                         dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """The ``AttentionInterface`` entry: S²-Attn in training, the model's full ``sdpa`` attention otherwise."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward  # transformers: Llama only

    if not module.training:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if attention_mask is not None or key.shape[-2] != query.shape[-2]:
        raise HFModelError("S²-Attn trains on whole unpadded sequences (no attention mask, no KV cache)")
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    ratio = getattr(module, "s2_group_ratio", DEFAULT_GROUP_RATIO)
    out = s2_attention(query, key, value, ratio, scaling, dropout)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register the function in transformers' ``AttentionInterface`` (idempotent); returns its name."""
    from transformers import AttentionInterface  # transformers: only a LongLoRA run needs it

    AttentionInterface.register(S2_ATTENTION, s2_attention_forward)
    return S2_ATTENTION
