"""``posbench bench``: step time, throughput, MFU, peak memory and the ratio to RoPE of every encoding."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from posbench.cli.common import out, progress_reporter, show_configs, split_names, user_errors

BENCH_EPILOG = """[bold]Examples[/bold]

  posbench bench                                        # every encoding, the small CPU model

  posbench bench --size paper --device cuda             # the paper's model, 16 x 1024 and 1 x 8192

  posbench bench -e rope,tape --lengths 1024 --batch 16 --compile

  posbench bench --mode decode --size paper --lengths 1024 --batch 1
"""


def bench(
    encoding: str = typer.Option("", "--encoding", "-e", help="Encodings, comma-separated (default: every one; "
                                 "RoPE is always measured: ratios are to it)."),
    size: str = typer.Option("small", "--size", help="small (4 x 256, the CPU benchmark) or paper (12 x 768)."),
    batch: Optional[str] = typer.Option(None, "--batch", help="Sequences per step: one value, or one per length "
                                        "(default: small 8; paper 16,1)."),
    lengths: Optional[str] = typer.Option(None, "--lengths", help="Sequence lengths, comma-separated (default: "
                                          "small 256; paper 1024,8192)."),
    mode: str = typer.Option("train", "--mode", help="train (forward, backward, AdamW), forward, or decode "
                             "(ms per new token after a prompt of each length)."),
    compile_: bool = typer.Option(False, "--compile", help="torch.compile the model."),
    compile_backend: str = typer.Option("inductor", "--compile-backend", help="With --compile: inductor, or eager "
                                        "/ aot_eager (trace only, to check the graphs; the times mean nothing)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:N."),
    attention: str = typer.Option("auto", "--attention", help="Attention backend for every model."),
    steps: int = typer.Option(10, "--steps", help="Timed steps per cell (the median is reported)."),
    warmup: int = typer.Option(3, "--warmup", help="Untimed steps first."),
    new_tokens: int = typer.Option(0, "--new-tokens", help="decode: tokens per timed run (default: small 32, "
                                   "paper 128)."),
    peak_tflops: Optional[float] = typer.Option(None, "--peak-tflops", help="The device's dense bf16 peak, for "
                                                "the MFU (known GPUs are recognised)."),
    threads: int = typer.Option(0, "--threads", help="CPU threads (0: the free cores)."),
    out_dir: Path = typer.Option(Path("results"), "--out", "-o", help="Results root directory."),
    cells_to: Optional[Path] = typer.Option(None, "--cells-to", help="Also append every cell, one JSON line, to this "
                                            "file the moment it finishes (a kill keeps every finished cell)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Resolve and print the configuration (JSON); run and "
                                 "write nothing."),
) -> None:
    """Measure each encoding's training (or forward, or decoding) step; writes results/bench/<mode>/<run-id>/."""
    from posbench.runs import runner
    from posbench.runs.config import resolve_run_config

    from posbench.errors import ConfigError

    with user_errors():
        lengths_given, batch_given = _ints("--lengths", lengths), _ints("--batch", batch)
        if lengths_given and batch_given and len(batch_given) not in (1, len(lengths_given)):
            raise ConfigError(f"--batch gives {len(batch_given)} values for {len(lengths_given)} lengths; give one, "
                             f"or one per length")
        task = {"encodings": ",".join(split_names(encoding)), "mode": mode, "steps": steps, "warmup": warmup,
                "lengths": lengths, "batch": batch, "new_tokens": new_tokens or None, "peak_tflops": peak_tflops,
                "compile_backend": compile_backend, "cells_to": str(cells_to) if cells_to else None}
        sets = [f"task.{k}={v}" for k, v in task.items() if v is not None]
        sets += [f"train.compile={compile_}", f"train.threads={threads}", f"model.attention={attention}"]
        config = resolve_run_config("bench", None, size, device=device, sets=sets)
        if dry_run:
            show_configs([config])
            return
        reporter = progress_reporter(quiet)
        outcome = runner.execute(config, out_dir, reporter=reporter, command=["posbench", *sys.argv[1:]])
        out().print(efficiency_table(outcome.record))
        out().print(f"-> {outcome.run_dir}")


def _ints(flag: str, text: Optional[str]) -> list[int]:
    from posbench.errors import ConfigError

    if text is None:
        return []
    try:
        return [int(v) for v in split_names(text)]
    except ValueError:
        raise ConfigError(f"{flag} expects integers separated by commas, got {text!r}") from None


def efficiency_table(record) -> Table:
    info, task = record.bench, record.config.task_options
    peak = f"{info['peak_tflops']:g} TFLOP/s ({info['peak_source']})" if info.get("peak_tflops") else \
        info.get("peak_source", "")
    table = Table(title=f"bench {task['mode']}, {record.preset} model, {info['device_name']}, {record.precision}; "
                        f"{info['unit']}, median of {task['steps']}; peak {peak}", title_justify="left")
    compiled = any(cell.get("compiled") is not None for cell in info["cells"])
    columns = ["encoding", "batch x length", info["unit"], "x RoPE", "tokens/s", "MFU", "peak GiB"]
    for col in columns + (["compiled (graphs)"] if compiled else []):
        table.add_column(col, justify="left" if col == "encoding" else "right")
    for cell in info["cells"]:
        graphs = [f"{'yes' if cell.get('compiled') else 'NO'} ({cell.get('graphs')})"] if compiled else []
        if cell["status"] != "ok":
            table.add_row(cell["encoding"], f"{cell['batch']} x {cell['length']}", cell["status"].upper(),
                          "-", "-", "-", "-", *graphs)
            continue
        table.add_row(cell["encoding"], f"{cell['batch']} x {cell['length']}", f"{cell['ms']:.1f}",
                      f"{cell['x_rope']:.2f}" if cell["x_rope"] is not None else "-",
                      f"{cell['tokens_per_s']:,.0f}",
                      f"{100 * cell['mfu']:.1f}%" if cell["mfu"] is not None else "-",
                      f"{cell['peak_gib']:.1f}" if cell["peak_gib"] is not None else "-", *graphs)
    return table
