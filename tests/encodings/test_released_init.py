"""Every encoding's learned position parameters start as their authors release them, and the model's own N(0, 0.02)
never reaches them (docs/encodings.md, "Initialisation as released").

Random inits are checked by their distribution: the sample mean within 5 standard errors of the release's mean,
the sample standard deviation within 5 standard errors of the release's (for n draws of a distribution with
standard deviation s the sample mean's standard error is s / sqrt(n); for a normal the sample standard
deviation's is s / sqrt(2 (n - 1)), for a uniform s sqrt(0.8 / (n - 1)) / 2, its kurtosis being 1.8); a uniform's
draws also lie inside its interval. Deterministic inits are checked exactly. Models are built with 16 layers
(or a wide table) so that each check pools several hundred draws.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from posbench.encodings import ENCODINGS
from posbench.encodings.t5 import causal_bucket
from posbench.model import ModelConfig, Transformer

from encoding_helpers import BUILTIN, task_context

DOCS = Path(__file__).resolve().parents[2] / "docs" / "encodings.md"
WITHOUT_PARAMETERS = ("rope", "alibi", "randpe", "xpos", "nope", "sandwich")


def model(encoding: str, *, init_std: float = 0.02, seed: int = 0, layers: int = 16, d_model: int = 128,
          heads: int = 4, max_seq_len: int = 256, own: dict | None = None, **options) -> Transformer:
    """``init_std``: the model's; ``own`` and ``options``: the encoding's options (``own`` for a name the model's
    settings share: Abacus's ``init_std``)."""
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=64, encoding=encoding, d_model=d_model, n_layers=layers,
                                   n_heads=heads, max_seq_len=max_seq_len, init_std=init_std,
                                   encoding_options={**task_context(encoding), **(own or {}), **options}))


def pooled(m: Transformer, pattern: str) -> torch.Tensor:
    """Every element of the encoding's parameters whose name matches ``pattern``, in one vector."""
    found = [p.detach().flatten() for n, p in m.encoding.named_parameters() if re.fullmatch(pattern, n)]
    assert found, pattern
    return torch.cat(found).double()


def assert_normal(x: torch.Tensor, std: float) -> None:
    n = x.numel()
    assert abs(x.mean().item()) <= 5 * std / math.sqrt(n), (x.mean().item(), std, n)
    assert abs(x.std().item() - std) <= 5 * std / math.sqrt(2 * (n - 1)), (x.std().item(), std, n)


def assert_uniform(x: torch.Tensor, low: float, high: float) -> None:
    n, s = x.numel(), (high - low) / math.sqrt(12)
    assert low <= x.min().item() and x.max().item() <= high
    assert abs(x.mean().item() - (low + high) / 2) <= 5 * s / math.sqrt(n), (x.mean().item(), low, high, n)
    assert abs(x.std().item() - s) <= 5 * s * math.sqrt(0.8 / (n - 1)) / 2, (x.std().item(), s, n)


@pytest.mark.parametrize("encoding", [e for e in BUILTIN if e not in WITHOUT_PARAMETERS])
def test_the_models_init_never_reaches_an_encodings_parameters(encoding):
    """Built twice from one seed with the model's std 0.02 and 0.5: the encoding's parameters are the same (it owns
    them), the model's own weights are not. (Abacus draws its table like the token embeddings unless its own
    ``init_std`` is given: given here; the next tests check the default.)"""
    own = {"init_std": 0.1} if encoding == "abacus" else {}
    a, b = model(encoding, layers=2, init_std=0.02, own=own), model(encoding, layers=2, init_std=0.5, own=own)
    for (name, p), (_, q) in zip(a.encoding.named_parameters(), b.encoding.named_parameters()):
        assert torch.equal(p, q), name
    assert not torch.equal(a.embed.weight, b.embed.weight)


@pytest.mark.parametrize("encoding", WITHOUT_PARAMETERS)
def test_these_encodings_learn_nothing(encoding):
    assert list(model(encoding, layers=2).encoding.parameters()) == []


