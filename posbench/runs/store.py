"""Run directories: created fresh (never reused), their files, and reading a whole tree of them.

Layout of one run (never overwritten; the run id is a UTC timestamp plus a random suffix)::

    <out>/<task>/<label>/<run-id>/
        config.json          the resolved RunConfig, written once the run is checked (resume reads it)
        .lock                flock'ed while a process works in the run; removed when it has finished
        result.json          written once, when the run has finished (``posbench.runs.record``)
        predictions.jsonl    one JSON object per evaluated sample
        phases/<name>.json   what a finished training phase produced (runs of several phases: SCROLLS)
        checkpoint/          weights, optimizer and training state (``posbench.train.checkpoint``); one
                             sub-directory per phase for runs of several phases

``label`` is the encoding, or a pretrained model's label (``llama+tape``), or for a benchmark its mode. The task
and the label become directory names only when they are plain names (``posbench.files.check_name``): a label
read from a model directory's metadata can never place a run outside ``--out``.

A run directory is locked (``lock_run``: ``flock`` on its ``.lock`` file) while a process works in it, so a
second ``--resume`` of a run that is still going is refused in one line; the lock file goes when the run has
finished.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import secrets
import shutil
import socket
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from posbench.errors import os_error
from posbench.files import MAX_RESULT_BYTES, atomic_write_json, check_name, inside, json_object, read_json, write_jsonl
from posbench.runs.run_config import RunConfig
from posbench.runs.record import RESULT_FILE, ResultError, RunRecord, parse_record

CONFIG_FILE, PREDICTIONS_FILE, CHECKPOINT_DIR, PHASES_DIR = "config.json", "predictions.jsonl", "checkpoint", "phases"
LOCK_FILE = ".lock"


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_dir(root: Path, task: str, label: str) -> Path:
    """Create ``root/task/label/<run-id>``; ``mkdir`` without ``exist_ok`` means it never reuses one. ``task``
    and ``label`` must be plain names (one path component each), so the directory lies inside ``root``."""
    root = Path(root)
    check_name(task, "the task", ResultError)
    check_name(label, "the run's label", ResultError)
    parent = root / task / label
    try:
        if root.exists() and not root.is_dir():
            raise ResultError(f"--out {root} is not a directory")
        parent.mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            path = parent / new_run_id()
            try:
                path.mkdir()
                return path
            except FileExistsError:
                continue
    except OSError as exc:
        raise os_error(exc, "create the run directory") from None
    raise ResultError(f"could not create a fresh run directory under {parent}")


def remove_unstarted(run_dir: Path, root: Path) -> None:
    """Remove a run directory this process created whose run never started (it stopped before ``config.json``
    was written), and the parents it left empty up to ``root``: nothing is left that ``--resume`` or
    ``compare`` would find."""
    run_dir = Path(run_dir)
    if (run_dir / CONFIG_FILE).exists():
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    for parent in (run_dir.parent, run_dir.parent.parent):
        if parent.resolve() == Path(root).resolve() or not inside(root, parent):
            break
        try:
            parent.rmdir()                      # only when empty
        except OSError:
            break


class RunLock:
    """An exclusive ``flock`` on ``run_dir/.lock`` for as long as a process works in the run (the kernel drops
    it when the process dies, so a killed run is never left locked)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_FILE
        self.fd: int | None = None
        for _ in range(10):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise os_error(exc, "lock the run directory") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise ResultError(f"{run_dir} is in use by {holder}; wait for it to finish (or stop it) "
                                      f"before --resume") from None
                raise os_error(exc, "lock the run directory") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:            # the run finished and removed the file meanwhile: retry
                same = False
            if same:
                self.fd = fd
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"process {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
                return
            os.close(fd)
        raise ResultError(f"could not lock {run_dir}")

    def release(self, finished: bool = False) -> None:
        """Drop the lock; ``finished``: the run has its result.json, the lock file goes too."""
        if self.fd is None:
            return
        if finished:
            try:
                os.unlink(self.path)
            except OSError:
                pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None


# ---- a run's own files -----------------------------------------------------------------------------------

def write_config(run_dir: Path, config: RunConfig, command: list[str] | None) -> None:
    """``config.json``, once, when the run has been checked and starts training (a resumed run keeps its own)."""
    if not (run_dir / CONFIG_FILE).exists():
        atomic_write_json(run_dir / CONFIG_FILE, {"config": config.to_dict(), "created": now_iso(),
                                                  "command": command or sys.argv})


