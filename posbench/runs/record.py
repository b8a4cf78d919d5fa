"""The record of a finished run (``result.json``): typed, versioned, written by one function (``write_record``) and
typed by one (``parse_record``, from the file ``posbench.runs.store.load_record`` reads) for every reader
(``compare``, the figures, the HTML page, ``posbench.results.frame``).

``result.json`` (``schema_version`` 2)::

    {
      "schema_version": 2, "run_id": str, "task": str, "encoding": str (the row name: the encoding, or a
      pretrained model's label such as llama+tape), "preset": str, "status": "complete",
      "created": ISO-8601, "finished": ISO-8601, "command": [argv...],
      "posbench": {"version", "git_commit", "git_dirty", "tree", ["base_commit", "patch", "patch_sha256"]},
      "plugins": [{"module", "file", "sha256"}, ...] (only when plugins were loaded: posbench.registry),
      "environment": {"python", "torch", "platform", "device", "device_name", "threads", "precision"},
      "seeds": {"python", "numpy", "torch", "data", "eval", ...},
      "config": RunConfig.to_dict() (task, encoding, preset, task_version, label, seed, device, init, source,
                model, encoding_options, train, task_options, logs) + {"model_config": the built model's config},
      "model": {"parameters", "checkpoint", "checkpoint_sha256", ...},
      "init": null | {"run" (what --init named), "kind", "label", "checkpoint_sha256", ...},
      "data": {"source", "hash", ...task-specific},
      "training": TrainResult.to_dict() (or, for runs of several phases, the last phase's) + "phases",
      "timings": {"train_s", "eval_s", "total_s", "tokens_per_s"} (total_s: see ``total_seconds``),
      "metrics": {name: {"value", "stderr", "n", "higher_is_better"}},
      "primary_metric": name,
      "grids": {name: {"metric", "higher_is_better", "axes": [{"name", "values"}], "values": nested lists,
                        "stderr": nested lists, "n": nested lists, "meta": {...}}},
      "evaluation": {...task-specific facts; a benchmark's cells under "bench"},
      "predictions": "predictions.jsonl" | null, "n_predictions": int
    }

Version 1 (posbench before the one-pipeline redesign) is read into the same record: its benchmark runs kept
their cells at the top level (``"bench"``), its extend runs their base model (``"base_model"``). A record
without ``config.task_version`` (written before tasks had versions) is read as version 1.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posbench import __version__
from posbench.errors import UserError
from posbench.evaluation.outcome import Grid, Metric
from posbench.files import atomic_write_json
from posbench.options import RECORDED_SECTIONS, SECTIONS
from posbench.runs.code import CodeState, capture
from posbench.runs.run_config import RunConfig

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
RESULT_FILE = "result.json"
REQUIRED_KEYS = ("task", "encoding", "metrics")
#: the parts of a recorded config (``config.KEY``) that its readers read as objects of settings
CONFIG_OBJECTS = (*(RECORDED_SECTIONS[section] for section in SECTIONS), "model_config")


class ResultError(UserError):
    """A missing, unreadable or invalid run or results tree; ``str()`` is one line."""


@dataclass
class Timings:
    train_s: float | None = None
    eval_s: float | None = None
    total_s: float | None = None
    tokens_per_s: float | None = None


def total_seconds(elapsed: float, train_s: float, eval_s: float, probe_s: float) -> float:
    """A run's ``total_s``: the wall time of the process that finished it, but never less than the work the record
    holds (training and probes summed over resumes, and evaluation). A resumed run's finishing process may have
    trained only its last steps; the earlier processes' start-up is not known and not counted."""
    return max(elapsed, train_s + eval_s + probe_s)


def record_seconds(result: dict[str, Any]) -> float | None:
    """``total_seconds`` of a result.json as read (``None`` without timings): records written before the rule
    held a resumed run's last process alone, less than its own training time."""
    timings, training = result.get("timings") or {}, result.get("training") or {}
    numbers = [timings.get("total_s"), timings.get("train_s") or 0.0, timings.get("eval_s") or 0.0,
               training.get("probe_s") or 0.0]
    if not all(isinstance(n, (int, float)) for n in numbers):
        return None
    return total_seconds(*(float(n) for n in numbers))


