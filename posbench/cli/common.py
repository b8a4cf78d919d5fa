"""What every command shares: the consoles, the one-line errors (exit code 2 for bad input, 1 for the machine),
small parsers.

A command is a function in its own module of ``posbench/cli/``; ``posbench.cli.app`` registers it on the
typer app. Command modules import this module, never ``posbench.cli.app``, so there is no import loop.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text

from posbench.data.progress import library_progress
from posbench.errors import ConfigError, UserError, os_error
from posbench.reporters import NullReporter, RichReporter


def out() -> Console:
    return Console(highlight=False, soft_wrap=True)


def err() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


@contextmanager
def user_errors():
    """Every error a user can meet -> one line on stderr (``print_error``), no traceback: a ``UserError`` exits
    with its ``exit_code`` (2 for bad input, 1 for the machine: disk full, permission, a lost process), an
    ``OSError`` that got this far likewise (``posbench.errors.os_error``), a non-finite loss with 1."""
    try:
        yield
    except UserError as exc:
        if getattr(exc, "announce", True):      # a lost rank: one process of the job says it
            print_error(one_line(exc))
        raise typer.Exit(exc.exit_code) from None
    except OSError as exc:
        error = os_error(exc)
        print_error(one_line(error))
        raise typer.Exit(error.exit_code) from None
    except non_finite_loss() as exc:
        print_error(one_line(exc))
        raise typer.Exit(1) from None


def non_finite_loss() -> tuple[type, ...]:
    """The trainer's ``NonFiniteLossError`` where the trainer was imported; else nothing (no model was trained, so
    none was raised; importing the trainer would import torch for a command that needs none)."""
    trainer = sys.modules.get("posbench.train.trainer")
    return (trainer.NonFiniteLossError,) if trainer is not None else ()


def print_error(message: str) -> None:
    """``error: MESSAGE`` on stderr: the message as plain text (never rich markup, so that a message that
    holds brackets, such as ``pip install 'posbench[tensorboard]'``, prints as it is)."""
    err().print(Text.assemble(("error:", "red"), " ", message), soft_wrap=True)


def progress_reporter(quiet: bool):
    """Training progress on stderr (none with ``--quiet``); the libraries' download / preprocessing bars and
    posbench's data bars follow the same switch."""
    library_progress(not quiet)
    return NullReporter() if quiet else RichReporter(err())


def show_configs(configs) -> None:
    """``--dry-run``: the resolved configurations, as ``config.json`` would record them."""
    out().print(json.dumps([c.to_dict() for c in configs], indent=2), markup=False, highlight=False)


def resume_run(run_dir, *, others: bool, dry_run: bool, device: str, reporter):
    """``--resume DIR`` of run and extend: refuses other flags (``others``); with ``--dry-run`` prints the stored
    configuration on the device the run would use (and whether the run has finished) and returns None; else
    continues the run, its outcome."""
    from posbench.runs import runner  # torch: only for what builds or names a class
    from posbench.train.device import pick_device  # torch: only a resume names a device

    if others:
        raise ConfigError("--resume continues a run with its own config; pass only --resume (and optionally --device)")
    device = None if device == "auto" else device       # None: the run's own
    if dry_run:
        config = runner.resumed_config(run_dir)
        config.device = device or config.device
        pick_device(config.device)                      # refused as the run would refuse it
        show_configs([config])
        if (Path(run_dir) / "result.json").exists():
            err().print(f"{run_dir} has finished: --resume would refuse it", markup=False)
        return None
    return runner.resume(run_dir, device=device, reporter=reporter)


def one_line(exc: BaseException) -> str:
    text = exc.message if hasattr(exc, "message") else str(exc)
    return " ".join(str(text).split()) or type(exc).__name__


def split_names(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def kv(mapping: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in mapping.items()) or "-"
