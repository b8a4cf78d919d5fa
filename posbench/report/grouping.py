"""Which runs ``compare`` pools into one row: those whose settings are equal but for the seed.

A run's *settings* are its resolved configuration, flattened (``model.d_model``, ``encoding.theta``,
``train.lr``, ``task.train_digits``, ...), plus the precision it really ran in and, for a run started from
another one (``--init``), that run's own settings (so runs started from the three seeds of one pretraining
form one row). Left out, because they change how fast a run goes but not what it computes (beyond
floating-point rounding): ``seed`` (the dimension that is pooled), ``device`` (the precision that the device
implied stays in), every setting declared ``changes_results=False`` (``train.threads``, ``train.compile``,
``model.attention``, ``task.eval_batch_size``, ``train.log_every``, ``train.checkpoint_every``,
``train.probe_every``, ``task.cells_to``: ``posbench.options.Option``, read by ``setting_facts``); and
``preset``, whose content is in the resolved settings. Runs whose settings differ by anything else are never
pooled: each set of settings gets its own row, labelled with what sets it apart.

The code of the plugins a run loaded (``plugins`` in its record: each one's module and the SHA-256 of its source,
``posbench.registry.loaded_plugins``) counts as a setting too, ``plugins``, compared as an encoding's options are
(between rows of one encoding): runs of one name whose plugin code differs (a plugin file edited between them, or
loaded in one and not the other) are never pooled, each row is labelled with its plugins' hashes, and
``plugins_note`` says why. Records without ``plugins`` (no plugin loaded) are as they were.

The version of the task that made a run (``task_version``, 1 for records written before versions existed) is
a setting too, counted only when it is not 1 (so that the runs and fingerprints of version 1 stay as they
were): runs of two versions of a task are never pooled, and ``versions_note`` says so in one line.

The functions that read settings take the ``Comparison`` the compare built (the declarations' facts, the
``--init`` records already read).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from posbench.options import SECTIONS
from posbench.report.comparison import Comparison
from posbench.runs.record import RunRecord

#: the setting that holds a run's plugins' code (``module`` and the start of its SHA-256, one entry per plugin)
PLUGINS = "plugins"


def settings(comparison: Comparison, run: RunRecord) -> dict[str, Any]:
    """The flattened settings that define what a run computes (see the module docstring). A setting declared
    ``added`` (since schema 2) counts only when it differs from the value earlier runs had (their records lack
    it): old and new runs of one recipe pool, and old runs keep their fingerprints."""
    flat: dict[str, Any] = {}
    for section in SECTIONS:
        for key, value in run.config.section(section).items():
            name = f"{section}.{key}"
            if comparison.facts.counts(name, value, run.schema_version):
                flat[name] = value
    if run.config.task_version != 1:
        flat["task_version"] = run.config.task_version
    if run.plugins:
        flat[PLUGINS] = sorted(f"{p.get('module')} {str(p.get('sha256'))[:12]}" for p in run.plugins)
    if run.precision is not None:
        flat["precision"] = run.precision
    if run.init_given:
        parent = comparison.parent(run)
        flat["init"] = f"{parent.task} run {fingerprint(comparison, parent)}" if parent else str(run.init_given)
    return flat


def fingerprint(comparison: Comparison, run: RunRecord, *, with_init: bool = True,
                without: tuple[str, ...] = ()) -> str:
    """A short hash of a run's settings without its encoding and seed (and without its ``--init`` run when
    ``with_init`` is false, and the settings starting with any of ``without``): the runs that one pretraining
    recipe made for several encodings share it (their encodings set them apart already)."""
    flat = {k: v for k, v in settings(comparison, run).items() if not k.startswith(("encoding.", *without))
            and (with_init or k != "init")}
    return hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:8]


def group_key(comparison: Comparison, run: RunRecord) -> str:
    code = sorted([str(p.get("module")), str(p.get("sha256"))] for p in run.plugins)    # the whole hashes
    key = {"encoding": run.encoding, **settings(comparison, run), **({"plugin code": code} if code else {})}
    return json.dumps(key, sort_keys=True, default=str)


def per_encoding(name: str) -> bool:
    """A setting compared only between rows of one encoding: the encoding's options, and the plugins' code."""
    return name.startswith("encoding.") or name == PLUGINS


def seed_of(comparison: Comparison, run: RunRecord) -> Any:
    """The seed that tells apart the runs of one row: the run's own, with its ``--init`` run's appended."""
    parent = comparison.parent(run)
    return run.seed if parent is None else f"{run.seed}/{seed_of(comparison, parent)}"


def newest_first(run: RunRecord) -> tuple:
    return (str(run.finished or ""), str(run.run_id or ""))


def group_runs(comparison: Comparison, runs: list[RunRecord]) -> tuple[list[list[RunRecord]], int]:
    """Runs in groups of equal settings (first-seen order), one run per seed (the newest of repeated ones);
    also returns how many repeated runs were left out."""
    groups: dict[str, list[RunRecord]] = {}
    for run in runs:
        groups.setdefault(group_key(comparison, run), []).append(run)
    out, repeated = [], 0
    for members in groups.values():
        by_seed: dict[str, RunRecord] = {}
        for run in sorted(members, key=newest_first, reverse=True):
            by_seed.setdefault(json.dumps(seed_of(comparison, run), default=str), run)
        repeated += len(members) - len(by_seed)
        out.append(sorted(by_seed.values(), key=lambda r: str(seed_of(comparison, r))))
    return out, repeated


def distinguishing(comparison: Comparison,
                   groups: list[list[RunRecord]]) -> tuple[list[dict[str, Any]], list[str]]:
    """For each group, the settings that set it apart from the other groups of the table, and the names of
    all settings that differ between groups. Encoding options count only between groups of one encoding."""
    # version 1 is implied where unrecorded, and a setting added later holds the value earlier runs had where it
    # is not counted (a record without it, or with that value): say that value rather than "-"
    flats = [{"task_version": 1, **held(g[0]), **settings(comparison, g[0])} for g in groups]
    encodings = [str(g[0].encoding) for g in groups]
    keys = sorted({k for f in flats for k in f})
    varying = [k for k in keys if not per_encoding(k)
               and len({json.dumps(f.get(k, "-"), default=str) for f in flats}) > 1]
    apart = []
    for flat, enc in zip(flats, encodings):
        same_enc = [f for f, e in zip(flats, encodings) if e == enc]
        own = [k for k in keys if per_encoding(k)
               and len({json.dumps(f.get(k, "-"), default=str) for f in same_enc}) > 1]
        apart.append({k: flat.get(k, "-") for k in [*varying, *own]})
    differing = varying + sorted({k for a in apart for k in a if per_encoding(k)})
    return apart, differing


def held(run: RunRecord) -> dict[str, Any]:
    """The earlier values of the settings added later (``runs.config.earlier_values``), flat, for ``run``'s row."""
    from posbench.runs.config import earlier_values

    return {f"{section}.{key}": value for section, values in earlier_values(run.encoding, run.task).items()
            for key, value in values.items()}


