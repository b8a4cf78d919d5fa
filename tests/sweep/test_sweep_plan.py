"""What a sweep's plan says before it runs (issue 36, item 4): the expected time follows the study's ``set`` (a
raised ``train.steps`` raises it, and so a SLURM cell's time limit), a cell whose earlier sweep still runs it is
shown as running (followed, not restarted), and a finished cell's time is its run's own, the same on every rerun."""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

import pytest

from posbench.cli import main
from posbench.cli.sweep import statuses
from posbench.sweep.plan import expand
from posbench.sweep.scheduler import finished
from posbench.sweep.slurm import SlurmOptions, job_parameters
from posbench.sweep.study import read_study


def study(tmp_path: Path, extra: str = "", task: str = "pretrain") -> Path:
    path = tmp_path / "study.toml"
    path.write_text(f'encodings = ["rope"]\ntasks = ["{task}"]\npresets = "tiny"\n{extra}')
    return path


def test_the_expected_time_follows_the_studys_steps(tmp_path):
    (plain,) = expand(read_study(study(tmp_path)))
    (longer,) = expand(read_study(study(tmp_path, 'set = ["train.steps=200"]\n')))
    assert plain.expected_s == 6.0                              # pretrain tiny: 20 steps, 6 s
    assert longer.expected_s == 60.0                            # 10 x the steps: 10 x the time
    limit = lambda cell: job_parameters(SlurmOptions(), {"id": cell.id, "expected_s": cell.expected_s})["time"]  # noqa: E731
    assert limit(longer) > limit(plain)


def test_a_cell_an_earlier_sweep_still_runs_is_shown_running(tmp_path):
    (cell,) = expand(read_study(study(tmp_path)))
    folder = tmp_path / "out" / "cells" / cell.id
    (folder / "pretrain" / "rope" / "20261127-000000-abcdef").mkdir(parents=True)
    (folder / "pretrain" / "rope" / "20261127-000000-abcdef" / "config.json").write_text("{}")
    assert statuses([cell], tmp_path / "out") == {cell.id: "resume"}        # killed: to resume
    with open(folder / "cell.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)                  # another sweep runs it now
        assert statuses([cell], tmp_path / "out") == {cell.id: "running"}


def test_a_finished_cells_time_is_its_runs_own(tmp_path):
    (cell,) = expand(read_study(study(tmp_path)))
    run = tmp_path / "run"
    run.mkdir()
    (run / "result.json").write_text(json.dumps({"primary_metric": "val_ppl", "metrics": {"val_ppl": {"value": 9.5}},
                                                 "timings": {"total_s": 12.5}}))
    for state in ("done", "resumed", "complete"):
        assert finished(cell, state, run, "log", "").seconds == 12.5


@pytest.mark.slow  # a sweep, each cell a fresh process
def test_a_rerun_shows_the_same_time_for_a_finished_cell(tmp_path, capsys):
    path = study(tmp_path, task="arithmetic")                  # the quickest cell: no corpus to tokenise
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--jobs", "1", "--quiet"]) == 0
    first = capsys.readouterr().out
    assert main(["sweep", str(path), "--out", str(out), "--jobs", "1", "--quiet"]) == 0
    second = capsys.readouterr().out

    def time_of(shown: str) -> str:
        line = next(l for l in shown.split("cells (paths under")[-1].splitlines() if "arithmetic-rope-tiny-s0" in l)
        return line.split("│")[3].strip()
    assert time_of(first) == time_of(second) != "-"
