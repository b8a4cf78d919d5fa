"""``compare`` from records to tables, in a straight line, each step taking what the one before returned: read the
records (``posbench.runs.store``) and each run's facts once (``reading``), group each task's runs into rows
(``grouping``), pool the rows into the task's table (``tables``), test it against a baseline when asked (``paired``);
``--by-model`` makes one table of models instead (``by_model``), and a benchmark run is its efficiency table
(``bench``). Rendering is the caller's (``formats``, ``terminal``, ``html``)."""

from __future__ import annotations

from pathlib import Path

from posbench.report.bench import bench_table
from posbench.report.by_length import by_length_tables
from posbench.report.comparison import Comparison
from posbench.report.effective_length import Tolerance, capped, effective_note, with_effective_lengths
from posbench.report.structure import Report
from posbench.report.by_model import models_table
from posbench.report.grouping import group
from posbench.report.paired import add_differences
from posbench.report.reading import facts_of
from posbench.report.tables import pooled_table, unusable_values
from posbench.runs.record import ResultError, RunRecord
from posbench.runs.store import scan_runs


def collect(root: Path | str, task: str | None = None, *, by_run: bool = False, against: str | None = None,
            by_model: bool = False, comparison: Comparison | None = None,
            tolerance: Tolerance = Tolerance()) -> Report:
    """Read every run under ``root`` (optionally one task) into tables; unreadable runs go to ``problems``. One
    ``Comparison`` serves the whole compare's paired differences: each predictions file is read once, each run
    resampled once. Pass the same ``comparison`` to several collects of one tree (against several baselines: a
    study's tables) to share that work; the tables are those of a collect alone."""
    runs, problems = scan_runs(Path(root))
    runs = [with_effective_lengths(run, tolerance) for run in runs if task is None or run.task == task]
    reading = facts_of(runs, problems)
    comparison = Comparison() if comparison is None else comparison
    if by_model:
        return Report([models_table(reading, runs)] if runs else [], problems, unusable_values(runs))
    by_task: dict[str, list[RunRecord]] = {}
    for run in runs:
        if run.bench is None:
            by_task.setdefault(str(run.task), []).append(run)
    tables = []
    for name, items in sorted(by_task.items()):
        groups = None if by_run else group(reading, name, items)
        table = pooled_table(name, items, groups)
        if any("eff_len" in run.metrics for run in items):
            table.notes.append(effective_note(tolerance, capped(items)))
        if against is not None:
            add_differences(comparison, reading, table, against)
        tables.append(table)
        tables += by_length_tables(table)
    tables += [bench_table(run) for run in runs if run.bench is not None]
    return Report(tables, problems, unusable_values(runs) + comparison.said)


def check_baseline(report: Report, against: str, root: Path | str) -> None:
    """``--against NAME`` needs a row of NAME among the report's tables: one line (``ResultError``) naming the
    encodings there are, otherwise."""
    if not any(row.encoding == against for table in report.tables for row in table.rows):
        names = sorted({row.encoding for table in report.tables for row in table.rows})
        raise ResultError(f"--against {against}: no {against} run under {root}; encodings: {', '.join(names)}")
