"""``posbench compare``: read a tree of runs and report it.

* ``tables``: one table per task; rows pool the runs that differ only in their seed (mean and 95% interval
  over seeds; ``grouping`` says which settings count), or one row per run; ``bench`` renders a ``posbench
  bench`` run as an efficiency table; ``models`` gives one row per evaluated model (``--by-model``).
* ``paired``: ``--against NAME``, every row's difference to NAME's, paired by seed and by example
  (the statistics are in ``posbench.stats``).
* ``formats`` (markdown, csv, latex, json), ``terminal`` (rich tables that fit the width), ``figures``
  (matplotlib PNGs), ``html`` (one self-contained file).
"""

from posbench.report.formats import FORMATS, fmt_cell, fmt_value, header, render_text
from posbench.report.structure import Cell, DifferenceRow, Report, Row, TaskTable
from posbench.report.collect import collect, collect_models
from posbench.report.tables import build_table


def __getattr__(name: str):
    """``plot`` (``figures.plot``), imported when first asked for: the figures need matplotlib."""
    if name == "plot":
        from posbench.report.figures import plot  # matplotlib: only where figures are drawn
        return plot
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FORMATS", "Cell", "DifferenceRow", "Report", "Row", "TaskTable", "build_table", "collect", "collect_models",
           "fmt_cell", "fmt_value", "header", "plot", "render_text"]
