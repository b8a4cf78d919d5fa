"""What a sweep shows: the plan before it starts, a progress bar while it runs (cells done / running / waiting,
an ETA from the presets' expected times) with one line per cell that starts or ends, and the table of every cell
at the end with the ``posbench compare`` command for the study.

On a terminal the bar redraws in place; elsewhere (a log, a pipe, a batch job) only the lines are printed.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from posbench.sweep.plan import Cell

STYLES = {"done": "green", "resumed": "green", "complete": "green", "failed": "red", "killed": "yellow",
          "blocked": "yellow", "running": "cyan", "queued": "cyan", "waiting": ""}


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def plan_table(cells: list[Cell], statuses: dict[str, str] | None = None) -> Table:
    """The plan: one row per cell (its id says task-encoding-preset[-variant]-seed), the cell it starts from, its
    expected time, and where it stands (``statuses``: complete, running, queued, resume, failed, new)."""
    table = Table(title=f"plan: {len(cells)} cells", title_justify="left")
    table.add_column("cell", no_wrap=True)
    table.add_column("starts from", no_wrap=True)
    table.add_column("expected", justify="right", no_wrap=True)
    if statuses:
        table.add_column("now", no_wrap=True)
    for cell in cells:
        table.add_row(cell.id, cell.parent or "-", fmt_seconds(cell.expected_s),
                      *([statuses.get(cell.id, "")] if statuses else []))
    return table


def expected_total(cells: list[Cell]) -> str:
    known = [c.expected_s for c in cells if c.expected_s is not None]
    text = f"expected {fmt_seconds(sum(known))} of cell time in all"
    missing = len(cells) - len(known)
    return text + (f" ({missing} cell(s) without an expected time)" if missing else "") + \
        " (the presets' expected times, each on the hardware its preset names, scaled by the study's train.steps)"


class SweepDisplay:
    """The live bar and the per-cell lines; ``quiet`` shows neither."""

    def __init__(self, console: Console, cells: list[Cell], parallel: int | None, quiet: bool = False):
        self.console, self.cells, self.parallel, self.quiet = console, cells, parallel, quiet
        self.started = time.monotonic()
        self.live = console.is_terminal and not quiet
        self.progress = Progress(TextColumn("[bold]cells[/bold]"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[counts]}"), TimeElapsedColumn(),
                                 TextColumn("ETA {task.fields[eta]}"), console=console, disable=not self.live)
        self.task = self.progress.add_task("cells", total=len(cells), counts="", eta="-")
        self.progress.start()

    def update(self, outcomes: dict) -> None:
        counts: dict[str, int] = {}
        for outcome in outcomes.values():
            counts[outcome.state] = counts.get(outcome.state, 0) + 1
        ended = sum(1 for o in outcomes.values() if o.ended)
        done = sum(counts.get(s, 0) for s in ("done", "resumed", "complete"))
        parts = [f"{done} done", f"{counts.get('running', 0)} running"]
        if counts.get("queued"):
            parts.append(f"{counts['queued']} queued")
        parts.append(f"{counts.get('waiting', 0)} waiting")
        parts += [f"{counts[s]} {s}" for s in ("failed", "killed", "blocked") if counts.get(s)]
        self.progress.update(self.task, completed=ended, counts=" · ".join(parts), eta=self.eta(outcomes))

    def eta(self, outcomes: dict) -> str:
        """The expected time of the waiting cells and what is left of the running ones, over the cells that run
        at once (the local slots; on SLURM the jobs running now)."""
        now = time.monotonic()
        left, running = 0.0, 0
        for outcome in outcomes.values():
            expected = outcome.cell.expected_s
            if expected is None:
                continue
            if outcome.state == "waiting":
                left += expected
            elif outcome.state in ("running", "queued") and outcome.handle is not None:
                running += 1
                left += max(0.0, expected - (now - outcome.handle.started))
        width = self.parallel or max(1, running)
        return f"~{fmt_seconds(left / max(1, width))}" if left else "-"

    def event(self, outcome) -> None:
        if self.quiet:
            return
        cell = outcome.cell
        style = STYLES.get(outcome.state, "")
        text = Text.assemble((f"{outcome.state:>8} ", style), cell.id)
        extra = [x for x in (outcome.metric, fmt_seconds(outcome.seconds) if outcome.seconds else "",
                             outcome.note) if x]
        if extra:
            text.append("  " + "  ".join(extra))
        self.console.print(text, soft_wrap=True)

    def close(self) -> None:
        self.progress.stop()


def outcome_table(outcomes: dict, root: Path) -> Table:
    """Every cell: its state, time and primary metric, and where to look (the run; or the last line of its log and
    the log), paths under ``root``."""
    table = Table(title=f"cells (paths under {root})", title_justify="left")
    table.add_column("cell", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("time", justify="right", no_wrap=True)
    table.add_column("metric")
    table.add_column("run, or the log's last line and the log", overflow="fold")
    for outcome in outcomes.values():
        if outcome.state in ("failed", "killed"):
            where = f"{outcome.note}\nlog: {relative(outcome.log, root)}"
        elif outcome.state in ("done", "resumed", "complete"):
            where = relative(outcome.run_dir, root) + (f"\n{outcome.note}" if outcome.note else "")
        else:
            where = outcome.note
        table.add_row(outcome.cell.id, Text(outcome.state, style=STYLES.get(outcome.state, "")),
                      fmt_seconds(outcome.seconds), outcome.metric or "-", where)
    return table


def relative(path: str, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return str(path)


def compare_command(out: Path) -> str:
    return f"posbench compare {out}"
