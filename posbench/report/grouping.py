"""Which runs ``compare`` pools into one row: those whose settings are equal but for the seed.

A run's *settings* are its resolved configuration, flattened (``model.d_model``, ``encoding.theta``,
``train.lr``, ``task.train_digits``, ...), plus the precision it really ran in and, for a run started from
another one (``--init``), that run's own settings (so runs started from the three seeds of one pretraining
form one row). Left out, because they change how fast a run goes but not what it computes (beyond
floating-point rounding): ``seed`` (the dimension that is pooled), ``device`` (the precision that the device
implied stays in), ``train.threads``, ``train.compile``, ``model.attention`` (every backend computes the same
attention), ``task.eval_batch_size``, ``train.log_every`` and ``train.checkpoint_every``; and ``preset``, whose
content is in the resolved settings. Runs whose settings differ by anything else are never pooled: each set
of settings gets its own row, labelled with what sets it apart.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from posbench.results import RESULT_FILE, load_result
from posbench.errors import UserError

IGNORED = ("train.threads", "train.compile", "train.log_every", "train.checkpoint_every", "model.attention",
           "task.eval_batch_size")
SECTIONS = (("model", "model"), ("encoding_options", "encoding"), ("train", "train"), ("task_options", "task"))

_init_cache: dict[str, dict[str, Any] | None] = {}


def forget() -> None:
    """Drop the cached ``--init`` results (each ``collect`` reads the tree afresh)."""
    _init_cache.clear()


def init_of(run: dict[str, Any]) -> str | None:
    """The run (or model directory) this run started from with ``--init``, as recorded; None if none."""
    return (run.get("config") or {}).get("init") or (run.get("init") or {}).get("run") or None


def init_result(run: dict[str, Any]) -> dict[str, Any] | None:
    """The result of the run this run started from (``--init``), when it is a readable posbench run."""
    init = init_of(run)
    if not init:
        return None
    path = Path(str(init))
    if not path.is_absolute() and not path.exists() and "_path" in run:
        # recorded relative to where the run was started: try the directories above the run
        path = next((p / path for p in Path(run["_path"]).resolve().parents if (p / path).exists()), path)
    key = str(path.resolve()) if path.exists() else str(path)
    if key not in _init_cache:
        try:
            _init_cache[key] = load_result(path / RESULT_FILE) if (path / RESULT_FILE).is_file() else None
        except UserError:
            _init_cache[key] = None
    return _init_cache[key]


def settings(run: dict[str, Any]) -> dict[str, Any]:
    """The flattened settings that define what a run computes (see the module docstring)."""
    config = run.get("config") or {}
    flat: dict[str, Any] = {}
    for section, prefix in SECTIONS:
        for key, value in (config.get(section) or {}).items():
            name = f"{prefix}.{key}"
            if name not in IGNORED:
                flat[name] = value
    precision = (run.get("environment") or {}).get("precision")
    if precision is not None:
        flat["precision"] = precision
    init = init_of(run)
    if init:
        parent = init_result(run)
        flat["init"] = f"{parent.get('task')} run {fingerprint(parent)}" if parent else str(init)
    return flat


def fingerprint(run: dict[str, Any], *, with_init: bool = True) -> str:
    """A short hash of a run's settings without its encoding and seed (and without its ``--init`` run when
    ``with_init`` is false): the runs that one pretraining recipe made for several encodings share it (their
    encodings set them apart already)."""
    flat = {k: v for k, v in settings(run).items() if not k.startswith("encoding.") and (with_init or k != "init")}
    return hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:8]


def group_key(run: dict[str, Any]) -> str:
    return json.dumps({"encoding": run.get("encoding"), **settings(run)}, sort_keys=True, default=str)


def seed_of(run: dict[str, Any]) -> Any:
    """The seed that tells apart the runs of one row: the run's own, with its ``--init`` run's appended."""
    config = run.get("config") or {}
    own = config.get("seed", (run.get("seeds") or {}).get("torch"))
    parent = init_result(run)
    return own if parent is None else f"{own}/{seed_of(parent)}"


def newest_first(run: dict[str, Any]) -> tuple:
    return (str(run.get("finished") or ""), str(run.get("run_id") or ""))


def group_runs(runs: list[dict[str, Any]]) -> tuple[list[list[dict[str, Any]]], int]:
    """Runs in groups of equal settings (first-seen order), one run per seed (the newest of repeated ones);
    also returns how many repeated runs were left out."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(group_key(run), []).append(run)
    out, repeated = [], 0
    for members in groups.values():
        by_seed: dict[str, dict[str, Any]] = {}
        for run in sorted(members, key=newest_first, reverse=True):
            by_seed.setdefault(json.dumps(seed_of(run), default=str), run)
        repeated += len(members) - len(by_seed)
        out.append(sorted(by_seed.values(), key=lambda r: str(seed_of(r))))
    return out, repeated


def distinguishing(groups: list[list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], list[str]]:
    """For each group, the settings that set it apart from the other groups of the table, and the names of
    all settings that differ between groups. Encoding options count only between groups of one encoding."""
    flats = [settings(g[0]) for g in groups]
    encodings = [str(g[0].get("encoding")) for g in groups]
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
