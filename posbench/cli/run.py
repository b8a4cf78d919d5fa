"""``posbench run``: train and evaluate encodings on a task (or continue a killed run)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from posbench.cli.common import err, out, progress_reporter, resume_run, show_configs, split_names, user_errors
from posbench.cli.setting_flags import given
from posbench.cli.shared_options import (Device, DryRun, Encoding, Init, Logs, Out, Preset, Quiet, Resume, Seed,
                                         Sets, Task)
from posbench.errors import ConfigError
from posbench.report import Cell, fmt_cell
from posbench.report.tables import incomplete
from posbench.runs import runner
from posbench.runs.config import resolve_run_config

RUN_EPILOG = """[bold]Examples[/bold]

  posbench run --encoding rope --task arithmetic

  posbench run --encoding rope,tape --task arithmetic --preset small --seed 1

  posbench run --encoding rope,alibi --task perplexity --seeds 3      (seeds 0, 1, 2; then 'posbench compare')

  posbench run -e alibi -t arithmetic --preset tiny --set lr=3e-4 --set task.train_digits=4

  posbench run -e alibi -t arithmetic --preset tiny --lr 3e-4 --train-digits 4     (the same: settings are flags)

  posbench run --resume results/arithmetic/rope/20250101-120000-ab12cd

  posbench run --task passkey --init results/pretrain/rope/20250101-120000-ab12cd
"""


def run(
    ctx: typer.Context,
    # the help of --encoding, --task and --preset lists what is registered (posbench.cli.setting_flags.RunCommand)
    encoding: Encoding = None,
    task: Task = None,
    preset: Preset = None,
    seed: Seed = None,
    seeds: Optional[int] = typer.Option(None, "--seeds", help="Run every encoding under seeds 0..N-1 "
                                        "(same as --seed 0,1,...,N-1)."),
    device: Device = "auto",
    out_dir: Out = None,
    resume: Resume = None,
    init: Init = None,
    sets: Sets = [],
    logs: Logs = [],
    quiet: Quiet = False,
    dry_run: DryRun = False,
) -> None:
    """Train and evaluate one or more encodings on a task; writes results/<task>/<encoding>/<run-id>/ (or continues
    a killed run, of any task: --resume).

    Every setting of the task, of train, of model and of the chosen encoding is also a flag
    (--lr 3e-4, --train-digits 4: the task's own first; 'posbench ls tasks TASK' lists a task's; --theta 500000
    or --rope-theta 500000: 'posbench ls encodings NAME' lists an encoding's).
    With -t TASK and -e NAME, --help lists them all (Settings, below)."""
    flags = given(ctx)                                 # the settings flags, typed (posbench.cli.setting_flags)
    with user_errors():
        reporter = progress_reporter(quiet)
        if resume is not None:                         # (it continues in its own directory: no --out)
            others = bool(encoding or task or preset is not None or sets or init or seed is not None
                          or seeds is not None or logs or flags or out_dir is not None)
            outcome = resume_run(resume, others=others, dry_run=dry_run, device=device, reporter=reporter)
            if outcome is not None:
                show_outcome(outcome)
            return
        out_dir = Path("results") if out_dir is None else out_dir
        if task is None:
            raise ConfigError("--task is required ('posbench ls tasks' lists them)")
        if task == "bench":                            # a measurement the runner runs, not a task
            raise ConfigError("bench is not a task: run it with 'posbench bench' ('posbench bench --help')")
        names = split_names(encoding) if encoding else [None]
        if encoding is not None and not names:
            raise ConfigError("--encoding is empty")
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:                                   # two identical runs, as --seed 0,0 would be
            raise ConfigError(f"--encoding {encoding!r}: an encoding is repeated ({', '.join(repeated)}); for more "
                              f"runs of one encoding: --seeds N")
        # seed-major: every encoding under seed 0, then under seed 1, ... (a stopped sweep stays balanced)
        configs = [resolve_run_config(task, name, preset, seed=s, device=device,
                                      init=str(Path(init)) if init is not None else None,
                                      settings=flags, sets=sets, logs=logs)
                   for s in parse_seeds(seed, seeds) for name in names]
        if dry_run:
            show_configs(configs)
            return
        for config in configs:
            try:
                outcome = runner.execute(config, out_dir, reporter=reporter, command=["posbench", *sys.argv[1:]])
            except KeyboardInterrupt:
                unfinished = latest_run(out_dir, config.task, config.label)
                how = (f"; continue with: posbench run --resume {unfinished}" if unfinished
                       else " before the run started; nothing was written")
                err().print("[yellow]interrupted[/yellow]" + how)
                raise typer.Exit(130) from None
            show_outcome(outcome)
        if len(configs) > 1 and outcome.main:
            out().print(f"compare them: posbench compare {out_dir / configs[0].task}")
        if outcome.main and any(config.preset == "tiny" for config in configs):
            out().print(TINY_NOTE)


#: what a run of the tiny preset says after its results
TINY_NOTE = ("note: tiny is a smoke test (does the pipeline run, in seconds?): its numbers do not compare encodings "
             "(they are often the same for all); compare at the default preset (small) or larger")


def parse_seeds(seed: str | None, seeds: int | None) -> list[int]:
    """``--seed 3`` -> [3]; ``--seed 0,1,2`` -> [0, 1, 2]; ``--seeds 3`` -> [0, 1, 2]; neither -> [0]."""
    if seed is not None and seeds is not None:
        raise ConfigError("give --seed or --seeds, not both")
    if seeds is not None:
        if not 1 <= seeds <= 1000:
            raise ConfigError(f"--seeds must be between 1 and 1000, got {seeds}")
        return list(range(seeds))
    if seed is None:
        return [0]
    values = []
    for item in split_names(seed):
        try:
            values.append(int(item))
        except ValueError:
            raise ConfigError(f"--seed {seed!r}: expected integers separated by commas") from None
    if not values:
        raise ConfigError("--seed is empty")
    if len(set(values)) != len(values):
        raise ConfigError(f"--seed {seed!r}: a seed is repeated")
    if any(v < 0 for v in values):
        raise ConfigError(f"--seed {seed!r}: seeds must be >= 0")
    return values


def latest_run(root: Path, task: str, encoding: str) -> str | None:
    """The newest run under ``root/task/encoding`` that has started (config.json) and not finished, if any."""
    runs = [p for p in sorted((root / task / encoding).glob("*"))
            if (p / "config.json").is_file() and not (p / "result.json").exists()]
    return str(runs[-1]) if runs else None


def show_outcome(outcome) -> None:
    if not outcome.main:                     # torchrun's other ranks: rank 0 reports
        return
    record = outcome.record
    metrics = "  ".join(f"{name} {fmt_metric(m, record, name)}" for name, m in record.metrics.items())
    timing = record.timings
    out().print(f"[bold]{record.task}[/bold] / [bold]{record.encoding}[/bold]: {metrics}  "
                f"(train {timing.train_s or 0:.0f}s, eval {timing.eval_s or 0:.0f}s) -> {outcome.run_dir}")


def fmt_metric(metric, record=None, name: str | None = None) -> str:
    """A metric as the run line shows it; ``(incomplete)`` after a value its run recorded as incomplete (a SCROLLS
    score over fewer than the seven data sets: ``posbench.report.tables.incomplete``)."""
    flag = "incomplete" if record is not None and name is not None and incomplete(record, name) else None
    return fmt_cell(Cell(metric.value, metric.stderr, flag=flag))
