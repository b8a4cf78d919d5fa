"""``posbench extend``: extend a pretrained Llama's context with one of the registered methods (``posbench.hf.methods``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from posbench.cli import setting_flags
from posbench.cli.common import out, progress_reporter, resume_run, show_configs, user_errors
from posbench.cli.run import fmt_metric, parse_seeds
from posbench.cli.shared_options import Device, DryRun, Init, Logs, Out, Preset, Quiet, Resume, Seed, Sets
from posbench.errors import ConfigError
from posbench.runs import runner
from posbench.runs.config import resolve_run_config

EXTEND_EPILOG = """[bold]Examples[/bold]

  posbench extend --model meta-llama/Llama-2-7b-hf --method tape --length 8192 --data togethercomputer/RedPajama-Data-1T-Sample --preset paper

  posbench extend --model ./llama-2-7b --method lora --length 8192 --data ./redpajama --scale 2 --preset paper

  posbench extend --model ./tiny-llama --method longlora --length 256 --data stdlib --preset tiny

  posbench extend --resume results/extend/llama+tape/20250101-120000-ab12cd

  posbench run -t perplexity --init results/extend/llama+tape/20250101-120000-ab12cd

""" + ("[bold]Settings[/bold]: each is a flag, and --set SECTION.KEY=VALUE. The defaults are the declarations'; a "
       "preset sets its own ('posbench ls presets extend').\n")


def extend(
    ctx: typer.Context,
    model: Init = None,
    # the help of --method and --preset lists what is registered (posbench.cli.setting_flags.ExtendCommand)
    method: Optional[str] = typer.Option(None, "--method", help="The extension method."),
    preset: Preset = None,
    seed: Seed = None,
    device: Device = "auto",
    out_dir: Out = None,
    sets: Sets = [],
    resume: Resume = None,
    logs: Logs = [],
    quiet: Quiet = False,
    dry_run: DryRun = False,
) -> None:
    """Extend a Llama's context window (and fine-tune it, unless the method is training-free); writes
    results/extend/<model>+<method>/<run-id>/.
    The same run as 'posbench run -t extend --init MODEL --encoding METHOD --length L --data SOURCE'.

    Every setting of the extend task, of train and of model is a flag (below): --length 8192 and --data SOURCE
    (both needed), --scale 2, --steps 100, --lr 2e-5; and so is every option of the method (--tape-gate scalar)."""
    flags = setting_flags.given(ctx)                   # the settings flags, typed; -l is --length
    with user_errors():
        reporter = progress_reporter(quiet)
        if resume is not None:                         # (it continues in its own directory: no --out)
            others = bool(model or method or preset is not None or seed is not None or out_dir is not None
                          or sets or logs or flags)
            outcome = resume_run(resume, others=others, dry_run=dry_run, device=device, reporter=reporter)
            if outcome is None:
                return
        else:
            given = {s.key for s in flags if s.section == "task"} | \
                {item.partition("=")[0].strip().removeprefix("task.") for item in sets}   # --set data, task.data
            missing = [flag for flag, value in (("--model", model), ("--method", method),
                                                ("--length", "length" in given or None),
                                                ("--data", "data" in given or None)) if value is None]
            if missing:
                raise ConfigError(f"extend needs {', '.join(missing)} (see 'posbench extend --help')")
            configs = [resolve_run_config("extend", method, preset, seed=s, device=device, init=model,
                                          settings=flags, sets=sets, init_flag="--model", logs=logs)
                       for s in parse_seeds(seed, None)]
            if dry_run:
                show_configs(configs)
                return
            for config in configs:
                show(runner.execute(config, out_dir or Path("results"), reporter=reporter,
                                    command=["posbench", *sys.argv[1:]]))
            return
        show(outcome)


def show(outcome) -> None:
    if not outcome.main:
        return
    record = outcome.record
    metrics = "  ".join(f"{name} {fmt_metric(m)}" for name, m in record.metrics.items())
    counts = record.model
    trainable = (f"trainable {counts['trainable_parameters']:,} of {counts['parameters']:,}  "
                 if "trainable_parameters" in counts else "")
    out().print(f"[bold]extend[/bold] / [bold]{record.encoding}[/bold]: {metrics}  {trainable}"
                f"(train {record.timings.train_s or 0:.0f}s) -> {outcome.run_dir}")
    out().print(f"evaluate it: posbench run -t perplexity --init {outcome.run_dir}")
