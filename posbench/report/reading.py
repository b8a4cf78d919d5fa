"""``compare``'s first step: every run under a folder read once, with what the later steps ask of it
(``RunFacts``): the run it started from (``--init``), its seed, and the settings that decide which runs pool into
one row (``posbench.report.grouping`` says which count and why). Each ``--init`` record is read once, and each
run's settings are flattened once; the steps after this one (grouping, the tables, the paired differences) read
these facts and never the records' settings again.

A run's *settings* are its resolved configuration, flattened (``model.d_model``, ``encoding.theta``,
``train.lr``, ``task.train_digits``, ...), less those the declarations say change no result
(``posbench.setting_facts``) and those added later at the value earlier runs had; plus its task's version when
not 1, its plugins' code, the precision it ran in and, for a run started from another one, that run's task and
fingerprint (so runs started from the three seeds of one pretraining form one row).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posbench.cells import flattened
from posbench.errors import UserError
from posbench.options import SECTIONS
from posbench.report.effective_length import Tolerance, with_effective_lengths
from posbench.runs.record import RESULT_FILE, RunRecord, load_record
from posbench.runs.store import Problem, scan_runs
from posbench.setting_facts import SettingFacts, declared_facts, earlier_values

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


@dataclass
class Reading:
    """The runs read (``runs``, in the order found), the runs not read (``problems``) and each run's facts
    (``facts[run]``, for its ``--init`` runs too)."""

    runs: list[RunRecord]
    problems: list[Problem] = field(default_factory=list)
    _facts: dict[int, RunFacts] = field(default_factory=dict, repr=False)

    def __getitem__(self, run: RunRecord) -> RunFacts:
        return self._facts[id(run)]


def read(root: Path | str, task: str | None = None, tolerance: Tolerance = Tolerance()) -> Reading:
    """Every readable run under ``root`` (of ``task`` only, when given), each with its effective lengths
    (``posbench.report.effective_length``) and its facts."""
    runs, problems = scan_runs(Path(root))
    runs = [with_effective_lengths(run, tolerance) for run in runs]
    if task is not None:
        runs = [r for r in runs if r.task == task]
    return facts_of(runs, problems)


def facts_of(runs: list[RunRecord], problems: list[Problem] = ()) -> Reading:
    """``runs`` with their facts (and their ``--init`` runs'), read as ``read`` reads them."""
    reader = _Reader(declared_facts())
    reading = Reading(list(runs), list(problems))
    for run in runs:
        reader.facts(run)
    reading._facts = reader.done
    return reading


class _Reader:
    """Reads each run's facts once, and each ``--init`` record once (its facts too: a row's seed and settings
    hold its ``--init`` run's)."""

    def __init__(self, declared: SettingFacts):
        self.declared = declared
        self.done: dict[int, RunFacts] = {}
        self.parents: dict[str, RunRecord | None] = {}
        self.earlier: dict[tuple, dict[str, Any]] = {}     # (encoding, task) -> its earlier values, flat

    def held(self, run: RunRecord) -> dict[str, Any]:
        """The earlier values of the settings added later, flat, read once per encoding and task."""
        key = (run.encoding, run.task)
        if key not in self.earlier:
            self.earlier[key] = flattened(earlier_values(run.encoding, run.task))
        return self.earlier[key]

    def facts(self, run: RunRecord) -> RunFacts:
        if id(run) in self.done:
            return self.done[id(run)]
        parent = self.parent(run)
        above = self.facts(parent) if parent is not None else None
        flat = settings(self.declared, run, parent, above)
        shared = {k: v for k, v in flat.items() if not per_encoding(k)}
        own = {k: v for k, v in flat.items() if per_encoding(k)}
        shown = {"task_version": 1, **self.held(run), **flat}
        code = sorted([str(p.get("module")), str(p.get("sha256"))] for p in run.plugins)    # the whole hashes
        group = json.dumps({"encoding": run.encoding, **flat, **({"plugin code": code} if code else {})},
                           sort_keys=True, default=str)
        found = RunFacts(
            parent, run.seed if above is None else f"{run.seed}/{above.seed}", flat, shared, own,
            {k: v for k, v in shown.items() if not per_encoding(k)}, {k: v for k, v in shown.items() if per_encoding(k)},
            group, fingerprint(flat, with_init=False, without=("model.",)))
        self.done[id(run)] = found
        return found

    def parent(self, run: RunRecord) -> RunRecord | None:
        """The record of the run this run started from (``--init``), when it is a readable posbench run."""
        init = run.init_given
        if not init:
            return None
        path = Path(str(init))
        if not path.is_absolute() and not path.exists() and run.path is not None:
            # recorded relative to where the run was started: try the directories above the run
            path = next((p / path for p in Path(run.path).resolve().parents if (p / path).exists()), path)
        key = str(path.resolve()) if path.exists() else str(path)
        if key not in self.parents:
            try:
                self.parents[key] = load_record(path / RESULT_FILE) if (path / RESULT_FILE).is_file() else None
            except UserError:
                self.parents[key] = None
        return self.parents[key]


def settings(declared: SettingFacts, run: RunRecord, parent: RunRecord | None,
             above: RunFacts | None) -> dict[str, Any]:
    """The flattened settings that define what a run computes (the module docstring). A setting declared
    ``added`` (since schema 2) counts only when it differs from the value earlier runs had (their records lack
    it): old and new runs of one recipe pool, and old runs keep their fingerprints."""
    flat: dict[str, Any] = {}
    for section in SECTIONS:
        for key, value in run.config.section(section).items():
            name = f"{section}.{key}"
            if declared.counts(name, value, run.schema_version):
                flat[name] = value
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
