"""``posbench bench``: step time, throughput, MFU, peak memory and the ratio to RoPE of every encoding."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.table import Table

from posbench.cli import setting_flags
from posbench.cli.common import out, progress_reporter, show_configs, split_names, user_errors
from posbench.cli.shared_options import Device, DryRun, Encoding, Out, Preset, Quiet, Sets
from posbench.errors import ConfigError
from posbench.options import Setting
from posbench.runs import runner
from posbench.runs.config import resolve_run_config

BENCH_EPILOG = """[bold]Examples[/bold]

  posbench bench                                        # every encoding, the small CPU model

  posbench bench --size paper --device cuda             # the paper's model, 16 x 1024 and 1 x 8192

  posbench bench -e rope,tape --lengths 1024 --batch 16 --compile

  posbench bench --mode decode --size paper --lengths 1024 --batch 1

""" + ("[bold]Settings[/bold]: each is a flag, and --set SECTION.KEY=VALUE. The defaults are the declarations'; a "
       "preset (--size) sets its own ('posbench ls presets bench').\n")


def bench(
    ctx: typer.Context,
    encoding: Encoding = None,
    size: Preset = None,
    device: Device = "auto",
    sets: Sets = [],
    out_dir: Out = None,
    quiet: Quiet = False,
    dry_run: DryRun = False,
) -> None:
    """Measure each encoding's training (or forward, or decoding) step; writes results/bench/<mode>/<run-id>/.

    Every setting of bench, of train and of model is a flag (below): --timed-steps 5, --lengths 1024,8192,
    --mode decode, --compile, --attention flex, --threads 2."""
    out_dir = Path("results") if out_dir is None else out_dir
    with user_errors():
        given = setting_flags.given(ctx)            # the settings flags, typed (posbench.cli.setting_flags)
        _no_train_steps(given, sets)
        if encoding:
            if any((s.section, s.key) == ("task", "encodings") for s in given) or \
                    any(item.partition("=")[0].strip() in ("encodings", "task.encodings") for item in sets):
                raise ConfigError("bench: -e and --encodings are one setting (task.encodings); give one of them")
            given.insert(0, Setting("task", "encodings", split_names(encoding)))
        _lengths_match_batches(given, sets)
        config = resolve_run_config("bench", None, size or "small", device=device, settings=given, sets=sets)
        if dry_run:
            show_configs([config])
            return
        reporter = progress_reporter(quiet)
        outcome = runner.execute(config, out_dir, reporter=reporter, command=["posbench", *sys.argv[1:]])
        out().print(efficiency_table(outcome.record))
        for line in failures(outcome.record):
            out().print(line, markup=False, highlight=False)
        out().print(f"-> {outcome.run_dir}")


def _no_train_steps(given: list, sets: list[str]) -> None:
    """train.steps, as a flag or ``--set train.steps=N``, is refused: bench trains to no step count."""
    spelled = next((f"--set {item.strip()}" for item in sets if item.partition("=")[0].strip() == "train.steps"),
                   None)
    if any((s.section, s.key) == ("train", "steps") for s in given):
        spelled = "--steps"
    if spelled:
        raise ConfigError(f"bench: {spelled} is train.steps, which bench does not use (it times steps, it trains "
                          f"to no step count); the timed steps per cell are --timed-steps N")


def _lengths_match_batches(given: list, sets: list[str]) -> None:
    """Lengths and batch sizes both given (flags, typed, or ``--set`` text) must pair up (one batch size, or one per
    length): a preset's batch sizes give their first to lengths the user chose, a user's own list never is cut
    short in silence."""
    counts = {s.key: len(s.value) for s in given if s.section == "task" and s.key in ("lengths", "batch")}
    for item in sets:                                                          # batch, task.batch
        key, _, value = item.partition("=")
        counts[key.strip().removeprefix("task.")] = len(split_names(value))
    lengths, batch = counts.get("lengths"), counts.get("batch")
    if lengths is not None and batch is not None and batch not in (1, lengths):
        raise ConfigError(f"bench: {batch} batch sizes for {lengths} lengths; give one, or one per length")


def failures(record) -> list[str]:
    """Why each cell that did not time failed (its status, ERROR or OOM, is all its row of the table shows): one
    line each, from the cell's record (``cells.jsonl`` holds the same)."""
    return [f"{cell['encoding']} ({cell['batch']} x {cell['length']}): {cell['status']}: "
            f"{cell.get('error') or 'no reason recorded'}"
            for cell in record.bench["cells"] if cell["status"] != "ok"]


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