@dataclass
class RunRecord:
    run_id: str
    task: str
    encoding: str                                  # the row name
    preset: str
    config: RunConfig
    metrics: dict[str, Metric]
    primary_metric: str | None = None
    grids: dict[str, Grid] = field(default_factory=dict)
    model_config: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    timings: Timings = field(default_factory=Timings)
    environment: dict[str, Any] = field(default_factory=dict)
    seeds: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    init: dict[str, Any] | None = None
    data: dict[str, Any] = field(default_factory=dict)
    evaluation: dict[str, Any] = field(default_factory=dict)
    created: str | None = None
    finished: str | None = None
    command: list[str] = field(default_factory=list)
    posbench: dict[str, Any] = field(default_factory=dict)
    plugins: list[dict[str, Any]] = field(default_factory=list)    # the code of each plugin loaded (registry)
    predictions: str | None = None
    n_predictions: int = 0
    status: str = "complete"
    schema_version: int = SCHEMA_VERSION
    path: Path | None = None                       # the run directory it was read from

    # ---- what the readers ask ----------------------------------------------------------------------------
    @property
    def seed(self) -> Any:
        return self.config.seed if self.config.seed is not None else self.seeds.get("torch")

    @property
    def precision(self) -> str | None:
        return self.environment.get("precision")

    @property
    def init_given(self) -> str | None:
        """The run (or model directory) this run started from, as ``--init`` named it; None if none."""
        return self.config.init or (self.init or {}).get("run") or None

    @property
    def bench(self) -> dict[str, Any] | None:
        """A benchmark run's measurements (device, peak, cells), else None."""
        bench = self.evaluation.get("bench")
        return bench if isinstance(bench, dict) and isinstance(bench.get("cells"), list) else None

    @property
    def loss_history(self) -> list[list[float]]:
        return list(self.training.get("loss_history") or [])

    @property
    def probe_history(self) -> list[list[Any]]:
        """``[[step, {name: value}], ...]`` of a run trained with a probe (``train.probe_every``)."""
        return list(self.training.get("probe_history") or [])

    # ---- writing -------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION, "run_id": self.run_id, "task": self.task, "encoding": self.encoding,
            "preset": self.preset, "status": self.status, "created": self.created, "finished": self.finished,
            "command": self.command, "posbench": self.posbench,
            **({"plugins": self.plugins} if self.plugins else {}), "environment": self.environment,
            "seeds": self.seeds, "config": {**self.config.to_dict(), "model_config": self.model_config},
            "model": self.model, "init": self.init, "data": self.data, "training": self.training,
            "timings": vars(self.timings), "metrics": {k: m.to_dict() for k, m in self.metrics.items()},
            "primary_metric": self.primary_metric, "grids": {k: g.to_dict() for k, g in self.grids.items()},
            "evaluation": self.evaluation, "predictions": self.predictions, "n_predictions": self.n_predictions,
        }


def write_record(run_dir: Path, record: RunRecord) -> Path:
    """The one function that writes ``result.json`` (atomically: a run either has its whole record or none)."""
    return atomic_write_json(Path(run_dir) / RESULT_FILE, record.to_dict())


# ---- reading ---------------------------------------------------------------------------------------------

def parse_record(data: Any, path: Path, *, with_settings: bool = False) -> RunRecord:
    """Check and type the content of one ``result.json`` (``path``, named in the one-line errors), of any readable
    schema version (``posbench.runs.store.load_record`` reads the file). ``with_settings``: a record without its
    ``config`` object (every posbench writes one) is refused, as ``compare`` cannot tell which runs it pools with."""
    if not isinstance(data, dict):
        raise ResultError(f"{path}: not a JSON object")
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise ResultError(f"{path}: missing {', '.join(missing)}")
    if with_settings and not (isinstance(data.get("config"), dict) and data["config"]):
        raise ResultError(f"{path}: no 'config' object (the run's settings), so compare cannot tell which runs it "
                          f"pools with or what sets it apart")
    version = data.get("schema_version", 1)
    if not isinstance(version, int) or version not in READABLE_VERSIONS:
        raise ResultError(f"{path}: schema_version {version!r} is not one this posbench reads "
                          f"({', '.join(map(str, READABLE_VERSIONS))})")
    if not isinstance(data["metrics"], dict):
        raise ResultError(f"{path}: 'metrics' is not an object")
    for name, metric in data["metrics"].items():
        if not isinstance(metric, dict) or "value" not in metric:
            raise ResultError(f"{path}: metric '{name}' has no value")
    plugins = data.get("plugins")
    if plugins is not None and not (isinstance(plugins, list) and all(
            isinstance(p, dict) and all(isinstance(p.get(k), (str, type(None))) for k in ("module", "file", "sha256"))
            for p in plugins)):
        raise ResultError(f"{path}: 'plugins' is not a list of plugins (module, file, sha256)")
    config = data.get("config")
    for key in CONFIG_OBJECTS if isinstance(config, dict) else ():
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise ResultError(f"{path}: config.{key} is {type(config[key]).__name__} {str(config[key])[:60]!r}, "
                              f"not an object of settings")
    try:
        return _record(data, Path(path).parent, version)
    except (TypeError, ValueError, AttributeError, OverflowError, RecursionError) as exc:
        raise ResultError(f"{path}: not a posbench result ({type(exc).__name__}: {exc})") from None