def test_t5_by_default_as_t5s_own_release_a_small_normal_table_unscaled():
    m = model("t5")                                                     # d_model 128: std 128^-1/2
    assert_normal(pooled(m, r"tables\.\d+\.weight"), 128 ** -0.5)
    assert m.encoding.scale.item() == 1.0 and m.config.encoding_options["scale"] == 1.0
    assert m.config.encoding_options["table_init"] == "t5"
    # the bias a score reads is the entry of its distance's bucket, computed here from the definition
    distance = torch.arange(300)
    bucket = causal_bucket(distance.clamp(max=128), 64, 128)
    bias = m.encoding.bias(2, None, None, None, distance[None, :], torch.zeros(1, 1, dtype=torch.long))
    got = bias.materialise(4, distance[None, :], torch.zeros(1, 1, dtype=torch.long))[0, :, :, 0]   # [H, Nq]
    torch.testing.assert_close(got, m.encoding.tables[2].weight[bucket].T, rtol=1e-6, atol=1e-6)


def test_t5_as_x_transformers_a_unit_normal_table_times_sqrt_head_dim():
    m = model("t5", table_init="x-transformers")                        # head dim 32
    assert_normal(pooled(m, r"tables\.\d+\.weight"), 1.0)               # nn.Embedding's own N(0, 1): 16 x 64 x 4
    assert m.encoding.scale.item() == pytest.approx(math.sqrt(32), rel=1e-7)
    assert m.config.encoding_options["scale"] == pytest.approx(math.sqrt(32))
    # the bias a score reads: the entry of its distance's bucket times sqrt(D), computed here from the definition
    distance = torch.arange(300)
    bucket = causal_bucket(distance.clamp(max=128), 64, 128)
    bias = m.encoding.bias(3, None, None, None, distance[None, :], torch.zeros(1, 1, dtype=torch.long))
    got = bias.materialise(4, distance[None, :], torch.zeros(1, 1, dtype=torch.long))[0, :, :, 0]   # [H, Nq]
    expected = m.encoding.tables[3].weight[bucket].T * math.sqrt(32)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_a_t5_checkpoint_saved_before_its_scale_existed_loads_with_scale_one():
    m = model("t5", layers=2, table_init="x-transformers")         # scale sqrt(32): the checkpoint's own
    old = {k: v for k, v in m.state_dict().items() if k != "encoding.scale"}
    fresh = model("t5", layers=2, seed=1, table_init="x-transformers")
    fresh.load_state_dict(old)
    assert fresh.encoding.scale.item() == 1.0 and fresh.encoding.options["scale"] == 1.0
    newer = model("t5", layers=2, seed=1)                                # T5's own init: scale 1 until loaded
    newer.load_state_dict(m.state_dict())
    assert newer.encoding.scale.item() == pytest.approx(math.sqrt(32), rel=1e-7)
    assert newer.encoding.options["scale"] == pytest.approx(math.sqrt(32))  # the record says the scale it reads


def test_a_t5_record_from_before_table_init_reads_as_the_init_it_had():
    """A run recorded before ``table_init`` existed trained x-transformers' table (its ``Added.before``), not
    today's default: resumed or read, its config says so; a record that names its init keeps it, and an encoding
    that declares a name without ``added`` (DAPE's ``fire_init_l``) gets nothing filled in."""
    from posbench.runs.config import RunConfig

    old = {"task": "perplexity", "preset": "study", "encoding": "t5",
           "encoding_options": {"num_buckets": 64, "max_distance": 128, "scale": 0.0}}
    assert RunConfig.from_dict(old, earlier_values=True).encoding_options["table_init"] == "x-transformers"
    assert "table_init" not in RunConfig.from_dict(old).encoding_options          # as written, for compare
    named = {**old, "encoding_options": {**old["encoding_options"], "table_init": "t5"}}
    assert RunConfig.from_dict(named, earlier_values=True).encoding_options["table_init"] == "t5"
    dape = {"task": "perplexity", "preset": "study", "encoding": "dape", "encoding_options": {"base": "alibi"}}
    assert RunConfig.from_dict(dape, earlier_values=True).encoding_options == {"base": "alibi"}


