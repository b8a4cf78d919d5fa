"""``task.start_token``: every training and evaluation window of the language-model tasks starts with the tokenizer's
BOS. The evaluation scores the same tokens as without it, each with BOS before its context; checked against a
token-by-token computation written here in float64 (tolerance 1e-6 relative: ``evaluate`` takes each token's loss
in float32)."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from posbench.cli import main
from posbench.evaluation.perplexity import evaluate, windows
from posbench.model import ModelConfig, Transformer
from posbench.tasks.corpus_task import ChunkStream, StartTokenStream

BOS = 1


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=23, d_model=32, n_layers=2, n_heads=4, max_seq_len=12,
                                   encoding="nope")).double().eval()


@pytest.fixture(scope="module")
def text():
    return torch.randint(3, 23, (101,), generator=torch.Generator().manual_seed(2))


def by_hand(model, text, length, protocol, stride=None) -> tuple[float, int]:
    """Each scored token's loss from its own forward pass over [BOS, the window's tokens before it]."""
    nll, count = 0.0, 0
    for w in windows(len(text), length, protocol, stride):
        for t in range(w.score_from, w.end):
            x = torch.cat((torch.tensor([BOS]), text[w.start:t]))[None]
            with torch.no_grad():
                logp = F.log_softmax(model(x)[0, -1], -1)
            nll -= float(logp[text[t]])
            count += 1
    return nll, count


@pytest.mark.parametrize("protocol,stride", [("chunks", None), ("sliding", 5)])
def test_windows_start_with_the_start_token_and_score_the_same_tokens(model, text, protocol, stride):
    got = evaluate(model, text, 12, protocol, stride=stride, start_token=BOS, batch_size=3)
    without = evaluate(model, text, 12, protocol, stride=stride, batch_size=3)
    nll, count = by_hand(model, text, 12, protocol, stride)
    assert got.tokens_scored == without.tokens_scored == count
    assert math.isclose(got.nll_sum, nll, rel_tol=1e-6)
    assert not math.isclose(got.nll_sum, without.nll_sum, rel_tol=1e-4)     # NoPE: the start token is seen


def test_training_windows_start_with_the_start_token():
    tokens = torch.arange(3, 60).numpy()
    chunks = ChunkStream(seed=4, tokens=tokens, length=8)
    plain = chunks.make_examples(5, 3)
    batch = StartTokenStream(ChunkStream(seed=4, tokens=tokens, length=8), BOS).make_examples(5, 3)
    assert batch.tokens.shape == batch.targets.shape == (3, 8)
    assert (batch.tokens[:, 0] == BOS).all()
    assert torch.equal(batch.tokens[:, 1:], plain.tokens[:, :-1])       # then the chunk's first 7 tokens
    assert torch.equal(batch.targets, plain.tokens)                      # predicting its first 8


def test_a_run_records_the_start_token(tmp_path, capsys):
    code = main(["run", "-e", "nope", "-t", "perplexity", "-p", "tiny", "--set", "task.start_token=true",
                 "--set", "train.steps=3", "--out", str(tmp_path)])
    capsys.readouterr()
    assert code == 0
    (result,) = tmp_path.glob("perplexity/nope/*/result.json")
    record = json.loads(result.read_text())
    assert record["config"]["task_options"]["start_token"] is True
