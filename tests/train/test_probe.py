"""The probe during training (``train.probe_every``): the arithmetic task's in-distribution accuracy, measured
while a run trains, recorded, resumed, and judged by the probe plateau rule (``posbench.report.plateau``).

What must hold, each derived independently here:
* a probe changes nothing the run computes: the same weights (SHA-256 of the checkpoint) and metrics with and
  without it, for RandPE too (random positions drawn from torch's generator in training and at evaluation);
* the recorded value is the exact-match accuracy of the model at that step on the probe's examples, recomputed
  here by decoding every example one at a time without the KV cache (a second implementation);
* the probe's examples are the in-distribution cells only, equally many per cell, and not the evaluation's;
* a run killed and resumed records the same probe history as one that ran through.
"""

from __future__ import annotations

import json

import pytest
import torch

from posbench.data.char import EOS
from posbench.model import Transformer
from posbench.report.plateau import CEILING, PROBE_GAIN, probe_plateau, probe_plateau_table
from posbench.runs import runner
from posbench.runs.config import resolve_run_config
from posbench.tasks import TASKS
from posbench.tasks.arithmetic.task import PROBE_EXAMPLES, TOKENIZER, format_example
from posbench.train import StopTraining

TINY = ["steps=20", "task.train_digits=2", "task.eval_digits=3", "task.eval_samples=4"]


def finished(root) -> dict:
    return json.loads(next(root.rglob("result.json")).read_text())


@pytest.mark.parametrize("encoding", ["rope", "randpe"])
def test_a_probe_changes_nothing_the_run_computes(tmp_path, encoding):
    records = {}
    for every in (0, 5):
        out = tmp_path / str(every)
        runner.execute(resolve_run_config("arithmetic", encoding, "tiny", sets=TINY + [f"probe_every={every}"]),
                       out)
        records[every] = finished(out)
    plain, probed = records[0], records[5]
    assert probed["model"]["checkpoint_sha256"] == plain["model"]["checkpoint_sha256"]
    assert probed["metrics"] == plain["metrics"]
    assert probed["training"]["loss_history"] == plain["training"]["loss_history"]
    assert [step for step, _ in probed["training"]["probe_history"]] == [5, 10, 15, 20]
    assert "probe_history" not in plain["training"]            # a run without a probe keeps its old record


def test_a_probe_that_draws_from_torchs_generator_does_not_move_randpes_training_positions(tmp_path, monkeypatch):
    """RandPE draws its training positions from torch's generator: a probe that used it without the fork would
    shift every later draw (and the weights)."""
    arithmetic = TASKS["arithmetic"]
    measured = arithmetic.probe

    def drawing_probe(self, model, device):
        torch.rand(17)
        return measured(self, model, device)

    hashes = {}
    for every in (0, 5):
        monkeypatch.setattr(arithmetic, "probe", drawing_probe)
        runner.execute(resolve_run_config("arithmetic", "randpe", "tiny", sets=TINY + [f"probe_every={every}"]),
                       tmp_path / str(every))
        hashes[every] = finished(tmp_path / str(every))["model"]["checkpoint_sha256"]
    assert hashes[5] == hashes[0]


def one_by_one_accuracy(model, examples) -> float:
    """Exact match, each example decoded alone by argmax over full forward passes (no cache, no batching)."""
    correct = 0
    for _, a, b in examples:
        prompt, answer = format_example(a, b)
        ids = TOKENIZER.encode(prompt)
        target = TOKENIZER.encode(answer) + [EOS]
        for _ in target:
            logits = model(torch.tensor([ids]))
            logits = logits if isinstance(logits, torch.Tensor) else logits[0]
            ids.append(int(logits[0, -1].argmax()))
        correct += ids[-len(target):] == target
    return 100 * correct / len(examples)


@pytest.mark.slow  # 40 steps and the evaluation
def test_the_recorded_value_is_the_accuracy_of_the_model_at_that_step(tmp_path):
    cfg = resolve_run_config("arithmetic", "rope", "tiny", sets=TINY + ["probe_every=10", "steps=40", "lr=1e-2"])
    runner.execute(cfg, tmp_path)
    record = finished(tmp_path)
    task = TASKS["arithmetic"](cfg)
    model = Transformer(task.model_config())
    from posbench.train.checkpoint import load_weights
    load_weights(model, next(tmp_path.rglob("model.safetensors")))
    model.eval()
    examples = [example for batch in task.probe_batches for example in batch]
    with torch.no_grad():
        expected = one_by_one_accuracy(model, examples)
    step, values = record["training"]["probe_history"][-1]
    assert step == 40 and values["accuracy_id"] == pytest.approx(expected, abs=1e-9)


