"""Which runs ``compare`` pools into one row: those whose settings are equal but for the seed.

A run's *settings* are its resolved configuration, flattened (``model.d_model``, ``encoding.theta``,
``train.lr``, ``task.train_digits``, ...), plus the precision it really ran in and, for a run started from
another one (``--init``), that run's own settings (so runs started from the three seeds of one pretraining
form one row). Left out, because they change how fast a run goes but not what it computes (beyond
floating-point rounding): ``seed`` (the dimension that is pooled), ``device`` (the precision that the device
implied stays in), every setting declared ``changes_results=False`` (``train.threads``, ``train.compile``,
``model.attention``, ``task.eval_batch_size``, ``train.log_every``, ``train.checkpoint_every``,
``train.probe_every``, ``task.cells_to``: ``posbench.options.Option``, read by ``posbench.setting_facts``); and
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

compare's second step (``group``): it takes what the first one read (``posbench.report.reading``: each run's
settings, seed and group key, computed there once) and returns a task's rows: the runs each pools, what sets each
apart and the lines to say.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from posbench.report.facts import PLUGINS
from posbench.report.reading import Reading
from posbench.runs.record import RunRecord


@dataclass
class Groups:
    """A task's runs in rows (``group``): each row's runs (one per seed, in the order of their seeds), their seeds
    (``RunFacts.seed``), the row's label and the settings that set it apart, and the lines its table says of them."""

    runs: list[list[RunRecord]]
    seeds: list[list[Any]]
    labels: list[str]
    apart: list[dict[str, Any]]
    notes: list[str]


def group(reading: Reading, task: str, runs: list[RunRecord]) -> Groups:
    """The rows of ``task``'s table: its runs in groups of equal settings (the module docstring)."""
    groups, repeated = group_runs(reading, runs)
    apart, differing = distinguishing(reading, groups)
    notes = [line for line in [versions_note(task, runs), plugins_note(groups)] if line]
    if differing:
        notes.append(f"rows differ in {', '.join(differing)} (besides the encoding); every other setting is equal")
    if repeated:
        notes.append(f"{repeated} repeated run(s) of a seed left out (the newest is kept; --by-run lists all)")
    return Groups(groups, [[reading[r].seed for r in g] for g in groups],
                  [label(str(g[0].encoding), a) for g, a in zip(groups, apart)], apart, notes)


def newest_first(run: RunRecord) -> tuple:
    return (str(run.finished or ""), str(run.run_id or ""))


def group_runs(reading: Reading, runs: list[RunRecord]) -> tuple[list[list[RunRecord]], int]:
    """Runs in groups of equal settings (first-seen order), one run per seed (the newest of repeated ones);
    also returns how many repeated runs were left out."""
    groups: dict[str, list[RunRecord]] = {}
    for run in runs:
        groups.setdefault(reading[run].group, []).append(run)
    out, repeated = [], 0
    for members in groups.values():
        by_seed: dict[str, RunRecord] = {}
        for run in sorted(members, key=newest_first, reverse=True):
            by_seed.setdefault(json.dumps(reading[run].seed, default=str), run)
        repeated += len(members) - len(by_seed)
        out.append(sorted(by_seed.values(), key=lambda r: str(reading[r].seed)))
    return out, repeated


def distinguishing(reading: Reading, groups: list[list[RunRecord]]) -> tuple[list[dict[str, Any]], list[str]]:
    """For each group, the settings that set it apart from the other groups of the table, and the names of
    all settings that differ between groups. Encoding options count only between groups of one encoding."""
    # version 1 is implied where unrecorded, and a setting added later holds the value earlier runs had where it
    # is not counted (a record without it, or with that value): say that value rather than "-"
    shared = [reading[g[0]].shown_shared for g in groups]
    own = [reading[g[0]].shown_own for g in groups]
    encodings = [str(g[0].encoding) for g in groups]
    varying = differing_keys(shared)
    apart = []
    for i, encoding in enumerate(encodings):
        own_keys = differing_keys([f for f, e in zip(own, encodings) if e == encoding])
        apart.append({**{k: shared[i].get(k, "-") for k in varying}, **{k: own[i].get(k, "-") for k in own_keys}})
    differing = varying + sorted({k for a in apart for k in a if k not in varying})
    return apart, differing


def differing_keys(flats: list[dict[str, Any]]) -> list[str]:
    """The names whose values are not the same in every one of ``flats`` (a name one lacks: ``"-"`` there)."""
    return [k for k in sorted({k for f in flats for k in f})
            if len({json.dumps(f.get(k, "-"), default=str) for f in flats}) > 1]


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
