"""``posbench analyze``: what each attention head of trained runs attends to, at each evaluation length."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from posbench.analysis.analyze import FACTORS, TOKENS, analyze as analyze_run
from posbench.analysis.record import keep_earlier, write
from posbench.analysis.heads import BLOCK
from posbench.cli.common import err, out, user_errors
from posbench.cli.shared_options import Device, Force
from posbench.options import OptionError
from posbench.reporters import RichReporter

ANALYZE_EPILOG = """[bold]Examples[/bold]

  posbench analyze results/perplexity/rope/20261207-050620-782488

  posbench analyze results/perplexity/*/*                      (every run: one analysis.json in each)

  posbench analyze RUN --factors 1,2,4,8,16 --tokens 16384     (longer windows, more text)

  posbench compare results --plots figures                      (draws the distance profiles and head heatmaps)
"""


def analyze(
    run_dirs: list[Path],
    factors: Optional[str] = typer.Option(None, "--factors", help="window lengths as multiples of the training "
                                          "length, comma-separated (default: the run's own evaluation lengths, else "
                                          f"{','.join(map(str, FACTORS))}); fractions allowed (1.5)"),
    tokens: int = typer.Option(TOKENS, "--tokens", min=1, help="held-out tokens read at each length (at least "
                               "one window)"),
    device: Device = "cpu",
    force: Force = False,
) -> None:
    """Per layer and head, at each length: attention mass by distance, mean attended distance, entropy, mass on the
    first token and beyond the training length, and rigidity (how much of the logits a function of distance
    alone explains); written to each run's analysis.json.

    RUN_DIRS: one or more finished runs of the pretrain or perplexity task (their checkpoints). The queries go in
    blocks of 128: memory is heads x 128 x the window length."""
    with user_errors():
        chosen = parse_factors(factors)
        reporter = RichReporter(err())
        for run_dir in run_dirs:
            keep_earlier(run_dir, force)                   # the one-line refusal, before any work
            bars: dict[int, object] = {}

            def progress(length: int, done: int, total: int) -> None:
                if length not in bars:
                    bars[length] = reporter.task(f"{run_dir.name} at {length}", total=total, unit="window")
                bars[length].update(done)
                if done == total:
                    bars[length].close()
            record = analyze_run(run_dir, chosen, tokens, BLOCK, device, progress, command=["posbench", *sys.argv[1:]])
            path = write(run_dir, record, force=force)
            lines = [f"{entry['factor']:g}x: rigidity {mean(entry['rigidity']):.2f}, entropy "
                     f"{mean(entry['entropy']):.2f}, first token {mean(entry['first_token']):.2f}"
                     for entry in record["lengths"]]
            out().print(f"[bold]analyze[/bold] {record['task']} / [bold]{record['encoding']}[/bold] "
                        f"({record['seconds']:.1f} s): {'; '.join(lines)} (means over heads) -> {path}",
                        highlight=False)


def parse_factors(text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise OptionError(f"--factors {text!r}: expected numbers separated by commas (1,2,4,8)") from None
    if not values or any(not (v > 0) or v != v or v == float("inf") for v in values):
        raise OptionError(f"--factors {text!r}: each factor must be a positive number")
    return values


def mean(values: list[list[float | None]]) -> float:
    flat = [v for row in values for v in row if v is not None]
    return sum(flat) / len(flat) if flat else float("nan")
