"""The public API of DESIGN.md works for every registered encoding."""

import pytest
import torch

from posbench.encodings import ENCODINGS
from posbench.options import OptionError
from posbench.model import ModelConfig, Transformer

#: what a task gives an encoding that names these options in its ``task_context`` (ids 4-13 are the digits 0-9
#: of the arithmetic task's tokenizer)
TASK_GIVEN = {"digit_ids": list(range(4, 14))}


def test_every_encoding_builds_runs_and_generates():
    for name in ENCODINGS:
        torch.manual_seed(0)
        options = {key: TASK_GIVEN[key] for key in ENCODINGS[name].task_context}
        model = Transformer(ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, max_seq_len=16,
                                        encoding=name, encoding_options=options))
        tokens = torch.randint(0, 40, (2, 12))
        logits = model(tokens)
        assert logits.shape == (2, 12, 40)
        assert torch.isfinite(logits).all()
        out = model.generate(tokens[:, :4], max_new_tokens=5)
        assert out.shape == (2, 5)


def test_an_encoding_built_without_what_only_a_task_gives_is_one_clear_error():
    with pytest.raises(OptionError, match="needs digit_ids"):
        Transformer(ModelConfig(vocab_size=40, encoding="abacus"))
