"""Run directories, the ``result.json`` schema, per-sample predictions, atomic writes, and reading trees.

Layout of one run (never overwritten; the run id is a UTC timestamp plus a random suffix)::

    <out>/<task>/<encoding>/<run-id>/
        config.json          the resolved RunConfig, written when the run starts (resume reads it)
        result.json          written once, when the run has finished (schema below)
        predictions.jsonl    one JSON object per evaluated sample
        checkpoint/          model.safetensors, model_config.json, optimizer.safetensors, train_state.json (see checkpoint.py)

``result.json`` (``schema_version`` 1)::

    {
      "schema_version": 1, "run_id": str, "task": str, "encoding": str, "preset": str, "status": "complete",
      "created": ISO-8601, "finished": ISO-8601, "command": [argv...],
      "posbench": {"version", "git_commit", "git_dirty"},
      "environment": {"python", "torch", "platform", "device", "device_name", "threads", "precision"},
      "seeds": {"python", "numpy", "torch", "data", "eval"},
      "config": RunConfig.to_dict() + {"model_config": the full ModelConfig incl. encoding_options},
      "model": {"parameters", "checkpoint", "checkpoint_sha256"},
      "init": null | {"run": dir, "checkpoint_sha256"},
      "data": {"source", "hash", ...task-specific},
      "training": TrainResult.to_dict(),
      "timings": {"train_s", "eval_s", "total_s", "tokens_per_s"},
      "metrics": {name: {"value", "stderr", "n", "higher_is_better"}},
      "primary_metric": name,
      "grids": {name: {"metric", "higher_is_better", "axes": [{"name", "values"}], "values": nested lists,
                        "stderr": nested lists, "n": nested lists, "meta": {...}}},
      "predictions": "predictions.jsonl"
    }

Grid ``values`` are nested lists in axis order (``values[i][j]`` is axes[0].values[i] x axes[1].values[j]);
``None`` marks a cell that was not evaluated. Every file is written atomically (temp file + ``os.replace``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from posbench.errors import UserError

SCHEMA_VERSION = 1
RESULT_FILE, CONFIG_FILE, PREDICTIONS_FILE, CHECKPOINT_DIR = (
    "result.json", "config.json", "predictions.jsonl", "checkpoint")


_UMASK = os.umask(0)
os.umask(_UMASK)


class ResultError(UserError):
    """A missing, unreadable or invalid run or results tree; ``str()`` is one line."""


# ---- metrics and grids -----------------------------------------------------------------------------------

@dataclass
class Metric:
    value: float | None
    stderr: float | None = None
    n: int | None = None
    higher_is_better: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"value": _finite(self.value), "stderr": _finite(self.stderr), "n": self.n,
                "higher_is_better": self.higher_is_better}


@dataclass
class Axis:
    name: str
    values: list[Any]


@dataclass
class Grid:
    """A metric over one or more axes (operand lengths, context length x depth, ...)."""

    metric: str
    axes: list[Axis]
    values: list[Any]                              # nested lists in axis order; None = not evaluated
    stderr: list[Any] | None = None
    n: list[Any] | None = None
    higher_is_better: bool = True
    meta: dict[str, Any] = field(default_factory=dict)   # e.g. {"train_max": {"len_a": 5, "len_b": 5}}

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "higher_is_better": self.higher_is_better,
                "axes": [asdict(a) for a in self.axes], "values": _finite_nested(self.values),
                "stderr": _finite_nested(self.stderr), "n": self.n, "meta": self.meta}


@dataclass
class Evaluation:
    """What ``Task.evaluate`` returns."""

    metrics: dict[str, Metric]
    primary: str                                   # the headline metric (compare sorts and plots by it)
    grids: dict[str, Grid] = field(default_factory=dict)
    predictions: Iterable[dict[str, Any]] = ()     # one JSON-able dict per sample -> predictions.jsonl
    info: dict[str, Any] = field(default_factory=dict)   # extra facts recorded under result["evaluation"]


def mean_stderr(values: list[float]) -> float | None:
    """Standard error of a mean with the sample standard deviation (as lm-evaluation-harness)."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return math.sqrt(var / n)


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _finite_nested(x: Any) -> Any:
    if isinstance(x, list):
        return [_finite_nested(v) for v in x]
    return _finite(x)


# ---- atomic files ----------------------------------------------------------------------------------------

def atomic_save(path: Path, writer: Callable[[Path], None]) -> Path:
    """Call ``writer(tmp_path)`` then rename the temp file onto ``path`` (same directory, so atomic)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        writer(Path(tmp))
        os.chmod(tmp, 0o666 & ~_UMASK)          # mkstemp creates 0600; give the usual file mode
        os.replace(tmp, path)
    except BaseException:
        with _suppress():
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    return atomic_save(path, write)


def atomic_write_json(path: Path, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, default=_json_default, allow_nan=False) + "\n")


def write_predictions(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write ``rows`` as JSON lines, atomically; returns how many."""
    count = 0

    def write(tmp: Path) -> None:
        nonlocal count
        with open(tmp, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, default=_json_default) + "\n")
                count += 1
    atomic_save(path, write)
    return count


