"""Had a run stopped improving when its training ended? The rule a study states for every cell, from the logged
training loss (the in-distribution metric: every step's batch is a fresh draw of the training distribution).

The last ``WINDOW`` (10%) of the logged steps against the 10% before them: the run **stopped improving** when the
mean loss of the last window is less than ``max(REL x the earlier mean, ABS)`` below the earlier window's mean
(1% of the loss, or 0.01 nats for a loss already near zero, as a passkey loss on the answer becomes once the key
is copied). A run whose loss still fell faster than that was still learning when its budget ended. The windows
are means over hundreds of batches, so a single noisy batch does not decide it. The schedule's decay of the
learning rate to its floor flattens every curve near the end; the rule says what the budget reached, not what a
longer schedule would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

WINDOW, REL, ABS = 0.1, 0.01, 0.01


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
    width = max(2, int(round(WINDOW * len(points))))
    last = [loss for _, loss in points[-width:]]
    earlier = [loss for _, loss in points[-2 * width:-width]]
    mean_last, mean_earlier = sum(last) / len(last), sum(earlier) / len(earlier)
    if not (math.isfinite(mean_last) and math.isfinite(mean_earlier)):
        return Plateau(points[-1][0], mean_earlier, mean_last, False, diverged=True)
    return Plateau(points[-1][0], mean_earlier, mean_last,
                   mean_earlier - mean_last < max(REL * mean_earlier, ABS))


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
