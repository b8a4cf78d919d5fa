"""``compare``'s facts of every run it read (``Reading``), each computed once (``posbench.report.facts``): from the
run's record, the record of the run it started from (``--init``: each read once), what the declarations say of
its settings (``posbench.setting_facts.Declarations``, read once: which count, and the earlier values of those added
later, once per encoding and task). The steps after this one read these facts and never the records' settings again:
grouping takes each run's with it, and its rows hand them on to the tables and the paired differences.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posbench.cells import flattened
from posbench.errors import UserError
from posbench.options import SECTIONS
from posbench.report.facts import RunFacts, run_facts
from posbench.runs.record import RESULT_FILE, RunRecord
from posbench.runs.store import Problem, load_record
from posbench.setting_facts import Declarations


@dataclass
class Reading:
    """The runs read (``runs``, in the order found), the runs not read (``problems``) and each run's facts
    (``facts[run]``, for its ``--init`` runs too)."""

    runs: list[RunRecord]
    problems: list[Problem] = field(default_factory=list)
    _facts: dict[int, RunFacts] = field(default_factory=dict, repr=False)

    def __getitem__(self, run: RunRecord) -> RunFacts:
        return self._facts[id(run)]


def facts_of(runs: list[RunRecord], problems: list[Problem] = ()) -> Reading:
    """``runs`` (``posbench.runs.store.scan_runs``) with their facts (and their ``--init`` runs')."""
    reader = _Reader(Declarations())
    reading = Reading(list(runs), list(problems))
    for run in runs:
        reader.facts(run)
    reading._facts = reader.done
    return reading


class _Reader:
    """Reads each run's facts once, and each ``--init`` record once (its facts too: a row's seed and settings
    hold its ``--init`` run's)."""

    def __init__(self, declared: Declarations):
        self.declared = declared
        self.done: dict[int, RunFacts] = {}
        self.parents: dict[str, RunRecord | None] = {}
        self.earlier: dict[tuple, dict[str, dict[str, Any]]] = {}     # (encoding, task) -> its earlier values

    def facts(self, run: RunRecord) -> RunFacts:
        if id(run) in self.done:
            return self.done[id(run)]
        parent = self.parent(run)
        above = self.facts(parent) if parent is not None else None
        counted = self.declared.facts.counted({section: run.config.section(section) for section in SECTIONS},
                                              run.schema_version)
        key = (run.encoding, run.task)
        if key not in self.earlier:
            self.earlier[key] = self.declared.earlier(run.encoding, run.task)
        found = run_facts(run, parent, above, flattened(counted), flattened(self.earlier[key]))
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
