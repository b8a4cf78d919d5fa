"""What ``compare`` builds before rendering: tables of rows of cells, the paired differences, and the report; and
which recorded values it can use (``num``, ``grid_values``; ``unusable_values``: the lines on those it cannot)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from posbench.stats import Difference

if TYPE_CHECKING:                        # a name in an annotation: runs.store is not imported for it
    from posbench.runs.store import Problem


@dataclass
class Cell:
    value: float | None                   # the run's value, or the mean over the seeds of a row
    stderr: float | None = None           # one run: its evaluation standard error
    n: int | None = None                  # examples (or tokens) behind one run's value
    best: bool = False
    half_width: float | None = None       # two seeds or more: the 95% Student-t half-width over seeds
    seeds: int = 1                        # how many seeds the value pools
    values: list[float] = field(default_factory=list)      # one value per seed
    note: str | None = None               # shown instead of the value (e.g. "OOM")
    flag: str | None = None               # shown after the value, in brackets ("incomplete", "1 of 2 seeds")

    @property
    def spread(self) -> float | None:
        """What ``±`` shows: the 95% interval's half-width over seeds, else the run's standard error."""
        return self.half_width if self.seeds >= 2 else self.stderr


@dataclass
class Row:
    label: str
    encoding: str
    run_id: str
    path: str
    seed: Any                             # one run: its seed; a row of several runs: the list of seeds
    cells: dict[str, Cell]
    train_s: float | None = None
    runs: list[Any] = field(default_factory=list)            # RunRecords
    settings: dict[str, Any] = field(default_factory=dict)    # the settings that set this row apart
    facts: list[Any] = field(default_factory=list)            # a task's row: its runs' RunFacts, one per run

    @property
    def seeds(self) -> int:
        """How many seeds the row pools: its list of seeds, one for a single seed (a model's row holds its own run
        and the runs that evaluate it, all of one seed)."""
        if isinstance(self.seed, list):
            return len(self.seed)
        return 1


@dataclass
class DifferenceRow:
    label: str                            # the row compared with the reference
    metric: str
    higher_is_better: bool | None        # None: not known (the metric's runs disagree), so no verdict
    difference: Difference

    @property
    def verdict(self) -> str:
        d = self.difference
        if d.low is None or d.high is None or (d.low <= 0 <= d.high) or self.higher_is_better is None:
            return "-"
        better = (d.estimate > 0) == self.higher_is_better
        return "better" if better else "worse"


@dataclass
class TaskTable:
    task: str
    primary: str | None
    columns: list[str]
    higher_is_better: dict[str, bool | None]            # None: not known (tables.direction_conflicts)
    rows: list[Row]
    runs: list[Any] = field(default_factory=list)            # RunRecords
    title: str | None = None              # shown instead of the task name
    grouped: bool = True                  # rows pool seeds (False: --by-run)
    notes: list[str] = field(default_factory=list)
    against: str | None = None            # the reference encoding of ``differences``
    differences: list[DifferenceRow] = field(default_factory=list)
    kind: str = "metrics"                 # metrics, bench or models
    labels: dict[str, str] = field(default_factory=dict)      # column -> header text (default: the name)
    row_header: str = "encoding"

    @property
    def heading(self) -> str:
        return self.title or self.task

    @property
    def multi_seed(self) -> bool:
        return any(len(r.runs) > 1 for r in self.rows)

    def column_label(self, name: str) -> str:
        return self.labels.get(name, name)


@dataclass
class Report:
    tables: list[TaskTable]
    problems: list[Problem]
    warnings: list[str] = field(default_factory=list)       # one line each: a value left out, a file not read


def grid_values(grid: dict[str, Any]) -> Any:
    """A grid's values as a float array with NaN where there is none (``null``) or where a value is not a number
    (``unusable_grid_values`` says so), or None when they do not form an array of one dimension per axis."""
    def clean(x: Any) -> Any:
        if isinstance(x, list):
            return [clean(v) for v in x]
        return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else np.nan

    try:
        values = np.array(clean(grid.get("values")), dtype=float)
    except (ValueError, TypeError, OverflowError):
        return None
    return values if values.ndim == len(grid.get("axes") or []) else None


def unusable_grid_values(grid: dict[str, Any]) -> tuple[int, Any]:
    """(how many of a grid's values are neither a number nor ``null``, the first of them)."""
    bad: list[Any] = []

    def walk(x: Any) -> None:
        if isinstance(x, list):
            for v in x:
                walk(v)
        elif x is not None and not (isinstance(x, (int, float)) and not isinstance(x, bool) and x == x):
            bad.append(x)

    walk(grid.get("values"))
    return len(bad), (bad[0] if bad else None)


def number(value) -> bool:
    """A metric's value compare can show: a number (an infinity too), not a bool, not NaN."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def unusable_values(runs: list[Any]) -> list[str]:
    """One line per recorded value of ``runs`` (RunRecords) that compare cannot use and leaves out: a metric's value
    or standard error that is not a number (a string, a bool, NaN, a list...), a grid that is not an array
    (``grid_values``) or holds values that are not numbers (``unusable_grid_values``). ``null`` is "no value",
    recorded as such."""
    lines = []
    for run in runs:
        if run.bench is not None:
            continue
        for name, metric in run.metrics.items():
            for what, value in (("value", metric.value), ("stderr", metric.stderr)):
                if value is not None and not number(value):
                    shown = "NaN" if isinstance(value, float) else repr(value)[:80]
                    left_out = "left out of its row" if what == "value" else "its ± left out"
                    lines.append(f"{run.path}: metric '{name}' has the {what} {shown}, not a number; {left_out}")
        for name, grid in run.grids.items():
            data = grid.to_dict() if hasattr(grid, "to_dict") else grid
            if not isinstance(data, dict):
                continue
            if grid_values(data) is None:
                lines.append(f"{run.path}: grid '{name}' does not hold one dimension per axis; left out")
                continue
            count, first = unusable_grid_values(data)
            if count:
                lines.append(f"{run.path}: grid '{name}' has {count} value(s) that are not numbers (first: "
                             f"{repr(first)[:80] if first == first else 'NaN'}); left out, as missing")
    return lines


def num(x: Any) -> float | None:
    """A finite float, or None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None
