"""``compare``'s first step: read every run under a directory into tables (one per task; a benchmark run as its
efficiency table; ``by_model``: one table of models), with paired differences when asked."""

from __future__ import annotations

from pathlib import Path

from posbench.report.bench import bench_table
from posbench.report.by_length import by_length_tables
from posbench.report.comparison import Comparison
from posbench.report.effective_length import Tolerance, capped, effective_note, with_effective_lengths
from posbench.report.structure import Report
from posbench.report.by_model import models_table
from posbench.report.paired import add_differences
from posbench.report.tables import build_table, unusable_values
from posbench.runs.record import RunRecord
from posbench.runs.store import scan_runs


def collect(root: Path | str, task: str | None = None, *, by_run: bool = False, against: str | None = None,
            by_model: bool = False, comparison: Comparison | None = None,
            tolerance: Tolerance = Tolerance()) -> Report:
    """Read every run under ``root`` (optionally one task) into tables; unreadable runs go to ``problems``. One
    ``Comparison`` serves the whole compare: each ``--init`` record and predictions file is read once, each run
    resampled once. Pass the same ``comparison`` to several collects of one tree (against several baselines: a
    study's tables) to share that work; the tables are those of a collect alone."""
    runs, problems = scan_runs(Path(root))
    runs = [with_effective_lengths(run, tolerance) for run in runs]     # posbench.report.effective_length
    if task is not None:
        runs = [r for r in runs if r.task == task]
    comparison = Comparison() if comparison is None else comparison
    if by_model:
        return Report([models_table(comparison, runs)] if runs else [], problems, unusable_values(runs))
    by_task: dict[str, list[RunRecord]] = {}
    for run in runs:
        if run.bench is None:
            by_task.setdefault(str(run.task), []).append(run)
    tables = []
    for name, items in sorted(by_task.items()):
        table = build_table(name, items, by_run=by_run, comparison=comparison)
        if any("eff_len" in run.metrics for run in items):
            table.notes.append(effective_note(tolerance, capped(items)))
        if against is not None:
            add_differences(comparison, table, against)
        tables.append(table)
        tables += by_length_tables(table)
    tables += [bench_table(run) for run in runs if run.bench is not None]
    return Report(tables, problems, unusable_values(runs) + comparison.said)


def check_baseline(report: Report, against: str, root: Path | str) -> None:
    """``--against NAME`` needs a row of NAME among the report's tables: one line (``ResultError``) naming the
    encodings there are, otherwise."""
    from posbench.runs.record import ResultError

    if not any(row.encoding == against for table in report.tables for row in table.rows):
        names = sorted({row.encoding for table in report.tables for row in table.rows})
        raise ResultError(f"--against {against}: no {against} run under {root}; encodings: {', '.join(names)}")
