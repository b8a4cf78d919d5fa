"""The metric registry (``posbench.evaluation.metrics``): a declaration per metric or family, duplicates refused
in one line, unknown metrics left to their record; every built-in task's metrics declared as their committed
records say; and a plugin task's own metric, lower is better, ranked and marked so by compare."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from posbench.evaluation.metrics import METRICS, MetricError, MetricRegistry, MetricSpec, register_metric
from posbench.evaluation.outcome import Metric

ROOT = Path(__file__).resolve().parents[2]
#: every committed result file: the fixtures' and the published studies'
COMMITTED = sorted([*(ROOT / "tests" / "fixtures").rglob("result.json"),
                    *(ROOT / "docs" / "studies").rglob("result.json")])


def registry(*specs: MetricSpec) -> MetricRegistry:
    """A registry of its own (the built-in tasks' declarations are in ``METRICS``, not here)."""
    made = MetricRegistry()
    for spec in specs:
        made.add(spec)
    return made


def spec(name: str, better: str = "higher", task: str = "t", **kwargs) -> MetricSpec:
    return MetricSpec(task, name, better, kwargs.pop("description", f"the {name}"), **kwargs)


# ---- declarations ------------------------------------------------------------------------------------------------

def test_a_family_covers_its_numbers_and_nothing_else():
    reg = registry(spec("ppl_{n}x", "lower"), spec("ppl_sliding_{n}x", "lower"), spec("acc_{n}"))
    assert reg.find("t", "ppl_2x").name == "ppl_{n}x"
    assert reg.find("t", "ppl_1.5x").name == "ppl_{n}x"
    assert reg.find("t", "ppl_sliding_16x").name == "ppl_sliding_{n}x"
    assert reg.find("t", "acc_4096").name == "acc_{n}"
    for other in ("ppl_x", "ppl_2xx", "ppl_ax", "acc_4x", "acc_", "xppl_2x", "ppl_2.x"):
        assert reg.find("t", other) is None, other


def test_a_name_is_found_before_a_family_and_only_for_its_task():
    reg = registry(spec("acc_{n}x"), spec("accuracy", task="other", better="lower"))
    assert reg.find("other", "accuracy").better == "lower"
    assert reg.find("t", "accuracy") is None and reg.find("other", "acc_2x") is None


def test_a_second_declaration_of_a_name_is_refused_in_one_line():
    reg = registry(spec("accuracy"))
    with pytest.raises(MetricError) as refused:
        reg.add(spec("accuracy", "lower"))
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("metric 'accuracy' of task 't' is already declared (higher is better")
    assert reg.find("t", "accuracy").better == "higher"          # the first declaration stands


def test_a_name_a_family_covers_is_refused_and_a_family_over_a_name_too():
    reg = registry(spec("ppl_{n}x", "lower"), spec("val_2x"))
    with pytest.raises(MetricError, match="metric 'ppl_4x' of task 't' is covered by 'ppl_{n}x'"):
        reg.add(spec("ppl_4x", "lower"))
    with pytest.raises(MetricError, match="already declared as 'val_2x', which 'val_{n}x' covers"):
        reg.add(spec("val_{n}x"))


def test_the_same_declaration_twice_is_one():
    """A module imported again (a notebook's cell run twice, a doc example executed by two tests) declares its
    metrics again: the same declaration is no duplicate."""
    reg = registry(spec("accuracy", per_example=True))
    again = reg.add(spec("accuracy", per_example=True))
    assert reg.of("t") == [again]
    with pytest.raises(MetricError):
        reg.add(spec("accuracy", per_example=False))              # anything else differs: refused


@pytest.mark.parametrize("bad, says", [
    (dict(name="x", better="up"), "better is 'up'; valid: higher, lower"),
    (dict(name="x", pool="median"), "pool is 'median'; valid: mean"),
    (dict(name="x_{k}"), "a family's name holds '{n}' (a number) and no other braces"),
    (dict(name="x", description=""), "needs a description of one line"),
    (dict(name="x", description="two\nlines"), "needs a description of one line"),
    (dict(name=""), "a metric needs a task and a name"),
])
def test_a_declaration_that_cannot_be_is_refused_in_one_line(bad, says):
    with pytest.raises(MetricError) as refused:
        registry(spec(**bad))
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_an_unknown_metric_keeps_its_recorded_direction_and_is_pooled_by_the_mean():
    from posbench.stats import seed_interval

    reg = registry(spec("loss", "lower"))
    assert reg.find("t", "bleu") is None and reg.find("no-such-task", "loss") is None
    assert reg.higher_is_better("t", "bleu", recorded=False) is False
    assert reg.higher_is_better("t", "bleu", recorded=True) is True
    assert reg.higher_is_better("t", "loss", recorded=True) is False          # the declaration wins
    assert reg.pooling("t", "bleu") is seed_interval and reg.pooling("t", "loss") is seed_interval
    assert reg.per_example("t", "bleu") is True and reg.per_example("t", "loss") is False
    with pytest.raises(MetricError, match=r"^task 't' declares no metric 'los'\. Did you mean 'loss'\? "
                                          r"Declared: loss\.$"):
        reg.get("t", "los")
    with pytest.raises(MetricError, match="task 'none' declares no metric 'x'. It declares none."):
        reg.get("none", "x")


def test_the_runner_records_the_declared_direction():
    reg = registry(spec("loss", "lower"))
    given = {"loss": Metric(1.0, None, 3), "extra": Metric(2.0, None, 3, higher_is_better=False)}
    recorded = reg.as_declared("t", given)
    assert list(recorded) == ["loss", "extra"]
    assert recorded["loss"] == Metric(1.0, None, 3, higher_is_better=False)
    assert recorded["extra"] is given["extra"]                  # undeclared: as the task gave it
    assert given["loss"].higher_is_better is True               # the task's own object is left alone


def test_register_metric_names_the_declaring_module():
    try:
        made = register_metric("test-origin-task", "score", better="higher", description="a score")
        assert made.origin == __name__ and METRICS.find("test-origin-task", "score") is made
        with pytest.raises(MetricError, match=rf"by {__name__}\); a metric is declared once"):
            register_metric("test-origin-task", "score", better="lower", description="a score")
    finally:
        METRICS.remove("test-origin-task")
    assert METRICS.find("test-origin-task", "score") is None


# ---- the built-in tasks ----------------------------------------------------------------------------------------

def test_every_built_in_task_declares_what_its_committed_runs_recorded():
    """Each metric of every committed result file (fixtures, published studies) is declared for its task, with the
    direction the record holds: compare's tables over them are what they were before the registry."""
    assert len(COMMITTED) > 100
    seen = set()
    for path in COMMITTED:
        data = json.loads(path.read_text())
        for name, metric in data["metrics"].items():
            found = METRICS.find(data["task"], name)
            assert found is not None, f"{path}: {data['task']} metric {name} is not declared"
            assert found.higher_is_better == metric["higher_is_better"], (path, name)
            seen.add(data["task"])
    assert seen >= {"arithmetic", "passkey", "perplexity", "pretrain", "extend", "scrolls"}


def test_every_task_with_per_example_scores_declares_exactly_those_metrics():
    """``per_example`` says which metrics the task's ``example_scores`` rebuilds: on each committed run with
    predictions, the recorded metrics it rebuilds are those declared per example."""
    from posbench.files import plain_or_gzipped, read_jsonl
    from posbench.runs.store import load_record
    from posbench.tasks import TASKS

    checked = set()
    for path in COMMITTED:
        if "studies" in path.parts and path.parent.name[-2:] not in ("s0", "-0"):
            continue                                 # the studies' first seeds are enough (10,000 examples each)
        predictions = plain_or_gzipped(path.parent / "predictions.jsonl")
        if predictions is None:
            continue
        run = load_record(path)
        scores = TASKS.get(run.task).example_scores(run, read_jsonl(predictions))
        rebuilt = {name for name in run.metrics if scores is not None and name in scores.metrics}
        declared = {name for name in run.metrics if METRICS.get(run.task, name).per_example}
        assert rebuilt == declared, path
        checked.add(run.task)
    assert checked >= {"arithmetic", "passkey", "scrolls"}


def test_posbench_check_fails_a_task_that_records_an_undeclared_metric():
    from posbench.checks.task import declared

    from posbench.checks.outcome import CheckFailed

    assert declared("perplexity", ["ppl_1x", "ppl_sliding_2x"]) == "2 metric(s)"
    with pytest.raises(CheckFailed, match="no declaration for bleu: declare each with "
                                          "posbench.evaluation.metrics.register_metric"):
        declared("perplexity", ["ppl_1x", "bleu"])


# ---- a plugin task's own metric -----------------------------------------------------------------------------------

PLUGIN = '''
# misses_task.py: a task whose headline metric is lower-is-better
import torch

from posbench.evaluation.metrics import register_metric
from posbench.evaluation.outcome import Evaluation, Metric
from posbench.tasks import SeededStream, Task

register_metric("test-misses", "misses", better="lower", description="retrievals missed (made up: 2 for rope, else 5)")


class Stream(SeededStream):
    def make_batch(self, rng, batch_size, index):
        from posbench.data.batch import Batch

        tokens = torch.from_numpy(rng.integers(0, 16, size=(batch_size, 9)))
        return Batch(tokens[:, :-1], tokens[:, 1:].clone())


class Misses(Task):
    name = "test-misses"
    description = "reports made-up misses: 2 for rope, 5 for any other encoding, plus a tenth per seed"
    presets = {"tiny": {"model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 8},
                        "train": {"steps": 1, "batch_size": 2}}}
    default_preset = "tiny"

    def vocab_size(self):
        return 16

    def train_stream(self):
        return Stream(self.config.seed)

    def evaluate(self, model, device, reporter, phases):
        misses = (2.0 if self.config.encoding == "rope" else 5.0) + 0.1 * self.config.seed
        return Evaluation(metrics={"misses": Metric(misses, None, 10)}, primary="misses")
'''


@pytest.fixture
def misses_runs(tmp_path):
    """Two seeds of rope (2 and 2.1 misses) and of alibi (5 and 5.1) of the plugin task, recorded by the runner;
    the plugin's module is gone from this process afterwards."""
    from posbench.runs import runner
    from posbench.runs.config import resolve_run_config
    from posbench.tasks import TASKS

    plugin = tmp_path / "misses_task.py"
    plugin.write_text(PLUGIN)
    module = types.ModuleType("misses_task")
    sys.modules[module.__name__] = module
    results = tmp_path / "results"
    try:
        exec(compile(PLUGIN, str(plugin), "exec"), module.__dict__)
        for encoding in ("rope", "alibi"):
            for seed in (0, 1):
                config = resolve_run_config("test-misses", encoding, None, seed=seed, sets=["train.threads=1"])
                assert runner.execute(config, results).record.metrics["misses"].higher_is_better is False
    finally:
        TASKS.remove("test-misses")
        METRICS.remove("test-misses")
        sys.modules.pop(module.__name__, None)
    return plugin, results


def compare_output(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "posbench", *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def rows_in_order(output: str, *labels: str) -> bool:
    lines = output.splitlines()
    where = [next(i for i, line in enumerate(lines) if line.lstrip("│| ").startswith(label)) for label in labels]
    return where == sorted(where)


def test_a_plugin_tasks_lower_is_better_metric_is_ranked_and_marked_so_by_compare(misses_runs):
    """The runs record ``higher_is_better: false``; to show that compare reads the plugin's declaration, not only
    the record, the records are then rewritten to say the opposite: with ``--plugins`` compare still ranks and
    marks by the declaration (lower is better); without the plugin it goes the way the records say."""
    plugin, results = misses_runs
    for path in results.rglob("result.json"):
        data = json.loads(path.read_text())
        assert data["metrics"]["misses"]["higher_is_better"] is False
        data["metrics"]["misses"]["higher_is_better"] = True
        path.write_text(json.dumps(data))
    declared = compare_output("--plugins", str(plugin), "compare", str(results), "--against", "alibi",
                              "--format", "markdown")
    assert "misses ↓" in declared and "misses ↑" not in declared
    assert rows_in_order(declared, "rope", "alibi")                  # fewer misses first
    assert "**2.05" in declared and "**5.05" not in declared         # the best value is the lowest
    difference = next(line for line in declared.splitlines() if line.startswith("| rope") and "-3.00" in line)
    assert "better" in difference and "worse" not in difference      # rope misses 3 fewer: better
    recorded = compare_output("compare", str(results), "--against", "alibi", "--format", "markdown")
    assert "misses ↑" in recorded and rows_in_order(recorded, "alibi", "rope")
    assert "worse" in next(line for line in recorded.splitlines() if line.startswith("| rope") and "-3.00" in line)
