"""``posbench check NAME``: the contract kit (``posbench.checks``) on encodings and tasks, one line per check."""

from __future__ import annotations

import typer

from posbench.cli.common import err, out, split_names, user_errors
from posbench.cli.shared_options import Encoding, Preset, Quiet, Sets, Task

CHECK_EPILOG = """[bold]Examples[/bold]

  posbench check rope                         (an encoding: options, backends, KV cache, ...)

  posbench check learned --no-compiled        (all but the one-graph check of torch.compile)

  posbench check t5 -t passkey -p study       (can its learned bias learn within that preset's budget?)

  posbench check t5 --set encoding.table_init=x-transformers   (... with that init: --set changes the budget's run)

  posbench --plugins my_tasks check copy      (a task: options, presets, stream, a short run)

  posbench check scrolls --set task.data=tests/fixtures/scrolls --set task.datasets=qasper
"""


def check(names: list[str], compiled: bool = typer.Option(True, "--compiled/--no-compiled", help="check that "
          "torch.compile traces a training step as one graph (traced only: about a second per encoding)"),
          encoding: Encoding = None, task: Task = None, preset: Preset = None, sets: Sets = [],
          quiet: Quiet = False) -> None:
    """Run the shared contract checks on encodings and tasks (yours or built-in): one line per check, exit code 1
    when one fails.

    NAMES: encodings or tasks, by name (comma-separated or several)."""
    from posbench.checks import check_encoding, check_task
    from posbench.encodings import ENCODINGS
    from posbench.tasks import TASKS

    failed = False
    with user_errors():
        wanted = [n for value in names for n in split_names(value)]
        for name in wanted:
            if name not in ENCODINGS and name not in TASKS:
                from posbench.registry import UnknownNameError

                error = UnknownNameError("encoding or task", name, [*ENCODINGS, *TASKS])
                error.message += (f" One of a plugin's? posbench imports a plugin only when told: posbench --plugins "
                                  f"FILE.py check {name} (or POSBENCH_PLUGINS=FILE.py).")
                raise error
        for name in wanted:
            if name in ENCODINGS:
                report = check_encoding(name, compiled=compiled, task=task, preset=preset, sets=tuple(sets))
            else:
                report = check_task(name, encoding=encoding or "rope", sets=tuple(sets))
            for check_result, line in zip(report.checks, report.lines()):
                if not check_result.passed:
                    err().print(line, markup=False, highlight=False)
                elif not quiet:
                    out().print(line, markup=False, highlight=False)
            failed = failed or not report.passed
    if failed:
        raise typer.Exit(1)
