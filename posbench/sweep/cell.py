"""What runs for one cell, wherever it runs: a local process (``python -m posbench.sweep.cell SPEC.json``) or a
SLURM job (submitit calls ``CellJob(spec)``). It owns the cell's folder::

    <out>/cells/<cell-id>/
        spec.json            what the sweep asked for (the ``posbench run`` arguments, threads, GPUs)
        cell.json            the cell's state, written when it starts and when it ends (``CellRecord``)
        cell.log             the runs' output, every attempt appended (each under a header line)
        cell.lock            held (flock) while the cell runs: a second sweep sees it and does not start it twice
        <task>/<label>/<run-id>/    the run, exactly as ``posbench run --out <cell folder>`` writes it

It decides from the folder what to do: a run with ``result.json`` -> nothing (done); a run without one (killed
or failed) -> ``posbench run --resume RUN_DIR``; no run -> ``posbench run`` with the cell's arguments, and
``--init`` the finished run of its parent cell. The run is a child process (its own threads, device and
memory); its exit decides the state: 0 -> done, a signal or 130 (Ctrl-C) -> killed (the next sweep resumes it),
anything else -> failed (resumed only with ``--retry-failed``). Python starts without the working directory on
its module path (``-P``, and ``PYTHONSAFEPATH=1`` for torchrun's workers): an ``fcntl.py`` or ``posbench/``
where the sweep was started is never imported in place of the real one.

Signals: the local executor starts this process as the leader of a process group of its own (``own_group`` in
the spec), which the run joins; SIGTERM here then ends the whole group (the run, and anything the run started:
torchrun's workers), and this process writes ``killed``. Such a run also holds the cell's lock (an inherited
descriptor), so a run that outlived this process would still be seen as running by the next sweep instead of
being resumed twice. On SLURM the run alone gets the SIGTERM (SLURM signals the job's processes itself).

This module imports nothing heavy (no torch): it starts in a fraction of a second, and on SLURM before the run.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from posbench.files import atomic_write_json, json_object

CELL_FILE, SPEC_FILE, LOG_FILE, LOCK_FILE = "cell.json", "spec.json", "cell.log", "cell.lock"
KILLED_CODES = {130, 137, 143}           # Ctrl-C, SIGKILL and SIGTERM as a shell reports them
#: Python's flag (3.11) that keeps the working directory (or a script's folder) off the module path; with ``-m``
#: Python would otherwise put the working directory first, before the standard library and posbench
SAFE_PATH = ["-P"]


def describe_exit(code: int | None) -> str:
    """A run's exit code in words: ``-15`` -> "killed by SIGTERM", 130 -> "interrupted (Ctrl-C)"."""
    if code is None:
        return "ended"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return {130: "interrupted (Ctrl-C)", 137: "killed (SIGKILL)", 143: "killed (SIGTERM)"}.get(code, f"exit code {code}")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_dirs(cell_dir: Path) -> list[Path]:
    """The run directories under a cell's folder (``<task>/<label>/<run-id>/``), oldest first."""
    found = [p.parent for p in Path(cell_dir).glob("*/*/*/config.json")]
    return sorted(found, key=lambda p: p.name)


def finished_run(cell_dir: Path) -> Path | None:
    done = [p for p in run_dirs(cell_dir) if (p / "result.json").is_file()]
    return done[-1] if done else None


def unfinished_run(cell_dir: Path) -> Path | None:
    left = [p for p in run_dirs(cell_dir) if not (p / "result.json").exists()]
    return left[-1] if left else None


def last_line(log: Path) -> str:
    """The last non-empty line of a log (its end only is read)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 8192))
            lines = [x.strip() for x in fh.read().decode("utf-8", "replace").replace("\r", "\n").splitlines()]
    except OSError:
        return ""
    lines = [x for x in lines if x]
    return lines[-1] if lines else ""


def is_locked(cell_dir: Path) -> bool:
    """Whether a cell process holds the cell's lock now (it is running, here or on another machine)."""
    path = Path(cell_dir) / LOCK_FILE
    if not path.exists():
        return False
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
    return False


def read_record(cell_dir: Path) -> dict[str, Any]:
    return json_object(Path(cell_dir) / CELL_FILE) or {}


def command_for(spec: dict[str, Any], cell_dir: Path) -> tuple[str, list[str]] | tuple[str, str]:
    """("resume" | "start", argv) for the run, or ("failed", reason) when its parent has no finished run."""
    prefix = [spec.get("python") or sys.executable, *SAFE_PATH]
    gpus = int(spec.get("gpus") or 0)
    if gpus > 1:
        prefix += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus)]
    prefix += ["-m", "posbench"]
    unfinished = unfinished_run(cell_dir)
    if unfinished is not None:
        return "resume", [*prefix, "run", "--resume", str(unfinished)]
    args = [*prefix, *spec["args"], "--out", str(cell_dir)]
    if spec.get("init_from"):
        parent = finished_run(Path(spec["init_from"]))
        if parent is None:
            return "failed", f"its parent cell {Path(spec['init_from']).name} has no finished run"
        args += ["--init", str(parent)]
    return "start", args


