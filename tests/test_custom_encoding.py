"""A user-defined encoding: the README's example verbatim, and a sinusoidal APE defined here."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from posbench.encodings import ENCODINGS, PositionalEncoding
from posbench.model import ModelConfig, Transformer

from encoding_helpers import one_thread  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Adding an encoding"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def train_one_step(model: Transformer, vocab: int) -> None:
    """One AdamW step: the loss is finite and every parameter moves."""
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, vocab, (2, 17), generator=torch.Generator().manual_seed(0))
    logits = model(x[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
    assert torch.isfinite(loss)
    loss.backward()
    optimizer.step()
    for name, p in model.named_parameters():
        assert not torch.equal(before[name], p), f"{name} did not change"


def test_readme_example_registers_builds_and_trains():
    namespace = {"__name__": "readme_example"}
    try:
        exec(compile(readme_example(), str(README), "exec"), namespace)
        cls = ENCODINGS["learned"]
        assert cls is namespace["LearnedAbsolute"]
        assert ENCODINGS.origin("learned") == "user (readme_example)"
        model = namespace["model"]
        assert isinstance(model.encoding, cls)
        assert model.config.encoding_options == {"max_positions": 512}
        assert model.encoding.table.weight.shape == (512, model.config.d_model)
        assert model.encoding.table.weight.std().item() < 0.03   # the model's N(0, 0.02) init covers it
        small = Transformer(ModelConfig(vocab_size=30, d_model=32, n_layers=1, n_heads=4, encoding="learned",
                                        encoding_options={"max_positions": 64}))
        train_one_step(small, 30)
        # its signal is absolute: a shift of all positions changes the logits
        x = torch.randint(0, 30, (1, 8))
        with torch.no_grad():
            assert (small(x) - small(x, positions=torch.arange(5, 13))).abs().max() > 1e-4
            assert small.generate(x, max_new_tokens=3).shape == (1, 3)
    finally:
        ENCODINGS.remove("learned")
    assert "learned" not in ENCODINGS


def define_sinusoidal_ape():
    """Defined on demand: a class defined at import would sit in the registry while other files' tests run."""

    class SinusoidalAPE(PositionalEncoding):
        """The original transformer's sin/cos table (base 10000), added to the embeddings."""

        name = "test-sincos"
        defaults = {"base": 10000.0}

        def init_state(self, positions):
            half = self.d_model // 2
            freq = self.options["base"] ** (-torch.arange(half, dtype=torch.float32) / half)
            angle = positions[..., None].float() * freq
            return torch.cat((angle.sin(), angle.cos()), dim=-1)

        def embed(self, x, table):
            return x + table.to(x.dtype)

    return SinusoidalAPE


def test_sinusoidal_ape_defined_in_a_test_file():
    cls = define_sinusoidal_ape()
    try:
        assert ENCODINGS["test-sincos"] is cls
        model = Transformer(ModelConfig(vocab_size=30, d_model=32, n_layers=2, n_heads=4, encoding="test-sincos",
                                        encoding_options={"base": 100}))
        assert model.config.encoding_options == {"base": 100.0}
        table = model.encoding.init_state(torch.arange(3)[None])
        # position 2: sin(2 * 100^0) in channel 0, cos(2 * 100^(-1/16)) in channel 17
        assert abs(table[0, 2, 0].item() - math.sin(2.0)) < 1e-6
        assert abs(table[0, 2, 17].item() - math.cos(2.0 * 100 ** (-1 / 16))) < 1e-6
        train_one_step(model, 30)
    finally:
        ENCODINGS.remove("test-sincos")
