"""A user-defined encoding and task: docs/extending.md's examples verbatim, and a sinusoidal APE defined here."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from posbench.encodings import ENCODINGS, PositionalEncoding
from posbench.evaluation.metrics import METRICS
from posbench.model import ModelConfig, Transformer
from posbench.options import Option, positive

from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from encoding_helpers import bias_tensor

pytestmark = pytest.mark.usefixtures("one_thread")

README = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def doc_blocks(language: str = "python") -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def readme_example(file: str) -> str:
    """The Python block of docs/extending.md that is the file ``file`` (its first line: ``# FILE: ...``), or,
    for a name that is no file, the block that mentions it."""
    found = [b for b in doc_blocks() if b.startswith(f"# {file}:")] or [b for b in doc_blocks() if file in b]
    assert len(found) == 1, (file, len(found))
    return found[0]


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
        exec(compile(readme_example("learned.py"), str(README), "exec"), namespace)
        exec(compile(readme_example('ModelConfig(encoding="learned"'), str(README), "exec"), namespace)
        cls = ENCODINGS["learned"]
        assert cls is namespace["LearnedAbsolute"]
        assert ENCODINGS.origin("learned") == "user (readme_example)"
        model = namespace["model"]
        assert isinstance(model.encoding, cls)
        assert model.config.encoding_options == {"max_positions": 512}
        assert model.encoding.table.weight.shape == (512, model.config.d_model)
        assert 0.015 < model.encoding.table.weight.std().item() < 0.025   # its own init_weights: N(0, 0.02)
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
        OPTIONS = {"base": Option(10000.0, "the sinusoids' base", positive())}

        def init_state(self, positions, tokens, memory):
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
        table = model.encoding.init_state(torch.arange(3)[None], None, None)
        # position 2: sin(2 * 100^0) in channel 0, cos(2 * 100^(-1/16)) in channel 17
        assert abs(table[0, 2, 0].item() - math.sin(2.0)) < 1e-6
        assert abs(table[0, 2, 17].item() - math.cos(2.0 * 100 ** (-1 / 16))) < 1e-6
        train_one_step(model, 30)
    finally:
        ENCODINGS.remove("test-sincos")


def test_readme_bias_example_runs_on_every_backend_with_gradients():
    """docs/extending.md's Gaussian window: a user's element-wise bias gets materialised for eager and SDPA,
    evaluated per score by FlexAttention, and trained; against an independent formula (1e-6)."""
    import warnings

    import sys
    import types

    module = types.ModuleType("readme_bias_example")      # a real module: FlexAttention's tracing imports it
    namespace = module.__dict__
    sys.modules[module.__name__] = module
    try:
        exec(compile(readme_example("gaussian.py"), str(README), "exec"), namespace)
        cls = ENCODINGS["gaussian"]
        assert cls is namespace["GaussianWindow"] and not cls.bias_from_qk
        cfg = dict(vocab_size=30, d_model=32, n_layers=2, n_heads=4, encoding="gaussian")
        torch.manual_seed(0)
        eager = Transformer(ModelConfig(**cfg, attention="eager"))
        with torch.no_grad():
            eager.encoding.log_width.uniform_(0.0, 2.0)
        # the bias by hand: -((i - j) / w)^2 for the layer's widths
        bias = bias_tensor(eager.encoding, 1, torch.tensor([[5]]), torch.tensor([[0, 2, 5]]))
        width = eager.encoding.log_width[1].detach().exp()
        for h in range(4):
            for b, j in enumerate((0, 2, 5)):
                expected = -((5 - j) / width[h].item()) ** 2
                assert abs(bias[0, h, 0, b].item() - expected) < 1e-6 * max(1.0, abs(expected))
        x = torch.randint(0, 30, (2, 12), generator=torch.Generator().manual_seed(1))
        reference = eager(x)
        reference.logsumexp(-1).mean().backward()
        assert eager.encoding.log_width.grad.abs().max() > 0
        for backend in ("sdpa", "flex"):
            other = Transformer(ModelConfig(**cfg, attention=backend))
            other.load_state_dict(eager.state_dict())
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.testing.assert_close(other(x), reference.detach(), rtol=1e-5, atol=1e-5)
        train_one_step(Transformer(ModelConfig(**cfg)), 30)
    finally:
        ENCODINGS.remove("gaussian")
        sys.modules.pop(module.__name__, None)


def test_every_python_block_of_the_page_is_run_by_this_file():
    run_here = ("learned.py", 'ModelConfig(encoding="learned"', "gaussian.py", "random_alibi.py", "copy_task.py",
                "test_learned.py")
    assert sorted(readme_example(name) for name in run_here) == sorted(doc_blocks())


def test_the_hook_table_lists_the_eight_hooks_in_the_order_the_model_calls_them():
    """docs/extending.md's table is the contract: one row per hook of ``posbench.encodings.base.HOOKS`` (at most
    eight), each a method of the base class with the documented parameters and at least one user named."""
    import inspect

    from posbench.encodings.base import HOOKS

    text = README.read_text(encoding="utf-8")
    table = text[text.index("| hook | what it does | used by |"):text.index("Hooks receive the layer")]
    rows = [line.split("|")[1:4] for line in table.splitlines()[2:] if line.startswith("| `")]
    assert len(HOOKS) <= 8 and [re.match(r" `(\w+)\(", hook).group(1) for hook, _, _ in rows] == list(HOOKS)
    for (hook, _, users), name in zip(rows, HOOKS):
        documented = re.findall(r"\w+", hook.split("(", 1)[1])
        assert documented == list(inspect.signature(getattr(PositionalEncoding, name)).parameters)[1:], name
        assert users.strip(), name
    public = {n for n, v in vars(PositionalEncoding).items() if callable(v) and not n.startswith("_")}
    assert public - set(HOOKS) == {"extra_repr"}      # no other method to override (nn.Module's own aside)


def test_the_randomized_alibi_example_reads_its_positions_from_the_state():
    """docs/extending.md's Randomized ALiBi: at evaluation ALiBi bit for bit; while training the bias of every
    (head, i, j) is -m_h (r_i - r_j) for the drawn positions r (sorted, distinct, in [0, 4 x max_seq_len)), whose
    slopes are computed here from Press et al.'s formula; the contract kit passes on it."""
    import sys
    import types

    from posbench.checks import check_encoding

    module = types.ModuleType("readme_random_alibi")      # a real module: FlexAttention's tracing imports it
    sys.modules[module.__name__] = module
    try:
        exec(compile(readme_example("random_alibi.py"), str(README), "exec"), module.__dict__)
        cfg = dict(vocab_size=30, d_model=32, n_layers=2, n_heads=4, max_seq_len=16)
        torch.manual_seed(0)
        model = Transformer(ModelConfig(**cfg, encoding="random-alibi"))
        alibi = Transformer(ModelConfig(**cfg, encoding="alibi"))
        alibi.load_state_dict(model.state_dict())
        x = torch.randint(0, 30, (2, 12), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            assert torch.equal(model.eval()(x), alibi.eval()(x))
        pe = model.encoding.train()
        positions = torch.arange(12)[None]
        torch.manual_seed(3)
        drawn = pe.init_state(positions, x, None)
        assert drawn.shape == (12,) and bool((drawn[1:] > drawn[:-1]).all()) and 0 <= int(drawn[0])
        assert int(drawn[-1]) < 4 * 16
        bias = bias_tensor(pe, 0, positions, positions, state=drawn)
        slopes = [2.0 ** (-8.0 * h / 4) for h in range(1, 5)]
        for h in range(4):
            for i in range(12):
                for j in range(12):
                    expected = -slopes[h] * (int(drawn[i]) - int(drawn[j]))
                    assert abs(bias[0, h, i, j].item() - expected) <= 1e-6 * max(1.0, abs(expected))
        torch.manual_seed(3)
        again = pe.init_state(positions, x, None)
        torch.manual_seed(4)
        assert torch.equal(again, drawn) and not torch.equal(pe.init_state(positions, x, None), drawn)
        check_encoding("random-alibi").assert_ok()
    finally:
        ENCODINGS.remove("random-alibi")
        sys.modules.pop(module.__name__, None)


def test_the_task_example_runs_through_the_runner(tmp_path):
    """docs/extending.md's copy task: registered by its definition, run end to end by the one runner with a
    built-in encoding, its record read by compare."""
    import sys
    import types

    from posbench import report
    from posbench.runs import runner
    from posbench.runs.config import resolve_run_config
    from posbench.tasks import TASKS

    module = types.ModuleType("readme_task_example")
    sys.modules[module.__name__] = module
    try:
        exec(compile(readme_example("copy_task.py"), str(README), "exec"), module.__dict__)
        assert TASKS["copy"] is module.__dict__["Copy"]
        outcome = runner.execute(resolve_run_config("copy", "alibi", None, sets=["train.threads=1"]), tmp_path)
        assert outcome.record.task == "copy" and 0.0 <= outcome.record.metrics["accuracy"].value <= 100.0
        assert outcome.record.metrics["wrong_tokens"].higher_is_better is False     # as its declaration says
        assert outcome.record.training["steps"] == 20
        assert outcome.record.config.task_version == 1
        assert json.loads((outcome.run_dir / "result.json").read_text())["config"]["task_version"] == 1
        table = report.collect(tmp_path).tables[0]
        assert table.task == "copy" and table.rows[0].encoding == "alibi"
        assert table.higher_is_better == {"accuracy": True, "wrong_tokens": False}
    finally:
        TASKS.remove("copy")
        METRICS.remove("copy")
        sys.modules.pop(module.__name__, None)


def test_the_documented_contract_tests_pass_on_the_documented_encoding_and_task():
    """docs/extending.md's test file, run on its own encoding and task: ``posbench.checks`` from a test suite."""
    import sys
    import types

    from posbench.tasks import TASKS

    modules = []
    try:
        for file in ("learned.py", "copy_task.py", "test_learned.py"):
            module = types.ModuleType(file[:-3])        # as named: test_learned.py imports the other two
            sys.modules[module.__name__] = module
            modules.append(module)
            exec(compile(readme_example(file), str(README), "exec"), module.__dict__)
        tests = modules[-1].__dict__
        tests["test_learned_keeps_the_contract"]()
        tests["test_copy_keeps_the_contract"]()
    finally:
        ENCODINGS.remove("learned")
        TASKS.remove("copy")
        METRICS.remove("copy")
        for module in modules:
            sys.modules.pop(module.__name__, None)