def test_fire_as_released_pytorch_linear_init_and_half_the_training_length():
    m = model("fire")
    assert_uniform(pooled(m, r"layers\.\d+\.mlp\.0\.(weight|bias)"), -1.0, 1.0)       # fan_in 1
    bound = 1 / math.sqrt(32)
    assert_uniform(pooled(m, r"layers\.\d+\.mlp\.2\.(weight|bias)"), -bound, bound)   # fan_in 32
    assert torch.equal(pooled(m, r"layers\.\d+\.c"), torch.full((16,), 0.1, dtype=torch.float32).double())
    assert torch.equal(pooled(m, r"layers\.\d+\.l_mult"), torch.ones(16, dtype=torch.float64))
    assert all(layer.init_l.item() == 128.0 for layer in m.encoding.layers)          # 256 / 2
    assert m.config.encoding_options["init_l"] == 128.0
    assert model("fire", layers=1, init_l=512.0).encoding.layers[0].init_l.item() == 512.0


def test_dape_mlp_as_released_pytorch_linear_init():
    m = model("dape")
    up, down = 1 / math.sqrt(2 * 4), 1 / math.sqrt(32)                  # Linear(2H, 32), Linear(32, H)
    assert_uniform(pooled(m, r"layers\.\d+\.up\.(weight|bias)"), -up, up)
    assert_uniform(pooled(m, r"layers\.\d+\.down\.(weight|bias)"), -down, down)
    assert model("dape", layers=1, base="fire").encoding.base.layers[0].init_l.item() == 64.0


def test_tape_as_released():
    m = model("tape")
    assert_normal(pooled(m, r"layers\.\d+\.(x_proj|down_proj)\.weight"), 0.02)
    assert not pooled(m, r"layers\.\d+\.(up_proj\.weight|gate)").any()


@pytest.mark.parametrize("init_std", [0.02, 0.5])
def test_abacus_as_released_drawn_like_the_token_embeddings(init_std):
    """The release draws token embeddings and the table from one N(0, d_model ** -0.5): their ratio is 1, and so
    is it here at whatever std the model draws its token embeddings from."""
    m = model("abacus", layers=1, d_model=64, init_std=init_std)
    assert_normal(pooled(m, r"table\.weight"), init_std)
    assert_normal(m.embed.weight.detach().flatten().double(), init_std)


def test_abacus_init_std_sets_the_tables_own():
    """``init_std`` draws the table from N(0, init_std) whatever the model's std: the release's absolute
    d_model ** -0.5 (0.125 at 64), six times posbench's token embeddings."""
    m = model("abacus", layers=1, d_model=64, init_std=0.02, own={"init_std": 64 ** -0.5})
    assert_normal(pooled(m, r"table\.weight"), 64 ** -0.5)


def test_cope_and_kerple_as_released():
    assert not pooled(model("cope", layers=2), r"pos_emb").any()
    kerple = model("kerple", per_layer=True, heads=32)                  # 16 layers x 32 heads
    eps = torch.tensor(0.01).item()                                     # 0.01 in float32
    assert_uniform(pooled(kerple, r"kernels\.\d+\.r1"), eps, 2.0)       # U(0, 2), then clamped to >= 0.01
    assert_uniform(pooled(kerple, r"kernels\.\d+\.r2"), eps, 1.0)


def test_docs_have_one_row_per_encoding_in_the_initialisation_table():
    text = DOCS.read_text()
    section = text.split("## Initialisation as released", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named = {line.split("`")[1] for line in rows}
    assert named == set(BUILTIN), sorted(set(BUILTIN) ^ named)


def test_a_t5_run_saved_before_its_scale_existed_exports_with_scale_one(tmp_path):
    """posbench export loads a checkpoint without ``encoding.scale`` (a T5 run from before issue 34): the export
    computes with scale 1, the bias that run was trained with, and the record of the model says so."""
    from posbench.hf.export import _load_into
    from posbench.hf.modeling import PosbenchConfig, PosbenchForCausalLM

    m = model("t5", layers=2, table_init="x-transformers")         # a model of scale sqrt(32)
    old = {f"model.{k}": v for k, v in m.state_dict().items() if k != "encoding.scale"}
    with torch.device("meta"):
        hf = PosbenchForCausalLM(PosbenchConfig.from_model_config(m.config))
    _load_into(hf, old, tmp_path)
    assert hf.model.encoding.scale.item() == 1.0 and hf.model.config.encoding_options["scale"] == 1.0
