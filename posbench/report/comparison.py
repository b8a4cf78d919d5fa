"""What one ``compare`` builds once and each of its steps reads (``collect`` makes it; the tables, the models'
table and the paired differences are handed it): the declarations' facts about settings (``setting_facts``), the
``--init`` run each run started from and each run's per-example scores (every file read once), and the lines to
say about the files it would not read. Nothing outlives the compare: the next one reads the tree afresh."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from posbench.errors import UserError
from posbench.report.predictions import read_scores
from posbench.report.setting_facts import SettingFacts, declared_facts
from posbench.runs.record import RESULT_FILE, RunRecord, load_record
from posbench.stats import ExampleScores, StratifiedBootstrap


@dataclass
class Comparison:
    """One compare's reading: ``facts`` (from the declarations, unless given), ``parent(run)``, ``scores(run)``
    and ``said``."""

    facts: SettingFacts = field(default_factory=declared_facts)
    #: one line per run whose predictions were not read, and why (in the order they were read)
    said: list[str] = field(default_factory=list)
    _parents: dict[str, RunRecord | None] = field(default_factory=dict, repr=False)
    _scores: dict[str, ExampleScores | None] = field(default_factory=dict, repr=False)
    #: the paired differences' work, done once for every baseline this comparison is asked against: one draw of
    #: bootstrap replicates per list of strata (each run resampled once), and each run's metric as a function of
    #: those weights per order of examples (``posbench.report.paired``)
    bootstraps: dict[tuple, StratifiedBootstrap] = field(default_factory=dict, repr=False)
    aligned: dict[tuple, object] = field(default_factory=dict, repr=False)
    _orders: dict[tuple, int] = field(default_factory=dict, repr=False)
    _order_of: dict[int, int] = field(default_factory=dict, repr=False)

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
        if key not in self._parents:
            try:
                self._parents[key] = load_record(path / RESULT_FILE) if (path / RESULT_FILE).is_file() else None
            except UserError:
                self._parents[key] = None
        return self._parents[key]

    def scores(self, run: RunRecord) -> ExampleScores | None:
        """The run's per-example scores (``predictions.read_scores``), read once."""
        key = str(run.path)
        if key not in self._scores:
            self._scores[key], line = read_scores(run)
            if line:
                self.said.append(line)
        return self._scores[key]

    def order(self, scores: ExampleScores) -> int:
        """A number for the order of ``scores``' examples, the same for every run that lists the same keys in the
        same order (``scores`` from ``self.scores``: each kept, so its identity stands for it)."""
        if id(scores) not in self._order_of:
            self._order_of[id(scores)] = self._orders.setdefault(tuple(scores.keys), len(self._orders))
        return self._order_of[id(scores)]
