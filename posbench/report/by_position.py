"""Reading what a run recorded about where its loss turns: the loss by token position of each perplexity
evaluation (``posbench.evaluation.positions``) and the held-out loss at each length over training (the length
probe, ``posbench.evaluation.length_probe``), as rows for ``posbench.results`` and as seed-pooled curves for the
figures.

A bucket's value is its mean NLL (nats per token): its summed NLL over its token count. Seeds pool as every metric
does: the mean of the seeds' values with the 95% Student-t interval over seeds (``posbench.stats.seed_interval``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from posbench.evaluation.probe_names import factor_of, is_length_loss
from posbench.evaluation.positions import PositionLoss
from posbench.stats import seed_interval


def position_losses(run: Any) -> dict[tuple[str, int], PositionLoss]:
    """``{(protocol, length): PositionLoss}`` of every evaluation the run recorded with its loss by position
    (perplexity: one per length and protocol; pretrain and extend: one); records without it give none."""
    evaluation = run.evaluation if isinstance(run.evaluation, dict) else {}
    results = evaluation.get("results") if isinstance(evaluation.get("results"), list) else [evaluation]
    out = {}
    for result in results:
        if not isinstance(result, dict) or not isinstance(result.get("by_position"), dict):
            continue
        try:
            out[(str(result.get("protocol") or "chunks"), int(result["length"]))] = \
                PositionLoss.from_dict(result["by_position"])
        except (KeyError, TypeError, ValueError):
            continue                               # a record not in the shape posbench writes: left out
    return out


def train_length(run: Any) -> int | None:
    """The run's training length in tokens (its model's ``max_seq_len``), or None."""
    value = (run.model_config or {}).get("max_seq_len") or run.config.model.get("max_seq_len")
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def position_rows(run: Any) -> list[dict[str, Any]]:
    """One row per evaluation and position bucket: protocol, length, factor, the bucket's first and last
    position, its centre, tokens and mean NLL."""
    trained = train_length(run)
    rows = []
    for (protocol, length), loss in position_losses(run).items():
        for lo, hi, n, nll in zip(loss.edges[:-1], loss.edges[1:], loss.tokens, loss.mean_nll):
            rows.append({"protocol": protocol, "length": length,
                         "factor": length / trained if trained else None, "train_length": trained,
                         "position_start": lo, "position_end": hi - 1, "position": centre(lo, hi), "tokens": n,
                         "nll": nll})
    return rows


def probe_rows(run: Any) -> list[dict[str, Any]]:
    """One row per probe step and evaluation length of the length probe: step, factor, nll."""
    rows = []
    for point in run.probe_history:
        if not (isinstance(point, (list, tuple)) and len(point) >= 2 and isinstance(point[1], dict)):
            continue
        for name, value in point[1].items():
            if is_length_loss(str(name)) and isinstance(value, (int, float)):
                rows.append({"step": int(point[0]), "factor": factor_of(str(name)), "nll": float(value)})
    return rows


def centre(lo: int, hi: int) -> float:
    """Where a bucket of positions ``lo .. hi - 1`` sits on a log axis: the geometric mean of its ends (its one
    position for a bucket of one; position 0 drawn at 0.5)."""
    return math.sqrt(max(lo, 0.5) * max(hi - 1, 0.5))


@dataclass
class PooledCurve:
    """A row's curve over its seeds: x, the mean and the 95% interval (None with one seed) at each x."""

    x: list[float]
    mean: list[float]
    low: list[float] | None
    high: list[float] | None
    seeds: int


def pool(series: list[dict[float, float]]) -> PooledCurve | None:
    """The seeds' ``{x: value}`` pooled at the x they all have."""
    series = [s for s in series if s]
    if not series:
        return None
    xs = sorted(set.intersection(*(set(s) for s in series)))
    if not xs:
        return None
    means, lows, highs = [], [], []
    for x in xs:
        values = [s[x] for s in series if math.isfinite(s[x])]
        interval = seed_interval(values) if len(values) >= 2 else None
        means.append(sum(values) / len(values) if values else math.nan)
        lows.append(interval.low if interval is not None and interval.half_width is not None else math.nan)
        highs.append(interval.high if interval is not None and interval.half_width is not None else math.nan)
    several = len(series) >= 2
    return PooledCurve(xs, means, lows if several else None, highs if several else None, len(series))


def longest_evaluations(runs: list[Any]) -> dict[str, int]:
    """Per protocol, the longest evaluation length every one of ``runs`` recorded by position."""
    shared: dict[str, set[int]] | None = None
    for run in runs:
        mine: dict[str, set[int]] = {}
        for protocol, length in position_losses(run):
            mine.setdefault(protocol, set()).add(length)
        shared = mine if shared is None else {p: shared[p] & mine[p] for p in shared if p in mine}
    return {p: max(lengths) for p, lengths in (shared or {}).items() if lengths}


def position_curve(runs: list[Any], protocol: str, length: int) -> PooledCurve | None:
    """The loss by position of one row (its seeds' runs) at one evaluation, pooled over the seeds."""
    series = []
    for run in runs:
        loss = position_losses(run).get((protocol, length))
        if loss is not None:
            series.append({centre(lo, hi): v for lo, hi, v in zip(loss.edges[:-1], loss.edges[1:], loss.mean_nll)
                           if v is not None})
    return pool(series)


def probe_curves(runs: list[Any]) -> dict[float, PooledCurve]:
    """The held-out loss against the step at each length factor, pooled over the row's seeds."""
    by_factor: dict[float, list[dict[float, float]]] = {}
    for run in runs:
        mine: dict[float, dict[float, float]] = {}
        for row in probe_rows(run):
            mine.setdefault(row["factor"], {})[float(row["step"])] = row["nll"]
        for factor, series in mine.items():
            by_factor.setdefault(factor, []).append(series)
    out = {}
    for factor in sorted(by_factor):
        curve = pool(by_factor[factor])
        if curve is not None:
            out[factor] = curve
    return out
