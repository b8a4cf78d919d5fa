"""Loss by token position (``posbench.evaluation.positions``), recorded by every perplexity evaluation from its own
forward passes: each bucket's sum and count equal a token-by-token computation done here independently (a
bigram model, whose every token's loss is known in closed form, and the real Transformer, scored one window at a
time by hand); the token-weighted mean over the buckets is the log of the reported perplexity (to 1e-12
relative: two float64 summation orders); the bucket edges are log-spaced and cover every position once."""

import math

import pytest
import torch

from posbench.evaluation.perplexity import evaluate, windows
from posbench.evaluation.positions import PER_OCTAVE, PositionLoss, bucket_edges, bucket_index
from posbench.model import ModelConfig, Transformer
from tests.evaluation.test_perplexity import Bigram      # logits from the previous token alone


@pytest.mark.parametrize("length", [1, 2, 12, 13, 64, 256, 2048, 3000])
def test_edges_cover_every_position_once_log_spaced(length):
    edges = bucket_edges(length)
    assert edges[0] == 0 and edges[-1] == length and edges == sorted(set(edges))
    index = bucket_index(length)
    assert index.tolist() == sorted(index.tolist()) and int(index[-1]) == len(edges) - 2
    for lo, hi in zip(edges[:-1], edges[1:]):
        if hi < length and lo >= 24:                           # past the first octaves: ~9% wider a bucket
            assert hi / lo == pytest.approx(2 ** (1 / PER_OCTAVE), rel=0.08)
    if length >= 12:
        assert edges[:13] == list(range(13))                   # every early position its own bucket
    assert len(edges) - 1 <= PER_OCTAVE * math.log2(max(length, 2)) + 1


def by_hand(model, tokens, length, protocol, stride=None, score="new", start_token=None):
    """Per-position sums of the token losses, each window scored alone (no batching, no masks)."""
    nll: dict[int, float] = {}
    count: dict[int, int] = {}
    for w in windows(len(tokens), length, protocol, stride, score):
        x = tokens[w.start: w.end]
        inputs = x[:-1] if start_token is None else torch.cat((torch.tensor([start_token]), x[:-1]))
        with torch.no_grad():
            logp = torch.log_softmax(model(inputs[None])[0].double(), -1)
        for t in range(w.score_from, w.end):                   # token t of the stream, scored at query position p
            p = t - w.start - (1 if start_token is None else 0)
            nll[p] = nll.get(p, 0.0) - float(logp[p, x[t - w.start]])
            count[p] = count.get(p, 0) + 1
    return nll, count


def check_against(result, nll, count, length):
    edges = result.by_position.edges
    assert edges == bucket_edges(length)
    for b, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
        want = sum(nll.get(p, 0.0) for p in range(lo, hi))
        assert result.by_position.tokens[b] == sum(count.get(p, 0) for p in range(lo, hi))
        assert result.by_position.nll_sum[b] == pytest.approx(want, rel=1e-6, abs=1e-9)   # float32 token losses, summed in float64
    total, tokens = result.by_position.total()
    assert tokens == result.tokens_scored
    assert total / tokens == pytest.approx(math.log(result.perplexity), rel=1e-12)


@pytest.mark.parametrize("protocol,stride,score", [("chunks", None, "new"), ("sliding", 5, "new"),
                                                   ("sliding", 7, "window")])
def test_bigram_by_position_equals_token_by_token(protocol, stride, score):
    tokens = torch.randint(0, 11, (103,), generator=torch.Generator().manual_seed(1))
    model = Bigram()
    res = evaluate(model, tokens, 16, protocol, stride=stride, score=score, batch_size=3)
    check_against(res, *by_hand(model, tokens, 16, protocol, stride, score), 16)


@pytest.mark.parametrize("start_token", [None, 3])
def test_transformer_by_position_equals_token_by_token(start_token):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=13, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=8,
                                    encoding="rope")).eval()
    tokens = torch.randint(0, 13, (90,), generator=torch.Generator().manual_seed(2))
    for length, protocol in ((8, "chunks"), (24, "chunks"), (24, "sliding")):
        res = evaluate(model, tokens, length, protocol, batch_size=2, start_token=start_token)
        check_against(res, *by_hand(model, tokens, length, protocol, start_token=start_token), length)


def test_the_record_round_trips_and_sums_across_evaluations():
    tokens = torch.randint(0, 11, (80,), generator=torch.Generator().manual_seed(4))
    res = evaluate(Bigram(), tokens, 16)
    back = PositionLoss.from_dict(res.to_dict()["by_position"])
    assert back == res.by_position
    half = evaluate(Bigram(), tokens[:48], 16)
    rest = evaluate(Bigram(), tokens[48:], 16)
    half.by_position.add(torch.tensor(rest.by_position.nll_sum, dtype=torch.float64),
                         torch.tensor(rest.by_position.tokens))
    assert half.by_position.tokens == res.by_position.tokens
    assert half.by_position.nll_sum == pytest.approx(res.by_position.nll_sum, rel=1e-12)
    with pytest.raises(ValueError):
        PositionLoss.from_dict({"edges": [0, 1, 2], "nll_sum": [1.0], "tokens": [1]})
