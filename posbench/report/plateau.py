"""Had a run stopped improving when its training ended? The rule a study states for every cell, from the logged
training loss (the in-distribution metric: every step's batch is a fresh draw of the training distribution).

The last ``WINDOW`` (10%) of the logged steps against the 10% before them: the run **stopped improving** when the
mean loss of the last window is less than ``max(REL x the earlier mean, ABS)`` below the earlier window's mean
(1% of the loss, or 0.01 nats for a loss already near zero, as a passkey loss on the answer becomes once the key
is copied). A run whose loss still fell faster than that was still learning when its budget ended. The windows
are means over hundreds of batches, so a single noisy batch does not decide it. The schedule's decay of the
learning rate to its floor flattens every curve near the end; the rule says what the budget reached, not what a
longer schedule would.

A run with a **probe** (``train.probe_every``; the arithmetic task's in-distribution accuracy in %, measured
during training) is judged on the probe instead, the metric its table reports: the mean of the last
``PROBE_WINDOW`` (20%) of its probes against the 20% before them; it **stopped improving** when the gain is
less than ``PROBE_GAIN`` (1 percentage point), or when the last window's mean is at least ``CEILING`` (99%, where
no room is left to improve). Windows of 20% of 20 probes are 4 probes (4,000 examples at 1,000 per probe): the
standard error of a window's mean is under 0.8 points, so a single lucky probe does not decide it. The length
probe of the language-model tasks (``posbench.evaluation.length_probe``: held-out losses, not percentages) is not
such a probe: those runs are judged on their training loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from posbench.evaluation.probe_names import is_length_loss

WINDOW, REL, ABS = 0.1, 0.01, 0.01
PROBE_WINDOW, PROBE_GAIN, CEILING, MIN_PROBES = 0.2, 1.0, 99.0, 10


@dataclass(frozen=True)
class Plateau:
    steps: int              # the last logged step
    earlier: float          # mean loss of the window before the last
    last: float             # mean loss of the last window
    stopped: bool
    diverged: bool = False  # a non-finite loss in either window: no verdict on learning

    @property
    def drop(self) -> float:
        return self.earlier - self.last


def plateau(history: list[tuple[int, float]] | list[list[Any]]) -> Plateau | None:
    """The rule of the module docstring over a loss history ``[(step, loss), ...]``; None for fewer than 20
    logged steps (two windows of at least two points each)."""
    points = [(int(step), float(loss)) for step, loss in history]
    if len(points) < 20:
        return None
    mean_earlier, mean_last = window_means([loss for _, loss in points], WINDOW)
    if not (math.isfinite(mean_last) and math.isfinite(mean_earlier)):
        return Plateau(points[-1][0], mean_earlier, mean_last, False, diverged=True)
    return Plateau(points[-1][0], mean_earlier, mean_last,
                   mean_earlier - mean_last < max(REL * mean_earlier, ABS))


def window_means(values: list[float], share: float) -> tuple[float, float]:
    """The means of the window before the last and of the last window, each ``share`` of the values (at least 2)."""
    width = max(2, int(round(share * len(values))))
    last, earlier = values[-width:], values[-2 * width:-width]
    return sum(earlier) / len(earlier), sum(last) / len(last)


def probe_plateau(history: list[list[Any]], name: str) -> Plateau | None:
    """The probe rule of the module docstring over ``[(step, {name: value, ...}), ...]`` for the probe's
    ``name``; ``earlier``/``last`` are the windows' means and ``drop`` (earlier - last) is minus the gain. None
    for fewer than ``MIN_PROBES`` probes."""
    points = [(int(step), float(values[name])) for step, values in history if name in values]
    if len(points) < MIN_PROBES:
        return None
    mean_earlier, mean_last = window_means([v for _, v in points], PROBE_WINDOW)
    return Plateau(points[-1][0], mean_earlier, mean_last,
                   mean_last - mean_earlier < PROBE_GAIN or mean_last >= CEILING)


def probe_name(record: dict[str, Any]) -> str | None:
    """The first percentage the run's probe recorded (``accuracy_id`` for arithmetic), or None without such a
    probe (none, or the length probe's held-out losses)."""
    return percentage_probe((record.get("training") or {}).get("probe_history") or [])


def percentage_probe(history: list[Any]) -> str | None:
    """The first value of the first probe that is not a held-out loss of the length probe, or None."""
    if not history or not isinstance(history[0], (list, tuple)) or len(history[0]) < 2 \
            or not isinstance(history[0][1], dict):
        return None
    return next((name for name in history[0][1] if not is_length_loss(str(name))), None)


def probe_plateau_table(records: dict[str, dict[str, Any]]) -> str:
    """A markdown table, one row per cell that has a probe: the two windows' means of the probe, the gain and
    the verdict."""
    lines = ["| cell | probe | steps | probes | earlier 20% | last 20% | gain | stopped improving |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for cell, record in records.items():
        name = probe_name(record)
        if name is None:
            continue
        history = record["training"]["probe_history"]
        found = probe_plateau(history, name)
        if found is None:
            lines.append(f"| {cell} | {name} | - | {len(history)} | - | - | - | too few probes |")
            continue
        verdict = "yes" if found.stopped else "**no**"
        lines.append(f"| {cell} | {name} | {found.steps} | {len(history)} | {found.earlier:.1f} | {found.last:.1f} | "
                     f"{0.0 - found.drop:+.1f} | {verdict} |")
    return "\n".join(lines) + "\n"


def plateau_table(records: dict[str, dict[str, Any]]) -> str:
    """A markdown table, one row per cell (its name -> its result.json), in the cells' order: the two windows'
    mean losses, the drop and the verdict."""
    lines = ["| cell | steps | loss, earlier 10% | loss, last 10% | drop | stopped improving |",
             "|---|---:|---:|---:|---:|---|"]
    for cell, record in records.items():
        found = plateau((record.get("training") or {}).get("loss_history") or [])
        if found is None:
            lines.append(f"| {cell} | - | - | - | - | too few logged steps |")
            continue
        verdict = "diverged (a non-finite loss)" if found.diverged else ("yes" if found.stopped else "**no**")
        lines.append(f"| {cell} | {found.steps} | {found.earlier:.4f} | {found.last:.4f} | {found.drop:+.4f} | "
                     f"{verdict} |")
    return "\n".join(lines) + "\n"


def still_improving(training: dict[str, Any]) -> bool:
    """Whether a run had not stopped improving when its training ended, by the rule of the module docstring (the
    probe's when the run has one, else the training loss's); False where the rule cannot say (too few logged steps
    or probes, no training, a diverged loss)."""
    history = training.get("probe_history") or []
    name = percentage_probe(history)
    try:
        found = probe_plateau(history, name) if name else plateau(training.get("loss_history") or [])
    except (TypeError, ValueError, IndexError, KeyError):        # a history not in the shape posbench writes
        return False
    return found is not None and not found.stopped and not found.diverged
