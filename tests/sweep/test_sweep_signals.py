"""A sweep's cells and signals, with real processes and a stand-in for ``posbench run`` (a shell script that
starts a process of its own, as torchrun starts its workers, and sleeps): nothing here trains, each test takes
a second or two.

- the pid a sweep prints leads the cell's process group: ``kill -9`` of it, or a plain ``kill``, ends the run and
  whatever the run started, and the cell is recorded ``killed``; the next plan resumes it, never calls it complete;
- SIGTERM (or Ctrl-C, which reaches only the sweep: the cells are not in the terminal's group) stops the sweep:
  the running cells end, group and all, and the sweep prints its table and exits non-zero;
- a cell process, and the run it starts, import nothing from the working directory (``-P``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from posbench.sweep.local import LocalExecutor
from posbench.sweep.plan import Cell
from posbench.sweep.scheduler import Sweep

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists() or not hasattr(os, "killpg"),
                                reason="process groups as Linux has them")

#: ``posbench run`` stood in for: writes what a started run writes (its config.json), what it was given, the
#: pids of itself and of a process it starts, then sleeps until it is ended (or, with FINISH, finishes at once)
FAKE_RUN = """#!/bin/sh
out=""; prev=""
for a in "$@"; do [ "$prev" = "--out" ] && out="$a"; prev="$a"; done
mkdir -p "$out/task/enc/run1"
echo '{}' > "$out/task/enc/run1/config.json"
printf '%s\\n' "$@" > "$out/argv.txt"
echo "${PYTHONSAFEPATH:-}" > "$out/safepath.txt"
FINISH
sleep 120 &
echo $! > "$out/grandchild.pid.tmp" && mv "$out/grandchild.pid.tmp" "$out/grandchild.pid"
echo $$ > "$out/run.pid.tmp" && mv "$out/run.pid.tmp" "$out/run.pid"
exec sleep 120
"""
FINISHES = """echo '{}' > "$out/task/enc/run1/result.json"; exit 0"""


@pytest.fixture
def fake_run(tmp_path):
    """The stand-in's path; every process it started is ended after the test, whatever the test found."""
    path = tmp_path / "fake-python"
    path.write_text(FAKE_RUN.replace("FINISH", ""))
    path.chmod(0o755)
    yield path
    for pid_file in tmp_path.rglob("*.pid"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped by whoever adopted it, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def wait_for(check, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def pids(cell_dir: Path) -> tuple[int, int]:
    """The stand-in run's pid and its own child's, once it has written both."""
    wait_for(lambda: (cell_dir / "run.pid").is_file() and (cell_dir / "grandchild.pid").is_file())
    return int((cell_dir / "run.pid").read_text()), int((cell_dir / "grandchild.pid").read_text())


CELL = Cell("task", "enc", "tiny", 0, "", ())


def sweep_of(out: Path, fake: Path) -> Sweep:
    sweep = Sweep([CELL], out, LocalExecutor(1, 1, "cpu"), poll_s=0.05)
    spec = sweep.spec
    sweep.spec = lambda cell: {**spec(cell), "python": str(fake)}      # the stand-in instead of posbench run
    return sweep


def next_plan(out: Path) -> str:
    from posbench.cli.sweep import statuses

    return statuses([CELL], out)[CELL.id]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill -9", "kill"])
def test_killing_the_printed_pid_ends_the_cells_whole_group(tmp_path, fake_run, sig):
    out = tmp_path / "out"
    sweep = sweep_of(out, fake_run)
    cell_dir = sweep.cell_dir(CELL)
    found = {}

    def kill_the_printed_pid():
        found["run"], found["grandchild"] = pids(cell_dir)
        handle = sweep.outcomes[CELL.id].handle
        found["said"] = handle.describe()
        os.kill(handle.process.pid, sig)

    killer = threading.Thread(target=kill_the_printed_pid)
    killer.start()
    outcomes = sweep.run()
    killer.join()
    assert found["said"].startswith("pid ")
    wait_for(lambda: not alive(found["run"]) and not alive(found["grandchild"]), timeout=5)
    assert outcomes[CELL.id].state == "killed"
    assert json.loads((cell_dir / "cell.json").read_text())["state"] == "killed"
    assert next_plan(out) == "resume"                  # not complete: the run never finished, nor will it


def test_a_run_that_outlives_its_cell_process_still_holds_the_cells_lock(tmp_path, fake_run):
    """Until the sweep ends what is left of a killed cell (or when no sweep is left to: it was killed too), the
    run still holds the cell's lock, so that another sweep follows the cell instead of resuming the same run
    beside it."""
    from posbench.sweep.cell import is_locked

    sweep = sweep_of(tmp_path / "out", fake_run)
    executor = sweep.executor
    handle = executor.start(sweep.spec(CELL))
    cell_dir = sweep.cell_dir(CELL)
    run, grandchild = pids(cell_dir)
    os.kill(handle.process.pid, signal.SIGKILL)
    wait_for(lambda: os.waitid(os.P_PID, handle.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None)
    assert alive(run) and is_locked(cell_dir)
    assert not executor.running(handle)                 # the sweep sees the cell process gone: it ends the group
    assert not alive(run) and not alive(grandchild) and not is_locked(cell_dir)


def test_a_cell_whose_run_finished_is_done_even_when_its_cell_process_was_killed_after(tmp_path, fake_run):
    """The truth both ways: a run that wrote its result.json is done, whatever happened to the cell process
    after; the next plan says complete, and so does cell.json."""
    out = tmp_path / "out"
    fake_run.write_text(FAKE_RUN.replace("FINISH", "echo '{}' > \"$out/task/enc/run1/result.json\"\nFINISH"))
    sweep = sweep_of(out, fake_run)
    cell_dir = sweep.cell_dir(CELL)

    def kill_the_printed_pid():
        pids(cell_dir)                                   # result.json is written before these
        os.kill(sweep.outcomes[CELL.id].handle.process.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_the_printed_pid)
    killer.start()
    outcomes = sweep.run()
    killer.join()
    assert outcomes[CELL.id].state == "done"
    assert json.loads((cell_dir / "cell.json").read_text())["state"] == "done"
    assert next_plan(out) == "complete"


SWEEP_SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from posbench.cli.sweep import run_study
    from posbench.sweep import scheduler
    from posbench.sweep.local import LocalExecutor
    from posbench.sweep.plan import Cell

    fake, root = sys.argv[1], Path(sys.argv[2])
    spec = scheduler.Sweep.spec
    scheduler.Sweep.spec = lambda self, cell: {**spec(self, cell), "python": fake}
    class Study:
        text = ""
    cells = [Cell("task", "enc", "tiny", 0, "", ()), Cell("task", "enc", "tiny", 1, "", ())]
    sys.exit(run_study(Study(), cells, root, LocalExecutor(2, 1, "cpu"), retry_failed=False, quiet=False))
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_signal_to_the_sweep_ends_its_cells_and_prints_the_table(tmp_path, fake_run, sig):
    """SIGTERM to the sweep's process alone (as a batch system or ``kill`` sends it), or SIGINT to it alone (a
    terminal's Ctrl-C reaches only the sweep: each cell leads a session of its own): both running cells end,
    group and all, each is recorded killed, and the sweep prints its table and exits non-zero."""
    out = tmp_path / "out"
    # SIGINT at its default, as in a terminal: a test run in the background (a CI job under nohup, a shell's `&`)
    # starts with SIGINT ignored, which its children inherit, and the sweep rightly leaves an ignored signal alone
    proc = subprocess.Popen([sys.executable, "-c", SWEEP_SCRIPT, str(fake_run), str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"},
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        cells = [out / "cells" / f"task-enc-tiny-s{seed}" for seed in (0, 1)]
        started = [pids(cell) for cell in cells]
        proc.send_signal(sig)
        shown, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode not in (0, None, -sig), err
    assert "cells (paths under" in shown, err
    for cell, (run, grandchild) in zip(cells, started):
        wait_for(lambda: not alive(run) and not alive(grandchild), timeout=5)
        assert json.loads((cell / "cell.json").read_text())["state"] == "killed"
        assert re.search(rf"│ {cell.name} +│ killed ", shown), shown
        assert next_plan_of(out, cell.name) == "resume"


def next_plan_of(out: Path, cell_id: str) -> str:
    from posbench.cli.sweep import statuses

    seed = int(cell_id.rsplit("-s", 1)[1])
    cell = Cell("task", "enc", "tiny", seed, "", ())
    return statuses([cell], out)[cell.id]


def test_a_cell_and_its_run_import_nothing_from_the_working_directory(tmp_path, fake_run, monkeypatch):
    """An ``fcntl.py`` (and a ``posbench/``) where the sweep is started: with ``python -m`` the working directory
    comes first on the module path, and every cell process imported them. The cell process starts with ``-P``;
    the run's command has it too, and ``PYTHONSAFEPATH=1`` for the processes the run starts (torchrun's workers)."""
    here = tmp_path / "cwd"
    (here / "posbench").mkdir(parents=True)
    marker = tmp_path / "imported"
    hostile = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    (here / "fcntl.py").write_text(hostile)
    (here / "posbench" / "__init__.py").write_text(hostile)
    monkeypatch.chdir(here)
    fake_run.write_text(FAKE_RUN.replace("FINISH", FINISHES))
    sweep = sweep_of(tmp_path / "out", fake_run)
    outcomes = sweep.run()
    assert not marker.exists(), marker.read_text()
    assert outcomes[CELL.id].state == "done"
    cell_dir = sweep.cell_dir(CELL)
    assert (cell_dir / "argv.txt").read_text().splitlines()[:3] == ["-P", "-m", "posbench"]
    assert (cell_dir / "safepath.txt").read_text().strip() == "1"