def run_cell(spec: dict[str, Any]) -> dict[str, Any]:
    """Run (or resume, or skip) one cell; returns its final ``cell.json``."""
    cell_dir = Path(spec["dir"])
    cell_dir.mkdir(parents=True, exist_ok=True)
    lock = open(cell_dir / LOCK_FILE, "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        return {"id": spec["id"], "state": "running", "note": "another process runs this cell"}
    try:
        return _run_locked(spec, cell_dir, lock.fileno())
    finally:
        lock.close()


def _run_locked(spec: dict[str, Any], cell_dir: Path, lock_fd: int) -> dict[str, Any]:
    if spec.get("cpus") and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, spec["cpus"])          # the run (a child) inherits its cores
    record: dict[str, Any] = {"id": spec["id"], "fingerprint": spec["fingerprint"], "host": socket.gethostname(),
                              "slurm_job": os.environ.get("SLURM_JOB_ID"), "log": str(cell_dir / LOG_FILE),
                              "attempts": int(read_record(cell_dir).get("attempts", 0))}
    done = finished_run(cell_dir)
    if done is not None:
        return write(cell_dir, {**record, "state": "done", "action": "none", "run_dir": str(done)})
    action, command = command_for(spec, cell_dir)
    if action == "failed":
        return write(cell_dir, {**record, "state": "failed", "action": "none", "note": command, "finished": now()})
    record.update(action=action, command=command, started=now(), attempts=record["attempts"] + 1, pid=os.getpid())
    write(cell_dir, {**record, "state": "running"})
    with open(cell_dir / LOG_FILE, "ab") as log:
        log.write(f"# posbench sweep: {action} {spec['id']} at {record['started']} on {record['host']}"
                  f"{' (SLURM job ' + record['slurm_job'] + ')' if record['slurm_job'] else ''}: "
                  f"{' '.join(command)}\n".encode())
        log.flush()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONSAFEPATH": "1", **(spec.get("env") or {})}
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                 pass_fds=(lock_fd,) if owns_group(spec) else ())   # the run holds the lock too
        code = wait_passing_signals(child, owns_group(spec))
    run_dir = finished_run(cell_dir)
    killed = code < 0 or code in KILLED_CODES
    if run_dir is not None and (code == 0 or killed):   # killed after its last write (result.json): it finished
        state = "done"
    elif killed:
        state = "killed"
    else:
        state = "failed"
    return write(cell_dir, {**record, "state": state, "returncode": code, "finished": now(),
                            "run_dir": str(run_dir or unfinished_run(cell_dir) or ""),
                            "note": "" if state == "done" else last_line(cell_dir / LOG_FILE)})


def wait_passing_signals(child: subprocess.Popen, group: bool = False) -> int:
    """Wait for the run; Ctrl-C reaches it directly (it is in this process's group, and the sweep sends it to the
    group), so this process only waits for it to stop. SIGTERM ends the run: with ``group`` (a local cell, which
    leads a process group of its own) the whole group, the run and whatever it started; else the run alone (a
    SLURM job's step, whose processes SLURM signals itself). Either way the cell's state is written after the
    run ends, and a second SIGTERM does not stop this process before it has written it."""
    previous, terminated = {}, []

    def terminate(*_: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # from here on: ours to end, then to write the state
        terminated.append(True)
        end_run(child, signal.SIGTERM, group)

    try:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, terminate)
    except ValueError:                                   # not the main thread: nothing to pass on
        pass
    try:
        return child.wait()
    finally:
        if terminated:
            previous.pop(signal.SIGTERM, None)           # terminated: SIGTERM stays ignored until the state is written
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def owns_group(spec: dict[str, Any]) -> bool:
    """Whether this cell process leads a process group of its own, as the local executor starts it (``spec``
    says so, and it does): its run, and what the run starts, are then the group's, to end together."""
    return bool(spec.get("own_group")) and hasattr(os, "getpgrp") and os.getpgrp() == os.getpid()


def end_run(child: subprocess.Popen, sig: int, group: bool = False) -> None:
    """Send ``sig`` to the run: with ``group`` to this process's whole group (this process ignores ``sig`` by
    then), else to the run alone."""
    try:
        if group:
            os.killpg(os.getpgrp(), sig)
        else:
            child.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        pass


def write(cell_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    atomic_write_json(Path(cell_dir) / CELL_FILE, record)
    return record


class CellJob:
    """The callable a SLURM job runs (pickled by submitit): one cell."""

    def __init__(self, spec: dict[str, Any]):
        self.spec = spec

    def __call__(self) -> dict[str, Any]:
        return run_cell(self.spec)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit calls this when the job is preempted or near its time limit (SIGUSR2, ``--signal=USR2@90``):
        the same cell is requeued as the same job, and resumes from its run's last checkpoint (up to three time
        limits; after that the cell is ``killed`` and the next sweep resumes it)."""
        from submitit.helpers import DelayedSubmission  # submitit: optional, only under SLURM

        return DelayedSubmission(CellJob(self.spec))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(args[0]).read_text())
    record = run_cell(spec)
    return 0 if record.get("state") == "done" else 1


if __name__ == "__main__":
    sys.exit(main())
