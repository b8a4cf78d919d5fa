"""Which cells of a column are marked best: the best value, and every value that is not significantly different
from it, so that a table never singles out one of several rows whose intervals say they are alike.

A cell's value is a mean over seeds (2 or more: its variance is s^2 / k with k - 1 degrees of freedom) or one
run's value (with the evaluation's standard error: its square, with infinite degrees of freedom). Another cell
is tied with the best when the two-sided Welch t-test of their difference, t = (x - x_best) / sqrt(v + v_best)
with Welch-Satterthwaite's degrees of freedom, gives p >= 0.05 (``ALPHA``), or when the values are equal. A
cell with neither seeds nor a standard error cannot be tested: it is marked only when it equals the best.
"""

from __future__ import annotations

import math

from posbench.report.structure import Cell, Row
from posbench.stats import seed_interval, t_two_sided_p

ALPHA = 0.05
RULE = ("bold: the best value and every value not significantly different from it (two-sided Welch t-test "
        "over seeds, or over the runs' standard errors, p >= 0.05)")


def variance(cell: Cell) -> tuple[float, float] | None:
    """(the variance of the cell's value, its degrees of freedom), or None when nothing says it."""
    if cell.seeds >= 2 and len(cell.values) >= 2:
        interval = seed_interval(cell.values)
        if interval is not None and interval.sd is not None:
            return interval.sd ** 2 / interval.n, float(interval.n - 1)
    if cell.seeds < 2 and cell.stderr is not None and math.isfinite(cell.stderr):
        return cell.stderr ** 2, math.inf
    return None


def tied(best: Cell, other: Cell) -> bool:
    """``other`` is not significantly different from ``best`` (p >= ALPHA), or equal to it."""
    if other.value == best.value:
        return True
    a, b = variance(best), variance(other)
    if a is None or b is None or a[0] + b[0] <= 0:
        return False
    total = a[0] + b[0]
    spread = sum(v * v / df for v, df in (a, b) if math.isfinite(df) and df > 0)
    df = total * total / spread if spread > 0 else math.inf
    t = (other.value - best.value) / math.sqrt(total)
    return t_two_sided_p(t, max(df, 1.0)) >= ALPHA


def mark_best(rows: list[Row], columns: list[str], hib: dict[str, bool | None]) -> bool:
    """Mark each column's best cell and the cells tied with it (none in a column whose direction is not known:
    ``hib`` None); True when some column had a cell that could be tested against the best (the rule then goes
    under the table)."""
    tested = False
    for name in columns:
        cells = [r.cells[name] for r in rows if r.cells[name].value is not None]
        if not cells or hib.get(name) is None:
            continue
        best = max(cells, key=lambda c: c.value) if hib[name] else min(cells, key=lambda c: c.value)
        for cell in cells:
            cell.best = tied(best, cell)
        tested = tested or (variance(best) is not None and
                            any(c is not best and variance(c) is not None for c in cells))
    return tested
