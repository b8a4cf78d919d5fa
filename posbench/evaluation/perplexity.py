"""Perplexity of a token stream at a fixed evaluation length, under two protocols.

``chunks`` (the paper's pre-training evaluation, lm-eval's rolling windows with stride = length): the stream
is cut into ``n // L`` non-overlapping windows of ``L`` tokens; the remainder (``n mod L`` tokens) is not
evaluated. In each window every token but the first is scored, so ``(n // L) * (L - 1)`` tokens count.

``sliding`` (the sliding-window protocol of LongLoRA, ALiBi and the Hugging Face perplexity guide): windows
of exactly ``L`` tokens start every ``stride`` tokens (``1 <= stride < L``; default ``L // 2``), and one more window ends at the last token if the
stride does not land there. With ``score="new"`` (default) a window scores only the tokens no earlier
window scored, each with as much context as the window holds, so every token but the first of the stream
counts exactly once (``n - 1`` tokens). With ``score="window"`` (what LongLoRA's ``eval.py`` does) windows
start every ``stride`` tokens while they fit, each is scored entirely, and overlapping tokens count again.

Perplexity is ``exp(sum of token negative log-likelihoods / number of scored tokens)``, accumulated in
float64; the number of scored tokens is returned with it. A mean beyond float64's range of ``exp`` (about
709 nats: a diverged model) gives ``inf``, recorded as the JSON number ``1e999`` (read back as ``inf``) next to
its finite ``mean_nll``.

The same forward passes give the loss by token position (``posbench.evaluation.positions``: summed NLL and
counts in log-spaced position buckets), recorded with each result as ``by_position``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from posbench.evaluation.outcome import finite
from posbench.evaluation.positions import PositionLoss, accumulate, bucket_index
from posbench.train import distributed

PROTOCOLS = ("chunks", "sliding")
SCORING = ("new", "window")


@dataclass(frozen=True)
class Window:
    """Tokens ``[start, end)`` go through the model; tokens ``[score_from, end)`` are scored."""

    start: int
    end: int
    score_from: int


def windows(n_tokens: int, length: int, protocol: str = "chunks", stride: int | None = None,
            score: str = "new") -> list[Window]:
    if length < 2:
        raise ValueError(f"evaluation length must be at least 2, got {length}")
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown perplexity protocol '{protocol}'; valid: {', '.join(PROTOCOLS)}")
    if n_tokens < length:
        return []
    if protocol == "chunks":
        return [Window(i * length, (i + 1) * length, i * length + 1) for i in range(n_tokens // length)]
    stride = stride or length // 2
    if not 1 <= stride < length:
        raise ValueError(f"stride must be in [1, length) = [1, {length}), got {stride} (stride = length is the "
                         f"chunks protocol)")
    if score not in SCORING:
        raise ValueError(f"unknown sliding-window scoring '{score}'; valid: {', '.join(SCORING)}")
    starts = list(range(0, n_tokens - length + 1, stride))
    if score == "window":
        return [Window(s, s + length, s + 1) for s in starts]
    if starts[-1] + length < n_tokens:
        starts.append(n_tokens - length)
    out, scored_to = [], 1
    for s in starts:
        out.append(Window(s, s + length, max(scored_to, s + 1)))
        scored_to = s + length
    return out


@dataclass
class PerplexityResult:
    length: int
    protocol: str
    stride: int | None
    score: str | None
    nll_sum: float
    tokens_scored: int
    windows: int
    tokens_in_stream: int
    by_position: PositionLoss | None = None

    @property
    def mean_nll(self) -> float:
        return self.nll_sum / self.tokens_scored if self.tokens_scored else math.nan

    @property
    def perplexity(self) -> float:
        return exp_or_inf(self.mean_nll) if self.tokens_scored else math.nan

    def to_dict(self) -> dict:
        """As JSON records it: a non-finite number (no scored token, an overflowing perplexity) is ``None``."""
        bits = self.mean_nll / math.log(2) if self.tokens_scored else math.nan
        return {"length": self.length, "protocol": self.protocol, "stride": self.stride, "score": self.score,
                "perplexity": finite(self.perplexity), "mean_nll": finite(self.mean_nll), "bits_per_token": finite(bits),
                "tokens_scored": self.tokens_scored, "windows": self.windows, "tokens_in_stream": self.tokens_in_stream,
                **({"by_position": self.by_position.to_dict()} if self.by_position is not None else {})}


def exp_or_inf(x: float) -> float:
    """``math.exp(x)``, ``inf`` where it overflows float64 (x above about 709.78)."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


