"""``posbench compare``: one table per task from any tree of runs (seeds pooled), paired differences,
figures and a self-contained HTML report."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from posbench import report as rep
from posbench.cli.common import err, out, user_errors
from posbench.files import atomic_write_text, file_in_the_way
from posbench.registry import UnknownNameError
from posbench.cli.shared_options import Force, Format, Task
from posbench.report.collect import check_baseline
from posbench.report.effective_length import Tolerance, parse_tolerance, with_effective_lengths
from posbench.report.structure import unusable_values
from posbench.report.terminal import render
from posbench.runs.record import ResultError
from posbench.runs.store import scan_runs

COMPARE_EPILOG = """[bold]Examples[/bold]

  posbench compare results

  posbench compare results --task perplexity --against rope

  posbench compare results --by-run --format markdown

  posbench compare results --format csv > table.csv

  posbench compare results --format tidy > runs.csv       (one row per run and metric: posbench.results.frame)

  posbench compare results --plots figures --html report.html

  posbench compare results --plots figures --html report.html --force      (replace what an earlier compare wrote)

  posbench compare results --by-model
"""


def compare(
    directory: Path,
    task: Task = None,
    fmt: Format = "table",
    against: Optional[str] = typer.Option(None, "--against", "-a", help="Add every encoding's difference to this "
                                          "one: 95% interval and p-value, paired by seed and by example."),
    by_run: bool = typer.Option(False, "--by-run", help="One row per run instead of one per encoding and "
                                "settings with the seeds pooled."),
    by_model: bool = typer.Option(False, "--by-model", help="One row per evaluated model (runs that start from "
                                  "another run with --init join its row), every task's metrics as columns."),
    plots: Optional[Path] = typer.Option(None, "--plots", help="Write figures (PNG) to this directory."),
    html: Optional[Path] = typer.Option(None, "--html", help="Write the whole report (tables, figures, every run's "
                                        "provenance) as one self-contained HTML file."),
    force: Force = False,
    tolerance: Optional[str] = typer.Option(None, "--eff", help="eff_len's tolerances, any of eps=0.1 (perplexity "
                                            "at most (1 + eps) x its 1x value), tau=0.9 (accuracy at least tau x its "
                                            "in-distribution value), abs=85.6 (eff_len_abs: RULER's bar, %), "
                                            "comma-separated (posbench.report.effective_length)."),
) -> None:
    """One table per task: a row per encoding (runs that differ only in their seed pooled: mean ± 95% interval),
    the best of each column marked; paired differences (--against), figures, an HTML report.

    DIRECTORY: a results tree (any depth)."""
    with user_errors():
        if fmt == "tidy":
            write_tidy(directory, task, parse_tolerance(tolerance))
            return
        if fmt not in rep.FORMATS:
            raise UnknownNameError("format", fmt, [*rep.FORMATS, "tidy"])
        if by_model and (by_run or against):
            raise ResultError("--by-model makes one table of models; it does not combine with --by-run or --against")
        if not directory.exists():
            raise ResultError(f"results directory {directory} does not exist")
        for flag, target in (("--html", html), ("--plots", plots)):        # before any work, as one line
            blocked = file_in_the_way(target / "figure.png" if flag == "--plots" else target) if target else None
            if blocked is not None:
                raise ResultError(f"{flag} {target}: {blocked} is a file, not a folder")
        if html is not None and html.exists() and (html.is_dir() or not force):
            raise ResultError(f"--html {html} is a directory" if html.is_dir() else
                              f"--html {html} already exists; pass --force to replace it, or choose another file")
        tolerance = parse_tolerance(tolerance)
        result = (rep.collect_models(directory, task, tolerance=tolerance) if by_model else
                  rep.collect(directory, task, by_run=by_run, against=against, tolerance=tolerance))
        if not result.tables:
            where = f" for task '{task}'" if task else ""
            skipped = f" ({len(result.problems)} unreadable, listed above)" if result.problems else ""
            show_problems(result.problems, result.warnings)
            raise ResultError(f"no finished runs{where} under {directory}{skipped}")
        if against is not None:
            check_baseline(result, against, directory)
        figures_from = rep.collect(directory, task, by_run=by_run, tolerance=tolerance) if by_model and (plots or html) else result
        written = rep.plot(figures_from, plots, force=force) if plots is not None else []
        if fmt == "table":
            console = out()
            for table in result.tables:
                for item in render(table, console.width):
                    console.print(item, soft_wrap=False)       # notes and titles wrap at the width
                console.print()
        else:
            sys.stdout.write(rep.render_text(result, fmt))
        show_problems(result.problems, result.warnings)
        for path in written:
            err().print(f"wrote {path}", markup=False)
        if html is not None:
            from posbench.report.html import to_html  # matplotlib: only an HTML report draws its figures

            if by_model:
                figures_from.tables = result.tables + figures_from.tables
            page = to_html(figures_from, source=str(directory))
            atomic_write_text(html, page)
            err().print(f"wrote {html}", markup=False)


def show_problems(problems, warnings=()) -> None:
    """On stderr: the runs left out (unreadable), then one line per value left out or file not read."""
    console = err()
    if problems:
        console.print(f"[yellow]skipped {len(problems)} unreadable run(s):[/yellow]")
        for problem in problems:
            console.print(f"  {problem.path}: {problem.reason}", markup=False)
    for line in warnings:
        console.print(f"note: {line}", markup=False, soft_wrap=True)


def write_tidy(directory: Path, task: str | None, tolerance: Tolerance) -> None:
    """``--format tidy``: the DataFrame of ``posbench.results.frame`` as CSV on stdout."""
    from posbench.results import frame_of  # pandas: only --format tidy makes a data frame

    runs, problems = scan_runs(directory)
    if task is not None:
        runs = [r for r in runs if r.task == task]
    df = frame_of([with_effective_lengths(run, tolerance) for run in runs])
    if df.empty:
        show_problems(problems, unusable_values(runs))
        raise ResultError(f"no finished runs{f' for task {task!r}' if task else ''} under {directory}")
    sys.stdout.write(df.to_csv(index=False))
    show_problems(problems, unusable_values(runs))
