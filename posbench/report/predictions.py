"""A run's per-example scores for ``compare --against``: its predictions file (``predictions.jsonl``, or the name
its record gives, plain or gzipped) read within bounds, through its task's ``example_scores``."""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posbench.errors import UserError
from posbench.files import (MAX_PREDICTIONS_BYTES, MAX_PREDICTIONS_ROWS, TooLarge, inside, plain_or_gzipped,
                            read_jsonl)
from posbench.registry import beyond_catalog, built_in
from posbench.runs.record import RunRecord
from posbench.runs.store import PREDICTIONS_FILE
from posbench.stats import ExampleScores

#: what gives a run's per-example scores from its record and its predictions' rows (a task's ``example_scores``)
Scorer = Callable[[RunRecord, list[dict[str, Any]]], ExampleScores | None]


def predictions_file(run: RunRecord) -> tuple[Path | None, str | None]:
    """The run's predictions file and None; or None and why it is not read: the record names an absolute path,
    or a path (or a link) that leads out of the run's folder, which compare never reads. (None, None): the run
    has no predictions file."""
    named = run.predictions or PREDICTIONS_FILE
    if not isinstance(named, str):
        return None, f"its record names predictions {str(named)[:80]!r}, not a file name"
    if Path(named).is_absolute():
        return None, f"its record names predictions at the absolute path {named[:200]!r}; only a file inside the " \
                     f"run's folder is read"
    run_dir = Path(str(run.path))
    path = plain_or_gzipped(run_dir / named)
    if path is None:
        return None, None
    if not inside(run_dir, path):
        return None, f"its predictions {named[:200]!r} lead outside the run's folder (to {path.resolve()}); not read"
    return path, None


def read_scores(run: RunRecord, scorers: dict[str, Scorer] | None = None) -> tuple[ExampleScores | None, str | None]:
    """The run's per-example scores (its task's ``example_scores`` over its predictions), or None; and the line to
    say when its predictions were refused (a path that leaves the run's folder, a file past its size bound) or
    could not be read. ``scorers``: task -> its ``scorer``, found once for every run that shares it."""
    scorers = {} if scorers is None else scorers
    path, refused = predictions_file(run)
    if path is None:
        return None, f"{run.path}: {refused}; paired across seeds only" if refused else None
    try:
        rows = read_jsonl(path, limit=MAX_PREDICTIONS_BYTES, max_rows=MAX_PREDICTIONS_ROWS)
    except TooLarge as exc:
        return None, f"{run.path}: {path.name} {exc}; not read, paired across seeds only"
    except (OSError, ValueError, EOFError, zlib.error, RecursionError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        return None, f"{run.path}: {path.name} is unreadable ({reason}); paired across seeds only"
    try:
        task = str(run.task)
        if task not in scorers:
            scorers[task] = scorer(task)
        return (scorers[task](run, rows) if rows else None), None
    except (UserError, OSError, ValueError, KeyError, TypeError, IndexError):
        return None, None      # rows that do not rebuild the task's scores: the table's note says "seeds only"


def scorer(task: str) -> Scorer:
    """What gives a task's per-example scores: a built-in task's ``example_scorer`` module, as the catalog names it
    (no torch), or the task class's ``example_scores`` (a plugin's: its class is imported)."""
    entry = None if beyond_catalog("task") else built_in("task").get(task)
    if entry is None:
        from posbench.tasks import TASKS  # torch: a task the catalog does not describe is known by its class

        return TASKS.get(task).example_scores
    module = entry["example_scorer"]
    return importlib.import_module(module).example_scores if module else lambda run, rows: None
