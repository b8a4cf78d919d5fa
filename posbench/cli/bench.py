"""``posbench bench``: step time, throughput, MFU, peak memory and the ratio to RoPE of every encoding."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.table import Table

from posbench.cli.common import out, progress_reporter, show_configs, split_names, user_errors

BENCH_EPILOG = """[bold]Examples[/bold]

  posbench bench                                        # every encoding, the small CPU model

  posbench bench --size paper --device cuda             # the paper's model, 16 x 1024 and 1 x 8192

  posbench bench -e rope,tape --lengths 1024 --batch 16 --compile

  posbench bench --mode decode --size paper --lengths 1024 --batch 1

""" + ("[bold]Settings[/bold]: each is a flag, and --set SECTION.KEY=VALUE. The defaults are the declarations'; a "
       "preset (--size) sets its own ('posbench ls presets bench').\n")


def bench(
    ctx: typer.Context,
    encoding: str = typer.Option("", "--encoding", "-e", help="Encodings, comma-separated (default: every one; "
                                 "RoPE is always measured: ratios are to it)."),
    size: str = typer.Option("small", "--size", help="The preset: small (4 x 256, the CPU benchmark) or paper "
                             "(12 x 768 at 16 x 1024 and 1 x 8192)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:N."),
    sets: list[str] = typer.Option([], "--set", "-s", help="Override a setting: [section.]key=value. Repeatable."),
    out_dir: Path = typer.Option(Path("results"), "--out", "-o", help="Results root directory."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Resolve and print the configuration (JSON); run and "
                                 "write nothing."),
) -> None:
    """Measure each encoding's training (or forward, or decoding) step; writes results/bench/<mode>/<run-id>/.

    Every setting of the bench task, of train and of model is a flag (below): --steps 5, --lengths 1024,8192,
    --mode decode, --compile, --attention flex, --threads 2."""
    from posbench.cli.setting_flags import own_options, sets_from_flags
    from posbench.runs import runner
    from posbench.runs.config import resolve_run_config

    with user_errors():
        given = sets_from_flags(list(ctx.args), "bench", "bench", own_options(ctx.command))
        _lengths_match_batches([*given, *sets])
        if encoding:
            given.insert(0, f"task.encodings={','.join(split_names(encoding))}")
        config = resolve_run_config("bench", None, size, device=device, sets=[*given, *sets])
        if dry_run:
            show_configs([config])
            return
        reporter = progress_reporter(quiet)
        outcome = runner.execute(config, out_dir, reporter=reporter, command=["posbench", *sys.argv[1:]])
        out().print(efficiency_table(outcome.record))
        out().print(f"-> {outcome.run_dir}")


def _lengths_match_batches(sets: list[str]) -> None:
    """Lengths and batch sizes both given must pair up (one batch size, or one per length): a preset's batch
    sizes give their first to lengths the user chose, a user's own list never is cut short in silence."""
    from posbench.errors import ConfigError
    from posbench.runs.config import parse_assignment

    given = {key.removeprefix("task."): value for key, value in map(parse_assignment, sets)}   # batch, task.batch
    lengths, batch = given.get("lengths"), given.get("batch")
    if lengths is not None and batch is not None:
        count = [len(split_names(str(v))) for v in (lengths, batch)]
        if count[1] not in (1, count[0]):
            raise ConfigError(f"bench: {count[1]} batch sizes for {count[0]} lengths; give one, or one per length")


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
