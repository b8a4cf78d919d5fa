"""``--resume`` runs what ``config.json`` records or nothing: a run killed before its first checkpoint has only its
config.json to say what it was, so an edit there (a section or setting taken out, a value of another type, an
encoding or label that is not the run's, a field this posbench does not record) is refused in one line, by the
dry run and the run alike, where it was filled in with today's defaults or read as text from the command line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from posbench.runs import runner
from posbench.runs.config import resolve_run_config
from posbench.runs.run_config import RunConfig
from posbench.train import StopTraining

from cli_helpers import cli, one_error_line
from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from tests.runs.test_round_four_records import edited_copy     # a copy of a run with its config.json edited

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def started(tmp_path_factory) -> Path:
    """A run killed at step 1 of 4, before any checkpoint: its directory holds its config.json and no weights."""
    cfg = resolve_run_config("arithmetic", "rope", "tiny", sets=["steps=4", "task.eval_samples=2", "train.threads=1"])

    def kill(step, model, loss):
        raise StopTraining

    root = tmp_path_factory.mktemp("started")
    with pytest.raises(StopTraining):
        runner.execute(cfg, root / "runs", callbacks=(kill,))
    run = next((root / "runs" / "arithmetic" / "rope").iterdir())
    assert not (run / "checkpoint").exists()
    return run


def without(section: str, key: str | None = None):
    def edit(config):
        if key is None:
            del config[section]
        else:
            del config[section][key]
    return edit


@pytest.mark.parametrize("edit, words", [
    (without("model"), "it lacks model.d_model"),
    (without("train", "lr"), "it lacks train.lr"),
    (lambda c: c["train"].update(steps="4"), "train.steps is '4', where a run records 4"),
    (lambda c: c["train"].update(steps=4.0), "train.steps is 4.0, where a run records 4"),
    (lambda c: c["train"].update(lr=str(c["train"]["lr"])), "train.lr is '"),
    (lambda c: c["task_options"].update(eval_samples=True), "task.eval_samples=True: expected an integer"),
    (lambda c: c.update(encoding=None), "'encoding' is None"),
    (lambda c: c.update(label="alibi"), "'label' is 'alibi', where its encoding and model make it 'rope'"),
    (lambda c: c.update(task_version=0), "'task_version' is 0"),
    (lambda c: c.update(task_version=None), "'task_version' is None"),
    (lambda c: c.update(learning_rate=1), "learning_rate is not a field"),
], ids=["no-model", "no-lr", "text", "float-for-int", "text-float", "bool-for-int", "encoding-null", "label",
        "version-0", "version-null", "unknown-field"])
def test_a_config_json_edited_before_the_first_checkpoint_is_refused(capsys, tmp_path, started, edit, words):
    run = edited_copy(started, tmp_path, edit)
    code, out, err = cli(capsys, "run", "--resume", run, "--dry-run")
    assert code == 2 and words in one_error_line(err) and not out
    code, _, err = cli(capsys, "run", "--resume", run, "-q")
    assert code == 2 and words in one_error_line(err)
    assert not (run / "result.json").exists() and not (run / "checkpoint").exists()


def test_an_unedited_run_resumes_from_its_config_alone(capsys, tmp_path, started):
    run = edited_copy(started, tmp_path, lambda c: None)
    code, _, err = cli(capsys, "run", "--resume", run, "-q")
    assert code == 0, err
    result = json.loads((run / "result.json").read_text())
    assert result["training"]["steps"] == 4
    recorded = json.loads((started / "config.json").read_text())["config"]
    assert {key: result["config"][key] for key in recorded} == recorded


def test_a_record_of_an_earlier_posbench_still_resumes(capsys, tmp_path):
    """A v1 record (before train.probe_every and task.probe_tokens existed) lacks them: they are filled in at the
    values it ran with (their ``added``), not refused as missing."""
    source = next(Path(__file__).resolve().parents[1].glob("fixtures/results-v1/pretrain/*/*/config.json")).parent
    run = tmp_path / "pretrain" / source.parent.name / source.name
    shutil.copytree(source, run)
    (run / "result.json").unlink()
    recorded = json.loads((run / "config.json").read_text())["config"]
    assert "probe_every" not in recorded["train"] and "probe_tokens" not in recorded["task_options"]
    code, out, err = cli(capsys, "run", "--resume", run, "--dry-run")
    assert code == 0, err
    (config,) = json.loads(out)
    assert config["train"]["probe_every"] == 0 and config["task_options"]["probe_tokens"] == 4096


def test_compare_reads_an_empty_task_version_as_1_where_a_resume_refuses_it():
    for written in (None, 0):
        data = {"task": "arithmetic", "encoding": "rope", "preset": "tiny", "task_version": written}
        assert RunConfig.from_dict(data).task_version == 1                  # compare's reading, as before
        assert RunConfig.from_dict(data, earlier_values=True).task_version == written    # checked, then refused
    assert RunConfig.from_dict({"task": "arithmetic", "preset": "tiny"}, earlier_values=True).task_version == 1
