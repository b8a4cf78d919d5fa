#!/usr/bin/env python3
"""What changed from one version of a study to the next: each encoding's mean of every metric in both, side by side.

    python studies/changes.py docs/studies/cpu/v1/runs docs/studies/cpu/v2/runs > docs/studies/cpu/v2/changes.md

For each task and each metric both versions report, one markdown table: encoding, the earlier version's mean over
its seeds, the later one's, the change, and the seeds behind each (a cell still running counts no seed). Means
are plain means of the result files' values (``compare`` gives the intervals and paired differences; this is the
before/after view).

Then the verdicts that moved: for each baseline of the study's tables (RoPE, ALiBi), ``posbench compare --against``
over each version gives every encoding's paired difference and its verdict (better / worse / - for no difference);
one table per task lists the (encoding, metric) pairs whose verdict differs between the versions, each with both
differences and intervals, and says how many kept theirs, how many of the moves compare versions with unequal
seeds (an interval over fewer seeds is wider: a move to "no difference" there may be the seeds', not the
encoding's), and which pairs only one version has. A pair without an interval (one seed, no paired examples)
has no verdict to move and is listed as such. tests/report/test_study_tables.py checks that a committed
changes.md is what this prints.
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


BASELINES = ("rope", "alibi")


class ChangesError(Exception):
    """Something the user can fix; ``str()`` is one line."""


def differences(runs: Path, baseline: str, comparison=None) -> dict[tuple[str, str, str], dict]:
    """(task, row label, metric) -> compare's paired difference to ``baseline`` (its verdict, value, interval,
    seeds): what ``posbench compare RUNS --against BASELINE --format json`` prints, made in this process (with
    ``comparison``, a ``posbench.report.comparison.Comparison`` of the same tree: its work shared between
    baselines)."""
    from posbench import report
    from posbench.errors import UserError
    from posbench.report.collect import check_baseline

    failed = f"posbench compare {runs} --against {baseline} failed"
    try:
        result = report.collect(runs, against=baseline, comparison=comparison)
        if not result.tables:
            raise ChangesError(f"{failed}: no finished runs under {runs}")
        check_baseline(result, baseline, runs)                 # compare's own check, its own line
    except UserError as exc:
        raise ChangesError(f"{failed}: {exc}") from None
    tables = json.loads(report.render_text(result, "json"))["tables"]
    return {(table["task"], d["label"], d["metric"]): d for table in tables for d in table["differences"]}


def has_interval(d: dict) -> bool:
    return d.get("ci_low") is not None and d.get("ci_high") is not None


def said(d: dict) -> str:
    """A difference as the verdict and its numbers: ``worse: +4.37 [+3.90, +4.84]``; without an interval
    ``no interval: +4.37 (1 seed)``."""
    if not has_interval(d):
        return f"no interval: {d['difference']:+.2f} ({d.get('seeds')} seed(s))"
    verdict = d["verdict"] if d["verdict"] in ("better", "worse") else "no difference"
    return f"{verdict}: {d['difference']:+.2f} [{d['ci_low']:+.2f}, {d['ci_high']:+.2f}]"


def moved(before: Path, after: Path, labels: tuple[str, str] = ("v1", "v2")) -> str:
    from posbench.report.comparison import Comparison

    out = ["## Verdicts that moved", ""]
    comparisons = {before: Comparison(), after: Comparison()}     # each tree read and resampled once
    for baseline in BASELINES:
        old, new = differences(before, baseline, comparisons[before]), differences(after, baseline, comparisons[after])
        for task in sorted({key[0] for key in old} | {key[0] for key in new}):
            both = sorted(key for key in set(old) & set(new) if key[0] == task)
            judged = [key for key in both if has_interval(old[key]) and has_interval(new[key])]
            changed = [key for key in judged if old[key]["verdict"] != new[key]["verdict"]]
            unequal = [key for key in changed if old[key]["seeds"] != new[key]["seeds"]]
            out += [f"### {task}: against {baseline}", "",
                    f"{len(changed)} of {len(judged)} verdicts moved (paired 95% intervals); {len(unequal)} of the "
                    f"moves compare unequal numbers of seeds.", ""]
            if changed:
                out += [f"| encoding | metric | {labels[0]} | {labels[1]} | seeds {labels[0]} / {labels[1]} |",
                        "|---|---|---|---|---:|"]
                out += [f"| {key[1]} | {key[2]} | {said(old[key])} | {said(new[key])} | "
                        f"{old[key]['seeds']} / {new[key]['seeds']} |" for key in changed]
                out.append("")
            unjudged = [key for key in both if key not in judged]
            if unjudged:
                out += ["Without an interval in a version (no verdict to compare): " +
                        "; ".join(f"{k[1]} {k[2]} ({said(old[k])} / {said(new[k])})" for k in unjudged), ""]
            for version, mine, other in ((labels[0], old, new), (labels[1], new, old)):
                alone = sorted(f"{k[1]} {k[2]}" for k in mine if k[0] == task and k not in other)
                if alone:
                    out += [f"Only in {version}: " + ", ".join(alone) + ".", ""]
    return "\n".join(out)


def report(before: Path, after: Path) -> str:
    """changes.md: the means side by side, then the verdicts that moved."""
    return changes(before, after) + "\n" + moved(before, after)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not all(Path(a).is_dir() for a in argv):
        print("usage: python studies/changes.py EARLIER_RUNS LATER_RUNS", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(report(Path(argv[0]), Path(argv[1])))
    except ChangesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
