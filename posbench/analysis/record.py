"""The record ``posbench analyze`` writes into a run directory (``analysis.json``, docs/schema.md), read and
written without torch (compare reads it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posbench.files import atomic_write_json, json_object
from posbench.runs.record import ResultError

ANALYSIS_FILE = "analysis.json"
ANALYSIS_VERSION = 1
#: the per-head statistics of each length (``mass``, per distance bucket, beside them)
STATS = ("mean_distance", "entropy", "first_token", "beyond_train", "rigidity")


def write(run_dir: Path | str, record: dict[str, Any], force: bool = False) -> Path:
    """``analysis.json`` in the run directory, written atomically; an earlier analysis is kept unless ``force``."""
    path = Path(run_dir) / ANALYSIS_FILE
    if path.exists() and not force:
        raise ResultError(f"{path} exists (an earlier analysis); pass --force to replace it")
    atomic_write_json(path, record)
    return path


def read(run_dir: Path | str) -> dict[str, Any] | None:
    """A run's analysis record, or None without one (or one of a version this posbench does not read)."""
    data = json_object(Path(run_dir) / ANALYSIS_FILE)
    return data if data is not None and data.get("analysis_version") == ANALYSIS_VERSION else None
