"""The options several commands share, each declared once (``quiet: Quiet = False``): one spelling, short form and
help everywhere (``tests/cli/test_cli_options_once.py``). Defaults that differ between commands are ``None``, filled in
by the command; registry-made help is ``posbench.cli.registry_help``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from posbench.options import SECTIONS

Encoding = Annotated[Optional[str], typer.Option(
    "--encoding", "-e", help="Encoding name, or several separated by commas (run: each in turn; bench: those "
    "measured, default every one, RoPE always; check: the one a task's short run trains, default rope).")]

Task = Annotated[Optional[str], typer.Option(
    "--task", "-t", help="Task name ('posbench ls tasks'); compare: only this task; check: an encoding's budget, the "
    "task whose preset's steps and learning rates its learned parameters must learn within (default: perplexity, "
    "or the first task the encoding runs on).")]

Preset = Annotated[Optional[str], typer.Option(
    "--preset", "-p", "--size", help="Preset (default: the task's; 'posbench ls presets'); bench: small (4 x 256, "
    "the CPU benchmark) or paper (12 x 768 at 16 x 1024 and 1 x 8192), also as --size.")]

Seed = Annotated[Optional[str], typer.Option(
    "--seed", help="Seed for Python, NumPy, torch, the training data and new parameters (default 0); several "
    "separated by commas run each encoding under each seed in turn.")]

Init = Annotated[Optional[str], typer.Option(
    "--init", "--model", "-m", help="Start from a model: a run directory (its checkpoint; an extend run too), a "
    "posbench export, or a Hugging Face model directory or hub name (when online); extend: the Llama to extend.")]

Device = Annotated[str, typer.Option("--device", help="auto (cuda, mps, cpu), cpu, cuda, cuda:N, mps.")]

Out = Annotated[Optional[Path], typer.Option(
    "--out", "-o", help="Results root directory (default: results; sweep: results/<study name>, one folder per "
    "cell under cells/).")]

Sets = Annotated[list[str], typer.Option(
    "--set", "-s", help=f"Override a setting: \\[section.]key=value (sections: {', '.join(SECTIONS)}; extend: "
    "method, the method's options). Repeatable; wins over the flags.")]

Resume = Annotated[Optional[Path], typer.Option("--resume", help="Continue a killed run directory (of any task, "
                                                                 "an extend run too).")]

Logs = Annotated[list[str], typer.Option(
    "--log", help="Log the training to csv, tensorboard or wandb (repeatable): loss, learning rate, gradient norm, "
    "tokens/s and the final metrics.")]

Quiet = Annotated[bool, typer.Option(
    "--quiet", "-q", help="No progress output (sweep: no progress bar and no per-cell lines; check: print only "
    "the failed checks).")]

DryRun = Annotated[bool, typer.Option(
    "--dry-run", help="Show what would run and run nothing: the resolved configuration as JSON (sweep: the plan, "
    "the cells, their expected times and where each stands); writes nothing.")]

Format = Annotated[str, typer.Option(
    "--format", "-f", help="table, markdown, csv, latex, json, or tidy (every run and metric as one CSV row with "
    "its settings, as posbench.results.frame gives them); score: table or json (the official metric's keys).")]

Force = Annotated[bool, typer.Option(
    "--force", help="Replace what an earlier command wrote (compare: an --html file and the figures in the --plots "
    "directory; export: OUT_DIR's files); without it, nothing is overwritten.")]
