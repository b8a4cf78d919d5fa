"""Extrapolation over training (``posbench.evaluation.length_probe``): a language-model run with
``train.probe_every`` records the held-out loss at each evaluation length at every probe step.

What must hold, each derived independently here:
* the probe changes nothing the run computes (the same checkpoint SHA-256, metrics and loss history);
* the last probe's values are the mean NLL of the final model on the first ``probe_tokens`` held-out tokens in
  windows of each length, recomputed window by window with the model loaded from the run's checkpoint;
* the plateau rule judges such a run on its training loss (the probe's values are losses, not percentages);
* a sample that holds no window of the longest length is refused in one line before the run exists.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from posbench.cli import main
from posbench.evaluation.length_probe import factor_of, is_length_loss, probe_name
from posbench.model import ModelConfig, Transformer
from posbench.report.plateau import probe_name as plateau_probe_name
from posbench.report.plateau import still_improving
from posbench.runs import runner
from posbench.runs.config import resolve_run_config
from posbench.tasks import TASKS
from posbench.train.checkpoint import load_weights

SETS = ["steps=6", "task.probe_tokens=1024"]


def finished(root) -> dict:
    path = next(root.rglob("result.json"))
    return json.loads(path.read_text()) | {"dir": str(path.parent)}


def test_names():
    assert probe_name(2) == "nll_2x" and probe_name(1.5) == "nll_1.5x" and probe_name(8.0) == "nll_8x"
    assert is_length_loss("nll_4x") and not is_length_loss("accuracy_id") and not is_length_loss("nll_x")
    assert factor_of("nll_1.5x") == 1.5


def test_the_probe_changes_nothing_and_records_the_final_models_losses(tmp_path):
    records = {}
    for every in (0, 3):
        out = tmp_path / str(every)
        runner.execute(resolve_run_config("perplexity", "rope", "tiny", sets=SETS + [f"probe_every={every}"]), out)
        records[every] = finished(out)
    plain, probed = records[0], records[3]
    assert probed["model"]["checkpoint_sha256"] == plain["model"]["checkpoint_sha256"]
    assert probed["metrics"] == plain["metrics"]
    assert probed["training"]["loss_history"] == plain["training"]["loss_history"]
    history = probed["training"]["probe_history"]
    assert [step for step, _ in history] == [3, 6]
    assert list(history[-1][1]) == ["nll_1x", "nll_2x", "nll_4x"]        # the tiny preset's lengths

    # the last probe, recomputed window by window from the checkpoint
    config = probed["config"]["model_config"]
    model = Transformer(ModelConfig(**config)).eval()
    load_weights(model, Path(probed["dir"]) / "checkpoint" / "model.safetensors")
    task = TASKS["perplexity"](resolve_run_config("perplexity", "rope", "tiny", sets=SETS))
    sample = task.eval_tokens().tokens[:1024]
    train_length = config["max_seq_len"]
    for name, value in history[-1][1].items():
        length = int(factor_of(name) * train_length)
        nll, n = 0.0, 0
        for start in range(0, len(sample) - length + 1, length):
            x = torch.as_tensor(sample[start: start + length])
            with torch.no_grad():
                logp = torch.log_softmax(model(x[None, :-1])[0].double(), -1)
            nll -= float(logp.gather(-1, x[1:, None]).sum())
            n += length - 1
        assert value == pytest.approx(nll / n, rel=1e-5)           # float32 forward passes, batched vs alone
    # the plateau rule: the training loss's verdict, as without the probe
    assert plateau_probe_name(probed) is None
    assert still_improving(probed["training"]) == still_improving(plain["training"])


def test_plateau_ignores_length_losses_but_not_a_percentage():
    losses = [[s, 3.0 - s / 100] for s in range(1, 101)]             # still falling: still improving
    flat = [[s, {"nll_1x": 9.0, "nll_2x": 9.0}] for s in range(1, 21)]
    assert still_improving({"loss_history": losses, "probe_history": flat})
    both = [[s, {"nll_1x": 9.0, "accuracy_id": 100.0}] for s in range(1, 21)]
    assert not still_improving({"loss_history": losses, "probe_history": both})   # the percentage decides


def test_a_sample_too_short_for_the_longest_length_is_refused_before_the_run(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["run", "-e", "rope", "-t", "perplexity", "-p", "tiny", "--steps", "4", "--set", "train.probe_every=2",
                 "--set", "task.probe_tokens=200", "--out", str(out)])
    assert code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "task.probe_tokens" in lines[0] and "256" in lines[0]
    assert not any(out.rglob("config.json"))
