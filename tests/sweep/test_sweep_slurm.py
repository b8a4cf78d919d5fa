"""``posbench sweep --executor slurm`` on a real one-node SLURM (tests/slurm_cluster.py: slurmctld, slurmd and
munge from the distribution's packages, started and stopped here).

One study of 4 tiny cells (2 encodings x 2 seeds) runs twice: with the local executor, and through sbatch
(submitit). On SLURM one cell is preempted mid-training (SIGUSR2, what SLURM sends before a time limit or a
preemption): it is requeued as the same job and resumes in the same sweep; another is cancelled with
``scancel`` mid-training: the sweep reports it killed, and the next sweep resumes it. Every cell's metrics and
final weights (the SHA-256 of ``model.safetensors``) must be equal in both, the resumed cells included: the
engine's resume is exact on a CPU at the same thread count (one thread per cell in both).

Skipped, with the reason, only where the packages cannot be installed (no root or no apt-get); .ci/run
installs them.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import threading
import time

import pytest

from posbench.cli import main

from slurm_cluster import SlurmCluster, install_packages

# real SLURM daemons and two sweeps of 200-step cells: the slow tier; one worker runs the module (its cluster is
# made once, and no other test starts one)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]

STUDY = """
encodings = ["rope", "alibi"]
tasks = ["arithmetic"]
seeds = 2
presets = ["tiny"]
set = ["steps=200", "checkpoint_every=25", "task.eval_samples=4"]
"""
CELLS = ["arithmetic-rope-tiny-s0", "arithmetic-alibi-tiny-s0", "arithmetic-rope-tiny-s1",
         "arithmetic-alibi-tiny-s1"]
PREEMPTED = "arithmetic-rope-tiny-s0"         # the first cell: SIGUSR2 after its first checkpoint
KILLED = "arithmetic-alibi-tiny-s1"            # the last cell to start: cancelled after its first checkpoint


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pytest.importorskip("submitit", reason="submitit is not installed (pip install -e '.[dev]')")
    reason = install_packages()
    if reason:
        pytest.skip(f"no SLURM: {reason}")
    started = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(started.conf)
    try:
        yield started
    finally:
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        started.stop()


def result(out, cell):
    found = list((out / "cells" / cell).glob("*/*/*/result.json"))
    assert len(found) == 1, found
    return json.loads(found[0].read_text())


@pytest.fixture(scope="module")
def studies(cluster, tmp_path_factory):
    """The study run locally, then on SLURM with one cell cancelled mid-training, then the SLURM sweep again."""
    work = tmp_path_factory.mktemp("studies")
    study = work / "study.toml"
    study.write_text(STUDY)
    local, slurm = work / "local", work / "slurm"
    assert main(["sweep", str(study), "--out", str(local), "--jobs", "2", "-q"]) == 0

    codes = []
    sweep = threading.Thread(target=lambda: codes.append(
        main(["sweep", str(study), "--out", str(slurm), "--executor", "slurm", "-q"])))
    sweep.start()
    jobs = {}
    for cell, signal in ((PREEMPTED, ["--signal=USR2"]), (KILLED, [])):
        folder = slurm / "cells" / cell
        deadline = time.monotonic() + 120
        while not list(folder.glob("*/*/*/checkpoint/train_state.json")):
            assert sweep.is_alive() and time.monotonic() < deadline, f"{cell} never wrote a checkpoint"
            time.sleep(0.05)
        jobs[cell] = json.loads((folder / "job.json").read_text())["job_id"]
        cluster.run("scancel", *signal, jobs[cell])
    sweep.join(timeout=180)
    cell = slurm / "cells" / KILLED
    killed_first = json.loads((cell / "cell.json").read_text())
    squeue_first = cluster.run("squeue", "-h", "-t", "all", "-o", "%i %j %T").stdout

    shown, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(shown), contextlib.redirect_stderr(errors):
        code = main(["sweep", str(study), "--out", str(slurm), "--executor", "slurm"])
    rerun = subprocess.CompletedProcess([], code, shown.getvalue(), errors.getvalue())
    return {"local": local, "slurm": slurm, "first": codes, "killed": killed_first, "jobs": jobs,
            "squeue_first": squeue_first, "rerun": rerun,
            "squeue": cluster.run("squeue", "-h", "-t", "all", "-o", "%i %j %T").stdout}


def test_a_preempted_cell_is_requeued_and_resumes_in_the_same_sweep(studies):
    job = studies["jobs"][PREEMPTED]
    assert f"{job} posbench:{PREEMPTED} COMPLETED" in studies["squeue_first"]   # the same job, requeued, finished
    record = result(studies["slurm"], PREEMPTED)
    resumed_from = record["training"]["resumed_from"]
    assert len(resumed_from) == 1 and 25 <= resumed_from[0] < 200 and resumed_from[0] % 25 == 0
    log = (studies["slurm"] / "cells" / PREEMPTED / "cell.log").read_text()
    assert log.count(f"# posbench sweep: start {PREEMPTED}") == 1
    assert log.count(f"# posbench sweep: resume {PREEMPTED}") == 1 and f"(SLURM job {job})" in log


def test_a_cell_cancelled_with_scancel_is_resumed_by_the_next_sweep(studies):
    assert studies["first"] == [1]                                # the first SLURM sweep ends with a killed cell
    killed = studies["killed"]
    job = studies["jobs"][KILLED]
    assert killed["state"] == "killed" and killed["slurm_job"] == job
    assert f"{job} {'posbench:' + KILLED} CANCELLED" in studies["squeue_first"]
    rerun = studies["rerun"]
    assert rerun.returncode == 0, rerun.stderr
    lines = {cell: next(line for line in rerun.stdout.splitlines() if f" {cell} " in line and "│" in line
                        and ("complete" in line or "resumed" in line)) for cell in CELLS}
    assert all("complete" in lines[c] for c in CELLS if c != KILLED), lines
    assert "resumed" in lines[KILLED]
    record = result(studies["slurm"], KILLED)
    resumed_from = record["training"]["resumed_from"]
    assert len(resumed_from) == 1 and 25 <= resumed_from[0] < 200 and resumed_from[0] % 25 == 0
    assert f"resumed from step {resumed_from[0]}" in rerun.stdout
    # the queue's history: four cells finished (one after a requeue), one cancelled, and the resumed one finished
    # as a fifth job
    states = [line.split()[-1] for line in studies["squeue"].strip().splitlines()]
    assert sorted(states) == ["CANCELLED", "COMPLETED", "COMPLETED", "COMPLETED", "COMPLETED"], studies["squeue"]


def test_slurm_results_equal_the_local_executors(studies):
    for cell in CELLS:
        local, slurm = result(studies["local"], cell), result(studies["slurm"], cell)
        assert slurm["environment"]["threads"] == local["environment"]["threads"] == 1
        assert slurm["metrics"] == local["metrics"], cell
        assert slurm["model"]["checkpoint_sha256"] == local["model"]["checkpoint_sha256"], cell
        assert slurm["config"] == local["config"], cell
    # and every cell went through sbatch, as submitit wrote it
    scripts = sorted((studies["slurm"] / "slurm").glob("*/*_submission.sh"))
    assert len(scripts) == 5
    assert all("#SBATCH --cpus-per-task=1" in s.read_text() and "#SBATCH --job-name=posbench:arithmetic-" in
               s.read_text() for s in scripts)
