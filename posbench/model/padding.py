"""Padded batches: rows of different lengths in one batch, each as if it ran alone.

``model(tokens, attention_mask=mask)``: ``mask [B, N]`` is 1 (True) for a real token and 0 for padding, as
transformers' ``attention_mask``. Padding goes before a row's first real token (left padding: what generation
needs, so that every row's last token is real) or after its last (right padding); a pad between two real tokens
is refused in one line. Then:

- positions come from the mask: a real token's position is the number of real tokens before it in its row (a
  KV cache's included), so row b's real tokens sit at 0, 1, 2, ... as they would alone; a pad's position is
  clamped to 0 and matters to nothing;
- attention: a real query sees the real keys up to itself only, never a pad; a pad query sees only the keys
  up to itself that are real, and itself (so that its row of weights is never empty: a softmax over no key is
  NaN, and a NaN value times a zero weight is NaN in every real row); its output is never read;
- ``init_state`` sees ``PAD_TOKEN`` (-1) as a pad's token id, so an encoding that reads tokens never takes a pad
  for a real one (Abacus: a pad is never a digit, whatever id the batch pads with);
- a KV cache keeps which of its keys are real (``key_mask``) and how many of each row are pads (``pads``), so
  that later calls continue every row's positions and never see its pads.

Because every real query sees exactly the keys it sees alone, at the same positions, and pads lie only before
or after a row's real tokens, a relative bias still reads the distance between two real tokens as the
difference of their indices: per-distance tables (FlexAttention, the static decoding cache) stay exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

#: the token id ``init_state`` sees at a padded place
PAD_TOKEN = -1


class PaddingError(ValueError):
    """A mask that is not a padding mask (wrong shape, or a pad between two real tokens); ``str()`` is one line."""


def real_tokens(attention_mask: Tensor | None, batch: int, n: int,
                cached_real: Tensor | None = None) -> tuple[Tensor | None, bool]:
    """The boolean mask ``[B, N]`` of real tokens (None when every token is real: no mask, or all ones, the
    unpadded path, unchanged) and whether a row ends with a pad. ``cached_real [B]``: whether each row already has
    a real token in a KV cache (a pad before this call's first real token then lies between two real ones).
    One host read."""
    if attention_mask is None:
        return None, False
    if attention_mask.shape != (batch, n):
        raise PaddingError(f"attention_mask of shape {tuple(attention_mask.shape)}: expected one 0 / 1 per token, "
                           f"{(batch, n)}")
    mask = attention_mask.bool()
    seen = mask.cummax(dim=1).values
    if cached_real is not None:
        seen = seen | cached_real[:, None]
    later = mask.flip(1).cummax(dim=1).values.flip(1)
    every, hole, trailing = torch.stack((mask.all(), (~mask & seen & later).any(),
                                         ~mask[:, -1:].all())).tolist()
    if hole:
        raise PaddingError("attention_mask has a pad between two real tokens of a row: pad on the left (for "
                           "generation) or on the right only")
    return (None if every else mask), bool(trailing)


def mask_positions(mask: Tensor, start: Tensor | int = 0) -> Tensor:
    """Positions ``[B, N]`` from a mask of real tokens: ``start`` (each row's real tokens already cached) plus the
    real tokens before each one; a pad gets the clamped count (0 before a row's first real token)."""
    counted = mask.long().cumsum(dim=1) - 1
    return (counted + (start.reshape(-1, 1) if isinstance(start, Tensor) else start)).clamp(min=0)


def visible_mask(nq: int, nk: int, device, key_mask: Tensor | None = None, start: int = 0,
                 end: int | None = None) -> Tensor:
    """Which keys the queries ``start..end`` (of ``nq``, bottom-right aligned over ``nk`` keys) may see: causal
    ``[Nq', Nk]``, and with ``key_mask [B, Nk]`` (True for a real key) ``[B, 1, Nq', Nk]``: a real key up to the
    query, or the query's own key (a pad query's only key before its row's first real token)."""
    end = nq if end is None else end
    own = torch.arange(start, end, device=device)[:, None] + (nk - nq)        # each query's own key index
    keys = torch.arange(nk, device=device)[None, :]
    causal = keys <= own
    if key_mask is None:
        return causal
    return causal & (key_mask[:, None, None, :] | (keys == own))


@dataclass
class CachePadding:
    """What a KV cache keeps of a padded batch: which keys are real ``[B, >= length]``, how many pads each row
    has ``[B]``, and whether a row ended with a pad (no token may follow it)."""

    key_mask: Tensor
    pads: Tensor
    ends_padded: bool = False

    def real_rows(self, length: int) -> Tensor:
        """Whether each row has a real token among the ``length`` cached ones ``[B]``."""
        return length - self.pads > 0


def check_continuation(padding: CachePadding | None, n: int) -> None:
    """Refuse tokens after a row that ended with a pad (right padding cannot be continued)."""
    if padding is not None and padding.ends_padded and n > 0:
        raise PaddingError("a row of the cached batch ended with a pad, so no token can follow it: pad on the "
                           "left to generate")


def extended(padding: CachePadding | None, length: int, mask: Tensor | None, n: int,
             trailing: bool) -> CachePadding | None:
    """A growing cache's padding after ``n`` more tokens whose mask is ``mask`` (None: all real); None while no
    token is padded (one concatenation per call: a bool per row and token)."""
    if mask is None and padding is None:
        return None
    reference = mask if mask is not None else padding.key_mask
    batch, device = reference.shape[0], reference.device
    old = padding.key_mask[:, :length] if padding is not None else \
        torch.ones(batch, length, dtype=torch.bool, device=device)
    new = mask if mask is not None else torch.ones(batch, n, dtype=torch.bool, device=device)
    added = (~new).sum(dim=1)
    return CachePadding(torch.cat((old, new), dim=1), added if padding is None else padding.pads + added, trailing)
