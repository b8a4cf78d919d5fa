"""Terminal tables (rich) that stay readable at any width, and never cut a number, a header or a name.

A table is drawn whole when it fits the console. When it does not (a pipe or an 80-column terminal and a
task with many metrics), it is drawn transposed (metrics as rows, encodings as columns) if that fits, else whole
with its row labels wrapped (a long label, such as the settings that set a row apart, takes several lines), else
split into several tables of as many metric columns as fit, each repeating the encoding column. The paired
differences likewise: whole, then without the "paired over" column (said once under the table), then with the
labels wrapped. Where no table fits (a very narrow console), every value is a line of its own. Column headers,
numbers and row labels are never cut: every metric's and every encoding's name stays whole.
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


def least_width(table: Table) -> int:
    """The narrowest ``table`` is drawn without cutting anything: every column as wide as its widest cell, but
    the first (the row labels, which wrap between words) only as wide as its longest word."""
    console = Console(width=100_000)
    first = table.columns[0]
    if first.no_wrap:
        return natural_width(table)
    sizes = [Measurement.get(console, console.options, cell) for cell in [first.header, *first.cells]]
    return natural_width(table) - max(m.maximum for m in sizes) + max(m.minimum for m in sizes)


def fits(renderable: RenderableType, width: int) -> bool:
    return natural_width(renderable) <= width


def fits_wrapped(table: Table, width: int) -> bool:
    """``table`` fits ``width`` with its row labels wrapped where they must."""
    return least_width(table) <= width


def grid(headers: Sequence[str], rows: Iterable[Sequence[Text | str]], right_from: int = 1,
         wrap: bool = False) -> Table:
    """A rich table: first column left-aligned, the others right-aligned from ``right_from`` on. Its title is
    printed above it as a line of its own (``render``), so that a long title wraps at the console's width. Only
    the first column (the row labels) may wrap, between words (a word longer than the column folds onto the
    next line, whole): a number or a header is never wrapped, nor cut, as long as the table is drawn at
    ``least_width`` or wider (``render`` sees to it)."""
    table = Table()
    for i, name in enumerate(headers):
        table.add_column(Text(name), justify="right" if i >= right_from else "left", no_wrap=not (wrap or i == 0),
                         overflow="fold" if i == 0 else "ellipsis")
    for row in rows:
        table.add_row(*[c if isinstance(c, Text) else Text(str(c)) for c in row])
    return table


def _title(table: TaskTable) -> str:
    ranked = table.primary and table.kind == "metrics" and table.higher_is_better.get(table.primary) is not None
    return table.heading + (f"  (sorted by {table.primary})" if ranked else "")


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


def split(table: TaskTable, width: int, fit=fits) -> list[tuple[str, Table]] | None:
    """Consecutive metric columns, as many per table as ``fit`` ``width``; None when one column alone does not."""
    chunks: list[list[str]] = []
    current: list[str] = []
    for name in table.columns:
        trial = current + [name]
        if current and not fit(wide(table, trial, extras=False), width):
            chunks.append(current)
            trial = [name]
        current = trial
    if current:
        chunks.append(current)
    if chunks and not fit(wide(table, chunks[-1]), width):
        chunks.append([])                          # seeds and training time in a table of their own
    out = []
    for i, chunk in enumerate(chunks):
        title = _title(table) + (f"  [{i + 1}/{len(chunks)}]" if len(chunks) > 1 else "")
        out.append((title, wide(table, chunk, extras=i == len(chunks) - 1)))
    return out if all(fit(t, width) for _, t in out) else None


def metric_tables(table: TaskTable, width: int) -> list[tuple[str, Table]] | None:
    """The table, or the tables it splits into, that fit ``width`` without cutting anything; None if none do."""
    full = wide(table)
    if fits(full, width):
        return [(_title(table), full)]
    flipped = transposed(table)
    if len(table.rows) <= len(table.columns) and fits(flipped, width):
        return [(_title(table), flipped)]
    if fits_wrapped(full, width):
        return [(_title(table), full)]
    return split(table, width) or split(table, width, fits_wrapped)


def metric_lines(table: TaskTable) -> list[RenderableType]:
    """Where no table fits: each row's label, then one line per value (lines wrap, nothing is cut)."""
    out: list[RenderableType] = [Text(_title(table), style="bold")]
    names = [column_header(table, c) for c in table.columns] + extra_columns(table)
    for row in table.rows:
        out.append(Text(row.label))
        values = [_cell(table, row, c) for c in table.columns] + [Text(t) for t in extra_cells(table, row)]
        out += [Text.assemble(f"  {name}: ", value) for name, value in zip(names, values)]
    return out


def difference_table(table: TaskTable, width: int) -> tuple[Table, list[str]] | None:
    """The paired differences as one table that fits ``width`` without cutting anything (and the lines to print
    under it), or None if none does."""
    rows = [difference_cells(d) for d in table.differences]
    headers = [h or "verdict" for h in DIFFERENCE_HEADER]
    full = grid(headers, rows, right_from=2)
    short = grid(headers[:-1], [r[:-1] for r in rows], right_from=2)
    for fit in (fits, fits_wrapped):
        if fit(full, width):
            return full, []
        if fit(short, width):
            return short, [_bases(rows)]
    return None


def _bases(rows: list[list[str]]) -> str:
    return f"paired over: {'; '.join(sorted({r[-1] for r in rows}))}"


def difference_blocks(table: TaskTable, width: int) -> list[RenderableType] | None:
    """The paired differences as one table per row label (the label a line above it), or None if they do not
    fit ``width``."""
    headers = [h or "verdict" for h in DIFFERENCE_HEADER][1:-1]
    rows = [difference_cells(d) for d in table.differences]
    labels = list(dict.fromkeys(r[0] for r in rows))
    blocks = [(label, grid(headers, [r[1:-1] for r in rows if r[0] == label])) for label in labels]
    if not all(fits(block, width) for _, block in blocks):
        return None
    out: list[RenderableType] = []
    for label, block in blocks:
        out += [Text(label), block]
    return out + [Text(_bases(rows), style="dim")]


def difference_lines(table: TaskTable) -> list[RenderableType]:
    """Where no table of the differences fits: each row's label, then one line per metric (lines wrap, nothing
    is cut)."""
    out: list[RenderableType] = []
    last = None
    for d in table.differences:
        label, metric, estimate, interval, p, verdict, basis = difference_cells(d)
        if label != last:
            out.append(Text(label))
            last = label
        out.append(Text(f"  {metric}: {estimate} {interval}, p {p}" + (f", {verdict}" if verdict != "-" else "") +
                        f"; paired over {basis}"))
    return out


def render(table: TaskTable, width: int) -> list[RenderableType]:
    """Everything the terminal shows for one table: title and table(s), notes, paired differences."""
    out: list[RenderableType] = []
    tables = metric_tables(table, width)
    if tables is None:
        out += metric_lines(table)
    else:
        for title, rt in tables:
            out += [Text(title, style="bold"), rt]
    out += [Text(note, style="dim") for note in table.notes]
    if table.differences:
        out.append(Text(difference_title(table), style="bold"))
        drawn = difference_table(table, width)
        if drawn is not None:
            diff, notes = drawn
            out += [diff] + [Text(n, style="dim") for n in notes]
        else:
            out += difference_blocks(table, width) or difference_lines(table)
    return out
