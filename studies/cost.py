#!/usr/bin/env python3
"""What a study cost: the measured time of every finished cell, summed by task and encoding, from the result files.

    python studies/cost.py docs/studies/cpu/v2/runs          (studies/publish.py writes it to PAGE/cost.md)

Each cell's time is its record's ``timings.total_s`` as ``posbench.runs.record.record_seconds`` reads it: the wall
time of the process that finished the cell, and never less than its training and probes (summed over resumes; a
killed cell's steps after its last checkpoint are lost and not counted) and evaluation. Not counted: an earlier
process's start-up, and the time a cell waited for a core. One table per task (encoding, cells, the CPUs they ran on,
minutes per cell, the encoding's total), then the study's total in hours. On a machine shared with other work the
times are upper bounds of what quiet cores would take; the CPUs column says which machine each row's cells ran on.
tests/report/test_study_tables.py checks that a committed cost.md is what this prints over the committed runs.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from posbench.runs.record import record_seconds


def cells(runs: Path) -> dict[str, dict[str, list[tuple[float, str]]]]:
    """task -> encoding -> (seconds, CPU) of each finished cell under ``runs``."""
    found: dict[str, dict[str, list[tuple[float, str]]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(runs.glob("*/result.json")):
        record = json.loads(path.read_text())
        seconds = record_seconds(record) or 0.0
        cpu = str((record.get("environment") or {}).get("device_name") or "unknown")
        found[record["task"]][record["encoding"]].append((seconds, cpu))
    return found


def short(cpu: str) -> str:
    """A CPU's name without its vendor's trademarks and the instruction-set note: 'Intel Xeon', 'AMD EPYC'; a bare
    architecture (older records held ``platform.machine()``) as 'unknown (x86_64)'."""
    if cpu in ("x86_64", "AMD64", "aarch64", "arm64"):
        return f"unknown ({cpu})"
    for noise in ("(R)", "(TM)", "(AVX512)", " Processor", " CPU"):
        cpu = cpu.replace(noise, "")
    return " ".join(cpu.split())


def cost(runs: Path) -> str:
    found = cells(runs)
    out: list[str] = []
    everything = 0.0
    for task in sorted(found):
        rows = sorted(found[task].items(), key=lambda item: -sum(s for s, _ in item[1]))
        total = sum(s for _, done in rows for s, _ in done)
        everything += total
        out += [f"### {task}", "", "| encoding | cells | CPUs | min per cell | min in all |", "|---|---:|---|---:|---:|"]
        for encoding, done in rows:
            seconds = [s for s, _ in done]
            cpus = ", ".join(f"{cpu} x{n}" for cpu, n in sorted(Counter(short(c) for _, c in done).items()))
            out.append(f"| {encoding} | {len(done)} | {cpus} | {sum(seconds) / len(seconds) / 60:.1f} | "
                       f"{sum(seconds) / 60:.1f} |")
        cell_count = sum(len(done) for _, done in rows)
        out += ["", f"{task}: {cell_count} cells, {total / 3600:.2f} h of cell time.", ""]
    count = sum(len(done) for task in found.values() for done in task.values())
    out.append(f"**In all: {count} cells, {everything / 3600:.2f} h of cell time.**")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python studies/cost.py RUNS", file=sys.stderr)
        return 2
    sys.stdout.write(cost(Path(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
