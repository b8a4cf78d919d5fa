"""Which runs ``compare`` pools into one row: those whose settings are equal but for the seed.

A run's *settings* are its resolved configuration, flattened (``model.d_model``, ``encoding.theta``,
``train.lr``, ``task.train_digits``, ...), plus the precision it really ran in and, for a run started from
another one (``--init``), that run's own settings (so runs started from the three seeds of one pretraining
form one row). Left out, because they change how fast a run goes but not what it computes (beyond
floating-point rounding): ``seed`` (the dimension that is pooled), ``device`` (the precision that the device
implied stays in), ``train.threads``, ``train.compile``, ``model.attention`` (every backend computes the same
attention), ``task.eval_batch_size``, ``train.log_every``, ``train.checkpoint_every``, ``train.probe_every`` (a
probe forks torch's random state) and ``task.cells_to`` (where a bench also appended its cells); and
``preset``, whose content is in the resolved settings. Runs whose settings differ by anything else are never
pooled: each set of settings gets its own row, labelled with what sets it apart.

The version of the task that made a run (``task_version``, 1 for records written before versions existed) is
a setting too, counted only when it is not 1 (so that the runs and fingerprints of version 1 stay as they
were): runs of two versions of a task are never pooled, and ``versions_note`` says so in one line.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from posbench.errors import UserError
from posbench.runs.record import RESULT_FILE, RunRecord, load_record

IGNORED = ("train.threads", "train.compile", "train.log_every", "train.checkpoint_every", "train.probe_every",
           "model.attention", "task.eval_batch_size", "task.cells_to")
SECTIONS = ("model", "encoding", "train", "task")
#: settings added since schema 1, with their defaults
ADDED = {"train.checkpointing": False,
         # the backbone's settings (the pre-norm decoder's values, which every earlier run had)
         "model.norm": "rms", "model.norm_position": "pre", "model.mlp": "swiglu", "model.embedding_norm": False,
         "model.head_mlp": False, "model.recurrences": 1, "model.eval_recurrences": 0, "model.input_injection": False,
         "model.state_std": 0.0, "model.init_scheme": "normal",
         "encoding.table_init": "x-transformers", "encoding.attention_bias": "none", "encoding.fire_init_l": 0.0,
         "task.start_token": False}

_init_cache: dict[str, RunRecord | None] = {}


def forget() -> None:
    """Drop the cached ``--init`` records (each ``collect`` reads the tree afresh)."""
    _init_cache.clear()


def init_result(run: RunRecord) -> RunRecord | None:
    """The record of the run this run started from (``--init``), when it is a readable posbench run."""
    init = run.init_given
    if not init:
        return None
    path = Path(str(init))
    if not path.is_absolute() and not path.exists() and run.path is not None:
        # recorded relative to where the run was started: try the directories above the run
        path = next((p / path for p in Path(run.path).resolve().parents if (p / path).exists()), path)
    key = str(path.resolve()) if path.exists() else str(path)
    if key not in _init_cache:
        try:
            _init_cache[key] = load_record(path / RESULT_FILE) if (path / RESULT_FILE).is_file() else None
        except UserError:
            _init_cache[key] = None
    return _init_cache[key]


def settings(run: RunRecord) -> dict[str, Any]:
    """The flattened settings that define what a run computes (see the module docstring). In a record of
    schema 2 or later, a setting added since schema 1 counts only when it differs from its default (records of
    schema 1 lack it): old and new runs of one recipe pool, and old runs keep their fingerprints."""
    flat: dict[str, Any] = {}
    for section in SECTIONS:
        for key, value in run.config.section(section).items():
            name = f"{section}.{key}"
            added_default = run.schema_version >= 2 and name in ADDED and ADDED[name] == value
            if name not in IGNORED and not added_default:
                flat[name] = value
    if run.config.task_version != 1:
        flat["task_version"] = run.config.task_version
    if run.precision is not None:
        flat["precision"] = run.precision
    if run.init_given:
        parent = init_result(run)
        flat["init"] = f"{parent.task} run {fingerprint(parent)}" if parent else str(run.init_given)
    return flat


def fingerprint(run: RunRecord, *, with_init: bool = True, without: tuple[str, ...] = ()) -> str:
    """A short hash of a run's settings without its encoding and seed (and without its ``--init`` run when
    ``with_init`` is false, and the settings starting with any of ``without``): the runs that one pretraining
    recipe made for several encodings share it (their encodings set them apart already)."""
    flat = {k: v for k, v in settings(run).items() if not k.startswith(("encoding.", *without))
            and (with_init or k != "init")}
    return hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:8]


def group_key(run: RunRecord) -> str:
    return json.dumps({"encoding": run.encoding, **settings(run)}, sort_keys=True, default=str)


def seed_of(run: RunRecord) -> Any:
    """The seed that tells apart the runs of one row: the run's own, with its ``--init`` run's appended."""
    parent = init_result(run)
    return run.seed if parent is None else f"{run.seed}/{seed_of(parent)}"


def newest_first(run: RunRecord) -> tuple:
    return (str(run.finished or ""), str(run.run_id or ""))


def group_runs(runs: list[RunRecord]) -> tuple[list[list[RunRecord]], int]:
    """Runs in groups of equal settings (first-seen order), one run per seed (the newest of repeated ones);
    also returns how many repeated runs were left out."""
    groups: dict[str, list[RunRecord]] = {}
    for run in runs:
        groups.setdefault(group_key(run), []).append(run)
    out, repeated = [], 0
    for members in groups.values():
        by_seed: dict[str, RunRecord] = {}
        for run in sorted(members, key=newest_first, reverse=True):
            by_seed.setdefault(json.dumps(seed_of(run), default=str), run)
        repeated += len(members) - len(by_seed)
        out.append(sorted(by_seed.values(), key=lambda r: str(seed_of(r))))
    return out, repeated


def distinguishing(groups: list[list[RunRecord]]) -> tuple[list[dict[str, Any]], list[str]]:
    """For each group, the settings that set it apart from the other groups of the table, and the names of
    all settings that differ between groups. Encoding options count only between groups of one encoding."""
    flats = [{"task_version": 1, **settings(g[0])} for g in groups]    # version 1 is implied where unrecorded
    encodings = [str(g[0].encoding) for g in groups]
    keys = sorted({k for f in flats for k in f})
    varying = [k for k in keys if not k.startswith("encoding.")
               and len({json.dumps(f.get(k, "-"), default=str) for f in flats}) > 1]
    apart = []
    for flat, enc in zip(flats, encodings):
        same_enc = [f for f, e in zip(flats, encodings) if e == enc]
        own = [k for k in keys if k.startswith("encoding.")
               and len({json.dumps(f.get(k, "-"), default=str) for f in same_enc}) > 1]
        apart.append({k: flat.get(k, "-") for k in [*varying, *own]})
    differing = varying + sorted({k for a in apart for k in a if k.startswith("encoding.")})
    return apart, differing


def versions_note(task: str, runs: list[RunRecord]) -> str | None:
    """One line when the runs of a task come from several versions of it (they are never pooled)."""
    counts: dict[int, int] = {}
    for run in runs:
        counts[run.config.task_version] = counts.get(run.config.task_version, 0) + 1
    if len(counts) < 2:
        return None
    which = " and ".join(f"version {v} ({n} run{'s' if n != 1 else ''})" for v, n in sorted(counts.items()))
    return f"task '{task}' has runs of {which}: runs of different versions are never pooled"


def label(encoding: str, apart: dict[str, Any]) -> str:
    if not apart:
        return encoding
    return f"{encoding} [{', '.join(f'{k}={show(v)}' for k, v in apart.items())}]"


def show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(show(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