def _record(data: dict[str, Any], run_dir: Path, version: int) -> RunRecord:
    config_data = dict(data.get("config") or {})
    model_config = config_data.pop("model_config", {}) or {}
    evaluation = dict(data.get("evaluation") or {})
    model = dict(data.get("model") or {})
    if version == 1:
        if isinstance(data.get("bench"), dict):
            evaluation["bench"] = data["bench"]
        if isinstance(data.get("base_model"), dict):
            model["base_model"] = data["base_model"]
        config_data.setdefault("label", data.get("label") or data.get("encoding"))
    config_data.setdefault("task", data["task"])
    config_data.setdefault("preset", data.get("preset", ""))
    config = RunConfig.from_dict(_v1_config(config_data))
    timings = {k: v for k, v in (data.get("timings") or {}).items() if k in Timings.__dataclass_fields__}
    return RunRecord(
        run_id=str(data.get("run_id", run_dir.name)), task=str(data["task"]), encoding=str(data["encoding"]),
        preset=str(data.get("preset", "")), config=config,
        metrics={k: Metric.from_dict(m) for k, m in data["metrics"].items()},
        primary_metric=data.get("primary_metric"),
        grids={k: Grid.from_dict(g) for k, g in (data.get("grids") or {}).items() if isinstance(g, dict)},
        model_config=model_config, training=dict(data.get("training") or {}), timings=Timings(**timings),
        environment=dict(data.get("environment") or {}), seeds=dict(data.get("seeds") or {}), model=model,
        init=data.get("init"), data=dict(data.get("data") or {}), evaluation=evaluation,
        created=data.get("created"), finished=data.get("finished"), command=list(data.get("command") or []),
        posbench=dict(data.get("posbench") or {}), plugins=list(data.get("plugins") or []),
        predictions=data.get("predictions"),
        n_predictions=int(data.get("n_predictions") or 0), status=str(data.get("status", "complete")),
        schema_version=version, path=run_dir)


def _v1_config(config: dict[str, Any]) -> dict[str, Any]:
    """Version 1 benchmark configs had no sections; keep their settings as task options."""
    if "encodings" in config and "task_options" not in config:
        sections = {"task", "preset", "device", "label"}
        config = {**{k: v for k, v in config.items() if k in sections},
                  "encoding": None, "task_options": {k: v for k, v in config.items() if k not in sections},
                  "model": config.get("model") or {}}
    if "init" in config and isinstance(config.get("init"), dict):      # never written, but be safe
        config["init"] = config["init"].get("run")
    return config


# ---- provenance ------------------------------------------------------------------------------------------

def environment_info(device: Any, precision: str) -> dict[str, Any]:
    import torch  # torch: only a run that trains records its environment; compare reads records without it

    from posbench.train.device import device_name  # torch: as above

    return {"python": sys.version.split()[0], "torch": torch.__version__, "platform": platform.platform(),
            "device": str(device), "device_name": device_name(device), "threads": torch.get_num_threads(),
            "precision": precision}


def posbench_info(state: CodeState | None = None) -> dict[str, Any]:
    """The version and the code (``posbench.runs.code``: commit, tree, and the patch's name where one was kept)."""
    return {"version": __version__, **(state if state is not None else capture()).facts}