def versions_note(task: str, runs: list[RunRecord]) -> str | None:
    """One line when the runs of a task come from several versions of it (they are never pooled)."""
    counts: dict[int, int] = {}
    for run in runs:
        counts[run.config.task_version] = counts.get(run.config.task_version, 0) + 1
    if len(counts) < 2:
        return None
    which = " and ".join(f"version {v} ({n} run{'s' if n != 1 else ''})" for v, n in sorted(counts.items()))
    return f"task '{task}' has runs of {which}: runs of different versions are never pooled"


def plugins_note(groups: list[list[RunRecord]]) -> str | None:
    """One line when rows of one encoding are apart because their runs ran different plugin code."""
    code: dict[str, set[str]] = {}
    for group in groups:
        run = group[0]
        code.setdefault(str(run.encoding), set()).add(json.dumps(sorted(
            [str(p.get("module")), str(p.get("sha256"))] for p in run.plugins)))
    split = sorted(encoding for encoding, kinds in code.items() if len(kinds) > 1)
    if not split:
        return None
    return (f"{', '.join(split)}: runs of different plugin code (the SHA-256 of each plugin's source, "
            f"or a plugin loaded in some runs only) are never pooled; each row says its plugins' code ('{PLUGINS}'). "
            f"A plugin edited under the same name is a different encoding: docs/extending.md says how to version one")


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
