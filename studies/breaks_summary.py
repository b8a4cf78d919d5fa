#!/usr/bin/env python3
"""The numbers of "Where each encoding breaks" (docs/studies/breaks.md), computed from the published runs:

    python studies/breaks_summary.py docs/studies/breaks [docs/studies/breaks.md]

writes ``docs/studies/breaks/summary.md`` and rewrites the page's copy of it (between ``<!-- summary.md -->`` and
``<!-- /summary.md -->``; the page defaults to PAGE_DIR.md).

From every run under ``PAGE/runs`` (result.json with its loss by position and length probe; analysis.json beside
it, from ``posbench analyze``), per encoding, the mean over its seeds with the 95% Student-t interval over seeds:

- **where the loss turns**: the mean loss (nats per token) of the 8x windows' query positions in each octave
  around the training length T: [T/4, T/2), [T/2, T), [T, 2T), [2T, 4T), [4T, 8T) (from the records' position
  buckets; a bucket belongs to the octave that holds its first position, and the octaves' edges are bucket edges
  at these lengths);
- **over training** (the length probe): the gap between the held-out loss at 8x and at 1x at the last probe, its
  largest value, and the first probed step from which the gap stays above 0.1 nats (``-``: it never does);
- **attention** at 1x and 8x (``posbench analyze``): the mean over layers and heads of rigidity, entropy, the
  first token's mass, the mass beyond the training length, and the mean attended distance;
- **rigidity against TAPE**: each encoding's mean rigidity minus TAPE's at 1x, paired by seed (the paired t over
  seeds, ``posbench.stats.paired_difference``): the TAPE paper's claim that other encodings impose a fixed
  distance pattern while TAPE's addressing depends on content says this difference is positive.

tests/test_breaks_study.py holds summary.md equal to this script's output over the committed runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from posbench.files import atomic_write_text
from posbench.results import attention_frame, frame, positions_frame, probe_frame
from posbench.stats import paired_difference, seed_interval

sys.path.insert(0, str(Path(__file__).resolve().parent))
from publish import refresh_copy  # noqa: E402  (studies/publish.py, a script beside this one)

ORDER = ["rope", "alibi", "nope", "fire", "t5", "kerple", "xpos", "tape"]
OCTAVES = [(0.25, 0.5), (0.5, 1), (1, 2), (2, 4), (4, 8)]
GAP = 0.1
STATS = [("rigidity", "rigidity"), ("entropy", "entropy"), ("first_token", "first token"),
         ("beyond_train", "beyond T"), ("mean_distance", "mean distance")]


def cell(values, digits: int = 2) -> str:
    """``mean ± half-width`` over seeds (the mean alone for one seed; ``-`` for none)."""
    interval = seed_interval([v for v in values if v is not None])
    if interval is None:
        return "-"
    if interval.half_width is None:
        return f"{interval.mean:.{digits}f}"
    return f"{interval.mean:.{digits}f} ± {interval.half_width:.{digits}f}"


def encodings(df: pd.DataFrame) -> list[str]:
    present = set(df.encoding)
    return [e for e in ORDER if e in present] + sorted(present - set(ORDER))


def loss_by_octave(runs: Path) -> str:
    df = positions_frame(runs)
    df = df[(df.protocol == "chunks") & (df.factor == df.factor.max())]
    lines = ["| encoding | " + " | ".join(f"[{lo:g}T, {hi:g}T)" for lo, hi in OCTAVES) + " |",
             "|---|" + "---:|" * len(OCTAVES)]
    for encoding in encodings(df):
        mine = df[df.encoding == encoding]
        cells = []
        for lo, hi in OCTAVES:
            per_seed = []
            for _, run in mine.groupby("run_id"):
                t = run.train_length.iloc[0]
                inside = run[(run.position_start >= lo * t) & (run.position_start < hi * t)]
                per_seed.append(float((inside.nll * inside.tokens).sum() / inside.tokens.sum())
                                if inside.tokens.sum() else None)
            cells.append(cell(per_seed))
        lines.append(f"| {encoding} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def over_training(runs: Path) -> str:
    df = probe_frame(runs)
    top = df.factor.max()
    lines = [f"| encoding | gap {top:g}x - 1x, last probe | largest gap | first step the gap stays > {GAP:g} |",
             "|---|---:|---:|---:|"]
    for encoding in encodings(df):
        last, largest, parted = [], [], []
        for _, run in df[df.encoding == encoding].groupby("run_id"):
            wide = run.pivot_table(index="step", columns="factor", values="nll")
            gap = (wide[top] - wide[1.0]).sort_index()
            last.append(float(gap.iloc[-1]))
            largest.append(float(gap.max()))
            above = gap > GAP
            stays = [step for step in gap.index if above.loc[step:].all()]
            parted.append(float(stays[0]) if stays else None)
        seen = [p for p in parted if p is not None]
        when = cell(seen, 0) + (f" ({len(seen)} of {len(parted)} seeds)" if len(seen) < len(parted) else "") \
            if seen else "-"
        lines.append(f"| {encoding} | {cell(last, 3)} | {cell(largest, 3)} | {when} |")
    return "\n".join(lines) + "\n"


def per_run_means(df: pd.DataFrame, factor: float, stat: str) -> dict[str, dict[int, float]]:
    """encoding -> {seed: the mean of ``stat`` over its layers and heads at ``factor``}."""
    mine = df[df.factor == factor]
    out: dict[str, dict[int, float]] = {}
    for (encoding, seed), run in mine.groupby(["encoding", "seed"]):
        values = run[stat].dropna()
        if len(values):
            out.setdefault(encoding, {})[int(seed)] = float(values.mean())
    return out


def attention(runs: Path) -> str:
    df = attention_frame(runs)
    if df.empty:
        return "(no run analysed: posbench analyze)\n"
    factors = sorted(set(df.factor))
    chosen = [factors[0], factors[-1]] if len(factors) > 1 else factors
    lines = ["| encoding | " + " | ".join(f"{name} {f:g}x" for name, _ in [(n, s) for s, n in STATS]
                                          for f in chosen) + " |",
             "|---|" + "---:|" * (len(STATS) * len(chosen))]
    means = {(stat, f): per_run_means(df, f, stat) for stat, _ in STATS for f in chosen}
    for encoding in encodings(df):
        cells = []
        for stat, _ in STATS:
            for f in chosen:
                seeds = means[(stat, f)].get(encoding, {})
                cells.append(cell(list(seeds.values()), 1 if stat == "mean_distance" else 2))
        lines.append(f"| {encoding} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def rigidity_against(runs: Path, reference: str = "tape") -> str:
    df = attention_frame(runs)
    if df.empty:
        return "(no run analysed: posbench analyze)\n"
    factor = min(set(df.factor))
    means = per_run_means(df, factor, "rigidity")
    if reference not in means:
        return f"(no {reference} run analysed)\n"
    lines = [f"| encoding | rigidity minus {reference}'s at {factor:g}x | 95% interval (paired t over seeds) | "
             f"reading |", "|---|---:|---:|---|"]
    ref = means[reference]
    for encoding in encodings(df):
        if encoding == reference or encoding not in means:
            continue
        seeds = sorted(set(ref) & set(means[encoding]))
        if len(seeds) < 2:
            continue
        d = paired_difference([ref[s] for s in seeds], [means[encoding][s] for s in seeds])
        reading = "more rigid" if d.low > 0 else "less rigid" if d.high < 0 else "no difference"
        lines.append(f"| {encoding} | {d.estimate:+.3f} | [{d.low:+.3f}, {d.high:+.3f}] | {reading} |")
    return "\n".join(lines) + "\n"


def perplexity_and_lengths(runs: Path) -> str:
    df = frame(runs)
    df = df[df.task == "perplexity"]
    names = [m for m in ("ppl_1x", "ppl_2x", "ppl_4x", "ppl_8x") if m in set(df.metric)]
    lines = ["| encoding | " + " | ".join(names) + " | seeds |", "|---|" + "---:|" * (len(names) + 1)]
    for encoding in encodings(df):
        mine = df[df.encoding == encoding]
        cells = [cell(list(mine[mine.metric == m].value)) for m in names]
        lines.append(f"| {encoding} | " + " | ".join(cells) + f" | {mine.seed.nunique()} |")
    return "\n".join(lines) + "\n"


def summary(runs: Path) -> str:
    parts = [("Perplexity at each length (chunks; mean ± 95% interval over seeds)", perplexity_and_lengths),
             ("Where the loss turns: mean loss (nats) of the 8x windows' positions, by octave of the training length T",
              loss_by_octave),
             ("Over training: the held-out loss at 8x minus at 1x (nats), from the length probe", over_training),
             ("What the heads attend to: means over layers and heads, at 1x and 8x", attention),
             ("Rigidity against TAPE's at 1x", rigidity_against)]
    out = ["<!-- written by studies/breaks_summary.py from the runs; do not edit -->", ""]
    for title, make in parts:
        out += [f"### {title}", "", make(runs)]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: python studies/breaks_summary.py PAGE_DIR [PAGE.md]", file=sys.stderr)
        return 2
    page = Path(argv[0])
    text_page = Path(argv[1]) if len(argv) == 2 else page.with_suffix(".md")
    text = summary(page / "runs")
    atomic_write_text(page / "summary.md", text)
    if text_page.is_file():
        atomic_write_text(text_page, refresh_copy(text_page.read_text(), "summary.md", text))
    print(f"wrote {page / 'summary.md'} and its copy in {text_page}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
