"""Issue 59, items 7 to 10: records that are not what they seem.

- ``--resume`` of a run whose ``config.json`` was edited after it started: refused in one line when it no longer
  describes the checkpoint (item 7); checked as a new configuration is, so that a setting this posbench does not
  declare, a section that is not an object or a value out of range is one line too (item 8).
- ``compare`` of a record whose ``config.encoding_options`` is not an object: listed as unreadable; a metric no
  task declares whose runs disagree on its direction: neither ranked nor marked, and said (item 9).
- a plugin's code: every run records the SHA-256 of each plugin it loaded, and ``compare`` never pools runs whose
  plugin code differs (item 10).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from posbench.runs import runner
from posbench.runs.config import resolve_run_config
from posbench.train import StopTraining

from cli_helpers import cli, one_error_line
from encoding_helpers import one_thread  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["-t", "arithmetic", "-p", "tiny", "--steps", "4", "--set", "task.eval_samples=4", "--set", "train.threads=1",
        "-q"]


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> Path:
    """A run killed at step 3 of 6, with its checkpoint at step 2 (copied by each test that edits it)."""
    cfg = resolve_run_config("arithmetic", "rope", "tiny", sets=["steps=6", "checkpoint_every=2",
                                                                 "task.eval_samples=2", "train.threads=1"])

    def kill(step, model, loss):
        if step == 3:
            raise StopTraining

    root = tmp_path_factory.mktemp("killed")
    with pytest.raises(StopTraining):
        runner.execute(cfg, root / "runs", callbacks=(kill,))
    return next((root / "runs" / "arithmetic" / "rope").iterdir())


def edited_copy(killed: Path, tmp_path: Path, edit) -> Path:
    """A copy of the killed run (under ``<out>/<task>/<label>/``, as resume expects) with its config.json edited."""
    run = tmp_path / "runs" / "arithmetic" / "rope" / killed.name
    shutil.copytree(killed, run)
    stored = json.loads((run / "config.json").read_text())
    edit(stored["config"])
    (run / "config.json").write_text(json.dumps(stored))
    return run


# ---- item 7: a config.json that no longer describes its checkpoint -------------------------------------------

def backbone(config):
    config["model"].update(recurrences=3, norm_position="post")


@pytest.mark.parametrize("edit", [
    backbone,
    lambda c: c["task_options"].update(train_digits=3),
    lambda c: c["train"].update(lr=0.01),
    lambda c: c["encoding_options"].update(theta=500.0),
    lambda c: c.update(seed=7),
], ids=["backbone", "task-option", "train-lr", "encoding-option", "seed"])
def test_resume_refuses_a_config_edited_after_the_checkpoint(capsys, tmp_path, killed, edit):
    run = edited_copy(killed, tmp_path, edit)
    code, _, err = cli(capsys, "run", "--resume", run, "-q")
    assert code == 2 and "does not describe the run its checkpoint" in one_error_line(err)
    assert not (run / "result.json").exists()


def test_a_checkpoint_written_before_it_kept_the_settings_is_checked_by_its_model(capsys, tmp_path, killed):
    """The issue's case as an older checkpoint has it: only model_config.json says recurrences 1, pre-norm."""
    run = edited_copy(killed, tmp_path, backbone)
    state_file = run / "checkpoint" / "train_state.json"
    state = json.loads(state_file.read_text())
    state.pop("run_settings", None)                       # (this posbench writes it)
    state_file.write_text(json.dumps(state))
    code, _, err = cli(capsys, "run", "--resume", run, "-q")
    line = one_error_line(err)
    assert code == 2 and "model.recurrences 3 now, 1 in the checkpoint" in line and "model.norm_position" in line
    assert not (run / "result.json").exists()


def test_an_unedited_run_and_a_setting_that_changes_nothing_still_resume(capsys, tmp_path, killed):
    run = edited_copy(killed, tmp_path, lambda c: c["task_options"].update(eval_batch_size=3))
    code, _, err = cli(capsys, "run", "--resume", run, "-q")
    assert code == 0, err
    result = json.loads((run / "result.json").read_text())
    assert result["training"]["steps"] == 6 and result["training"]["resumed_from"] == [2]
    assert "plugins" not in result                          # no plugin loaded: the record is as it was


