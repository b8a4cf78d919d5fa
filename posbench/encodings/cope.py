"""CoPE (Golovneva et al. 2024, "Contextual Position Encoding: Learning to Count What's Important",
arXiv 2405.18719): positions counted by gates on q . k, read from learned position embeddings.

For query i and key j <= i of one head (Section 3 of the paper, Eq. 3-5):

    g_ij = sigmoid(q_i . k_j / sqrt(D))                      gates (Eq. 3)
    p_ij = sum_{t = j..i} g_it                               position of key j seen from query i (Eq. 4)
    e[p] = (p - floor(p)) e[ceil(p)] + (1 - p + floor(p)) e[floor(p)]    interpolated embedding (Eq. 5)
    a_ij = (q_i . k_j + q_i . e[p_ij]) / sqrt(D)              the logit (Eq. 6, with the code's scale)

so the logit bias this encoding adds is ``q_i . e[p_ij] / sqrt(D)``. Positions are fractional, lie in
[0, i - j + 1] and grow as the key moves away from the query; they are clamped to ``npos_max - 1``.

Where the paper leaves a choice open, this follows the released code (facebookresearch/RAM,
``projects/cope/src/cope/context_position.py``):
- the gates use the scaled logit q . k / sqrt(D) (the paper writes sigmoid(q^T k));
- the position logit is divided by sqrt(D) together with q . k (the code's default; ``--cope-nodiv`` off);
- positions are summed from the key to the query over the causally masked gates, and the interpolation is
  computed as the code does: the logits q . e[p] at every integer position p first (a ``[B, H, Nq, npos_max]``
  product), then each (i, j) gathers its floor and ceil entries and mixes them with weight p - floor(p) (the
  gradient reaches the gates through that weight);
- one table e of shape ``[D, npos_max]`` per layer, shared by the heads, zero-initialised (so a fresh CoPE model
  is NoPE); ``npos_max`` defaults to ``max_seq_len + 1`` (every position a training sequence can reach).

How it is computed (exactly that, with fewer passes over the N x N tensors): the scale goes on q before the
product; q and k are taken in reverse order, so the masked gates need one forward cumsum and the finished bias one
flip (the code flips the gates, sums and flips back); the table gets its last column repeated, so the upper
neighbour is read by gathering the same floor index from the table shifted by one (no ceil, no second index).

CoPE is the only position signal (the paper's language-model runs use it without RoPE), and the logits do not
depend on the token positions at all, only on q and k: shifting every position changes nothing. The bias is
computed from q and k (``bias_from_qk``): materialised ``[B, H, Nq, Nk]``, on ``sdpa``/``eager``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posbench.encodings.base import PositionalEncoding
from posbench.model.generate import UNWRITTEN
from posbench.options import Option, OptionError, at_least


def reversed_positions(reversed_logits: Tensor, npos_max: int) -> Tensor:
    """CoPE's positions with the queries and the keys both in reverse order: for the scaled logits
    ``R[i', j'] = l[Nq-1-i', Nk-1-j']`` the sum from the key to the query is a plain cumulative sum along j'
    (key j' is visible to query i' when j' >= i', bottom-right causal for any Nq <= Nk), clamped to
    ``npos_max - 1``; zero for the keys a query may not see."""
    gates = torch.sigmoid(reversed_logits).triu()
    return gates.cumsum(-1).clamp(max=npos_max - 1)


def interpolated_logits(pos_logits: Tensor, positions: Tensor) -> Tensor:
    """``pos_logits [B, H, Nq, npos + 1]`` (the logit at every integer position, the last one repeated) read at
    fractional ``positions`` ``[B, H, Nq, Nk]`` in [0, npos - 1]: the entries at floor(p) and floor(p) + 1
    mixed linearly, weight ``p - floor(p)`` on the upper one (the paper's floor / ceil interpolation: at an
    integer p the weight is 0)."""
    floor = positions.long()                                  # positions >= 0: truncation is floor
    low = pos_logits.gather(-1, floor)
    high = pos_logits[..., 1:].gather(-1, floor)              # the entry at floor + 1, without an index pass
    return torch.lerp(low, high, positions - floor)


class CoPE(PositionalEncoding):
    name = "cope"
    description = "contextual positions: gates sigmoid(q.k) counted from key to query, learned embeddings"
    bias_from_qk = True
    OPTIONS = {"npos_max": Option(0, "positions with an embedding (0: max_seq_len + 1); larger ones are clamped",
                                  at_least(0))}

    @classmethod
    def check_options(cls, options):
        if options["npos_max"] == 1:
            raise OptionError("encoding 'cope' option npos_max=1 is out of range: it must be 0 "
                              "(max_seq_len + 1) or at least 2")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.npos_max = self.options["npos_max"] or self.max_seq_len + 1
        self.pos_emb = nn.Parameter(torch.zeros(self.n_layers, self.head_dim, self.npos_max))

    def bias(self, layer: int, state, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        # Queries and keys in reverse order (a flip of [*, N, D], cheap): the sum from the key to the query is a
        # forward cumsum, and one flip of the finished bias puts it back (one N x N flip instead of two).
        # float32 at least, autocast or not: a position near 2048 in bf16 would keep no fraction at all
        dtype = torch.promote_types(q.dtype, torch.float32)
        with torch.autocast(q.device.type, enabled=False):
            q_rev = q.to(dtype).flip(-2) * (1.0 / math.sqrt(self.head_dim))
            logits = q_rev @ k.to(dtype).flip(-2).transpose(-2, -1)
            if q.shape[-2] == 1 and k_pos is not None:     # a static cache's one-token step: empty slots, no gate
                logits = logits.masked_fill((k_pos == UNWRITTEN).flip(-1)[:, None, None, :], float("-inf"))
            positions = reversed_positions(logits, self.npos_max)
            table = self.pos_emb[layer].to(dtype)
            table = torch.cat((table, table[:, -1:]), dim=-1)                 # [D, npos_max + 1]
            return interpolated_logits(q_rev @ table, positions).flip(-2, -1)
