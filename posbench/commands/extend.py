"""``posbench extend``: extend a pretrained Llama's context with TAPE, LoRA, LongLoRA or theta scaling."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from posbench.commands.common import err, out, user_errors

EXTEND_EPILOG = """[bold]Examples[/bold]

  posbench extend --model meta-llama/Llama-2-7b-hf --method tape --length 8192 --data togethercomputer/RedPajama-Data-1T-Sample

  posbench extend --model ./llama-2-7b --method lora --length 8192 --data ./redpajama --scale 2

  posbench extend --model ./tiny-llama --method longlora --length 256 --data stdlib --preset tiny

  posbench extend --resume results/extend/llama+tape/20250101-120000-ab12cd

  posbench run -t perplexity --init results/extend/llama+tape/20250101-120000-ab12cd
"""


def extend(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="A local Llama directory, or a hub name "
                                        "(when online)."),
    method: Optional[str] = typer.Option(None, "--method", help="tape, lora, longlora or theta."),
    length: Optional[int] = typer.Option(None, "--length", "-l", help="The new context length in tokens (at least "
                                         "the model's own)."),
    data: Optional[str] = typer.Option(None, "--data", help="Training text: stdlib (built in), a .jsonl/.json/"
                                       ".parquet/.txt file or directory, or a hub name."),
    scale: Optional[float] = typer.Option(None, "--scale", help="Linear position interpolation factor (default: "
                                          "length / the model's context)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Training steps (overrides the preset)."),
    preset: str = typer.Option("paper", "--preset", "-p", help="paper (the TAPE paper's recipe) or tiny (tests)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the data order and the new parameters."),
    device: str = typer.Option("auto", "--device", help="auto (cuda, mps, cpu), cpu, cuda, cuda:N, mps."),
    out_dir: Path = typer.Option(Path("results"), "--out", "-o", help="Results root directory."),
    sets: list[str] = typer.Option([], "--set", "-s", help="Override a key: section.key=value (sections: train "
                                   "incl. checkpointing, method, data). Repeatable."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue a killed extend run directory."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
) -> None:
    """Extend a Llama's context window and fine-tune it; writes results/extend/<model>+<method>/<run-id>/."""
    from posbench.errors import ConfigError
    from posbench.hf.extend import resolve_extend_config, resume_extend, run_extend
    from posbench.progress import NullReporter, RichReporter

    with user_errors():
        reporter = NullReporter() if quiet else RichReporter(err())
        if resume is not None:
            if model or method or length is not None or data or scale is not None or steps is not None or sets:
                raise ConfigError("--resume continues a run with its own config; pass only --resume "
                                  "(and optionally --device)")
            run_dir, result = resume_extend(resume, device=None if device == "auto" else device, reporter=reporter)
        else:
            missing = [flag for flag, value in (("--model", model), ("--method", method), ("--length", length),
                                                ("--data", data)) if value is None]
            if missing:
                raise ConfigError(f"extend needs {', '.join(missing)} (see 'posbench extend --help')")
            config = resolve_extend_config(model, method, length, data, scale=scale, steps=steps, seed=seed,
                                           device=device, preset=preset, sets=sets)
            run_dir, result = run_extend(config, out_dir, reporter=reporter, command=["posbench", *sys.argv[1:]])
        show(run_dir, result)


def show(run_dir: Path, result: dict) -> None:
    from posbench.commands.run import fmt_metric

    metrics = "  ".join(f"{name} {fmt_metric(m)}" for name, m in result["metrics"].items())
    counts = result["model"]
    out().print(f"[bold]extend[/bold] / [bold]{result['encoding']}[/bold]: {metrics}  trainable "
                f"{counts['trainable_parameters']:,} of {counts['parameters']:,}  "
                f"(train {result['timings']['train_s']:.0f}s) -> {run_dir}")
    out().print(f"evaluate it: posbench run -t perplexity --init {run_dir}")
