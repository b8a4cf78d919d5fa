"""What each attention head attends to: statistics of the scores a model really uses, accumulated over many
contexts in blocks of queries.

``HeadStats`` receives, for one attention call (one layer of one pass), what the model's attention receives
(``posbench.model.transformer.Attention.observer``): the queries and keys after the encoding rotated them (RoPE,
xPos, TAPE's per-token rotations), and the encoding's bias (a ``ScoreBias``: ALiBi, T5, FIRE, KERPLE, Sandwich; or
a tensor computed from q and k: CoPE's gates, DAPE's MLP). The logit of query i and key j is
``q_i . k_j / sqrt(D) + bias_ij`` over the keys ``j <= i`` (causal), exactly what every backend computes. The
queries go in blocks of ``block``: memory is O(heads x block x length), never a length x length tensor per head
(a contextual bias is the encoding's own tensor, made by the model whatever the analysis does).

Per head, with ``d = i - j`` the distance of a key, ``p_ij`` the attention weights, and means over every query of
every context (``n_queries``):

* ``mass``: the mean attention mass at each distance bucket (``posbench.evaluation.positions.bucket_edges``: every
  distance below 12 its own bucket, then 8 buckets an octave); each query's masses add up to 1;
* ``mean_distance``: the mean over queries of ``sum_j p_ij d_ij``;
* ``entropy``: the mean over queries i >= 1 of ``H(p_i) / log(i + 1)``, the entropy over its largest possible
  value (1: uniform over the visible keys; 0: one key);
* ``first_token``: the mean mass on key 0 (the first token of the window);
* ``beyond_train``: the mean mass on keys farther than the training length ``T`` (``d >= T``), over the queries
  that see such keys (i >= T); None where no query does (windows of at most T tokens);
* ``rigidity``: the share of the logits' variance around each query's mean (softmax ignores that mean) that a
  function of the distance alone explains, over all contexts. Fitted as the two-way least-squares model
  ``s_ij = a_i + g(d_ij) + e_ij`` (a free shift per query, one value per distance): with ``c_ij`` the logits
  centred per query over its visible keys, the fit is ``g = M^+ S`` where ``S_d`` is the sum of ``c_ij`` over the
  pairs at distance d and ``M`` depends on the queries' numbers of visible keys alone (``distance_gram``), and
  ``rigidity = S^T M^+ S / sum c_ij^2``. A pure distance pattern (``s_ij = a_i + f(d)``) gives exactly 1, logits
  that do not depend on distance give about ``(T - 1) / pairs`` (the noise a fit of T values absorbs), and a query
  whose keys all have the same logit adds nothing to either sum. Removing each query's mean and averaging by
  distance would not give 1 for a pure pattern: the causal windows have different sizes, so the per-query shift
  and the distance term must be fitted together.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from posbench.evaluation.positions import bucket_edges, bucket_index
from posbench.model.attention import attention_logits
from posbench.model.bias import ScoreBias

BLOCK = 128


@dataclass
class HeadStats:
    """The sums behind one attention call's statistics (one layer of one pass), over every context seen."""

    heads: int
    length: int                      # keys per context (the window)
    train_length: int
    block: int = BLOCK
    mass: Tensor = field(init=False)
    distance: Tensor = field(init=False)
    entropy: Tensor = field(init=False)
    first: Tensor = field(init=False)
    beyond: Tensor = field(init=False)
    centred_by_distance: Tensor = field(init=False)
    centred_squares: Tensor = field(init=False)
    queries: Tensor = field(init=False)              # how many queries at each index i (over contexts)

    def __post_init__(self):
        self.edges = bucket_edges(self.length)
        self.bucket_of = bucket_index(self.length)
        n_buckets = len(self.edges) - 1
        f64 = torch.float64
        self.mass = torch.zeros(self.heads, n_buckets, dtype=f64)
        self.distance = torch.zeros(self.heads, dtype=f64)
        self.entropy = torch.zeros(self.heads, dtype=f64)
        self.first = torch.zeros(self.heads, dtype=f64)
        self.beyond = torch.zeros(self.heads, dtype=f64)
        self.centred_by_distance = torch.zeros(self.heads, self.length, dtype=f64)
        self.centred_squares = torch.zeros(self.heads, dtype=f64)
        self.queries = torch.zeros(self.length, dtype=f64)

    def add(self, q: Tensor, k: Tensor, bias: ScoreBias | Tensor | None, q_pos: Tensor, k_pos: Tensor) -> None:
        """One call's queries ``[B, H, N, D]`` over its keys ``[B, H, N, D]`` (self-attention of a window)."""
        b, h, n, dim = q.shape
        if k.shape[2] != n or n != self.length:
            raise ValueError(f"the analysis reads self-attention over windows of {self.length} tokens, got "
                             f"{n} queries and {k.shape[2]} keys")
        device = q.device
        bucket_of = self.bucket_of.to(device)
        for start in range(0, n, self.block):
            end = min(n, start + self.block)
            logits = logits_of(q, k, bias, q_pos, k_pos, start, end).double()        # [B, H, b, N]
            i = torch.arange(start, end, device=device)[:, None]
            j = torch.arange(n, device=device)[None, :]
            visible = j <= i
            d = (i - j).clamp(min=0)
            self._add_block(logits, visible, d, i, bucket_of)

    def _add_block(self, logits: Tensor, visible: Tensor, d: Tensor, i: Tensor, bucket_of: Tensor) -> None:
        b, h, rows, n = logits.shape
        masked = logits.masked_fill(~visible, float("-inf"))
        p = torch.softmax(masked, dim=-1)                                             # 0 where not visible
        visible_keys = (i[:, 0] + 1).to(p.dtype)                                       # [rows]
        entropy = -torch.special.xlogy(p, p).sum(-1)                                   # [B, H, rows]
        several = visible_keys > 1
        self.entropy += (entropy[..., several] / visible_keys[several].log()).sum((0, 2)).cpu()
        self.first += p[..., 0].sum((0, 2)).cpu()
        mean = logits.masked_fill(~visible, 0.0).sum(-1, keepdim=True) / visible_keys[:, None]
        centred = (logits - mean).masked_fill(~visible, 0.0)
        self.centred_squares += centred.square().sum((-1, 0, 2)).cpu()
        # by distance: column t of row i is key i - t (distance t), zero past the first key
        key_at = i - torch.arange(n, device=p.device)[None, :]                         # [rows, N]
        reached = (key_at >= 0).to(p.dtype)
        index = key_at.clamp(min=0).expand(b, h, rows, n)
        mass = (p.gather(-1, index) * reached).sum((0, 2))                             # [H, N]: mass at distance t
        self.centred_by_distance += (centred.gather(-1, index) * reached).sum((0, 2)).cpu()
        distances = torch.arange(n, device=p.device, dtype=p.dtype)
        self.distance += (mass * distances).sum(-1).cpu()
        self.beyond += mass[:, self.train_length:].sum(-1).cpu()
        buckets = torch.zeros(h, self.mass.shape[1], dtype=p.dtype, device=p.device)
        self.mass += buckets.index_add_(1, bucket_of, mass).cpu()
        self.queries[i[:, 0].cpu()] += b

    # ---- the statistics ------------------------------------------------------------------------------------
    def n_queries(self) -> float:
        return float(self.queries.sum())

    def summary(self) -> dict:
        """Per head (lists of ``heads`` values): the statistics of the module docstring."""
        n = self.n_queries()
        with_entropy = float(self.queries[1:].sum())
        beyond_queries = float(self.queries[self.train_length:].sum())
        return {
            "mass": (self.mass / n).tolist(),
            "mean_distance": (self.distance / n).tolist(),
            "entropy": (self.entropy / with_entropy).tolist() if with_entropy else [None] * self.heads,
            "first_token": (self.first / n).tolist(),
            "beyond_train": (self.beyond / beyond_queries).tolist() if beyond_queries else [None] * self.heads,
            "rigidity": rigidity(self.centred_by_distance, self.centred_squares, self.queries),
        }


