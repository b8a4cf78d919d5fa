"""``posbench compare``: read a tree of runs and report it.

* ``tables``: one table per task; rows pool the runs that differ only in their seed (mean and 95% interval
  over seeds; ``grouping`` says which settings count), or one row per run; ``bench`` renders a ``posbench
  bench`` run as an efficiency table; ``models`` gives one row per evaluated model (``--by-model``).
* ``paired``: ``--against NAME``, every row's difference to NAME's, paired by seed and by example
  (the statistics are in ``posbench.stats``).
* ``formats`` (markdown, csv, latex, json), ``terminal`` (rich tables that fit the width), ``figures``
  (matplotlib PNGs), ``html`` (one self-contained file).
"""

from posbench.report.figures import plot
from posbench.report.formats import FORMATS, fmt_cell, fmt_value, header, render_text
from posbench.report.structure import Cell, DifferenceRow, Report, Row, TaskTable
from posbench.report.collect import collect
from posbench.report.tables import build_table

__all__ = ["FORMATS", "Cell", "DifferenceRow", "Report", "Row", "TaskTable", "build_table", "collect", "fmt_cell",
           "fmt_value", "header", "plot", "render_text"]