# ---- item 8: a resumed configuration is checked as a new one is ----------------------------------------------

@pytest.mark.parametrize("edit, words", [
    (lambda c: c["model"].update(future_knob=7), "model.future_knob"),
    (lambda c: c["train"].update(future_knob=7), "train.future_knob"),
    (lambda c: c.update(encoding_options=[["theta", 500.0]]), "'encoding_options' is list"),
    (lambda c: c.update(task_options="train_digits=2"), "'task_options' is str"),
    (lambda c: c["task_options"].update(train_digits=-3), "task.train_digits=-3"),
    (lambda c: c.update(seed="zero"), "'seed'"),
], ids=["model-key", "train-key", "encoding-list", "task-string", "out-of-range", "seed"])
def test_resume_checks_the_recorded_config(capsys, tmp_path, killed, edit, words):
    run = edited_copy(killed, tmp_path, edit)
    code, _, err = cli(capsys, "run", "--resume", run, "-q")
    assert code == 2 and words in one_error_line(err)
    assert not (run / "result.json").exists()
    code, out, err = cli(capsys, "run", "--resume", run, "--dry-run")        # the dry run says it too
    assert code == 2 and words in one_error_line(err) and not out


# ---- item 9: compare of records that are not what they seem --------------------------------------------------

def fake_run(root: Path, encoding: str, seed: int = 0, config: dict | None = None, metrics: dict | None = None,
             plugins: list | None = None) -> Path:
    run = root / "arithmetic" / encoding / f"{encoding}-{seed}-{len(list(root.rglob('result.json')))}"
    run.mkdir(parents=True)
    data = {"schema_version": 2, "task": "arithmetic", "encoding": encoding, "run_id": run.name,
            "config": {"task": "arithmetic", "preset": "tiny", "encoding": encoding, "seed": seed, **(config or {})},
            "primary_metric": "accuracy",
            "metrics": metrics or {"accuracy": {"value": 40.0 + seed, "stderr": 1.0, "n": 10,
                                                "higher_is_better": True}}}
    if plugins is not None:
        data["plugins"] = plugins
    (run / "result.json").write_text(json.dumps(data))
    return run


def compare_json(capsys, root: Path) -> tuple[dict, str]:
    code, out, err = cli(capsys, "compare", root, "--format", "json")
    assert code == 0, err
    return json.loads(out), err


@pytest.mark.parametrize("options", [[1, 2], "theta=500", 3])
def test_compare_lists_a_record_whose_encoding_options_are_not_an_object(capsys, tmp_path, options):
    fake_run(tmp_path, "rope")
    bad = fake_run(tmp_path, "alibi", config={"encoding_options": options})
    data, _ = compare_json(capsys, tmp_path)
    assert [row["encoding"] for row in data["tables"][0]["rows"]] == ["rope"]
    assert [Path(p["path"]) for p in data["skipped"]] == [bad] and "encoding_options" in data["skipped"][0]["reason"]
    code, out, err = cli(capsys, "compare", tmp_path)
    assert code == 0 and "skipped 1 unreadable run(s)" in out + err and "Traceback" not in err


def test_an_undeclared_metric_whose_runs_disagree_on_its_direction_is_not_ranked(capsys, tmp_path):
    def metrics(value, higher):
        return {"oddity": {"value": value, "stderr": 0.01, "n": 10, "higher_is_better": higher},
                "accuracy": {"value": value * 10, "stderr": 0.01, "n": 10, "higher_is_better": True}}

    for encoding, value, higher in (("rope", 4.0, True), ("tape", 5.0, False), ("alibi", 3.0, True)):
        run = fake_run(tmp_path, encoding, metrics=metrics(value, higher))
        data = json.loads((run / "result.json").read_text())
        data["primary_metric"] = "oddity"
        (run / "result.json").write_text(json.dumps(data))
    table = compare_json(capsys, tmp_path)[0]["tables"][0]
    directions = {c["name"]: c["higher_is_better"] for c in table["columns"]}
    assert directions == {"oddity": None, "accuracy": True}
    assert not any(row["metrics"]["oddity"]["best"] for row in table["rows"])       # no best marked
    assert [row["encoding"] for row in table["rows"]] == ["alibi", "rope", "tape"]  # by name, not by oddity
    assert [row["encoding"] for row in table["rows"] if row["metrics"]["accuracy"]["best"]] == ["tape"]
    assert any("oddity" in note and "disagree" in note for note in table["notes"])
    code, out, _ = cli(capsys, "compare", tmp_path, "--format", "markdown")
    assert code == 0 and "oddity ?" in out


