"""compare's third step, a task's table: each row ``posbench.report.grouping`` made of its runs (one per seed, or one
run: ``--by-run``) pooled, the mean and 95% interval over its seeds."""

from __future__ import annotations

import math

from posbench.evaluation.metrics import METRICS
from posbench.report.best import RULE, mark_best
from posbench.report.grouping import Groups, Members, of_task
from posbench.report.plateau import still_improving
from posbench.report.reading import Reading
from posbench.report.structure import Cell, Row, TaskTable, num
from posbench.runs.record import RunRecord


def build_table(task: str, runs: list[RunRecord], reading: Reading, *, by_run: bool = False) -> TaskTable:
    """One task's table from its runs, their facts in ``reading`` (``posbench.report.reading``): in rows
    (``posbench.report.grouping.of_task``; one per run when ``by_run``) and pooled (``pooled_table``), the two steps
    ``collect`` takes for every task of a tree (``grouping.by_task``)."""
    return pooled_table(of_task(task, runs, reading, by_run=by_run))


def pooled_table(groups: Groups) -> TaskTable:
    """The table of a task's runs: each row of ``groups`` (``posbench.report.grouping.by_task``) pooled."""
    runs = groups.runs
    columns, hib, primary = metric_columns(runs)
    rows = [row_of(members, columns) for members in groups.rows]
    notes = list(groups.notes)
    notes += [line for line in [incomplete_note(runs, columns), improving_note(rows, primary),
                                directions_note(runs, columns)] if line]
    if mark_best(rows, columns, hib):
        notes.append(RULE)
    sort_rows(rows, primary, hib)
    table = TaskTable(groups.task, primary, columns, hib, rows, runs, grouped=groups.grouped, notes=notes)
    if table.multi_seed:
        table.notes.insert(0, "± is the 95% Student-t interval over seeds (rows of 2 or more seeds) or the run's "
                              "standard error (rows of 1 seed)")
    return table


def metric_columns(runs: list[RunRecord]) -> tuple[list[str], dict[str, bool | None], str | None]:
    """The table's columns (the primary metric first, or the task's own order), which way each is better (as the
    metric registry declares it, else as the runs recorded it; None for a metric no task declares whose runs
    disagree: ``direction_conflicts``; such a column is neither ranked nor marked) and the primary metric."""
    primary = next((r.primary_metric for r in runs if r.primary_metric), None)
    columns: list[str] = []
    hib: dict[str, bool | None] = {}
    conflicts = direction_conflicts(runs)
    for run in runs:
        for name, metric in run.metrics.items():
            if name not in columns:
                columns.append(name)
                hib[name] = None if name in conflicts else \
                    METRICS.higher_is_better(str(run.task), name, metric.higher_is_better)
    if primary in columns:
        columns.remove(primary)
        columns.insert(0, primary)
    layout = next((r.evaluation["table_columns"] for r in runs
                   if isinstance(r.evaluation.get("table_columns"), list)), None)
    if layout:      # a task's own column order (scrolls: the paper's Table 1, then the score)
        columns = [c for c in layout if c in columns] + [c for c in columns if c not in layout]
    return columns, hib, primary


def direction_conflicts(runs: list[RunRecord]) -> dict[str, tuple[int, int]]:
    """The metrics no task declares (``posbench.evaluation.metrics``) whose runs recorded both directions: name ->
    (runs saying higher is better, runs saying lower)."""
    said: dict[str, list[int]] = {}
    for run in runs:
        for name, metric in run.metrics.items():
            if METRICS.find(str(run.task), name) is None:
                said.setdefault(name, [0, 0])[0 if bool(metric.higher_is_better) else 1] += 1
    return {name: (higher, lower) for name, (higher, lower) in said.items() if higher and lower}


def directions_note(runs: list[RunRecord], columns: list[str]) -> str | None:
    """The line under a table with columns whose direction its runs disagree on."""
    conflicts = direction_conflicts(runs)
    parts = [f"{name} (higher is better in {conflicts[name][0]} run(s), lower in {conflicts[name][1]})"
             for name in columns if name in conflicts]
    if not parts:
        return None
    return (f"which way is better is not known for {'; '.join(parts)}: no task declares the metric "
            f"(posbench.evaluation.metrics) and its runs disagree, so its column is neither ranked nor marked")


def run_id(run: RunRecord) -> str:
    return str(run.run_id)


def incomplete(run: RunRecord, name: str) -> bool:
    """The run recorded ``name`` as incomplete: its evaluation's entry of that name says ``"complete": false``
    (a SCROLLS score over fewer than the seven data sets, docs/tasks.md)."""
    info = run.evaluation.get(name)
    return isinstance(info, dict) and info.get("complete") is False


