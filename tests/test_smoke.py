"""The public API of DESIGN.md works for every registered encoding."""

import torch

from posbench.encodings import ENCODINGS
from posbench.model import ModelConfig, Transformer


def test_every_encoding_builds_runs_and_generates():
    for name in ENCODINGS:
        torch.manual_seed(0)
        model = Transformer(ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, max_seq_len=16,
                                        encoding=name))
        tokens = torch.randint(0, 40, (2, 12))
        logits = model(tokens)
        assert logits.shape == (2, 12, 40)
        assert torch.isfinite(logits).all()
        out = model.generate(tokens[:, :4], max_new_tokens=5)
        assert out.shape == (2, 5)