# ---- item 10: a plugin's code is recorded, and runs of different code are never pooled ----------------------

LOGDIST = '''# logdist.py: an attention bias of -log(1 + distance)
import torch

from posbench.encodings import PositionalEncoding, ScoreBias


def distance_bias(head, q_pos, k_pos):
    return -torch.log1p((q_pos - k_pos).clamp(min=0).float())


class LogDistance(PositionalEncoding):
    name = "logdist"
    description = "a bias of -log(1 + distance)"

    def bias(self, layer, state, q, k, q_pos, k_pos):
        return ScoreBias(distance_bias, (), relative=True)
'''


def run_plugin(tmp_path: Path, seed: int) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    env.pop("POSBENCH_PLUGINS", None)
    done = subprocess.run([sys.executable, "-m", "posbench", "--plugins", "logdist.py", "run", "-e", "logdist",
                           *TINY, "--seed", str(seed), "--out", "results"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow  # two runs, each a fresh process that imports the plugin
def test_runs_of_an_edited_plugin_are_never_pooled(capsys, tmp_path):
    plugin = tmp_path / "logdist.py"
    plugin.write_text(LOGDIST)
    run_plugin(tmp_path, seed=0)
    plugin.write_text(LOGDIST.replace("-torch.log1p((q_pos - k_pos).clamp(min=0).float())",
                                      "-(q_pos - k_pos).clamp(min=0).float()"))           # linear, same name
    run_plugin(tmp_path, seed=1)
    records = {json.loads(p.read_text())["config"]["seed"]: json.loads(p.read_text())
               for p in (tmp_path / "results").rglob("result.json")}
    hashes = {seed: [(p["module"], Path(p["file"]), p["sha256"]) for p in r["plugins"]] for seed, r in records.items()}
    assert hashes[1] == [("logdist", plugin.resolve(), hashlib.sha256(plugin.read_bytes()).hexdigest())]
    assert hashes[0][0][2] != hashes[1][0][2]
    table = compare_json(capsys, tmp_path / "results")[0]["tables"][0]
    rows = [row for row in table["rows"] if row["encoding"] == "logdist"]
    assert len(rows) == 2 and all(len(row["runs"]) == 1 for row in rows)          # never two seeds of one row
    assert len({row["label"] for row in rows}) == 2 and all("plugins=logdist " in row["label"] for row in rows)
    assert any("plugin code" in note for note in table["notes"])


def test_compare_splits_runs_whose_recorded_plugin_code_differs(capsys, tmp_path):
    """The same rule on records alone: one seed per code, a record without the plugin, and two seeds of one code
    (which pool)."""
    def plugin(sha):
        return [{"module": "logdist", "file": "/somewhere/logdist.py", "sha256": sha * 64}]

    fake_run(tmp_path, "logdist", seed=0, plugins=plugin("a"))
    fake_run(tmp_path, "logdist", seed=1, plugins=plugin("a"))
    fake_run(tmp_path, "logdist", seed=1, plugins=plugin("b"))
    fake_run(tmp_path, "logdist", seed=2)
    fake_run(tmp_path, "rope", seed=0)
    table = compare_json(capsys, tmp_path)[0]["tables"][0]
    seeds = sorted((row["label"], len(row["runs"])) for row in table["rows"])
    assert seeds == [("logdist [plugins=-]", 1), (f"logdist [plugins=logdist {'a' * 12}]", 2),
                     (f"logdist [plugins=logdist {'b' * 12}]", 1), ("rope", 1)]
    assert any("plugin code" in note for note in table["notes"])


def test_a_record_whose_plugins_are_not_a_list_of_plugins_is_unreadable(capsys, tmp_path):
    fake_run(tmp_path, "rope")
    fake_run(tmp_path, "logdist", plugins="logdist.py")
    data, _ = compare_json(capsys, tmp_path)
    assert [row["encoding"] for row in data["tables"][0]["rows"]] == ["rope"]
    assert len(data["skipped"]) == 1 and "plugins" in data["skipped"][0]["reason"]
