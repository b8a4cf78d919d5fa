"""Host-side cost of the arithmetic workload: what the CPU spends per training step and per evaluation,
independent of the GPU (the model is replaced by an instant stand-in in evaluation).

    python benchmarks/arithmetic_host.py                  # the paper preset's shapes
    python benchmarks/arithmetic_host.py --digits 10 --eval-digits 20 --batch 512

Measures, with one thread:
- ``data``: one training batch (``AdditionStream.next_batch``), median over repeats, ms;
- ``eval_examples``: generating the evaluation grid's examples (cells x samples), s;
- ``eval_host``: ``Arithmetic.evaluate`` with a model whose ``generate`` returns at once (prompt encoding,
  batching, scoring, predictions), s, and the number of ``generate`` calls and decoding steps it asks for.

It uses only public functions, so it runs unchanged on older checkouts (to measure "before").
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))          # measure the checkout this script belongs to

from posbench.runs.config import resolve_run_config  # noqa: E402
from posbench.reporters import NullReporter  # noqa: E402
from posbench.tasks import TASKS  # noqa: E402
from posbench.tasks.arithmetic.task import AdditionStream  # noqa: E402


class Instant:
    """A stand-in model: ``generate`` returns EOS at once and counts the decoding work it was asked for."""

    def __init__(self):
        self.calls = self.steps = 0

    def generate(self, prompt, max_new_tokens, eos_id=None):
        self.calls += 1
        self.steps += max_new_tokens
        return torch.full((prompt.shape[0], max_new_tokens), eos_id, dtype=torch.long)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--digits", type=int, default=None, help="task.train_digits (default: the preset's)")
    parser.add_argument("--eval-digits", type=int, default=None)
    parser.add_argument("--batch", type=int, default=512, help="examples per training batch")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args()
    torch.set_num_threads(1)

    sets = []
    if args.digits:
        sets.append(f"task.train_digits={args.digits}")
    if args.eval_digits:
        sets.append(f"task.eval_digits={args.eval_digits}")
    config = resolve_run_config("arithmetic", "rope", args.preset, sets=sets)
    task = TASKS["arithmetic"](config)
    digits = task.opts["train_digits"]

    stream = AdditionStream(0, digits)
    stream.next_batch(args.batch)
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        stream.next_batch(args.batch)
        times.append(time.perf_counter() - start)
    data_ms = 1e3 * statistics.median(times)

    start = time.perf_counter()
    for i in range(1, task.eval_digits + 1):
        for j in range(1, task.eval_digits + 1):
            task.eval_examples(i, j)
    examples_s = time.perf_counter() - start

    model = Instant()
    start = time.perf_counter()
    evaluation = task.evaluate(model, torch.device("cpu"), NullReporter(), {})
    eval_s = time.perf_counter() - start

    numbers = {"train_digits": digits, "batch": args.batch, "data_ms_per_batch": round(data_ms, 3),
               "eval_cells": task.eval_digits ** 2, "eval_samples": task.opts["eval_samples"],
               "eval_batch_size": task.opts["eval_batch_size"], "eval_examples_s": round(examples_s, 3),
               "eval_host_s": round(eval_s, 3), "generate_calls": model.calls, "decoding_steps": model.steps,
               "predictions": len(list(evaluation.predictions)), "torch": torch.__version__,
               "machine": platform.processor() or platform.machine()}
    print(json.dumps(numbers, indent=2))
    if args.json:
        args.json.write_text(json.dumps(numbers, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
