"""``posbench extend``: extend a pretrained Llama's context with one of the registered methods (``posbench.hf.methods``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from posbench.cli.common import out, progress_reporter, resume_run, show_configs, user_errors

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
    model: Optional[str] = typer.Option(None, "--model", "-m", help="A local Llama directory, or a hub name "
                                        "(when online)."),
    # the help of --method and --preset lists what is registered (posbench.cli.registry_help.ExtendHelp)
    method: Optional[str] = typer.Option(None, "--method", help="The extension method."),
    preset: Optional[str] = typer.Option(None, "--preset", "-p", help="Preset ('posbench ls presets')."),
    seed: int = typer.Option(0, "--seed", help="Seed of the data order and the new parameters."),
    device: str = typer.Option("auto", "--device", help="auto (cuda, mps, cpu), cpu, cuda, cuda:N, mps."),
    out_dir: Path = typer.Option(Path("results"), "--out", "-o", help="Results root directory."),
    sets: list[str] = typer.Option([], "--set", "-s", help="Override a key: section.key=value (sections: train, "
                                   "method (the method's options), task). Repeatable."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue a killed extend run directory."),
    logs: list[str] = typer.Option([], "--log", help="Log the training to csv, tensorboard or wandb (repeatable): "
                                   "loss, learning rate, gradient norm, tokens/s and the final metrics."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Resolve and print the configuration (JSON); run and "
                                 "write nothing."),
) -> None:
    """Extend a Llama's context window (and fine-tune it, unless the method is training-free); writes
    results/extend/<model>+<method>/<run-id>/.
    The same run as 'posbench run -t extend --init MODEL --encoding METHOD --length L --data SOURCE'.

    Every setting of the extend task, of train and of model is a flag (below): --length 8192 and --data SOURCE
    (both needed), --scale 2, --steps 100, --lr 2e-5; and so is every option of the method (--tape-gate scalar)."""
    from posbench.cli.setting_flags import for_encoding, own_options, sets_from_flags
    from posbench.errors import ConfigError
    from posbench.runs import runner
    from posbench.runs.config import resolve_run_config

    with user_errors():
        reporter = progress_reporter(quiet)
        if resume is not None:
            others = bool(model or method or sets or logs or ctx.args)
            outcome = resume_run(resume, others=others, dry_run=dry_run, device=device, reporter=reporter)
            if outcome is None:
                return
        else:
            flags = ["--length" if word == "-l" else word for word in ctx.args]       # -l: --length, as before
            chosen = [method] if method else []
            settings = [*for_encoding(sets_from_flags(flags, "extend", "extend", own_options(ctx.command), chosen),
                                      "extend", method), *sets]
            given = {item.partition("=")[0].strip().removeprefix("task.") for item in settings}   # data, task.data
            missing = [flag for flag, value in (("--model", model), ("--method", method),
                                                ("--length", "length" in given or None),
                                                ("--data", "data" in given or None)) if value is None]
            if missing:
                raise ConfigError(f"extend needs {', '.join(missing)} (see 'posbench extend --help')")
            config = resolve_run_config("extend", method, preset, seed=seed, device=device, init=model,
                                        sets=settings, init_flag="--model", logs=logs)
            if dry_run:
                show_configs([config])
                return
            outcome = runner.execute(config, out_dir, reporter=reporter, command=["posbench", *sys.argv[1:]])
        show(outcome)


def show(outcome) -> None:
    from posbench.cli.run import fmt_metric

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
