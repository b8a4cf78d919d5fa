"""Run directories: created fresh (never reused), their files, and reading a whole tree of them.

Layout of one run (never overwritten; the run id is a UTC timestamp plus a random suffix)::

    <out>/<task>/<label>/<run-id>/
        config.json          the resolved RunConfig, written when the run starts (resume reads it)
        result.json          written once, when the run has finished (``posbench.runs.record``)
        predictions.jsonl    one JSON object per evaluated sample
        phases/<name>.json   what a finished training phase produced (runs of several phases: SCROLLS)
        checkpoint/          weights, optimizer and training state (``posbench.train.checkpoint``); one
                             sub-directory per phase for runs of several phases

``label`` is the encoding, or a pretrained model's label (``llama+tape``), or for a benchmark its mode.
"""

from __future__ import annotations

import itertools

import secrets
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from posbench.files import atomic_write_json, json_object, read_json, write_jsonl
from posbench.runs.config import RunConfig
from posbench.runs.record import RESULT_FILE, ResultError, RunRecord, load_record

CONFIG_FILE, PREDICTIONS_FILE, CHECKPOINT_DIR, PHASES_DIR = "config.json", "predictions.jsonl", "checkpoint", "phases"


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_dir(root: Path, task: str, label: str) -> Path:
    """Create ``root/task/label/<run-id>``; ``mkdir`` without ``exist_ok`` means it never reuses one."""
    parent = Path(root) / task / label
    parent.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        path = parent / new_run_id()
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise ResultError(f"could not create a fresh run directory under {parent}")


# ---- a run's own files -----------------------------------------------------------------------------------

def write_config(run_dir: Path, config: RunConfig, command: list[str] | None) -> None:
    """``config.json``, once, when the run starts (a resumed run keeps its own)."""
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
    return Path(run_dir) / PHASES_DIR / f"{name}.json"


def read_phase(run_dir: Path, name: str) -> dict[str, Any] | None:
    """What a finished phase recorded, or None when it has not finished."""
    return json_object(phase_file(run_dir, name))


def write_phase(run_dir: Path, name: str, outcome: dict[str, Any]) -> None:
    atomic_write_json(phase_file(run_dir, name), outcome)


# ---- a tree of runs ---------------------------------------------------------------------------------------

@dataclass
class Problem:
    path: Path
    reason: str


def scan_runs(root: Path) -> tuple[list[RunRecord], list[Problem]]:
    """Every readable run under ``root``, and the runs that are not (corrupt, half-written, unfinished)."""
    root = Path(root)
    if not root.exists():
        raise ResultError(f"results directory {root} does not exist")
    if not root.is_dir():
        raise ResultError(f"{root} is not a directory")
    records, problems = [], []
    seen: set[Path] = set()
    for result in sorted(root.rglob(RESULT_FILE)):
        if CHECKPOINT_DIR in result.parts[len(root.parts):]:
            continue
        seen.add(result.parent)
        try:
            records.append(load_record(result))
        except ResultError as exc:
            problems.append(Problem(result.parent, str(exc).replace(f"{result}: ", "")))
    for stray in sorted(root.rglob(f".{RESULT_FILE}.*.tmp")):
        if stray.parent not in seen:
            seen.add(stray.parent)
            problems.append(Problem(stray.parent, "half-written: a temporary result file and no result.json"))
    for config in sorted(root.rglob(CONFIG_FILE)):
        inside = config.parts[len(root.parts):]
        if config.parent not in seen and CHECKPOINT_DIR not in inside:
            seen.add(config.parent)
            problems.append(Problem(config.parent, "unfinished: no result.json (still running, killed or failed; "
                                                   "'posbench run --resume DIR' continues it)"))
    return records, problems