def read_predictions(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return True


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


# ---- run directories -------------------------------------------------------------------------------------

def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def new_run_dir(root: Path, task: str, encoding: str) -> Path:
    """Create ``root/task/encoding/<run-id>``; ``mkdir`` without ``exist_ok`` means it never reuses one."""
    parent = Path(root) / task / encoding
    parent.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        path = parent / new_run_id()
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise ResultError(f"could not create a fresh run directory under {parent}")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def git_info() -> dict[str, Any]:
    """The commit of the posbench source tree, when it is a git checkout."""
    here = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5)
        if commit.returncode != 0:
            return {"git_commit": None, "git_dirty": None}
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        return {"git_commit": commit.stdout.strip(), "git_dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None, "git_dirty": None}


def environment_info(device: Any, precision: str) -> dict[str, Any]:
    import torch

    device = torch.device(device)
    name = platform.processor() or platform.machine()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    return {"python": sys.version.split()[0], "torch": torch.__version__, "platform": platform.platform(),
            "device": str(device), "device_name": name, "threads": torch.get_num_threads(),
            "precision": precision}


def posbench_info() -> dict[str, Any]:
    from posbench import __version__

    return {"version": __version__, **git_info()}


# ---- reading runs ----------------------------------------------------------------------------------------

@dataclass
class Problem:
    path: Path
    reason: str


REQUIRED_KEYS = ("task", "encoding", "metrics")


def load_result(path: Path) -> dict[str, Any]:
    """Read and check one ``result.json`` (or a run directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULT_FILE
    data = read_json(path, missing="{path} does not exist", unreadable="{path}: not valid JSON ({reason})")
    if not isinstance(data, dict):
        raise ResultError(f"{path}: not a JSON object")
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise ResultError(f"{path}: missing {', '.join(missing)}")
    if not isinstance(data["metrics"], dict):
        raise ResultError(f"{path}: 'metrics' is not an object")
    for name, metric in data["metrics"].items():
        if not isinstance(metric, dict) or "value" not in metric:
            raise ResultError(f"{path}: metric '{name}' has no value")
    version = data.get("schema_version", SCHEMA_VERSION)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ResultError(f"{path}: schema_version {version!r} is newer than this posbench reads ({SCHEMA_VERSION})")
    data["_path"] = str(path.parent)
    return data


def scan_runs(root: Path) -> tuple[list[dict[str, Any]], list[Problem]]:
    """Every readable run under ``root``, and the runs that are not (corrupt, half-written, unfinished)."""
    root = Path(root)
    if not root.exists():
        raise ResultError(f"results directory {root} does not exist")
    if not root.is_dir():
        raise ResultError(f"{root} is not a directory")
    runs, problems = [], []
    seen: set[Path] = set()
    for result in sorted(root.rglob(RESULT_FILE)):
        if CHECKPOINT_DIR in result.parts[len(root.parts):]:
            continue
        seen.add(result.parent)
        try:
            runs.append(load_result(result))
        except ResultError as exc:
            problems.append(Problem(result.parent, str(exc).replace(f"{result}: ", "")))
    for stray in sorted(root.rglob(f".{RESULT_FILE}.*.tmp")):
        if stray.parent not in seen:
            seen.add(stray.parent)
            problems.append(Problem(stray.parent, "half-written: a temporary result file and no result.json"))
    for config in sorted(root.rglob(CONFIG_FILE)):
        if config.parent not in seen and CHECKPOINT_DIR not in config.parts[len(root.parts):]:
            seen.add(config.parent)
            command = "extend" if config.parent.parent.parent.name == "extend" else "run"   # <task>/<label>/<id>
            problems.append(Problem(config.parent, "unfinished: no result.json (still running, killed or "
                                                   f"failed; 'posbench {command} --resume DIR' continues it)"))
    return runs, problems


def read_run_config(run_dir: Path) -> dict[str, Any]:
    if not Path(run_dir).is_dir():
        raise ResultError(f"run directory {run_dir} does not exist")
    return read_json(Path(run_dir) / CONFIG_FILE,
                     missing=f"{run_dir} is not a posbench run directory (no {CONFIG_FILE})")


def read_json(path: Path | str, *, missing: str, unreadable: str = "cannot read {path}: {reason}",
              error: type[UserError] = ResultError) -> Any:
    """The JSON in ``path``, or ``error`` with one line: ``missing`` when there is no such file, else
    ``unreadable`` (both may name ``{path}``; ``unreadable`` also ``{reason}``, the first line of the cause)."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(missing.replace("{path}", str(path))) from None
    except (OSError, ValueError) as exc:          # ValueError covers bad JSON and bad UTF-8
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise error(unreadable.replace("{path}", str(path)).replace("{reason}", reason)) from None


def result_header(run_dir: Path, task: str, encoding: str, preset: str, *, created: str, command: list[str] | None,
                  device: Any, precision: str, resumed: bool = False) -> dict[str, Any]:
    """The fields every ``result.json`` opens with (schema, identity, provenance). A resumed run keeps the
    creation time and command its ``config.json`` recorded when it started."""
    prior = read_run_config(run_dir) if resumed else {}
    command = prior.get("command", command or sys.argv)
    return {"schema_version": SCHEMA_VERSION, "run_id": Path(run_dir).name, "task": task, "encoding": encoding,
            "preset": preset, "status": "complete", "created": prior.get("created", created), "finished": now_iso(),
            "command": command, "posbench": posbench_info(), "environment": environment_info(device, precision)}


def result_timings(train_s: float, eval_s: float, started: float, tokens_per_s: float) -> dict[str, float]:
    return {"train_s": round(train_s, 3), "eval_s": round(eval_s, 3),
            "total_s": round(time.perf_counter() - started, 3), "tokens_per_s": round(tokens_per_s, 1)}


def elapsed(start: float) -> float:
    return round(time.perf_counter() - start, 3)
