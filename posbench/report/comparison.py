"""The paired differences' work, done once per compare (or shared by several compares of one tree: a study's
tables against several baselines): each run's per-example scores (every predictions file read once), one draw of
bootstrap replicates per list of strata, each run resampled once, and the lines to say about the files it would
not read. Nothing outlives the compare: the next one reads the tree afresh. (The runs' settings, seeds and
``--init`` records are read once, with each run's facts: ``posbench.report.reading``.)"""

from __future__ import annotations

from dataclasses import dataclass, field

from posbench.report.predictions import Scorer, read_scores
from posbench.runs.record import RunRecord
from posbench.stats import ExampleScores, StratifiedBootstrap


@dataclass
class Comparison:
    """One compare's resampling: ``scores(run)``, ``order(scores)``, ``bootstraps``, ``aligned`` and ``said``."""

    #: one line per run whose predictions were not read, and why (in the order they were read)
    said: list[str] = field(default_factory=list)
    _scores: dict[str, ExampleScores | None] = field(default_factory=dict, repr=False)
    _scorers: dict[str, Scorer] = field(default_factory=dict, repr=False)       # task -> what scores its runs
    #: the paired differences' work, done once for every baseline this comparison is asked against: one draw of
    #: bootstrap replicates per list of strata (each run resampled once), and each run's metric as a function of
    #: those weights per order of examples (``posbench.report.paired``)
    bootstraps: dict[tuple, StratifiedBootstrap] = field(default_factory=dict, repr=False)
    aligned: dict[tuple, object] = field(default_factory=dict, repr=False)
    _orders: dict[tuple, int] = field(default_factory=dict, repr=False)
    _order_of: dict[int, int] = field(default_factory=dict, repr=False)

    def scores(self, run: RunRecord) -> ExampleScores | None:
        """The run's per-example scores (``predictions.read_scores``), read once."""
        key = str(run.path)
        if key not in self._scores:
            self._scores[key], line = read_scores(run, self._scorers)
            if line:
                self.said.append(line)
        return self._scores[key]

    def order(self, scores: ExampleScores) -> int:
        """A number for the order of ``scores``' examples, the same for every run that lists the same keys in the
        same order (``scores`` from ``self.scores``: each kept, so its identity stands for it)."""
        if id(scores) not in self._order_of:
            self._order_of[id(scores)] = self._orders.setdefault(tuple(scores.keys), len(self._orders))
        return self._order_of[id(scores)]
