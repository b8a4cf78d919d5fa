"""What ``posbench analyze`` recorded for the runs of a row (``analysis.json`` beside each run's result), pooled
over the row's seeds for the figures and for ``posbench.results.attention_frame``.

A row's distance profile at one length is each seed's attention mass per key at each distance bucket (the
bucket's mass over its number of distances), averaged over every layer and head, then pooled over seeds (the mean,
the 95% interval). A row's head map of a statistic at one length is the mean over its seeds, layer by head.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from posbench.analysis.record import STATS, read
from posbench.report.by_position import PooledCurve, centre, pool


def analyses(runs: list[Any]) -> list[dict[str, Any]]:
    """The analysis records of ``runs`` (those that have one)."""
    found = [read(run.path) for run in runs if getattr(run, "path", None) is not None]
    return [a for a in found if a is not None]


def by_factor(analysis: dict[str, Any]) -> dict[float, dict[str, Any]]:
    out = {}
    for entry in analysis.get("lengths") or []:
        if isinstance(entry, dict) and isinstance(entry.get("factor"), (int, float)):
            out[float(entry["factor"])] = entry
    return out


def shared_factors(rows: list[list[dict[str, Any]]]) -> list[float]:
    """The length factors every analysed run of every row has."""
    sets = [set(by_factor(a)) for found in rows for a in found]
    return sorted(set.intersection(*sets)) if sets else []


def distance_profile(found: list[dict[str, Any]], factor: float) -> PooledCurve | None:
    series = []
    for analysis in found:
        entry = by_factor(analysis).get(factor)
        if entry is None or not entry.get("mass"):
            continue
        edges = entry["edges"]
        mass = np.array(entry["mass"], dtype=float)                   # [layers, heads, buckets]
        per_key = mass.mean(axis=(0, 1)) / np.diff(edges)
        series.append({centre(lo, hi): float(v) for lo, hi, v in zip(edges[:-1], edges[1:], per_key)})
    return pool(series)


def head_map(found: list[dict[str, Any]], factor: float, stat: str) -> np.ndarray | None:
    """The mean over seeds of ``stat`` per layer and head ``[layers, heads]`` (NaN where a value is None)."""
    maps = []
    for analysis in found:
        entry = by_factor(analysis).get(factor)
        if entry is None or stat not in entry:
            continue
        values = np.array([[np.nan if v is None else float(v) for v in layer] for layer in entry[stat]], dtype=float)
        maps.append(values)
    shapes = {m.shape for m in maps}
    if not maps or len(shapes) != 1:
        return None
    with np.errstate(invalid="ignore"):
        return np.nanmean(np.stack(maps), axis=0) if np.isfinite(np.stack(maps)).any() else None


def attention_rows(run: Any) -> list[dict[str, Any]]:
    """One row per length, layer and head of a run's analysis: factor, length, pass, layer, head and each
    statistic (``STATS``)."""
    analysis = read(run.path) if getattr(run, "path", None) is not None else None
    if analysis is None:
        return []
    layers = analysis.get("layers") or []
    rows = []
    for entry in analysis.get("lengths") or []:
        for call, values in enumerate(entry.get("rigidity") or []):
            where = layers[call] if call < len(layers) else {"pass": 0, "layer": call}
            for head in range(len(values)):
                rows.append({"factor": entry["factor"], "length": entry["length"], "pass": where["pass"],
                             "layer": where["layer"], "head": head,
                             **{stat: entry[stat][call][head] for stat in STATS}})
    return rows
