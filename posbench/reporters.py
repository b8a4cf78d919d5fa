"""Progress reporting for long work (training steps, evaluation cells): rich bars or nothing.

The engine and the tasks talk to a ``Progress``-like object with three methods, so they never depend on
how (or whether) progress is shown::

    bar = reporter.task("train", total=1000, completed=0, unit="step")   # optional log_every=N
    bar.update(completed, loss=2.31, rate="5.1k tok/s")
    bar.close()

``RichReporter`` draws bars with throughput and ETA on a terminal; when the console is not a terminal
(CI logs, pipes) it prints one plain line every ``log_every`` updates instead of animating.
``NullReporter`` shows nothing (tests, library use).
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)


class NullBar:
    def update(self, completed: int, **fields: Any) -> None:
        pass

    def close(self) -> None:
        pass


class NullReporter:
    def task(self, description: str, total: int, completed: int = 0, unit: str = "step",
             log_every: int | None = None) -> NullBar:
        return NullBar()


class _RichBar:
    def __init__(self, progress: Progress, task_id: int, total: int, description: str, console: Console,
                 log_every: int, completed: int = 0):
        self.progress, self.task_id, self.total = progress, task_id, total
        self.description, self.console, self.log_every = description, console, log_every
        self.start, self._last_logged = time.perf_counter(), completed

    def update(self, completed: int, **fields: Any) -> None:
        info = "  ".join(_format_field(k, v) for k, v in fields.items() if v is not None)
        self.progress.update(self.task_id, completed=completed, info=info)
        if not self.console.is_terminal and self.log_every > 0:
            due = completed == self.total or completed - self._last_logged >= self.log_every
            if due and completed != self._last_logged:
                self._last_logged = completed
                elapsed = time.perf_counter() - self.start
                self.console.print(f"{self.description} {completed}/{self.total}  {info}  [{elapsed:.0f}s]",
                                   markup=False, highlight=False)

    def close(self) -> None:
        self.progress.stop_task(self.task_id)
        self.progress.remove_task(self.task_id)
        if not self.progress.tasks:
            self.progress.stop()


class RichReporter:
    """Rich progress bars on a terminal, periodic plain lines elsewhere."""

    def __init__(self, console: Console | None = None, log_every: int = 50):
        self.console = console or Console(stderr=True)
        self.log_every = log_every
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=self.console, disable=not self.console.is_terminal, transient=False)

    def task(self, description: str, total: int, completed: int = 0, unit: str = "step",
             log_every: int | None = None) -> _RichBar:
        if not self.progress.live.is_started and self.console.is_terminal:
            self.progress.start()
        task_id = self.progress.add_task(description, total=total, completed=completed, info="")
        every = self.log_every if log_every is None else log_every
        return _RichBar(self.progress, task_id, total, description, self.console, every, completed)


def _format_field(key: str, value: Any) -> str:
    if isinstance(value, float):
        return f"{key} {value:.4g}"
    return f"{key} {value}" if key else str(value)
