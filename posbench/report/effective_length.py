"""Effective length: how far past its training length a run's metric holds, in multiples of the training length.

Every task with lengths records its metric over a length axis (a grid whose ``meta.train_max`` bounds the
``length`` axis, or the arithmetic task's two operand lengths); from it, for each run:

* **perplexity** (lower is better): the reference is the value at the training length (1x); a length *holds*
  when its perplexity is at most ``(1 + eps)`` times the reference. ``eps`` = ``EPS`` (0.1) by default: a tenth
  more perplexity is more than the seed spread of a converged CPU-study cell (about 1-6% of its value at 1x) and
  less than what RoPE loses at 2x, so the length at which it is crossed is the encoding's, not its seed's.
* **accuracy** (passkey, ruler, arithmetic; higher is better): the reference is the in-distribution accuracy
  (the mean over lengths up to the training length; arithmetic: every cell whose longer operand is at most the
  trained digits); a length holds when its accuracy is at least ``tau`` times the reference, ``tau`` = ``TAU``
  (0.9) by default: a tenth lost, a relative threshold as for perplexity, so that a small model is judged against
  itself. A run whose in-distribution accuracy is 0 has no relative effective length (nothing to hold: every
  length would hold against 0, and a run that fails everywhere would rank longest). ``eff_len_abs`` applies an
  absolute threshold instead, ``ABSOLUTE`` (85.6%: RULER's, the score of Llama-2-7B at 4K tokens, which RULER's
  README takes as the bar), for comparison with RULER's tables.

The effective length is the longest evaluated length ``L`` such that **every** evaluated length from the
training length up to ``L`` holds (the metric *stays* within the tolerance), divided by the training length:
1.0 where the first length beyond training already fails; the longest evaluated factor where none fails (a
lower bound then: the runs were not evaluated further, which compare's note says). The absolute threshold also
judges the lengths within training: where the in-distribution accuracy is below it, ``eff_len_abs`` is 0.

``compare`` adds these as metrics of every such run (``eff_len``; perplexity runs with both protocols also
``eff_len_sliding``; accuracy tasks also ``eff_len_abs``), so its table shows them with their seed interval and
``--against`` pairs them across seeds; ``--eff eps=0.2,tau=0.8,abs=50`` changes the tolerances.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from posbench.evaluation.metrics import METRICS, register_metric
from posbench.evaluation.outcome import Metric
from posbench.options import OptionError
from posbench.report.by_length import bounded_grid, by_longer_axis
from posbench.report.structure import grid_values

EPS, TAU, ABSOLUTE = 0.1, 0.9, 85.6
LENGTH_TASKS = ("perplexity", "passkey", "ruler", "arithmetic")

#: the metrics this module adds, each with its description (every length task: eff_len; perplexity: eff_len_sliding;
#: the accuracy tasks: eff_len_abs)
DECLARED = {
    "eff_len": "the longest evaluated length (x the training length) up to which the metric stays within the "
               "tolerance of its trained-length value",
    "eff_len_sliding": "eff_len of the sliding-window perplexity",
    "eff_len_abs": "eff_len against RULER's absolute threshold (85.6%) instead",
}
for _task in LENGTH_TASKS:
    for _name in ("eff_len", "eff_len_sliding" if _task == "perplexity" else "eff_len_abs"):
        register_metric(_task, _name, better="higher", description=DECLARED[_name])


@dataclass(frozen=True)
class Tolerance:
    eps: float = EPS              # perplexity: at most (1 + eps) x its 1x value
    tau: float = TAU              # accuracy: at least tau x its in-distribution value
    absolute: float = ABSOLUTE    # accuracy: at least this many percent


@dataclass(frozen=True)
class LengthCurve:
    """A run's metric against length: ``lengths`` in tokens (or digits), their ``values``, the ``trained``
    length, which way is better, and the reference (the trained-length or in-distribution value)."""

    lengths: list[float]
    values: list[float]
    trained: float
    higher_is_better: bool
    reference: float


def curves(run: Any) -> dict[str, LengthCurve]:
    """The run's length curves by the metric name each one's effective length takes (``eff_len``, ...)."""
    if run.task == "perplexity":
        out = {}
        for protocol, name in (("chunks", "eff_len"), ("sliding", "eff_len_sliding")):
            grid = _grid_dict(run.grids.get(f"ppl_{protocol}"))
            curve = _one_axis(grid, higher_is_better=False) if grid is not None else None
            if curve is not None:
                out[name] = curve
        if "eff_len" not in out and "eff_len_sliding" in out:     # sliding only: it is the run's curve
            out["eff_len"] = out.pop("eff_len_sliding")
        return out
    if run.task == "arithmetic":
        found = bounded_grid(run)
        return {"eff_len": _operand_lengths(found[1])} if found is not None else {}
    if run.task in ("passkey", "ruler"):
        curve = _mean_over_length_grids(run)
        return {"eff_len": curve} if curve is not None else {}
    return {}


def effective(curve: LengthCurve, tolerance: Tolerance, absolute: bool = False) -> float | None:
    """The effective length of the module docstring, in multiples of the trained length (None: no reference, or
    an accuracy of 0 to hold)."""
    if not (math.isfinite(curve.reference) and curve.trained > 0):
        return None
    if curve.higher_is_better and curve.reference <= 0 and not absolute:     # an accuracy of 0: nothing to hold
        return None
    if absolute:
        holds = [v >= tolerance.absolute for v in curve.values]
        considered = list(zip(curve.lengths, holds))
        best = 0.0
    else:
        bound = (tolerance.tau * curve.reference if curve.higher_is_better
                 else (1 + tolerance.eps) * curve.reference)
        considered = [(length, (v >= bound) if curve.higher_is_better else (v <= bound))
                      for length, v in zip(curve.lengths, curve.values) if length > curve.trained]
        best = 1.0
    for length, ok in sorted(considered):
        if not ok:
            break
        best = max(best, length / curve.trained)
    return best


def with_effective_lengths(run: Any, tolerance: Tolerance = Tolerance()) -> Any:
    """The run with its effective lengths added to its metrics (a copy; a run without lengths is returned as is)."""
    found = curves(run)
    if not found:
        return run
    added: dict[str, Metric] = {}
    for name, curve in found.items():
        value = effective(curve, tolerance)
        if value is not None:
            added[name] = Metric(value, None, None, True)
        if name == "eff_len" and curve.higher_is_better:
            value = effective(curve, tolerance, absolute=True)
            if value is not None:
                added["eff_len_abs"] = Metric(value, None, None, True)
    return dataclasses.replace(run, metrics={**run.metrics, **added}) if added else run


def effective_notes(runs: list[Any], tolerance: Tolerance) -> dict[str, str]:
    """task -> the line under its table on its eff_len columns (``effective_note``), for each task a run of which
    has an eff_len (benchmark runs aside: they make no task's table)."""
    runs = [run for run in runs if run.bench is None]
    measured = sorted({str(run.task) for run in runs if "eff_len" in run.metrics})
    return {task: effective_note(tolerance, capped([run for run in runs if str(run.task) == task]))
            for task in measured}


def capped(runs: list[Any]) -> bool:
    """Whether some run's effective length is its longest evaluated length (a lower bound, not a measurement)."""
    for run in runs:
        for name, curve in curves(run).items():
            value = run.metrics.get(name)
            if value is not None and value.value is not None and curve.lengths and \
                    value.value >= max(curve.lengths) / curve.trained:
                return True
    return False


def parse_tolerance(text: str | None) -> Tolerance:
    """``--eff``'s text (``eps=0.2,tau=0.8,abs=50``, any of them) as a ``Tolerance``; one line for anything else."""
    if not text:
        return Tolerance()
    ranges = {"eps": (0.0, math.inf), "tau": (0.0, 1.0), "abs": (0.0, 100.0)}
    given: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in ranges:
            raise OptionError(f"--eff {text!r}: expected eps=, tau= or abs= with a number, comma-separated")
        try:
            number = float(value)
        except ValueError:
            raise OptionError(f"--eff {key}={value.strip()!r}: expected a number") from None
        low, high = ranges[key]
        if not low <= number <= high or number != number:
            raise OptionError(f"--eff {key}={value.strip()}: must be between {low:g} and {high:g}")
        given[key] = number
    return Tolerance(given.get("eps", EPS), given.get("tau", TAU), given.get("abs", ABSOLUTE))


def effective_note(tolerance: Tolerance, lower_bound: bool) -> str:
    """The table's note on its eff_len columns."""
    return (f"eff_len: the longest evaluated length, x the training length, up to which the metric stays within "
            f"{1 + tolerance.eps:g} x (perplexity) or {tolerance.tau:g} x (accuracy) of its trained-length value"
            f" (eff_len_abs: accuracy >= {tolerance.absolute:g}%)" +
            ("; where a run held at every evaluated length, its value is that length: a lower bound"
             if lower_bound else ""))


# ---- reading the curves ------------------------------------------------------------------------------------

def _grid_dict(grid: Any) -> dict[str, Any] | None:
    if grid is None:
        return None
    data = grid.to_dict() if hasattr(grid, "to_dict") else grid
    axes = data.get("axes") if isinstance(data, dict) else None
    if not axes or not isinstance(axes[0], dict) or axes[0].get("name") != "length":
        return None
    trained = ((data.get("meta") or {}).get("train_max") or {}).get("length")
    return data if isinstance(trained, (int, float)) and not isinstance(trained, bool) and trained > 0 else None


def _one_axis(grid: dict[str, Any], higher_is_better: bool) -> LengthCurve | None:
    values = grid_values(grid)
    if values is None or values.ndim != 1:
        return None
    lengths = [float(x) for x in grid["axes"][0]["values"]]
    trained = float(grid["meta"]["train_max"]["length"])
    return _curve(lengths, [float(v) for v in values], trained, higher_is_better)


def _curve(lengths: list[float], values: list[float], trained: float, higher_is_better: bool
           ) -> LengthCurve | None:
    points = [(length, v) for length, v in zip(lengths, values) if math.isfinite(v)]
    inside = [v for length, v in points if length <= trained]
    if not inside:
        return None
    if higher_is_better:
        reference = float(np.mean(inside))
    else:                                   # the value at the longest length within training: the 1x value
        reference = max((length, v) for length, v in points if length <= trained)[1]
    return LengthCurve([p[0] for p in points], [p[1] for p in points], trained, higher_is_better, reference)


def _mean_over_length_grids(run: Any) -> LengthCurve | None:
    """Passkey and ruler: the accuracy at each length, the mean over every grid's depths (and ruler's kinds)."""
    per_length: dict[float, list[float]] = {}
    trained = None
    for grid in run.grids.values():
        data = _grid_dict(grid)
        values = grid_values(data) if data is not None else None
        if values is None:
            continue
        trained = float(data["meta"]["train_max"]["length"])
        rows = values if values.ndim == 2 else values[:, None]
        for length, row in zip(data["axes"][0]["values"], rows):
            per_length.setdefault(float(length), []).extend(float(v) for v in row if np.isfinite(v))
    if trained is None:
        return None
    lengths = sorted(k for k, v in per_length.items() if v)
    higher = METRICS.higher_is_better(str(run.task), "accuracy", True)
    return _curve(lengths, [float(np.mean(per_length[k])) for k in lengths], trained, higher)


def _operand_lengths(grid: dict[str, Any]) -> LengthCurve | None:
    """Arithmetic: the accuracy at each longer-operand length, the in-distribution cells pooled at the trained
    length: ``posbench.report.by_length``'s columns (``<= T``, then each longer length)."""
    trained = float(grid["meta"]["train_max"][grid["axes"][0]["name"]])
    columns = by_longer_axis(grid)
    lengths = [trained if label.startswith("<=") else float(label) for label in columns]
    return _curve(lengths, list(columns.values()), trained, True)
