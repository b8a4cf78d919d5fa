"""Checkpoints run no code: the training state is JSON and safetensors, resuming never unpickles anything, and a
crafted pickle in a shared run directory is refused with one line and exit code 2 -- without running it."""

import json
import os
import pickle

import pytest
import torch

from posbench.runs import runner
from posbench.train.checkpoint import load_train_state
from posbench.cli import main
from posbench.runs.config import resolve_run_config
from posbench.train import StopTraining

from encoding_helpers import one_thread  # noqa: F401 (a fixture)


pytestmark = pytest.mark.usefixtures("one_thread")   # tiny models gain nothing from threads


def killed_run(tmp_path):
    """A run killed at step 3 of 6, with its checkpoint at step 2: what ``--resume`` continues."""
    cfg = resolve_run_config("arithmetic", "rope", "tiny", sets=["steps=6", "checkpoint_every=2",
                                                                 "task.eval_samples=2"])

    def kill(step, model, loss):
        if step == 3:
            raise StopTraining

    with pytest.raises(StopTraining):
        runner.execute(cfg, tmp_path / "runs", callbacks=(kill,))
    return next((tmp_path / "runs" / "arithmetic" / "rope").iterdir())


class CreatesFile:
    """Unpickling this calls ``open(path, "w")``: it creates ``path``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


class RunsCommand:
    """Unpickling this runs a shell command (``os.system``)."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def resume_cli(capsys, run_dir):
    code = main(["run", "--resume", str(run_dir), "-q"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, err, *words):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_crafted_train_state_pt_is_refused_and_never_runs(capsys, tmp_path, writer):
    run_dir = killed_run(tmp_path)
    checkpoint = run_dir / "checkpoint"
    created, ran = tmp_path / "created-by-unpickling", tmp_path / "made-by-shell"
    payload = {"step": 2, "optimizer": CreatesFile(created), "rng": RunsCommand(f"touch {ran}")}
    # what a shared run directory from an older posbench (or an attacker) holds: a pickled state, no JSON
    (checkpoint / "train_state.json").unlink()
    (checkpoint / "optimizer.safetensors").unlink()
    if writer == "pickle":
        (checkpoint / "train_state.pt").write_bytes(pickle.dumps(payload))
    else:
        torch.save(payload, checkpoint / "train_state.pt")
    # the file is real: unpickling it does create the file (checked on a copy, then cleaned up)
    pickle.loads(pickle.dumps(CreatesFile(created))).close()
    assert created.exists()
    created.unlink()

    code, _, err = resume_cli(capsys, run_dir)
    assert_one_line_error(code, err, "train_state.pt", "pickle", "does not open it")
    assert not created.exists() and not ran.exists(), "resuming ran code from the checkpoint"
    assert not (run_dir / "result.json").exists()


def test_a_stray_pickle_beside_a_real_state_is_ignored(capsys, tmp_path):
    run_dir = killed_run(tmp_path)
    ran = tmp_path / "made-by-shell"
    (run_dir / "checkpoint" / "train_state.pt").write_bytes(pickle.dumps(RunsCommand(f"touch {ran}")))
    code, _, err = resume_cli(capsys, run_dir)
    assert code == 0, err
    assert not ran.exists()
    assert json.loads((run_dir / "result.json").read_text())["training"]["resumed_from"] == [2]


@pytest.mark.parametrize("damage", ["not json", "wrong format", "pickled optimizer", "truncated weights",
                                    "bad rng"])
def test_damaged_checkpoints_give_one_line(capsys, tmp_path, damage):
    run_dir = killed_run(tmp_path)
    checkpoint = run_dir / "checkpoint"
    state_path = checkpoint / "train_state.json"
    ran = tmp_path / "made-by-shell"
    if damage == "not json":
        state_path.write_bytes(pickle.dumps(RunsCommand(f"touch {ran}")))
    elif damage == "wrong format":
        state_path.write_text(json.dumps({"step": 2}))
    elif damage == "pickled optimizer":
        (checkpoint / "optimizer.safetensors").write_bytes(pickle.dumps(RunsCommand(f"touch {ran}")))
    elif damage == "truncated weights":
        path = checkpoint / "model.safetensors"
        path.write_bytes(path.read_bytes()[:100])
    else:
        state = json.loads(state_path.read_text())
        state["rng"][0]["torch"] = "not base64!"
        state_path.write_text(json.dumps(state))
    code, _, err = resume_cli(capsys, run_dir)
    assert_one_line_error(code, err, str(checkpoint.name))
    assert not ran.exists()


def test_resume_never_unpickles(monkeypatch, tmp_path):
    """With every unpickling entry point made to fail, a checkpoint still loads and the run resumes."""
    run_dir = killed_run(tmp_path)

    def refuse(*args, **kwargs):
        raise AssertionError("something was unpickled")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)
    state = load_train_state(run_dir / "checkpoint")
    assert state["step"] == 2 and state["optimizer"]["state"]
    outcome = runner.resume(run_dir)
    assert outcome.record.to_dict()["training"]["steps"] == 6


def test_state_is_plain_json_and_safetensors(tmp_path):
    run_dir = killed_run(tmp_path)
    checkpoint = run_dir / "checkpoint"
    assert sorted(p.name for p in checkpoint.iterdir()) == ["model.safetensors", "model_config.json",
                                                             "optimizer.safetensors", "train_state.json"]
    state = json.loads((checkpoint / "train_state.json").read_text())
    assert state["format"] == "posbench-train-state" and state["step"] == 2
    assert {"scheduler", "data", "rng", "loss_history", "optimizer", "batch_plan"} <= set(state)
    assert state["data"] == {"seed": 0, "examples": 2 * 32}
    from safetensors.torch import load_file

    slots = load_file(str(checkpoint / "optimizer.safetensors"))
    weights = load_file(str(checkpoint / "model.safetensors"))
    # the full, name-keyed AdamW state: every trained parameter has its step and both moments, full size
    names = {key.rpartition("/")[0] for key in slots}
    assert names and names <= set(weights)
    for name in names:
        assert slots[f"{name}/exp_avg"].shape == weights[name].shape == slots[f"{name}/exp_avg_sq"].shape
        assert slots[f"{name}/step"].item() == 2
