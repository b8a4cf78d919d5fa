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

from posbench.evaluation.metrics import METRICS
from posbench.report.best import RULE, mark_best
from posbench.report.structure import Cell, Row, TaskTable, grid_values
from posbench.stats import seed_interval


def bounded_grid(run: Any) -> tuple[str, dict[str, Any]] | None:
    """The run's first grid over two axes of one quantity (the same values, the same bound in training: the
    arithmetic task's two operand lengths; not passkey's length x depth), as (name, grid dict)."""
    for name, grid in run.grids.items():
        data = grid.to_dict() if hasattr(grid, "to_dict") else grid
        axes = data.get("axes") or []
        bounds = (data.get("meta") or {}).get("train_max") or {}
        if len(axes) == 2 and all(a.get("name") in bounds for a in axes) and axes[0]["values"] == axes[1]["values"] \
                and bounds[axes[0]["name"]] == bounds[axes[1]["name"]] and grid_values(data) is not None:
            return name, data
    return None


def by_longer_axis(grid: dict[str, Any]) -> dict[str, float]:
    """Column label -> the mean of the grid's cells at that length of the longer axis (the trained region pooled
    into one column, ``<= T``); a column without a value (every cell missing) is left out."""
    ya, bounds = grid["axes"][0], grid["meta"]["train_max"]          # both axes alike (``bounded_grid``)
    values = grid_values(grid)
    lengths = np.array(ya["values"])
    trained = bounds[ya["name"]]
    longer = np.maximum.outer(lengths, lengths)
    inside = longer <= trained
    columns = [(f"<= {trained}", inside)] + [(str(int(n)), (longer == n) & ~inside)
                                             for n in sorted({int(v) for v in longer[~inside].ravel()})]
    out = {}
    for label, where in columns:
        cells = values[where]
        if np.isfinite(cells).any():
            out[label] = float(np.nanmean(cells))
    return out


def shape(grid: dict[str, Any]) -> tuple:
    """What makes two grids' columns the same: the axis values and the trained maximum."""
    axis = grid["axes"][0]
    return tuple(axis["values"]), grid["meta"]["train_max"][axis["name"]]


def by_length_tables(table: TaskTable) -> list[TaskTable]:
    """The by-length tables of a task's table: one per kind of grid its rows have (the same lengths and the same
    trained maximum; runs trained to other lengths get a table of their own), none without such grids."""
    found = []
    for row in table.rows:
        grids = [g for g in (bounded_grid(run) for run in row.runs) if g is not None]
        if grids:
            found.append((row, grids))
    names = {name for _, grids in found for name, _ in grids}
    if len(names) != 1:
        return []
    name = names.pop()
    groups: dict[tuple, list[tuple[Row, list[dict[str, Any]]]]] = {}
    for row, grids in found:
        first = shape(grids[0][1])
        groups.setdefault(first, []).append((row, [g for _, g in grids if shape(g) == first]))
    return [by_length_table(table, name, items, several=len(groups) > 1) for items in groups.values()]


def by_length_table(table: TaskTable, name: str, items: list[tuple[Row, list[dict[str, Any]]]],
                    several: bool = False) -> TaskTable:
    rows, columns = [], []
    for row, grids in items:
        per_run = [by_longer_axis(g) for g in grids]
        for run_columns in per_run:
            columns += [c for c in run_columns if c not in columns]
        cells = {c: seed_cell([r[c] for r in per_run if c in r]) for c in columns}
        rows.append(Row(row.label, row.encoding, row.run_id, row.path, row.seed, cells, row.train_s, row.runs,
                        row.settings))
    for row in rows:
        for column in columns:
            row.cells.setdefault(column, Cell(None))
    grid = items[0][1][0]                       # its quantity's direction, as declared (else as recorded)
    higher = METRICS.higher_is_better(table.task, str(grid.get("metric")), grid.get("higher_is_better", True))
    hib = {c: higher for c in columns}
    axes = grid["axes"]
    trained = f" (trained to {shape(items[0][1][0])[1]})" if several else ""
    derived = TaskTable(table.task, None, columns, hib, rows, grouped=table.grouped, kind="by_length",
                        title=f"{table.heading}: {name} by the longer length, "
                              f"max({', '.join(a['name'] for a in axes)}){trained}", row_header=table.row_header)
    derived.notes.append(f"mean of the grid's cells whose longer length is the column's; {columns[0]}: every cell "
                         f"inside the training region (in distribution)" + ("; ± is the 95% interval over seeds"
                                                                            if any(len(r.runs) > 1 for r in rows)
                                                                            else ""))
    if mark_best(rows, columns, hib):
        derived.notes.append(RULE)
    return derived


def seed_cell(values: list[float]) -> Cell:
    finite = [v for v in values if np.isfinite(v)]
    if len(finite) <= 1:
        return Cell(finite[0] if finite else None, values=finite)
    interval = seed_interval(finite)
    return Cell(interval.mean, half_width=interval.half_width, seeds=interval.n, values=finite)