def read_config(run_dir: Path) -> dict[str, Any]:
    """A run directory's ``config.json`` (``config``, ``created``, ``command``)."""
    if not Path(run_dir).is_dir():
        raise ResultError(f"run directory {run_dir} does not exist")
    stored = read_json(Path(run_dir) / CONFIG_FILE, error=ResultError,
                       missing=f"{run_dir} is not a posbench run directory (no {CONFIG_FILE})")
    if not isinstance(stored, dict) or not isinstance(stored.get("config"), dict):
        raise ResultError(f"{Path(run_dir) / CONFIG_FILE} is not a posbench run config")
    return stored


def write_predictions(run_dir: Path, rows) -> int:
    """``predictions.jsonl`` when the evaluation has per-sample rows; no file when it has none."""
    rows = iter(rows)
    first = next(rows, None)
    if first is None:
        (Path(run_dir) / PREDICTIONS_FILE).unlink(missing_ok=True)
        return 0
    return write_jsonl(run_dir / PREDICTIONS_FILE, itertools.chain([first], rows))



def phase_file(run_dir: Path, name: str) -> Path:
    return Path(run_dir) / PHASES_DIR / f"{check_name(name, 'a training phase', ResultError)}.json"


def read_phase(run_dir: Path, name: str) -> dict[str, Any] | None:
    """What a finished phase recorded, or None when it has not finished."""
    return json_object(phase_file(run_dir, name))


def write_phase(run_dir: Path, name: str, outcome: dict[str, Any]) -> None:
    atomic_write_json(phase_file(run_dir, name), outcome)


def load_record(path: Path | str, *, with_settings: bool = False) -> RunRecord:
    """Read one ``result.json`` (or a run directory holding one) into its record (``posbench.runs.record.
    parse_record``: any readable schema version; ``with_settings`` as there); one of more than ``MAX_RESULT_BYTES``
    is not read past them."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULT_FILE
    data = read_json(path, missing="{path} does not exist", unreadable="{path}: not valid JSON ({reason})",
                     error=ResultError, limit=MAX_RESULT_BYTES)
    return parse_record(data, path, with_settings=with_settings)


# ---- a tree of runs ---------------------------------------------------------------------------------------

@dataclass
class Problem:
    path: Path
    reason: str


def scan_runs(root: Path) -> tuple[list[RunRecord], list[Problem]]:
    """Every readable run under ``root``, and the runs that are not (corrupt, half-written, unfinished): the
    result files outside checkpoints are found first, then read."""
    root = Path(root)
    if not root.exists():
        raise ResultError(f"results directory {root} does not exist")
    if not root.is_dir():
        raise ResultError(f"{root} is not a directory")
    results = [result for result in sorted(root.rglob(RESULT_FILE)) if not in_checkpoint(result, root)]
    unfinished = unfinished_runs(root, {result.parent for result in results})
    records, problems = [], []
    for result in results:
        if not result.is_file():
            problems.append(Problem(result.parent, f"{RESULT_FILE} is not a regular file"))
            continue
        try:
            records.append(load_record(result, with_settings=True))
        except ResultError as exc:
            problems.append(Problem(result.parent, str(exc).replace(f"{result}: ", "")
                                    .replace(f"{result} ", f"{RESULT_FILE} ")))
    return records, problems + unfinished


def unfinished_runs(root: Path, finished: set[Path]) -> list[Problem]:
    """The run directories under ``root`` without a result file (``finished``: those with one): half-written (a
    temporary result file) or unfinished (a ``config.json``, outside checkpoints)."""
    seen, problems = set(finished), []
    for stray in sorted(root.rglob(f".{RESULT_FILE}.*.tmp")):
        if stray.parent not in seen:
            seen.add(stray.parent)
            problems.append(Problem(stray.parent, "half-written: a temporary result file and no result.json"))
    for config in sorted(root.rglob(CONFIG_FILE)):
        if config.parent not in seen and not in_checkpoint(config, root):
            seen.add(config.parent)
            problems.append(Problem(config.parent, "unfinished: no result.json (still running, killed or failed; "
                                                   "'posbench run --resume DIR' continues it)"))
    return problems


def in_checkpoint(path: Path, root: Path) -> bool:
    """Whether ``path`` lies in a checkpoint (or a checkpoint being written: ``checkpoint.tmp...``)."""
    return any(part == CHECKPOINT_DIR or part.startswith(CHECKPOINT_DIR + ".")
               for part in Path(path).parts[len(Path(root).parts):])