@torch.no_grad()
def evaluate(model, tokens: Tensor, length: int, protocol: str = "chunks", stride: int | None = None,
             score: str = "new", batch_size: int = 8, max_windows: int | None = None,
             device: torch.device | str | None = None, start_token: int | None = None,
             local: bool = False) -> PerplexityResult:
    """Perplexity of ``model`` (``model(tokens [B, L]) -> logits [B, L, V]``) on the 1-D ``tokens``.
    ``start_token``: every window's input is that token and the window's first L - 1 tokens (L positions, as
    without it): the same tokens are scored, each with the start token before its context. ``local``: this
    process scores every window (the in-training probe, which rank 0 runs alone); otherwise torchrun's processes
    share them."""
    tokens = torch.as_tensor(tokens, dtype=torch.long).flatten()
    wins = windows(len(tokens), length, protocol, stride, score)
    if max_windows is not None:
        wins = wins[:max_windows]
    device = torch.device(device) if device is not None else next(model.parameters()).device
    was_training = model.training
    model.eval()
    index = bucket_index(length)
    by_position = PositionLoss.empty(length)
    n_buckets = len(by_position.tokens)

    def score_batch(b: int) -> tuple[Tensor, int, Tensor, Tensor]:
        batch = wins[b: b + batch_size]
        x = torch.stack([tokens[w.start: w.end] for w in batch]).to(device)
        if start_token is None:
            logits, target, first = model(x)[:, :-1], x[:, 1:], 1
        else:
            start = torch.full((x.shape[0], 1), start_token, dtype=x.dtype, device=device)
            logits, target, first = model(torch.cat((start, x[:, :-1]), dim=1)), x, 0
        losses = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1),
                                 reduction="none").view(target.shape)
        # target column j is token start + j + first; it is scored when start + j + first >= score_from
        offsets = torch.tensor([w.score_from - w.start - first for w in batch], device=device)
        mask = torch.arange(target.shape[1], device=device)[None, :] >= offsets[:, None]
        # column j holds the logits of query position j (with or without the start token)
        sums, counts = accumulate(losses, mask, index[:target.shape[1]], n_buckets)
        return losses[mask].double().sum().cpu(), int(mask.sum()), sums, counts

    nll = torch.zeros((), dtype=torch.float64)
    count = 0
    starts = range(0, len(wins), batch_size)
    try:
        # batches split across torchrun's processes, summed in batch order: the single-process sum exactly
        scored = [score_batch(b) for b in starts] if local else distributed.shard_map(score_batch, starts)
        for batch_nll, batch_count, sums, counts in scored:
            nll += batch_nll
            count += batch_count
            by_position.add(sums, counts)
    finally:
        model.train(was_training)
    return PerplexityResult(length, protocol, stride if protocol == "sliding" else None,
                            score if protocol == "sliding" else None, float(nll), count, len(wins), len(tokens),
                            by_position)


def unigram_entropy(tokens: Tensor, vocab_size: int | None = None) -> float:
    """Entropy (nats per token) of the empirical unigram distribution of ``tokens``: the loss of the best
    context-free model; a language model that uses context must do better."""
    t = torch.as_tensor(tokens, dtype=torch.long).flatten()
    counts = torch.bincount(t, minlength=vocab_size or 0).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())
