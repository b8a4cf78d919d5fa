#!/usr/bin/env python3
"""What changed from one version of a study to the next: each encoding's mean of every metric in both, side by side.

    python studies/changes.py docs/studies/cpu/v1/runs docs/studies/cpu/v2/runs > docs/studies/cpu/v2/changes.md

For each task and each metric both versions report, one markdown table: encoding, the earlier version's mean over
its seeds, the later one's, the change, and the seeds behind each (a cell still running counts no seed). Means
are plain means of the result files' values (``compare`` gives the intervals and paired differences; this is the
before/after view). tests/test_study_tables.py checks that a committed changes.md is what this prints.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from posbench.evaluation.outcome import as_number


def means(runs: Path) -> dict[str, dict[str, dict[str, list[float]]]]:
    """task -> metric -> encoding -> the values of its seeds, from every result.json under ``runs``."""
    found: dict[str, dict[str, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for path in sorted(runs.glob("*/result.json")):
        record = json.loads(path.read_text())
        for name, metric in (record.get("metrics") or {}).items():
            value = as_number(metric.get("value")) if isinstance(metric, dict) else None
            if isinstance(value, float):               # an infinity (a diverged seed) counts, and shows as inf
                found[record["task"]][name][record["encoding"]].append(value)
    return found


def fmt(values: list[float]) -> str:
    """The mean, ``inf`` when a seed diverged (then no change is computed), ``-`` without a seed."""
    return f"{sum(values) / len(values):.2f}" if values else "-"


def changes(before: Path, after: Path, labels: tuple[str, str] = ("v1", "v2")) -> str:
    old, new = means(before), means(after)
    out: list[str] = []
    for task in sorted(set(old) & set(new)):
        metrics = [m for m in new[task] if m in old[task]]
        for metric in metrics:
            encodings = sorted(set(old[task][metric]) | set(new[task][metric]))
            out += [f"### {task}: {metric}", "",
                    f"| encoding | {labels[0]} | {labels[1]} | change | seeds {labels[0]} / {labels[1]} |",
                    "|---|---:|---:|---:|---:|"]
            for encoding in encodings:
                a, b = old[task][metric].get(encoding, []), new[task][metric].get(encoding, [])
                change = f"{sum(b) / len(b) - sum(a) / len(a):+.2f}" if a and b else "-"
                out.append(f"| {encoding} | {fmt(a)} | {fmt(b)} | {change} | {len(a)} / {len(b)} |")
            out.append("")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not all(Path(a).is_dir() for a in argv):
        print("usage: python studies/changes.py EARLIER_RUNS LATER_RUNS", file=sys.stderr)
        return 2
    sys.stdout.write(changes(Path(argv[0]), Path(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
