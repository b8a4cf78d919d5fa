"""``compare --against NAME``: every other row's difference to the row of encoding NAME with the same
settings, per metric, with its 95% interval and p-value (``posbench.stats.paired_difference``).

Seeds are paired by number (seed s of one encoding with seed s of the other; seeds only one side has are left
out). Examples are paired when the task says how its metrics are built from its per-example results
(``Task.example_scores``: arithmetic, passkey, SCROLLS), every run of both rows scored the same examples (the
same keys) and those results rebuild the metric each run recorded; otherwise the metric is paired across
seeds only (perplexity), and a note says so.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Any

from posbench.errors import UserError
from posbench.report import grouping
from posbench.report.structure import DifferenceRow, Row, TaskTable, num
from posbench.files import plain_or_gzipped, read_jsonl
from posbench.runs.record import RunRecord
from posbench.runs.store import PREDICTIONS_FILE
from posbench.stats import ExampleScores, paired_difference

_scores: dict[str, ExampleScores | None] = {}


def forget_scores() -> None:
    _scores.clear()


def example_scores(run: RunRecord) -> ExampleScores | None:
    """The run's per-example scores (its task's ``example_scores`` over its predictions), or None."""
    key = str(run.path)
    if key not in _scores:
        _scores[key] = _load_scores(run)
    return _scores[key]


def _load_scores(run: RunRecord) -> ExampleScores | None:
    from posbench.tasks import TASKS

    path = plain_or_gzipped(Path(str(run.path)) / str(run.predictions or PREDICTIONS_FILE))
    if path is None:
        return None
    try:
        task = TASKS.get(str(run.task))
        rows = read_jsonl(path)
        return task.example_scores(run, rows) if rows else None
    except (UserError, OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-3)      # recorded metrics may be rounded to 4 decimals


def example_functions(a_runs: list[RunRecord], b_runs: list[RunRecord], metric: str) -> dict[str, Any] | None:
    """The per-example pairing of ``metric`` between the runs (seed-aligned lists), or None."""
    runs = a_runs + b_runs
    scores = [example_scores(r) for r in runs]
    if any(s is None or metric not in s.metrics for s in scores):
        return None
    order = scores[0].keys
    if any(len(s.keys) != len(order) or set(s.keys) != set(order) for s in scores):
        return None
    aligned = [s.aligned(order) for s in scores]
    for s, run in zip(aligned, runs):
        recorded = value_of(run, metric)
        rebuilt = float(s.metric_under(metric))
        if recorded is None or not math.isfinite(rebuilt) or not _close(recorded, rebuilt):
            return None
    functions = [partial(s.metric_under, metric) for s in aligned]
    return {"a_examples": functions[:len(a_runs)], "b_examples": functions[len(a_runs):],
            "strata": aligned[0].strata}


def value_of(run: RunRecord, metric: str) -> float | None:
    found = run.metrics.get(metric)
    return num(found.value) if found is not None else None


def _core(run: RunRecord) -> dict[str, Any]:
    return {k: v for k, v in grouping.settings(run).items() if not k.startswith("encoding.")}


def reference_for(row: Row, refs: list[Row]) -> Row | None:
    """The reference row with the same settings as ``row``, encoding aside."""
    if not row.runs:
        return None
    core = _core(row.runs[0])
    return next((ref for ref in refs if ref.runs and _core(ref.runs[0]) == core), None)


def add_differences(table: TaskTable, reference: str) -> None:
    table.against = reference
    refs = [r for r in table.rows if r.encoding == reference]
    if not refs:
        table.notes.append(f"--against {reference}: no {reference} run in this table")
        return
    seeds_only: set[str] = set()
    for row in table.rows:
        if row.encoding == reference:
            continue
        ref = reference_for(row, refs)
        if ref is None:
            table.notes.append(f"--against {reference}: no {reference} row with the settings of {row.label}")
            continue
        a_by_seed = {str(grouping.seed_of(r)): r for r in ref.runs}
        b_by_seed = {str(grouping.seed_of(r)): r for r in row.runs}
        common = sorted(set(a_by_seed) & set(b_by_seed))
        if not common:
            table.notes.append(f"--against {reference}: {row.label} shares no seed with {ref.label}")
            continue
        a_runs, b_runs = [a_by_seed[s] for s in common], [b_by_seed[s] for s in common]
        for metric in table.columns:
            a = [value_of(r, metric) for r in a_runs]
            b = [value_of(r, metric) for r in b_runs]
            if any(v is None for v in a + b):
                continue
            pairing = example_functions(a_runs, b_runs, metric) or {}
            if not pairing:
                seeds_only.add(metric)
            table.differences.append(DifferenceRow(row.label, metric, table.higher_is_better[metric],
                                                   paired_difference(a, b, **pairing)))
    if seeds_only:
        table.notes.append(f"paired across seeds only (no per-example results that rebuild them): "
                           f"{', '.join(m for m in table.columns if m in seeds_only)}")
