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

compare's second step (``by_task``): it takes what the first one returned (``posbench.report.reading``: each run's
settings, seed and group key, computed there once) and returns each task's rows: the runs each pools with their
facts (which travel on with them: the later steps look nothing up again), what sets each apart and the lines to say.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from posbench.report.facts import PLUGINS, RunFacts
from posbench.report.reading import Reading
from posbench.runs.record import RunRecord

#: a run as read: its record and its facts (``posbench.report.facts.RunFacts``), which travel together from here on
RunRead = tuple[RunRecord, RunFacts]


@dataclass
class Members:
    """One row's runs (one per seed, in the order of their seeds) and their facts, what the row says of its seed
    (one run's, or the list of them), its label and the settings that set it apart."""

    runs: list[RunRecord]
    facts: list[RunFacts]
    seed: Any
    label: str
    apart: dict[str, Any] = field(default_factory=dict)


@dataclass
class Groups:
    """A task's runs (``runs``, in the order read) in rows (``rows``: pooled by seed when ``grouped``, else one per
    run, ``--by-run``) and the lines its table says of them."""

    task: str
    runs: list[RunRecord]
    rows: list[Members]
    notes: list[str]
    grouped: bool = True


def by_task(reading: Reading, *, by_run: bool = False) -> list[Groups]:
    """The runs ``reading`` read, except the benchmark runs (each a table of its own: ``posbench.report.bench``), by
    task in the order of the tasks' names, each task's in rows (``group``; one per run when ``by_run``:
    ``one_per_run``). Each run's facts are looked up here, once, and go on with it."""
    runs = [run for run in reading.runs if run.bench is None]
    return [of_task(task, [run for run in runs if str(run.task) == task], reading, by_run=by_run)
            for task in sorted({str(run.task) for run in runs})]


def of_task(task: str, runs: list[RunRecord], reading: Reading, *, by_run: bool = False) -> Groups:
    """``task``'s runs in rows (``group``; one per run when ``by_run``: ``one_per_run``), each run's facts looked up
    in ``reading`` here, once, to go on with it."""
    read = [(run, reading[run]) for run in runs]
    return one_per_run(task, read) if by_run else group(task, read)


def group(task: str, read: list[RunRead]) -> Groups:
    """The rows of ``task``'s table: its runs in groups of equal settings (the module docstring)."""
    groups, repeated = group_runs(read)
    firsts = [members[0] for members in groups]
    apart, differing = distinguishing(firsts)
    runs = [run for run, _ in read]
    notes = [line for line in [versions_note(task, runs), plugins_note([run for run, _ in firsts])] if line]
    if differing:
        notes.append(f"rows differ in {', '.join(differing)} (besides the encoding); every other setting is equal")
    if repeated:
        notes.append(f"{repeated} repeated run(s) of a seed left out (the newest is kept; --by-run lists all)")
    return Groups(task, runs, [pooled(members, settings) for members, settings in zip(groups, apart)], notes)


def pooled(members: list[RunRead], apart: dict[str, Any]) -> Members:
    """The row of ``members``, runs of equal settings (one per seed), set apart by ``apart``: its seed is the list
    of theirs (``RunFacts.seed``), one run's its own."""
    runs, facts = [run for run, _ in members], [found for _, found in members]
    seeds = [found.seed for found in facts]
    return Members(runs, facts, seeds[0] if len(runs) == 1 else seeds, label(str(runs[0].encoding), apart), apart)


def one_per_run(task: str, read: list[RunRead]) -> Groups:
    """``--by-run``: a row per run of ``task``, in the order read, labelled with its encoding (and its seed and run
    id where the encoding has several runs), its seed the recorded one."""
    runs = [run for run, _ in read]
    rows = [Members([run], [facts], run.config.seed, by_run_label(run, runs)) for run, facts in read]
    return Groups(task, runs, rows, [], grouped=False)


def by_run_label(run: RunRecord, runs: list[RunRecord]) -> str:
    encoding = str(run.encoding)
    if sum(1 for r in runs if str(r.encoding) == encoding) > 1:
        return f"{encoding} (seed {run.seed}, {run.run_id})"
    return encoding


def newest_first(run: RunRecord) -> tuple:
    return (str(run.finished or ""), str(run.run_id or ""))


def group_runs(read: list[RunRead]) -> tuple[list[list[RunRead]], int]:
    """Runs in groups of equal settings (first-seen order), one run per seed (the newest of repeated ones);
    also returns how many repeated runs were left out."""
    groups: dict[str, list[RunRead]] = {}
    for run, facts in read:
        groups.setdefault(facts.group, []).append((run, facts))
    out, repeated = [], 0
    for members in groups.values():
        by_seed: dict[str, RunRead] = {}
        for run, facts in sorted(members, key=lambda pair: newest_first(pair[0]), reverse=True):
            by_seed.setdefault(json.dumps(facts.seed, default=str), (run, facts))
        repeated += len(members) - len(by_seed)
        out.append(sorted(by_seed.values(), key=lambda pair: str(pair[1].seed)))
    return out, repeated


def distinguishing(firsts: list[RunRead]) -> tuple[list[dict[str, Any]], list[str]]:
    """For each group (its first run and that run's facts), the settings that set it apart from the other groups of
    the table, and the names of all settings that differ between groups. Encoding options count only between
    groups of one encoding."""
    # version 1 is implied where unrecorded, and a setting added later holds the value earlier runs had where it
    # is not counted (a record without it, or with that value): say that value rather than "-"
    shared = [facts.shown_shared for _, facts in firsts]
    own = [facts.shown_own for _, facts in firsts]
    encodings = [str(run.encoding) for run, _ in firsts]
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


def plugins_note(firsts: list[RunRecord]) -> str | None:
    """One line when rows of one encoding (``firsts``: each row's first run) are apart because their runs ran
    different plugin code."""
    code: dict[str, set[str]] = {}
    for run in firsts:
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
