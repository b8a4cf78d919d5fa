"""``posbench check``: the contract kit passes on every built-in encoding and on a task, and fails, one line per
failed check and exit code 1, on an encoding and a task broken on purpose (each break is one a user could make:
an option without a range, a state that forgets the KV cache's offset, a bias that reads the future, a graph
break, a tensor that is neither a parameter nor a buffer; a stream that cannot resume)."""

from __future__ import annotations

import pytest
import torch

from posbench.cli import main
from posbench.encodings import ENCODINGS, PositionalEncoding
from posbench.options import Option, at_least
from posbench.tasks import TASKS

from encoding_helpers import BUILTIN

CHECKS = ["options declared with a default, a range and help", "options refused out of range, in one line",
          "builds, and every trainable parameter reaches the loss", "a later token never changes an earlier logit",
          "the attention backends agree", "a KV cache equals recomputation",
          "a padded batch gives each row what it gets alone",
          "on the depth-recurrent backbone it trains, stays causal and decodes as it recomputes",
          "a saved state dict rebuilds the same model",
          "one compiled graph for all layers"]


@pytest.mark.slow  # posbench check on all 13 (each encoding's checks run fast elsewhere)
def test_check_passes_on_every_builtin_encoding(capsys):
    """The contract, and every learned position parameter within the CPU study's perplexity budget (Abacus, which
    runs on arithmetic only, within arithmetic's default preset)."""
    language = [name for name in BUILTIN if name != "abacus"]
    assert main(["check", ",".join(language), "-t", "perplexity", "-p", "study"]) == 0
    assert main(["check", "abacus"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = [line for line in out.splitlines() if ": learns " not in line]
    assert len(lines) == len(BUILTIN) * len(CHECKS)
    for name in BUILTIN:
        assert [line.split(": ")[1] for line in lines if line.startswith(f"ok    encoding '{name}':")] == CHECKS
    learns = [line for line in out.splitlines() if ": learns " in line]
    assert len([line for line in learns if "'t5'" in line]) == 4          # one table per layer of the 4 layers
    assert all("perplexity preset 'study': 900 steps: effect" in line for line in learns if "'t5'" in line)
    assert any("encoding 'tape': learns layers.3 " in line and "unused: frozen" in line for line in learns)
    assert not [line for line in learns if any(f"'{name}'" in line for name in
                                                ("rope", "alibi", "randpe", "xpos", "nope", "sandwich"))]


def define_weak_t5():
    """T5's bias as posbench built it before issue 34: the table from N(0, 0.02), no scale."""
    from posbench.encodings.t5 import T5Bias

    class WeakT5(T5Bias):
        name = "test-weak-t5"
        OPTIONS = {**T5Bias.OPTIONS, "scale": Option(1.0, "fixed multiplier", at_least(0))}

        def init_weights(self):
            for table in self.tables:
                torch.nn.init.normal_(table.weight, std=0.02)
    return WeakT5


def test_a_position_parameter_that_cannot_learn_within_the_budget_fails(capsys):
    """Reach: a table entry read with scale 1 moves the logits by at most 2 x the summed learning rate (0.33 at the
    perplexity small preset: 300 steps of lr 2e-3, 5% warmup, decay to 0.1), 0.66 < 1 logit; with x-transformers'
    sqrt(32) it reaches 3.74 (both computed here from the schedule)."""
    from posbench.checks.learnable import summed_lr
    from posbench.runs.config import resolve_run_config
    from posbench.train.config import TrainConfig

    train = TrainConfig(**resolve_run_config("perplexity", "t5", "small").train)
    lr = 2e-3 * (sum((s + 1) / 15 for s in range(15)) + sum(0.1 + 0.9 * (300 - s) / 285 for s in range(15, 300)))
    assert summed_lr(train) == pytest.approx(lr, rel=1e-12)
    define_weak_t5()
    try:
        assert main(["check", "test-weak-t5", "--no-compiled"]) == 1
        out, err = capsys.readouterr()
        failed = [line for line in err.splitlines() if ": learns tables." in line]
        assert len(failed) == 4
        assert all(f"the budget can move its effect by at most {2 * lr:.3g} logits (< 1)" in line for line in failed)
        assert main(["check", "t5", "--no-compiled", "--set", "encoding.table_init=x-transformers"]) == 0
        out, _ = capsys.readouterr()
        assert f"reach {2 * lr * 32 ** 0.5:.3g}" in out
    finally:
        ENCODINGS.remove("test-weak-t5")


def test_set_reaches_the_learned_parameter_check(capsys):
    """``posbench check ENCODING --set ...`` measures the budget's run as changed (it was ignored: the check ran at
    the defaults). T5 at its default, T5's own init (scale 1): reach 2 x the summed lr, 0.66 logits in the perplexity
    small preset's 300 steps (< 1: fails) and 1.97 with ``--set train.steps=900`` (computed here from the schedule:
    5% warmup, then linear decay to 0.1)."""
    def reach(steps):
        warm = round(0.05 * steps)
        return 2 * 2e-3 * (sum((s + 1) / warm for s in range(warm))
                           + sum(0.1 + 0.9 * (steps - s) / (steps - warm) for s in range(warm, steps)))
    assert main(["check", "t5", "--no-compiled"]) == 1
    out, err = capsys.readouterr()
    failed = [line for line in err.splitlines() if ": learns tables." in line]
    assert len(failed) == 4 and all("preset 'small': 300 steps" in line for line in failed)
    assert all(f"by at most {reach(300):.3g} logits (< 1)" in line for line in failed), failed
    assert main(["check", "t5", "--no-compiled", "--set", "train.steps=900"]) == 0
    out, _ = capsys.readouterr()
    assert out.count("preset 'small' with train.steps=900: 900 steps") == 4, out
    assert out.count(f"reach {reach(900):.3g}") == 4, out


def test_a_frozen_or_skipped_position_parameter_fails(monkeypatch):
    from posbench.checks import learnable
    from posbench.checks.outcome import Report
    from posbench.encodings.t5 import T5Bias

    class FrozenT5(T5Bias):
        name = "test-frozen-t5"

        def init_weights(self):
            self.tables[1].weight.requires_grad_(False)
    try:
        report = Report("x")
        learnable.check_learnable(report, "test-frozen-t5", "perplexity", "study")     # where T5's tables learn
        failed = [c for c in report.checks if not c.passed]
        assert [c.name for c in failed] == ["learns tables.1 within the perplexity preset 'study': 900 steps"]
        assert failed[0].detail.startswith("frozen (requires_grad=False) but it changes the attention")
    finally:
        ENCODINGS.remove("test-frozen-t5")
    original = learnable.make_optimizer            # imported at the check's top: patch the name it holds

    def skipping(model, cfg):
        optimizer = original(model, cfg)
        skipped = model.encoding.tables[2].weight
        for group in optimizer.param_groups:
            group["params"] = [p for p in group["params"] if p is not skipped]
        return optimizer
    monkeypatch.setattr(learnable, "make_optimizer", skipping)    # the name the check holds
    report = Report("x")
    learnable.check_learnable(report, "t5", "perplexity", "study")
    failed = [c for c in report.checks if not c.passed]
    assert len(failed) == 1 and failed[0].detail.startswith("the optimizer skips tables.2.weight")


def test_cope_cannot_learn_in_the_quick_start_budget_and_can_in_the_studys():
    from posbench.checks.learnable import check_learnable
    from posbench.checks.outcome import Report

    small, study = Report("x"), Report("x")
    check_learnable(small, "cope", "perplexity", "small")
    check_learnable(study, "cope", "perplexity", "study")
    assert not small.passed and study.passed


def define_broken():
    class Broken(PositionalEncoding):
        """Sinusoidal positions added to the embeddings, with five mistakes."""

        name = "test-broken"
        OPTIONS = {"width": Option(4, "a number without a range")}                      # 1: no range

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.scale = torch.rand(1) + 0.5               # 5: neither a parameter nor a buffer, nor rebuilt

        def init_state(self, positions, tokens, memory):   # 2: forgets the cache's offset
            return torch.arange(positions.shape[1], device=positions.device).expand_as(positions)

        def embed(self, x, positions):
            table = torch.sin(positions[..., None].float() * self.scale)
            peek = x.mean(dim=1, keepdim=True)             # 3: every token sees the whole sequence
            if x.abs().max().item() > 1e9:                 # 4: a graph break
                return x
            return x + table + peek

    return Broken


def test_check_fails_on_a_broken_encoding_one_line_per_failed_check(capsys):
    define_broken()
    try:
        assert main(["check", "test-broken"]) == 1
    finally:
        ENCODINGS.remove("test-broken")
    out, err = capsys.readouterr()
    failed = err.splitlines()
    assert [line.split(": ")[1] for line in failed] == [
        "options declared with a default, a range and help", "a later token never changes an earlier logit",
        "a KV cache equals recomputation", "a padded batch gives each row what it gets alone",
        "on the depth-recurrent backbone it trains, stays causal and decodes as it recomputes",
        "a saved state dict rebuilds the same model", "one compiled graph for all layers"]
    assert all(line.startswith("FAIL  encoding 'test-broken': ") for line in failed)
    assert "option width=4 declares no range" in failed[0]
    assert "ok    encoding 'test-broken': the attention backends agree" in out


def test_check_fails_on_an_encoding_that_counts_pads_as_positions(capsys):
    """An encoding that counts its tokens itself (a learned embedding of each token's index, the KV cache's count
    carried in its memory) instead of reading the positions the model gives: right in every check but padding,
    where it counts a row's pads as tokens (the model's positions count real tokens only)."""

    class Counting(PositionalEncoding):
        name = "test-counting"

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.table = torch.nn.Embedding(64, self.d_model)

        def init_state(self, positions, tokens, memory):
            count = torch.ones_like(tokens).cumsum(dim=1) - 1
            if memory is not None:
                count = count + memory.get("count", torch.zeros_like(tokens[:, 0]))[:, None]
                memory["count"] = count[:, -1] + 1
            return count.clamp(max=63)

        def embed(self, x, state):
            return x + self.table(state)

    try:
        assert main(["check", "test-counting", "--no-compiled"]) == 1
    finally:
        ENCODINGS.remove("test-counting")
    out, err = capsys.readouterr()
    assert [line.split(": ")[1] for line in err.splitlines()] == ["a padded batch gives each row what it gets alone"]
    assert "left-padded by 4 tokens" in err
    assert out.count("ok    encoding 'test-counting'") == len(CHECKS) - 2 + 1  # no compiled check; its table learns
    assert "ok    encoding 'test-counting': learns table within the perplexity preset 'small'" in out


def test_check_fails_on_a_tensor_bias_the_class_does_not_declare(capsys):
    """A bias returned as a tensor (computed from q and k) needs ``bias_from_qk = True``, which routes attention to
    the backends that take a tensor: without it the model refuses at the first forward pass, naming the flag, and
    the kit stops there; with it the same encoding passes."""

    class QKBias(PositionalEncoding):
        name = "test-qk-bias"

        def bias(self, layer, state, q, k, q_pos, k_pos):    # -|q_i - k_j|^2 / D: computed from q and k
            return -torch.cdist(q.float(), k.float()) ** 2 / q.shape[-1]

    try:
        assert main(["check", "test-qk-bias", "--no-compiled"]) == 1
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and "builds, and every trainable parameter reaches the loss" in err[0]
        assert "must say bias_from_qk = True" in err[0]
        QKBias.bias_from_qk = True
        assert main(["check", "test-qk-bias", "--no-compiled"]) == 0
    finally:
        ENCODINGS.remove("test-qk-bias")


def test_check_refuses_an_unknown_name_in_one_line(capsys):
    assert main(["check", "ropee"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown encoding or task 'ropee'. Did you mean 'rope'?") and err.count("\n") == 1


def test_check_passes_on_a_task(capsys):
    assert main(["check", "arithmetic"]) == 0
    out = capsys.readouterr().out
    assert out.count("ok    task 'arithmetic'") == 7 and "FAIL" not in out
    assert "ok    task 'arithmetic': every metric it records is declared (register_metric): 3 metric(s)" in out


def define_broken_task():
    from posbench.data.batch import Batch
    from posbench.evaluation.outcome import Evaluation, Metric

    class ForgetfulStream:
        """Draws from torch's global generator and saves nothing of it: a resumed run sees other batches."""

        def next_batch(self, batch_size):
            tokens = torch.randint(0, 16, (batch_size, 9))
            return Batch(tokens[:, :-1], tokens[:, 1:])

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    from posbench.tasks import Task

    class BrokenTask(Task):
        name = "test-broken-task"
        description = "a stream that cannot resume, an option whose default is out of its range"
        OPTIONS = {"examples": Option(0, "examples evaluated", at_least(1))}
        presets = {"tiny": {"model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 8},
                            "train": {"steps": 2, "batch_size": 4}, "task": {"examples": 2}}}
        default_preset = "tiny"

        def vocab_size(self):
            return 16

        def train_stream(self):
            return ForgetfulStream()

        def evaluate(self, model, device, reporter, phases):
            return Evaluation(metrics={"loss": Metric(1.0, None, 1)}, primary="loss")

    return BrokenTask


def test_check_fails_on_a_broken_task(capsys):
    define_broken_task()
    try:
        assert main(["check", "test-broken-task"]) == 1
    finally:
        TASKS.remove("test-broken-task")
    failed = capsys.readouterr().err.splitlines()
    assert [line.split(": ")[1] for line in failed] == ["options declared with a default, a range and help",
                                                         "the training stream resumes from its saved state",
                                                         "every metric it records is declared (register_metric)"]
    assert all(line.startswith("FAIL  task 'test-broken-task': ") for line in failed)
    assert "option examples's default 0 is outside its range (>= 1)" in failed[0]
    assert "differs from the batch the stream gave after that state" in failed[1]
    assert "no declaration for loss: declare each with posbench.evaluation.metrics.register_metric" in failed[2]