def test_probe_examples_are_in_distribution_equally_per_cell_and_not_the_evaluations():
    cfg = resolve_run_config("arithmetic", "rope", "tiny", sets=["task.train_digits=3", "task.eval_samples=50"])
    task = TASKS["arithmetic"](cfg)
    examples = [example for batch in task.probe_batches for example in batch]
    cells = {}
    for (i, j), a, b in examples:
        assert len(str(a)) == i and len(str(b)) == j and i <= 3 and j <= 3
        cells.setdefault((i, j), []).append((a, b))
    assert len(cells) == 9 and {len(v) for v in cells.values()} == {-(-PROBE_EXAMPLES // 9)}
    for (i, j), pairs in cells.items():
        evaluation = task.eval_examples(i, j)
        assert pairs[:50] != evaluation                       # another stream of examples than the evaluation's
    assert all(len(batch) <= task.opts["eval_batch_size"] for batch in task.probe_batches)


def test_a_resumed_run_records_the_same_probe_history(tmp_path):
    sets = TINY + ["probe_every=4", "checkpoint_every=4", "lr=1e-2"]
    runner.execute(resolve_run_config("arithmetic", "rope", "tiny", sets=sets), tmp_path / "through")

    def kill(step, model, loss):
        if step == 10:
            raise StopTraining

    with pytest.raises(StopTraining):
        runner.execute(resolve_run_config("arithmetic", "rope", "tiny", sets=sets), tmp_path / "killed",
                       callbacks=(kill,))
    run_dir = next((tmp_path / "killed" / "arithmetic" / "rope").iterdir())
    runner.resume(run_dir)
    through, resumed = finished(tmp_path / "through"), finished(tmp_path / "killed")
    assert resumed["training"]["resumed_from"] == [8]
    assert resumed["training"]["probe_history"] == through["training"]["probe_history"]
    assert [s for s, _ in resumed["training"]["probe_history"]] == [4, 8, 12, 16, 20]


def probes(values: list[float]) -> list[list]:
    return [[100 * (k + 1), {"accuracy_id": v}] for k, v in enumerate(values)]


@pytest.mark.parametrize("tail, stopped", [
    ([50, 50, 50, 50, 50.9, 50.9, 50.9, 50.9], True),     # gain 0.9 < 1 point
    ([50, 50, 50, 50, 51.5, 51.5, 51.5, 51.5], False),    # gain 1.5: still improving
    ([98, 98, 98, 98, 99.2, 99.2, 99.2, 99.2], True),     # gain 1.2 but at the ceiling (>= 99)
    ([60, 60, 60, 60, 55, 55, 55, 55], True),             # falling: not improving
])
def test_the_probe_rule(tail, stopped):
    history = probes([10.0] * 12 + tail)                 # 20 probes: windows of 4
    found = probe_plateau(history, "accuracy_id")
    assert found.steps == 2000 and found.earlier == pytest.approx(sum(tail[:4]) / 4)
    assert found.last == pytest.approx(sum(tail[4:]) / 4) and found.stopped is stopped
    assert PROBE_GAIN == 1.0 and CEILING == 99.0


def test_too_few_probes_have_no_verdict_and_the_table_says_so():
    assert probe_plateau(probes([1.0] * 9), "accuracy_id") is None
    table = probe_plateau_table({"a": {"training": {"probe_history": probes([1.0] * 9)}},
                                 "b": {"training": {"probe_history": probes([10.0] * 16 + [50.0] * 4)}},
                                 "c": {"training": {"loss_history": [[1, 1.0]]}}})
    lines = table.splitlines()
    assert len(lines) == 4                                # header, rule, a and b (c has no probe)
    assert "too few probes" in lines[2] and "| b | accuracy_id | 2000 | 20 | 10.0 | 50.0 | +40.0 | **no** |" == lines[3]