def incomplete_note(runs: list[RunRecord], columns: list[str]) -> str | None:
    """The line under a table that has incomplete values: what they are."""
    parts = []
    for name in columns:
        marked = [r for r in runs if name in r.metrics and incomplete(r, name)]
        if marked:
            covered = sorted({str(d) for r in marked for d in (r.evaluation[name].get("datasets") or [])
                              if isinstance(r.evaluation[name].get("datasets"), list)})
            parts.append(f"{name} of {len(marked)} run(s)" + (f" (over {', '.join(covered)} only)" if covered else ""))
    if not parts:
        return None
    return (f"incomplete: {'; '.join(parts)}: the run recorded the value as incomplete (the mean over part of "
            f"what it covers), not comparable to a complete one")


def improving_note(rows: list[Row], primary: str | None) -> str | None:
    """Flags the ranked value of every row with a run that had not stopped improving when its training ended
    (``posbench.report.plateau``), and returns the line under the table that says what the flag means."""
    if primary is None:
        return None
    marked = 0
    for row in rows:
        cell = row.cells.get(primary)
        learning = sum(still_improving(run.training or {}) for run in row.runs)
        if not learning or cell is None:
            continue
        flag = "still improving" if len(row.runs) == 1 else f"{learning} of {len(row.runs)} seeds still improving"
        cell.flag = f"{cell.flag}, {flag}" if cell.flag else flag
        marked += 1
    if not marked:
        return None
    return (f"still improving: {marked} row(s) with a run whose training loss (or in-distribution probe) had not "
            f"stopped improving when training ended (posbench.report.plateau's rule): a longer budget may change "
            f"its rank")


def metric_cell(runs: list[RunRecord], name: str) -> Cell:
    """One cell from the runs of a row: one run as it is, several as the mean with a 95% interval. A cell that
    pools fewer of the row's runs than the row has (a run without the metric, or with a value that is not a
    number) says how many of them (``1 of 2 seeds``); a value a run recorded as incomplete is flagged. The seeds
    pool as the metric registry says (``posbench.evaluation.metrics``: the mean, perplexities too)."""
    measured = [(run, run.metrics.get(name)) for run in runs]
    metrics = [m for _, m in measured if m is not None]
    flags = ["incomplete"] if any(m is not None and incomplete(run, name) for run, m in measured) else []
    infinite = [m for m in metrics if isinstance(m.value, float) and math.isinf(m.value)]
    if infinite:      # beyond float range (a diverged model's perplexity): shown, never pooled or ranked
        sign = "-" if all(m.value < 0 for m in infinite) else ""
        note = f"{sign}inf" + (f" ({len(infinite)} of {len(runs)} seeds)" if len(infinite) < len(runs) else "")
        return Cell(None, n=infinite[0].n, note=note, flag=", ".join(flags) or None)
    finite = [(v, m) for v, m in ((num(m.value), m) for m in metrics) if v is not None]
    if finite and len(finite) < len(runs):
        flags.append(f"{len(finite)} of {len(runs)} seeds")
    flag = ", ".join(flags) or None
    if len(finite) <= 1:
        value, m = finite[0] if finite else (None, metrics[0] if metrics else None)
        return Cell(value, num(m.stderr) if value is not None else None, m.n if m is not None else None,
                    values=[value] if value is not None else [], flag=flag)
    values = [v for v, _ in finite]
    interval = METRICS.pooling(str(runs[0].task), name)(values)
    return Cell(interval.mean, None, finite[0][1].n, half_width=interval.half_width, seeds=interval.n,
                values=values, flag=flag)


def _train_s(runs: list[RunRecord]) -> float | None:
    times = [t for t in (num(r.timings.train_s) for r in runs) if t is not None]
    return sum(times) / len(times) if times else None


def row_of(members: Members, columns: list[str]) -> Row:
    """The row of ``members``' runs, with their facts (what ``--against`` reads of them)."""
    runs, first = members.runs, members.runs[0]
    return Row(members.label, str(first.encoding), ", ".join(run_id(r) for r in runs), str(first.path),
               members.seed, {c: metric_cell(runs, c) for c in columns}, _train_s(runs), list(runs), members.apart,
               list(members.facts))


def sort_rows(rows: list[Row], primary: str | None, hib: dict[str, bool | None]) -> None:
    if primary is not None and hib.get(primary) is not None and all(primary in r.cells for r in rows):
        sign = -1 if hib[primary] else 1
        rows.sort(key=lambda r: (r.cells[primary].value is None, sign * (r.cells[primary].value or 0.0), r.label))
    else:
        rows.sort(key=lambda r: r.label)
