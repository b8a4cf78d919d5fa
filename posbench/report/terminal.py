"""Terminal tables (rich) that stay readable at any width.

A table is drawn whole when it fits the console. When it does not (a pipe or an 80-column terminal and a
task with many metrics), it is drawn transposed (metrics as rows, encodings as columns) if that fits, else
split into several tables of as many metric columns as fit, each repeating the encoding column. Column
headers and row labels are never cut: every metric's and every encoding's name stays whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from posbench.report.formats import (DIFFERENCE_HEADER, column_header, difference_cells, difference_title,
                                     extra_cells, extra_columns, fmt_cell)
from posbench.report.structure import TaskTable

BEST = "bold green"


def natural_width(renderable: RenderableType) -> int:
    console = Console(width=100_000)
    return Measurement.get(console, console.options, renderable).maximum


def fits(renderable: RenderableType, width: int) -> bool:
    return natural_width(renderable) <= width


def grid(headers: Sequence[str], rows: Iterable[Sequence[Text | str]], right_from: int = 1,
         wrap: bool = False) -> Table:
    """A rich table: first column left-aligned, the others right-aligned from ``right_from`` on. Its title is
    printed above it as a line of its own (``render``), so that a long title wraps at the console's width."""
    table = Table()
    for i, name in enumerate(headers):
        table.add_column(Text(name), justify="right" if i >= right_from else "left", no_wrap=not wrap)
    for row in rows:
        table.add_row(*[c if isinstance(c, Text) else Text(str(c)) for c in row])
    return table


def _title(table: TaskTable) -> str:
    return table.heading + (f"  (sorted by {table.primary})" if table.primary and table.kind == "metrics" else "")


def _cell(table: TaskTable, row, name: str) -> Text:
    cell = row.cells[name]
    return Text(fmt_cell(cell), style=BEST if cell.best else "")


def wide(table: TaskTable, columns: Sequence[str] | None = None, extras: bool = True) -> Table:
    columns = table.columns if columns is None else columns
    headers = [table.row_header, *[column_header(table, c) for c in columns],
               *(extra_columns(table) if extras else [])]
    rows = [[Text(row.label), *[_cell(table, row, c) for c in columns], *(extra_cells(table, row) if extras else [])]
            for row in table.rows]
    return grid(headers, rows)


def transposed(table: TaskTable) -> Table:
    headers = ["metric", *[row.label for row in table.rows]]
    rows = [[column_header(table, c), *[_cell(table, row, c) for row in table.rows]] for c in table.columns]
    extra_names = extra_columns(table)
    for i, name in enumerate(extra_names):
        rows.append([name, *[extra_cells(table, row)[i] for row in table.rows]])
    return grid(headers, rows)


def split(table: TaskTable, width: int) -> list[tuple[str, Table]]:
    """Consecutive metric columns, as many per table as fit ``width`` (at least one)."""
    chunks: list[list[str]] = []
    current: list[str] = []
    for name in table.columns:
        trial = current + [name]
        if current and not fits(wide(table, trial, extras=False), width):
            chunks.append(current)
            trial = [name]
        current = trial
    if current:
        chunks.append(current)
    if chunks and not fits(wide(table, chunks[-1]), width):
        chunks.append([])                          # seeds and training time in a table of their own
    out = []
    for i, chunk in enumerate(chunks):
        title = _title(table) + (f"  [{i + 1}/{len(chunks)}]" if len(chunks) > 1 else "")
        out.append((title, wide(table, chunk, extras=i == len(chunks) - 1)))
    return out


def metric_tables(table: TaskTable, width: int) -> list[tuple[str, Table]]:
    full = wide(table)
    if fits(full, width):
        return [(_title(table), full)]
    flipped = transposed(table)
    if len(table.rows) <= len(table.columns) and fits(flipped, width):
        return [(_title(table), flipped)]
    return split(table, width)


def difference_table(table: TaskTable, width: int) -> tuple[Table, list[str]]:
    rows = [difference_cells(d) for d in table.differences]
    headers = [h or "verdict" for h in DIFFERENCE_HEADER]
    full = grid(headers, rows, right_from=2)
    if fits(full, width):
        return full, []
    bases = sorted({r[-1] for r in rows})
    return grid(headers[:-1], [r[:-1] for r in rows], right_from=2), [f"paired over: {'; '.join(bases)}"]


def render(table: TaskTable, width: int) -> list[RenderableType]:
    """Everything the terminal shows for one table: title and table(s), notes, paired differences."""
    out: list[RenderableType] = []
    for title, rt in metric_tables(table, width):
        out += [Text(title, style="bold"), rt]
    out += [Text(note, style="dim") for note in table.notes]
    if table.differences:
        diff, notes = difference_table(table, width)
        out += [Text(difference_title(table), style="bold"), diff] + [Text(n, style="dim") for n in notes]
    return out
