"""Perplexity equals exp(mean token loss) computed independently, for both protocols, at lengths that do and do
not divide the text, with every scored token counted exactly."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from posbench.evaluation.perplexity import evaluate, unigram_entropy, windows
from posbench.model import ModelConfig, Transformer

N = 100


class Bigram(nn.Module):
    """logits depend on the previous token only, so every protocol scores a token the same way."""

    def __init__(self, vocab=11):
        super().__init__()
        torch.manual_seed(0)
        self.table = nn.Parameter(torch.randn(vocab, vocab))

    def forward(self, tokens):
        return self.table[tokens]


def _bigram_nll(model, tokens, t):
    logp = torch.log_softmax(model.table[tokens[t - 1]].double(), -1)
    return -float(logp[tokens[t]].detach())


@pytest.fixture(scope="module")
def tokens():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 11, (N,), generator=g)


@pytest.mark.parametrize("length", [16, 20, 7])       # 20 divides 100; 16 and 7 do not
def test_window_arithmetic(length):
    chunks = windows(N, length, "chunks")
    assert len(chunks) == N // length
    assert sum(w.end - w.score_from for w in chunks) == (N // length) * (length - 1)
    for stride in (1, 3, length // 2, length - 1):
        wins = windows(N, length, "sliding", stride)
        assert all(w.end - w.start == length for w in wins)           # every window has full context length
        scored = [t for w in wins for t in range(w.score_from, w.end)]
        assert sorted(scored) == list(range(1, N))                   # each token but the first, exactly once
        whole = windows(N, length, "sliding", stride, score="window")
        assert len(whole) == (N - length) // stride + 1
        assert sum(w.end - w.score_from for w in whole) == len(whole) * (length - 1)
    assert windows(10, 16, "chunks") == [] and windows(10, 16, "sliding", 4) == []


@pytest.mark.parametrize("length", [16, 20])
def test_protocols_on_a_bigram_model(tokens, length):
    model = Bigram()
    per_token = {t: _bigram_nll(model, tokens, t) for t in range(1, N)}
    n_chunks = N // length
    chunk_tokens = [t for c in range(n_chunks) for t in range(c * length + 1, (c + 1) * length)]
    res = evaluate(model, tokens, length, "chunks", batch_size=3)
    assert res.tokens_scored == len(chunk_tokens) == n_chunks * (length - 1)
    assert res.perplexity == pytest.approx(math.exp(sum(per_token[t] for t in chunk_tokens) / len(chunk_tokens)),
                                           rel=1e-6)
    res = evaluate(model, tokens, length, "sliding", stride=5, batch_size=4)
    assert res.tokens_scored == N - 1
    assert res.perplexity == pytest.approx(math.exp(sum(per_token.values()) / (N - 1)), rel=1e-6)
    res = evaluate(model, tokens, length, "sliding", stride=5, score="window")
    starts = range(0, N - length + 1, 5)
    scored = [t for s in starts for t in range(s + 1, s + length)]
    assert res.tokens_scored == len(scored)
    assert res.perplexity == pytest.approx(math.exp(sum(per_token[t] for t in scored) / len(scored)), rel=1e-6)


@pytest.mark.parametrize("length", [16, 20])
def test_protocols_on_a_transformer(tokens, length):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=11, d_model=32, n_layers=2, n_heads=4, max_seq_len=16,
                                    encoding="alibi")).eval()
    # chunks: exp of the plain mean cross-entropy over the reshaped text
    k = N // length
    x = tokens[: k * length].view(k, length)
    with torch.no_grad():
        mean = F.cross_entropy(model(x)[:, :-1].reshape(-1, 11), x[:, 1:].reshape(-1))
    res = evaluate(model, tokens, length, "chunks", batch_size=2)
    assert res.perplexity == pytest.approx(math.exp(float(mean)), rel=1e-5)
    assert res.tokens_scored == k * (length - 1) and res.windows == k
    # sliding: each window run on its own; each token scored with the context its window gives it
    stride = 6
    total, count = 0.0, 0
    with torch.no_grad():
        for w in windows(N, length, "sliding", stride):
            logp = torch.log_softmax(model(tokens[None, w.start:w.end])[0].double(), -1)
            for t in range(w.score_from, w.end):
                total -= float(logp[t - w.start - 1, tokens[t]])
                count += 1
    res = evaluate(model, tokens, length, "sliding", stride=stride, batch_size=3)
    assert res.tokens_scored == count == N - 1
    assert res.perplexity == pytest.approx(math.exp(total / count), rel=1e-5)
    assert math.isnan(evaluate(model, tokens, 128, "chunks").perplexity)


def test_unigram_entropy():
    assert unigram_entropy(torch.tensor([0, 1, 0, 1])) == pytest.approx(math.log(2))
    assert unigram_entropy(torch.tensor([3, 3, 3])) == pytest.approx(0.0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="protocol"):
        windows(10, 4, "rolling")
    with pytest.raises(ValueError, match="stride"):
        windows(10, 4, "sliding", 4)