def logits_of(q: Tensor, k: Tensor, bias: ScoreBias | Tensor | None, q_pos: Tensor, k_pos: Tensor, start: int,
              end: int) -> Tensor:
    """The attention logits of queries ``start .. end - 1`` over every key, as the model's attention computes them
    (``posbench.model.attention.attention_logits``), the bias evaluated for those rows only."""
    if isinstance(bias, ScoreBias):
        bias = bias.materialise(q.shape[1], q_pos[:, start:end], k_pos)
    elif bias is not None:
        bias = bias[..., start:end, :]
    return attention_logits(q[:, :, start:end], k, bias)


def distance_gram(queries: Tensor) -> Tensor:
    """``M`` of the rigidity fit (module docstring): with ``w_i`` queries at index i (each seeing keys at distances
    0..i), ``M[d, e] = [d == e] W_d - A_max(d, e)`` where ``W_m = sum_{i >= m} w_i`` and ``A_m = sum_{i >= m}
    w_i / (i + 1)``: the design's Gram matrix, the same for every head and every content."""
    w = queries.double()
    n = len(w)
    suffix = lambda x: x.flip(0).cumsum(0).flip(0)           # noqa: E731  sum over i >= m
    big_w = suffix(w)
    big_a = suffix(w / torch.arange(1, n + 1, dtype=torch.float64))
    index = torch.arange(n)
    return torch.diag(big_w) - big_a[torch.maximum(index[:, None], index[None, :])]


def rigidity(by_distance: Tensor, squares: Tensor, queries: Tensor) -> list[float | None]:
    """Per head: ``S^T M^+ S / sum c^2`` (module docstring), from the sums of centred logits by distance
    ``[H, N]``, their squares ``[H]`` and the queries per index ``[N]``. The fit fixes ``g(0) = 0`` (a constant
    added to g is a shift of every query, which the per-query term already holds), which leaves ``M`` without
    its null space; distances no query reaches are left out."""
    reached = torch.nonzero(suffix_any(queries)).flatten()
    keep = reached[reached > 0]
    out: list[float | None] = []
    if len(keep) == 0:
        return [None] * by_distance.shape[0]
    gram = distance_gram(queries)[keep][:, keep]
    rhs = by_distance[:, keep].T                                             # [distances, heads]
    fit = torch.linalg.solve(gram, rhs)
    explained = (rhs * fit).sum(0)
    for head in range(by_distance.shape[0]):
        total = float(squares[head])
        out.append(float(explained[head]) / total if total > 0 else None)
    return out


def suffix_any(queries: Tensor) -> Tensor:
    """Distance d is reached by some query when some query has index >= d."""
    return queries.flip(0).cumsum(0).flip(0) > 0
