"""``posbench compare``: one table per task from any tree of runs, and figures."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from posbench.commands.common import err, out, user_errors

COMPARE_EPILOG = """[bold]Examples[/bold]

  posbench compare results

  posbench compare results --task arithmetic --format markdown

  posbench compare results --format csv > table.csv

  posbench compare results --plots figures
"""


def compare(
    directory: Path = typer.Argument(..., help="A results tree (any depth)."),
    task: Optional[str] = typer.Option(None, "--task", "-t", help="Only this task."),
    fmt: str = typer.Option("table", "--format", "-f", help="table, markdown, csv, latex or json."),
    plots: Optional[Path] = typer.Option(None, "--plots", help="Write figures (PNG) to this directory."),
) -> None:
    """One table per task (encodings as rows, best value of each column in bold, ± stderr) and figures."""
    from posbench import report as rep
    from posbench.results import ResultError

    with user_errors():
        if fmt not in rep.FORMATS:
            from posbench.registry import UnknownNameError

            raise UnknownNameError("format", fmt, list(rep.FORMATS))
        if not directory.exists():
            raise ResultError(f"results directory {directory} does not exist")
        result = rep.collect(directory, task)
        if not result.tables:
            where = f" for task '{task}'" if task else ""
            skipped = f" ({len(result.problems)} unreadable, listed above)" if result.problems else ""
            show_problems(result.problems)
            raise ResultError(f"no finished runs{where} under {directory}{skipped}")
        if fmt == "table":
            console = out()
            for table in result.tables:
                console.print(rich_table(table))
        else:
            sys.stdout.write(rep.render_text(result, fmt))
        show_problems(result.problems)
        if plots is not None:
            for path in rep.plot(result, plots):
                err().print(f"wrote {path}")


def rich_table(table) -> Table:
    from posbench.report import fmt_cell, fmt_value, header

    title = f"{table.task}" + (f"  (sorted by {table.primary})" if table.primary else "")
    rt = Table(title=title, title_justify="left")
    rt.add_column("encoding")
    for col in table.columns:
        rt.add_column(header(col, table.higher_is_better[col]), justify="right")
    rt.add_column("train s", justify="right")
    for row in table.rows:
        cells = [f"[bold green]{fmt_cell(row.cells[c])}[/bold green]" if row.cells[c].best
                 else fmt_cell(row.cells[c]) for c in table.columns]
        rt.add_row(row.label, *cells, fmt_value(row.train_s))
    return rt


def show_problems(problems) -> None:
    if problems:
        console = err()
        console.print(f"[yellow]skipped {len(problems)} unreadable run(s):[/yellow]")
        for problem in problems:
            console.print(f"  {problem.path}: {problem.reason}", markup=False)
