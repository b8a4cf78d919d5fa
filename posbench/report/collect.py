"""``compare`` from records to tables, in a straight line, each step taking what the one before returned: read the
records (``posbench.runs.store``) and each run's facts once (``reading``), group each task's runs into rows
(``grouping``), pool the rows into the task's table (``tables``), test it against a baseline when asked (``paired``);
a benchmark run is its efficiency table (``bench``). ``collect_models`` (``--by-model``) reads the same way and makes
one table of the models instead (``by_model``). Rendering is the caller's (``formats``, ``terminal``, ``html``)."""

from __future__ import annotations

from pathlib import Path

from posbench.report.bench import bench_table
from posbench.report.by_length import by_length_tables
from posbench.report.by_model import models_table
from posbench.report.comparison import Comparison
from posbench.report.effective_length import Tolerance, effective_notes, with_effective_lengths
from posbench.report.grouping import by_task
from posbench.report.paired import add_differences
from posbench.report.reading import Reading, facts_of
from posbench.report.structure import Report, unusable_values
from posbench.report.tables import pooled_table
from posbench.runs.record import ResultError
from posbench.runs.store import scan_runs


def collect(root: Path | str, task: str | None = None, *, by_run: bool = False, against: str | None = None,
            comparison: Comparison | None = None, tolerance: Tolerance = Tolerance()) -> Report:
    """Read every run under ``root`` (optionally one task) into tables; unreadable runs go to ``problems``. One
    ``Comparison`` serves the whole compare's paired differences: each predictions file is read once, each run
    resampled once. Pass the same ``comparison`` to several collects of one tree (against several baselines: a
    study's tables) to share that work; the tables are those of a collect alone."""
    reading, effective, warnings = read(root, task, tolerance)
    comparison = Comparison() if comparison is None else comparison
    tables = []
    for groups in by_task(reading, by_run=by_run):
        table = pooled_table(groups)
        if groups.task in effective:
            table.notes.append(effective[groups.task])
        if against is not None:
            add_differences(comparison, table, against)
        tables += [table, *by_length_tables(table)]
    tables += [bench_table(run) for run in reading.runs if run.bench is not None]
    return Report(tables, reading.problems, warnings + comparison.said)


def collect_models(root: Path | str, task: str | None = None, *, tolerance: Tolerance = Tolerance()) -> Report:
    """``--by-model``: every run under ``root`` (optionally one task) in one table of the models they evaluated
    (``posbench.report.by_model``); unreadable runs go to ``problems``."""
    reading, _, warnings = read(root, task, tolerance)
    return Report([models_table(reading, reading.runs)] if reading.runs else [], reading.problems, warnings)


def read(root: Path | str, task: str | None, tolerance: Tolerance) -> tuple[Reading, dict[str, str], list[str]]:
    """compare's first step: the readable runs under ``root`` (of ``task`` only, when given), each with its
    effective lengths, the unreadable ones and every run's facts (``posbench.report.reading``); the line under each
    task's table on its effective lengths (``effective_notes``); and one line per recorded value that compare
    cannot use and leaves out (``unusable_values``)."""
    runs, problems = scan_runs(Path(root))
    runs = [with_effective_lengths(run, tolerance) for run in runs if task is None or run.task == task]
    effective, warnings = effective_notes(runs, tolerance), unusable_values(runs)
    return facts_of(runs, problems), effective, warnings


def check_baseline(report: Report, against: str, root: Path | str) -> None:
    """``--against NAME`` needs a row of NAME among the report's tables: one line (``ResultError``) naming the
    encodings there are, otherwise."""
    if not any(row.encoding == against for table in report.tables for row in table.rows):
        names = sorted({row.encoding for table in report.tables for row in table.rows})
        raise ResultError(f"--against {against}: no {against} run under {root}; encodings: {', '.join(names)}")
