"""What every figure of a report shares: the pyplot backend, each series' colour, line and marker, the axes and
legend for a number of series, wrapped titles and labels. It imports matplotlib: so do the modules that draw
(``figures``, ``break_figures``, ``html``), which ``posbench compare`` imports only to draw (``--plots``, ``--html``)."""

from __future__ import annotations

import textwrap
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
from matplotlib import ticker


def legend_label(label: str) -> str:
    """A series' label as its legend shows it: matplotlib leaves out every label that starts with '_'."""
    return " " + label if label.startswith("_") else label


def pyplot():
    """``matplotlib.pyplot``, drawing with the Agg backend (PNG, no window)."""
    matplotlib.use("Agg")
    return plt


LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D")


def series_style(i: int) -> dict[str, Any]:
    """The i-th series' colour, line and marker: matplotlib's ten colours, then the same ten with another line
    and marker, so that no two of up to 40 series look alike (with the default cycle the 11th is the 1st)."""
    return {"color": f"C{i % 10}", "linestyle": LINE_STYLES[(i // 10) % 4], "marker": MARKERS[(i // 10) % 4]}


FEW_SERIES = 6                  # up to this many: the legend inside the axes, bands at full shade
SHORT_LABEL = 24                # longer labels (extensions: "llama+tape (seed 0, ...)") go beside the axes
LABEL_WIDTH = 32                # a legend label wraps at this many characters
TITLE_WIDTH = 56                # a title wraps at this many characters (about the axes' width)


def series_axes(n_series: int) -> tuple[Any, Any, float]:
    """A figure for ``n_series`` curves, its axes and the bands' alpha (wider and lighter for many)."""
    few = n_series <= FEW_SERIES
    fig, ax = pyplot().subplots(figsize=(6 if few else 7.5, 4), constrained_layout=True)
    return fig, ax, 0.2 if few else 0.08


def wrapped(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width, break_on_hyphens=False)) or text


def place_legend(ax, n_series: int) -> None:
    """Inside the axes for a few short labels; beside them (outside: the layout makes room, so nothing covers the
    curves or the y label, and nothing is cut) for many series or long labels, each label wrapped."""
    handles, labels = ax.get_legend_handles_labels()
    if n_series <= FEW_SERIES and all(len(label) <= SHORT_LABEL for label in labels):
        ax.legend(fontsize=8)
        return
    width, height = ax.figure.get_size_inches()
    ax.figure.set_size_inches(width + 2.5, height)              # the legend's room: the axes keep theirs
    ax.figure.legend(handles, [wrapped(label, LABEL_WIDTH) for label in labels], fontsize=7,
                     loc="outside right upper")


def log2_axis(ax, which: str = "x", base: int = 2) -> None:
    """A log axis (base 2 by default) whose ticks read as plain numbers (64, 128, 256; 0.001): the figures draw
    text without mathtext, which would show matplotlib's default ``2^{6}`` labels as their source."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=base)
    axis.set_major_locator(ticker.LogLocator(base=base))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(ticker.NullFormatter())
