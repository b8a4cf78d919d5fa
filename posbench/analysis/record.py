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


def keep_earlier(run_dir: Path | str, force: bool) -> Path:
    """The run's ``analysis.json`` path; one line (``ResultError``) when an earlier analysis is there and not ``force``."""
    path = Path(run_dir) / ANALYSIS_FILE
    if path.exists() and not force:
        raise ResultError(f"{path} exists (an earlier analysis); pass --force to replace it")
    return path


def write(run_dir: Path | str, record: dict[str, Any], force: bool = False) -> Path:
    """``analysis.json`` in the run directory, written atomically; an earlier analysis is kept unless ``force``."""
    path = keep_earlier(run_dir, force)
    atomic_write_json(path, record)
    return path


def read(run_dir: Path | str) -> dict[str, Any] | None:
    """A run's analysis record, or None without one, or with one of a version this posbench does not read or not in
    the shape ``posbench analyze`` writes (compare then draws nothing of it rather than fail on it)."""
    data = json_object(Path(run_dir) / ANALYSIS_FILE)
    if data is None or data.get("analysis_version") != ANALYSIS_VERSION:
        return None
    return data if well_formed(data) else None


def number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def well_formed(data: dict[str, Any]) -> bool:
    """Every length's statistics are per call and head (lists of equal shape, numbers or null), its edges rising."""
    lengths, layers = data.get("lengths"), data.get("layers")
    if not isinstance(lengths, list) or not isinstance(layers, list) or not number(data.get("train_length")):
        return False
    for entry in lengths:
        if not isinstance(entry, dict) or not all(number(entry.get(k)) for k in ("length", "factor", "contexts")):
            return False
        edges = entry.get("edges")
        if not isinstance(edges, list) or not all(isinstance(e, int) for e in edges) or edges != sorted(edges):
            return False
        shape = None
        for stat in STATS:
            rows = entry.get(stat)
            if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
                return False
            if not all(v is None or number(v) for r in rows for v in r):
                return False
            found = [len(r) for r in rows]
            if shape is not None and found != shape:
                return False
            shape = found
        mass = entry.get("mass")
        if not isinstance(mass, list) or [len(m) if isinstance(m, list) else -1 for m in mass] != shape:
            return False
        if not all(isinstance(h, list) and len(h) == len(edges) - 1 and all(number(v) for v in h)
                   for m in mass for h in m):
            return False
    return True
