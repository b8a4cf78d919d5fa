"""A run's facts: what compare's steps after reading ask of one run (``RunFacts``), made once from its settings
(``posbench.report.reading`` gathers what they are made of).

A run's *settings* are its resolved configuration, flattened (``model.d_model``, ``encoding.theta``,
``train.lr``, ``task.train_digits``, ...), less those the declarations say change no result and those added later
at the value earlier runs had (``posbench.setting_facts``); plus its task's version when not 1, its plugins' code,
the precision it ran in and, for a run started from another one, that run's task and fingerprint (so runs started
from the three seeds of one pretraining form one row). Which of them decide that runs pool into one row, and
why: ``posbench.report.grouping``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from posbench.runs.record import RunRecord

#: the setting that holds a run's plugins' code (``module`` and the start of its SHA-256, one entry per plugin)
PLUGINS = "plugins"


@dataclass(frozen=True)
class RunFacts:
    """What compare's later steps read of one run, computed once when it is read."""

    parent: RunRecord | None    # the record of the run it started from (--init), when a readable posbench run
    seed: Any                   # its seed, with its --init run's appended (``"0/1"``): what tells a row's runs apart
    settings: dict[str, Any]    # its settings (the module docstring), flat
    shared: dict[str, Any]      # those compared between every row: all but ``own``
    own: dict[str, Any]         # those compared between rows of one encoding: its options and its plugins' code
    shown_shared: dict[str, Any]    # ``shared`` as a row's label says it: version 1 and the earlier values where
    shown_own: dict[str, Any]       # unrecorded (``held``); ``own`` likewise
    group: str                  # runs of one group key pool into one row
    evaluation: str             # the fingerprint of what an evaluation run measured (``--by-model``'s columns)


def run_facts(run: RunRecord, parent: RunRecord | None, above: RunFacts | None, counted: dict[str, Any],
              held: dict[str, Any]) -> RunFacts:
    """The facts of ``run`` from ``counted``, the recorded settings that count (flat), and ``held``, the earlier
    values of the settings added later (flat); ``parent`` and ``above``: the record and the facts of the run it
    started from (--init), when readable."""
    flat = settings(run, counted, parent, above)
    shared = {k: v for k, v in flat.items() if not per_encoding(k)}
    own = {k: v for k, v in flat.items() if per_encoding(k)}
    shown = {"task_version": 1, **held, **flat}
    code = sorted([str(p.get("module")), str(p.get("sha256"))] for p in run.plugins)    # the whole hashes
    group = json.dumps({"encoding": run.encoding, **flat, **({"plugin code": code} if code else {})},
                       sort_keys=True, default=str)
    return RunFacts(
        parent, run.seed if above is None else f"{run.seed}/{above.seed}", flat, shared, own,
        {k: v for k, v in shown.items() if not per_encoding(k)}, {k: v for k, v in shown.items() if per_encoding(k)},
        group, fingerprint(flat, with_init=False, without=("model.",)))


def settings(run: RunRecord, counted: dict[str, Any], parent: RunRecord | None,
             above: RunFacts | None) -> dict[str, Any]:
    """The flattened settings that define what a run computes (the module docstring): ``counted``, then what its
    record says beside its configuration."""
    flat = dict(counted)
    if run.config.task_version != 1:
        flat["task_version"] = run.config.task_version
    if run.plugins:
        flat[PLUGINS] = sorted(f"{p.get('module')} {str(p.get('sha256'))[:12]}" for p in run.plugins)
    if run.precision is not None:
        flat["precision"] = run.precision
    if run.init_given:
        flat["init"] = f"{parent.task} run {fingerprint(above.settings)}" if parent else str(run.init_given)
    return flat


def fingerprint(flat: dict[str, Any], *, with_init: bool = True, without: tuple[str, ...] = ()) -> str:
    """A short hash of a run's settings without its encoding and seed (and without its ``--init`` run when
    ``with_init`` is false, and the settings starting with any of ``without``): the runs that one pretraining
    recipe made for several encodings share it (their encodings set them apart already)."""
    kept = {k: v for k, v in flat.items() if not k.startswith(("encoding.", *without)) and (with_init or k != "init")}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:8]


def per_encoding(name: str) -> bool:
    """A setting compared only between rows of one encoding: the encoding's options, and the plugins' code."""
    return name.startswith("encoding.") or name == PLUGINS
