"""What each head attends to (``posbench.analysis.heads``), checked against independent computations:

* on constructed logits whose answer is known: a pure distance pattern with any shift per query has rigidity 1
  (to 1e-9), logits that do not depend on distance have rigidity near the share a fit of one value per distance
  absorbs by chance ((N - 1) / pairs), uniform logits give entropy 1 and the first-token mass sum 1/(i + 1);
* for every built-in encoding, on a tiny model with the eager backend: the statistics of blocks of queries (5
  queries a block over 16 keys) equal those computed from the full attention matrices the model's own eager
  attention makes (captured in it), with rigidity fitted here by an explicit least-squares design (one column per
  query and one per distance, numpy's lstsq): the scores the analysis reads are the scores the model uses, every
  bias, rotation and gate included;
* the model's output is the same with the analysis watching.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import posbench.model.attention as attention_module
from posbench.analysis.heads import HeadStats
from posbench.evaluation.positions import bucket_edges
from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from encoding_helpers import BUILTIN, digit_rich, tiny

pytestmark = pytest.mark.usefixtures("one_thread")

N = 16


def constructed(logits_per_context: list[torch.Tensor], train_length: int = 4, block: int = 5) -> dict:
    heads = logits_per_context[0].shape[1]
    stats = HeadStats(heads, logits_per_context[0].shape[-1], train_length, block=block)
    zeros = torch.zeros(1, heads, logits_per_context[0].shape[-1], 2)
    for logits in logits_per_context:
        stats.add(zeros, zeros, logits, None, None)
    return stats.summary()


def test_a_pure_distance_pattern_has_rigidity_one_whatever_each_querys_shift():
    torch.manual_seed(0)
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    pattern = torch.randn(3, N)[:, (i - j).clamp(min=0)]                  # [heads, N, N]
    contexts = [torch.randn(1, 3, N, 1) * 5 + pattern[None] for _ in range(4)]
    assert constructed(contexts)["rigidity"] == pytest.approx([1.0, 1.0, 1.0], abs=1e-9)


def test_logits_that_ignore_distance_have_rigidity_near_chance():
    torch.manual_seed(1)
    contexts = [torch.randn(1, 2, N, N) for _ in range(200)]
    chance = (N - 1) / (200 * N * (N - 1) / 2)                            # fitted values / pairs
    for value in constructed(contexts)["rigidity"]:
        assert 0 <= value < 3 * chance


def test_a_mixture_lies_between_and_grows_with_the_distance_share():
    torch.manual_seed(2)
    i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
    pattern = -0.5 * (i - j).clamp(min=0).float()
    noise = [torch.randn(1, 1, N, N) for _ in range(50)]
    low = constructed([pattern + 2 * z for z in noise])["rigidity"][0]
    high = constructed([pattern + 0.5 * z for z in noise])["rigidity"][0]
    assert 0.05 < low < high < 1


def test_uniform_attention():
    s = constructed([torch.zeros(1, 1, N, N)], train_length=4)
    assert s["entropy"] == pytest.approx([1.0])
    assert s["first_token"] == pytest.approx([sum(1 / (i + 1) for i in range(N)) / N])
    assert s["mean_distance"] == pytest.approx([sum(i / 2 for i in range(N)) / N])
    beyond = [sum(1 for d in range(i + 1) if d >= 4) / (i + 1) for i in range(4, N)]
    assert s["beyond_train"] == pytest.approx([sum(beyond) / len(beyond)])
    assert sum(s["mass"][0]) == pytest.approx(1.0)
    assert constructed([torch.zeros(1, 1, 4, 4)], train_length=4)["beyond_train"] == [None]


# ---- against the model's own attention -----------------------------------------------------------------------

def direct_stats(scores: list[np.ndarray], train_length: int) -> dict:
    """The statistics from full score matrices ``[H, N, N]`` (causal, -inf above the diagonal), one query at a
    time; rigidity by an explicit two-way least-squares design."""
    heads, n = scores[0].shape[0], scores[0].shape[1]
    edges = bucket_edges(n)
    out = {k: [] for k in ("mass", "mean_distance", "entropy", "first_token", "beyond_train", "rigidity")}
    for h in range(heads):
        mass, dist, ent, first, beyond, rows, targets = np.zeros(len(edges) - 1), [], [], [], [], [], []
        n_rows = 0
        for c, s in enumerate(scores):
            for i in range(n):
                logit = s[h, i, : i + 1].astype(np.float64)
                p = np.exp(logit - logit.max())
                p /= p.sum()
                d = i - np.arange(i + 1)
                for b, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
                    mass[b] += p[(d >= lo) & (d < hi)].sum()
                dist.append((p * d).sum())
                if i >= 1:
                    ent.append(-(p[p > 0] * np.log(p[p > 0])).sum() / math.log(i + 1))
                first.append(p[0])
                if i >= train_length:
                    beyond.append(p[d >= train_length].sum())
                for jj in range(i + 1):                       # one design row per visible pair
                    row = np.zeros(len(scores) * n + n)
                    row[c * n + i] = 1.0
                    row[len(scores) * n + (i - jj)] = 1.0
                    rows.append(row)
                    targets.append(logit[jj])
                n_rows += 1
        x, y = np.array(rows), np.array(targets)
        queries_only = x[:, : len(scores) * n]
        residual_shift = y - queries_only @ np.linalg.lstsq(queries_only, y, rcond=None)[0]
        residual_both = y - x @ np.linalg.lstsq(x, y, rcond=None)[0]
        total = (residual_shift ** 2).sum()
        out["mass"].append(list(mass / n_rows))
        out["mean_distance"].append(float(np.mean(dist)))
        out["entropy"].append(float(np.mean(ent)))
        out["first_token"].append(float(np.mean(first)))
        out["beyond_train"].append(float(np.mean(beyond)))
        out["rigidity"].append(1 - (residual_both ** 2).sum() / total)
    return out


@pytest.mark.parametrize("encoding", BUILTIN)
def test_every_encodings_statistics_equal_a_direct_computation(encoding, monkeypatch):
    model = tiny(encoding, max_seq_len=8, attention="eager").eval()
    contexts = digit_rich(2, N, seed=3)
    captured: list[torch.Tensor] = []
    real = attention_module.masked_attention

    def capture(q, k, v, bias, visible):
        scores = (q @ k.transpose(-2, -1)).to(torch.float64) / math.sqrt(q.shape[-1])
        if bias is not None:
            scores = scores + bias.to(torch.float64)
        captured.append(scores.masked_fill(~visible, float("-inf"))[0])
        return real(q, k, v, bias, visible)

    calls: list[HeadStats] = []
    index = [0]

    def observe(q, k, bias, q_pos, k_pos):
        if index[0] == len(calls):
            calls.append(HeadStats(q.shape[1], N, 8, block=5))
        calls[index[0]].add(q, k, bias, q_pos, k_pos)
        index[0] += 1

    attentions = [m for m in model.modules() if hasattr(m, "observer")]
    monkeypatch.setattr(attention_module, "masked_attention", capture)
    outputs = []
    with torch.no_grad():
        for row in contexts:
            torch.manual_seed(0)
            plain = model(row[None])
            for m in attentions:
                m.observer = observe
            index[0] = 0
            torch.manual_seed(0)
            watched = model(row[None])
            for m in attentions:
                m.observer = None
            outputs.append((plain, watched))
    for plain, watched in outputs:
        assert torch.equal(plain, watched)
    layers = len(calls)
    assert layers == len(captured) // 4                          # two forward passes per context, two contexts
    for layer, stats in enumerate(calls):
        mine = stats.summary()
        # the captured scores of the watched passes: context c's second pass, this layer
        full = [captured[(2 * c + 1) * layers + layer].numpy() for c in range(2)]
        want = direct_stats(full, train_length=8)
        for key in ("mean_distance", "entropy", "first_token", "beyond_train"):
            assert mine[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), (encoding, layer, key)
        assert np.allclose(mine["mass"], want["mass"], rtol=1e-4, atol=1e-6), (encoding, layer)
        assert mine["rigidity"] == pytest.approx(want["rigidity"], rel=1e-4, abs=1e-6), (encoding, layer)
