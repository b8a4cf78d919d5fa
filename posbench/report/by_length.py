"""Accuracy by length, out of distribution: a table ``compare`` adds after a task's table when its runs report a
grid over two axes of one quantity, both bounded in training (the arithmetic task's operand lengths: the same
values on both axes, ``meta.train_max`` the same for both).

A run's value at length L is the mean of the grid's cells whose longer axis value is L (``max(len_a, len_b) =
L``): the first column pools every cell inside the training region (both lengths <= the trained maximum, the
in-distribution cells), each following column one length beyond it. A row pools its seeds as the task's table does
(the mean, and the 95% Student-t interval over seeds). The table derives from the grids alone, so it reads every
record, old ones included, and changes no number of the task's own table.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from posbench.report.best import RULE, mark_best
from posbench.report.structure import Cell, Row, TaskTable
from posbench.stats import seed_interval


def bounded_grid(run: Any) -> tuple[str, dict[str, Any]] | None:
    """The run's first grid over two axes of one quantity (the same values, the same bound in training: the
    arithmetic task's two operand lengths; not passkey's length x depth), as (name, grid dict)."""
    for name, grid in run.grids.items():
        data = grid.to_dict() if hasattr(grid, "to_dict") else grid
        axes = data.get("axes") or []
        bounds = (data.get("meta") or {}).get("train_max") or {}
        if len(axes) == 2 and all(a.get("name") in bounds for a in axes) and axes[0]["values"] == axes[1]["values"] \
                and bounds[axes[0]["name"]] == bounds[axes[1]["name"]]:
            return name, data
    return None


def by_longer_axis(grid: dict[str, Any]) -> dict[str, float]:
    """Column label -> the mean of the grid's cells at that length of the longer axis (the trained region pooled
    into one column, ``<= T``)."""
    (ya, xa), bounds = grid["axes"], grid["meta"]["train_max"]
    values = np.array([[np.nan if v is None else v for v in row] for row in grid["values"]], dtype=float)
    trained = bounds[ya["name"]]
    longer = np.maximum.outer(np.array(ya["values"]), np.array(xa["values"]))
    inside = (np.array(ya["values"])[:, None] <= bounds[ya["name"]]) & \
        (np.array(xa["values"])[None, :] <= bounds[xa["name"]])
    out = {f"<= {trained}": float(np.nanmean(values[inside]))}
    for length in sorted({int(v) for v in longer[~inside].ravel()}):
        out[str(length)] = float(np.nanmean(values[(longer == length) & ~inside]))
    return out


def by_length_table(table: TaskTable) -> TaskTable | None:
    """The by-length table of a task's table (its rows and their runs), or None when its runs have no bounded
    two-axis grid."""
    found = [(row, [bounded_grid(run) for run in row.runs]) for row in table.rows]
    named = {g[0] for _, grids in found for g in grids if g is not None}
    if len(named) != 1:
        return None
    name = named.pop()
    rows, columns = [], []
    for row, grids in found:
        per_run = [by_longer_axis(g[1]) for g in grids if g is not None and g[0] == name]
        if not per_run:
            continue
        for column in per_run[0]:
            if column not in columns:
                columns.append(column)
        cells = {c: seed_cell([r[c] for r in per_run if c in r]) for c in per_run[0]}
        rows.append(Row(row.label, row.encoding, row.run_id, row.path, row.seed, cells, row.train_s, row.runs,
                        row.settings))
    if not rows:
        return None
    for row in rows:
        for column in columns:
            row.cells.setdefault(column, Cell(None))
    hib = {c: True for c in columns}
    axis_names = ", ".join(a["name"] for a in next(g for _, gs in found for g in gs if g is not None)[1]["axes"])
    derived = TaskTable(table.task, None, columns, hib, rows, title=f"{table.heading}: {name} by the longer length, max({axis_names})",
                        grouped=table.grouped, kind="by_length", row_header=table.row_header)
    first = columns[0]
    derived.notes.append(f"mean of the grid's cells whose longer length is the column's; {first}: every cell inside "
                         f"the training region (in distribution)" + ("; ± is the 95% interval over seeds"
                                                                      if any(len(r.runs) > 1 for r in rows) else ""))
    if mark_best(rows, columns, hib):
        derived.notes.append(RULE)
    return derived


def seed_cell(values: list[float]) -> Cell:
    finite = [v for v in values if np.isfinite(v)]
    if len(finite) <= 1:
        return Cell(finite[0] if finite else None, values=finite)
    interval = seed_interval(finite)
    return Cell(interval.mean, half_width=interval.half_width, seeds=interval.n, values=finite)
