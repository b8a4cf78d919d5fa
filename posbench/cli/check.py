"""``posbench check NAME``: the contract kit (``posbench.checks``) on encodings and tasks, one line per check."""

from __future__ import annotations

import typer

from posbench.checks import check_encoding, check_task
from posbench.checks.learnable import default_task
from posbench.checks.outcome import CheckFailed
from posbench.cli.common import err, out, split_names, user_errors
from posbench.cli.shared_options import Encoding, Preset, Quiet, Sets, Task
from posbench.encodings import ENCODINGS
from posbench.errors import UserError
from posbench.registry import UnknownNameError
from posbench.runs.config import check_each_set, resolve_run_config, starting_point
from posbench.tasks import TASKS
from posbench.tasks.presets import presets_of

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
    failed = False
    with user_errors():
        wanted = [n for value in names for n in split_names(value)]
        for name in wanted:
            if name not in ENCODINGS and name not in TASKS:
                error = UnknownNameError("encoding or task", name, [*ENCODINGS, *TASKS])
                error.message += (f" One of a plugin's? posbench imports a plugin only when told: posbench --plugins "
                                  f"FILE.py check {name} (or POSBENCH_PLUGINS=FILE.py).")
                raise error
        for name in wanted:                            # the command line's choices, before any check runs
            choices_first(name, task=task, preset=preset, encoding=encoding, sets=tuple(sets))
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


def choices_first(name: str, *, task: str | None, preset: str | None, encoding: str | None,
                  sets: tuple[str, ...]) -> None:
    """What the command line chose for the run configuration the checks of ``name`` use (``--set``; an encoding's
    ``-t`` and ``-p``, a task's ``-e``), refused in one line (exit code 2) before any check runs: the whole
    configuration, when the same run without those choices resolves, and each ``--set`` on its own (its key, its
    type, its range) in any case. A configuration that fails without them is the contract's to report, as a
    failed check."""
    if name in ENCODINGS:
        try:
            usual = default_task(ENCODINGS.get(name))
        except CheckFailed:                              # no task gives what it needs: the contract's to say
            return
        chosen, plain = (task or usual, name, preset), (usual, name, None)
    else:
        smallest = "tiny" if "tiny" in presets_of(TASKS.get(name)) else None
        chosen, plain = (name, encoding or "rope", smallest), (name, "rope", smallest)
    if not sets and chosen == plain:
        return
    try:
        resolve_run_config(*chosen, sets=list(sets))
        return
    except UserError as exc:
        refused = exc
    try:
        resolve_run_config(*plain)
    except UserError:                                   # fails without the choices too: each --set still is one's
        try:
            starting_point(*chosen)
        except UserError:
            return
        check_each_set(*chosen, sets)
        return
    raise refused
