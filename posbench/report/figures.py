"""Figures of a report (matplotlib, PNG), one row of a table = one encoding, its seeds pooled:

* ``<task>_<grid>.png``: a 2-axis grid (arithmetic accuracy, passkey length x depth) as heatmaps, four to a
  line, on one colour scale, each the mean over the row's seeds, the training region outlined; a 1-axis grid
  (perplexity against length) as one curve per row, the mean over seeds with its 95% interval shaded (with
  one seed: the curve alone), the training length marked.
* ``<task>_loss.png``: the training loss of every row on one plot (mean over seeds, 95% interval shaded).
* ``<task>_probe_<name>.png``: likewise for a probe measured during training (``train.probe_every``; the
  arithmetic task's in-distribution accuracy), for the rows whose runs have one.

Every shaded interval is cut to the values the quantity can take (a loss never below zero, an accuracy in %
within 0-100).
* ``bench_<mode>_<run-id>.png``: a ``posbench bench`` run's time per step (or token) as bars per length and
  encoding, and its peak memory; a cell that ran out of memory is marked OOM.
"""

from __future__ import annotations

import io
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.patches import Rectangle

from posbench.evaluation.probe_names import is_length_loss
from posbench.files import atomic_save
from posbench.report.bench import bench_lengths
from posbench.report.break_figures import break_figures
from posbench.report.figure_style import (FEW_SERIES, LABEL_WIDTH, SHORT_LABEL, TITLE_WIDTH, legend_label,  # noqa: F401
                                          log2_axis, place_legend, pyplot, series_axes, series_style, wrapped)
from posbench.report.structure import Report, Row, TaskTable, grid_values
from posbench.runs.record import ResultError
from posbench.stats import seed_interval

DPI = 110
HEATMAPS_PER_ROW = 4        # then they wrap: twelve encodings in one row made a figure 12 times wider than tall


#: every text of a figure is drawn as the characters it holds: a name from a result.json (an encoding called
#: "$x^2$" or "$\\foo{$", a metric "a_b", "50%") is never parsed as mathtext or TeX, which drew it as something
#: else or failed with a traceback and no figure
PLAIN_TEXT = {"text.parse_math": False, "text.usetex": False}


def plain_text():
    """A context in which the figures are made and saved (tick labels are made when a figure is drawn)."""
    return matplotlib.rc_context(PLAIN_TEXT)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def figures(report: Report) -> Iterator[tuple[str, Any]]:
    """``(file stem, matplotlib figure)`` for every figure of the report; the caller closes them."""
    for table in report.tables:
        yield from table_figures(table)


def table_figures(table: TaskTable) -> list[tuple[str, Any]]:
    """``(file stem, matplotlib figure)`` for every figure of one table, made with ``PLAIN_TEXT``; save them
    with it too (``plot``, ``png_bytes``)."""
    pyplot()
    with plain_text():
        return list(_table_figures(table))


def _table_figures(table: TaskTable) -> Iterator[tuple[str, Any]]:
    if table.kind == "bench":
        fig = bench_figure(table)
        if fig is not None:
            run = table.runs[0]
            mode = run.config.task_options.get("mode", "run")
            yield f"bench_{_safe(str(mode))}_{_safe(str(run.run_id))}", fig
        return
    if table.kind != "metrics":
        return
    for name, items in grids_by_name(table).items():
        dims = len(items[0][1]["axes"])
        if dims == 2:
            yield f"{_safe(table.task)}_{_safe(name)}", heatmaps(table.task, name, items)
        elif dims == 1:
            yield f"{_safe(table.task)}_{_safe(name)}", curves(table.task, name, items)
    fig = loss_curves(table)
    if fig is not None:
        yield f"{_safe(table.task)}_loss", fig
    for name in probe_names(table):
        fig = probe_curves(table, name)
        if fig is not None:
            yield f"{_safe(table.task)}_probe_{_safe(name)}", fig
    for suffix, fig in break_figures(table):
        yield f"{_safe(table.task)}_{suffix}", fig


def plot(report: Report, out_dir: Path | str, *, force: bool = False) -> list[Path]:
    """Write every figure as PNG into ``out_dir``; returns the files written. A file already there is a one-line
    error before anything is written, unless ``force`` (then it is replaced)."""
    plt = pyplot()
    out_dir = Path(out_dir)
    made = [(out_dir / f"{stem}.png", fig) for stem, fig in figures(report)]
    taken = [path for path, _ in made if path.exists()]
    if (taken and not force) or (out_dir.exists() and not out_dir.is_dir()):
        for _, fig in made:
            plt.close(fig)
        if out_dir.exists() and not out_dir.is_dir():
            raise ResultError(f"--plots {out_dir} is a file, not a directory")
        raise ResultError(f"--plots {out_dir}: {len(taken)} figure(s) would replace files already there "
                          f"({', '.join(p.name for p in taken[:3])}{', ...' if len(taken) > 3 else ''}); pass --force "
                          f"to replace them, or choose another directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    for path, fig in made:
        with plain_text():
            atomic_save(path, lambda tmp, fig=fig: fig.savefig(tmp, dpi=DPI, format="png"))
        plt.close(fig)
    return [path for path, _ in made]


def png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    with plain_text():
        fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


# ---- grids -------------------------------------------------------------------------------------------------

def grid_ok(grid: Any) -> bool:
    return isinstance(grid, dict) and isinstance(grid.get("axes"), list) and isinstance(grid.get("values"), list) \
        and all(isinstance(a, dict) and "values" in a for a in grid["axes"])


def _array(grid: dict[str, Any]) -> np.ndarray:
    return grid_values(grid)


def grids_by_name(table: TaskTable) -> dict[str, list[tuple[Row, dict[str, Any], list[np.ndarray]]]]:
    """grid name -> [(row, the grid of its first run, the grid values of each of its runs)], axes equal."""
    out: dict[str, list[tuple[Row, dict[str, Any], list[np.ndarray]]]] = {}
    for row in table.rows:
        names = []
        for run in row.runs:
            names += [n for n in run.grids if n not in names]
        for name in names:
            grids = [run.grids[name].to_dict() for run in row.runs if name in run.grids]
            grids = [g for g in grids if grid_ok(g) and grid_values(g) is not None]
            if not grids:
                continue
            first = grids[0]
            same = [g for g in grids if g["axes"] == first["axes"]]
            out.setdefault(name, []).append((row, first, [_array(g) for g in same]))
    for name, items in out.items():
        dims = len(items[0][1]["axes"])
        out[name] = [it for it in items if len(it[1]["axes"]) == dims]
    return out


def _mean(arrays: list[np.ndarray]) -> np.ndarray:
    stack = np.stack(arrays)
    with np.errstate(invalid="ignore"), _quiet():
        return np.nanmean(stack, axis=0)


class _quiet:
    def __enter__(self):
        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


def _seeds_text(n: int) -> str:
    return f", mean of {n} seeds" if n > 1 else ""


def heatmaps(task: str, name: str, items) -> Any:
    plt = pyplot()
    arrays = [_mean(arrs) for _, _, arrs in items]
    finite = [a[np.isfinite(a)] for a in arrays]
    values = np.concatenate(finite) if any(f.size for f in finite) else np.array([0.0, 1.0])
    unit = items[0][1].get("meta", {}).get("unit")
    vmin, vmax = (0.0, 100.0) if unit == "%" else (float(values.min()), float(values.max()))
    if vmin == vmax:
        vmax = vmin + 1.0
    cols = min(len(items), HEATMAPS_PER_ROW)
    rows = -(-len(items) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols + 1.2, 3.2 * rows + 0.4), squeeze=False,
                             constrained_layout=True)
    used = axes.ravel()[:len(items)]
    for ax in axes.ravel()[len(items):]:
        ax.remove()
    image = None
    for ax, (row, grid, arrs), arr in zip(used, items, arrays):
        ya, xa = grid["axes"][0], grid["axes"][1]
        image = ax.imshow(arr, origin="lower", cmap="viridis", vmin=vmin, vmax=vmax, aspect="auto",
                          extent=(-0.5, len(xa["values"]) - 0.5, -0.5, len(ya["values"]) - 0.5))
        if arr.size <= ANNOTATE_CELLS:
            annotate(ax, arr, vmin, vmax)
        mean = float(np.nanmean(arr)) if np.isfinite(arr).any() else float("nan")
        ax.set_title(f"{row.label}\nmean {mean:.1f}{_seeds_text(len(arrs))}", fontsize=9)
        ax.set_xlabel(xa["name"])
        ax.set_ylabel(ya["name"])
        _ticks(ax, xa["values"], "x")
        _ticks(ax, ya["values"], "y")
        train_max = grid.get("meta", {}).get("train_max") or {}
        if ya["name"] in train_max and xa["name"] in train_max:
            ny = sum(1 for v in ya["values"] if v <= train_max[ya["name"]])
            nx = sum(1 for v in xa["values"] if v <= train_max[xa["name"]])
            ax.add_patch(Rectangle((-0.5, -0.5), nx, ny, fill=False, edgecolor="white", linewidth=1.5,
                                   linestyle="--"))
    fig.colorbar(image, ax=used.tolist(), shrink=0.85, label=f"{name}" + (f" ({unit})" if unit else ""))
    fig.suptitle(f"{task}: {name}", fontsize=10)
    return fig


#: a heatmap of at most this many cells writes each cell's value in it
ANNOTATE_CELLS = 144


def annotate(ax, values: np.ndarray, vmin: float, vmax: float) -> None:
    """Each finite cell's value written in it (a digit less past 100), dark on light colours and light on dark."""
    for (i, j), value in np.ndenumerate(values):
        if np.isfinite(value):
            text = f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
            ax.text(j, i, text, ha="center", va="center", fontsize=5 if values.size > 64 else 6,
                    color="white" if value < (vmin + vmax) / 2 else "black")


def _ticks(ax, values: list[Any], which: str) -> None:
    step = max(1, len(values) // 10)
    positions = list(range(0, len(values), step))
    labels = [str(values[i]) for i in positions]
    if which == "x":
        ax.set_xticks(positions, labels, fontsize=7)
    else:
        ax.set_yticks(positions, labels, fontsize=7)


def _band(arrays: list[np.ndarray], bounds: tuple[float, float] = (-np.inf, np.inf)
          ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Mean of the arrays and, with 2 or more, the 95% Student-t interval at every point, cut to ``bounds``
    (the values the quantity can take: a loss or a perplexity is never below 0, an accuracy in % never above
    100; with 2 seeds t = 12.71 makes the interval wider than that)."""
    mean = _mean(arrays)
    if len(arrays) < 2:
        return mean, None, None
    low, high = np.full(mean.shape, np.nan), np.full(mean.shape, np.nan)
    stack = np.stack(arrays)
    for i in range(mean.size):
        interval = seed_interval([float(v) for v in stack[:, i] if np.isfinite(v)])
        if interval is not None and interval.half_width is not None:
            low[i], high[i] = interval.low, interval.high
    return mean, np.clip(low, *bounds), np.clip(high, *bounds)


def value_bounds(grid: dict[str, Any], arrays: list[np.ndarray]) -> tuple[float, float]:
    """What a grid's values can be: [0, 100] for a percentage, [0, inf) when every value is >= 0 (perplexity,
    accuracy, a score), else unbounded."""
    if (grid.get("meta") or {}).get("unit") == "%":
        return 0.0, 100.0
    finite = np.concatenate([a[np.isfinite(a)] for a in arrays]) if arrays else np.array([])
    return (0.0, np.inf) if finite.size and finite.min() >= 0 else (-np.inf, np.inf)


def training_lengths(ax, axis: str, items, styles: list[dict[str, Any]]) -> int:
    """Each row's training length as a dashed vertical line: one grey line when every row trained at the same
    length, else one per length in the colour of the first row that trained at it; returns how many lengths."""
    lengths = [((grid.get("meta") or {}).get("train_max") or {}).get(axis) for _, grid, _ in items]
    known = [x for x in lengths if isinstance(x, (int, float))]
    if len(set(known)) == 1:
        ax.axvline(known[0], color="grey", linestyle="--", linewidth=1)
        return 1
    drawn = set()
    for length, style in zip(lengths, styles):
        if isinstance(length, (int, float)) and length not in drawn:
            ax.axvline(length, color=style["color"], linestyle="--", linewidth=1, alpha=0.8)
            drawn.add(length)
    return len(drawn)


def curves(task: str, name: str, items) -> Any:
    fig, ax, shade = series_axes(len(items))
    axis = items[0][1]["axes"][0]
    styles = [series_style(i) for i in range(len(items))]
    marked_effective = 0
    for (row, grid, arrs), style in zip(items, styles):
        xs = grid["axes"][0]["values"]
        mean, low, high = _band(arrs, value_bounds(grid, arrs))
        (line,) = ax.plot(xs, mean, label=legend_label(row.label + (f" ({len(arrs)} seeds)" if len(arrs) > 1 else "")),
                          **style)
        if low is not None:
            ax.fill_between(xs, low, high, color=line.get_color(), alpha=shade, linewidth=0)
        marked_effective += mark_effective(ax, row, name, grid, xs, mean, line.get_color())
    ax.set_xlabel(axis["name"])
    ax.set_ylabel(items[0][1].get("metric", name))
    marked = training_lengths(ax, axis["name"], items, styles)
    if all(isinstance(x, (int, float)) and x > 0 for x in axis["values"]) and \
            max(axis["values"]) / max(min(axis["values"]), 1e-9) >= 4:      # doubling lengths: equal steps
        log2_axis(ax)
    place_legend(ax, len(items))
    shaded = any(len(arrs) > 1 for _, _, arrs in items)
    title = f"{task}: {name}" + (" (mean over seeds, 95% interval shaded)" if shaded else "") + \
        {0: "", 1: "; dashed: the training length"}.get(marked, "; dashed: each row's training length") + \
        ("; hollow circle: each row's effective length (eff_len)" if marked_effective else "")
    ax.set_title(wrapped(title, TITLE_WIDTH), fontsize=9)
    return fig


#: which effective length (posbench.report.effective_length) a 1-axis grid's curve shows
EFFECTIVE_OF_GRID = {"ppl_chunks": "eff_len", "ppl_sliding": "eff_len_sliding", "accuracy": "eff_len"}


def mark_effective(ax, row: Row, name: str, grid: dict[str, Any], xs: list[Any], mean: np.ndarray,
                   colour: str) -> int:
    """A hollow circle on the row's curve at its effective length (the mean over seeds, in tokens: drawn on the
    curve between the lengths around it); 1 when drawn."""
    cell = row.cells.get(EFFECTIVE_OF_GRID.get(name, ""))
    trained = ((grid.get("meta") or {}).get("train_max") or {}).get(grid["axes"][0]["name"])
    if cell is None or cell.value is None or not isinstance(trained, (int, float)) or not len(xs):
        return 0
    x = cell.value * trained
    try:
        y = float(np.interp(x, np.asarray(xs, dtype=float), mean))
    except (TypeError, ValueError):
        return 0
    ax.plot([x], [y], marker="o", markersize=10, markerfacecolor="none", markeredgecolor=colour, linestyle="none")
    return 1


# ---- training loss -----------------------------------------------------------------------------------------

def _history(points: list[Any]) -> dict[int, float]:
    out = {}
    for point in points:
        if isinstance(point, (list, tuple)) and len(point) >= 2 and isinstance(point[1], (int, float)):
            out[int(point[0])] = float(point[1])
    return out


def _probe_history(run: Any, name: str) -> dict[int, float]:
    return _history([[step, values.get(name)] for step, values in run.probe_history if isinstance(values, dict)])


def probe_names(table: TaskTable) -> list[str]:
    names: list[str] = []
    for run in table.runs:
        for _, values in run.probe_history[:1]:
            names += [n for n in values if n not in names and not is_length_loss(str(n))]   # losses: break_figures
    return names


def loss_curves(table: TaskTable) -> Any | None:
    return history_curves(table, lambda run: _history(run.loss_history), "training loss (nats per target token)",
                          (0.0, np.inf), f"{table.task}: training loss")       # a cross-entropy is never below 0


def probe_curves(table: TaskTable, name: str) -> Any | None:
    return history_curves(table, lambda run: _probe_history(run, name), f"{name} (%), probed during training",
                          (0.0, 100.0), f"{table.task}: {name} during training (the probe, train.probe_every)")


def history_curves(table: TaskTable, history, ylabel: str, bounds: tuple[float, float], title: str) -> Any | None:
    """One curve per row of a quantity logged against the step (``history(run) -> {step: value}``): the mean
    over the row's seeds at the steps they share, the 95% interval shaded, cut to ``bounds``."""
    series = []
    for row in table.rows:
        histories = [h for h in (history(run) for run in row.runs) if h]
        if not histories:
            continue
        steps = sorted(set.intersection(*(set(h) for h in histories)))
        if steps:
            series.append((row, steps, [np.array([h[s] for s in steps]) for h in histories]))
    if not series:
        return None
    fig, ax, shade = series_axes(len(series))
    for i, (row, steps, arrays) in enumerate(series):
        mean, low, high = _band(arrays, bounds)
        style = {k: v for k, v in series_style(i).items() if k != "marker"}
        (line,) = ax.plot(steps, mean, label=legend_label(row.label + (f" ({len(arrays)} seeds)"
                                                                       if len(arrays) > 1 else "")), **style)
        if low is not None:
            ax.fill_between(steps, low, high, color=line.get_color(), alpha=shade, linewidth=0)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    place_legend(ax, len(series))
    ax.set_title(wrapped(title, TITLE_WIDTH), fontsize=10)
    return fig


# ---- posbench bench ----------------------------------------------------------------------------------------

def bench_figure(table: TaskTable) -> Any | None:
    run = table.runs[0]
    lengths = bench_lengths(run)
    if not lengths or not table.rows:
        return None
    plt = pyplot()
    unit = (run.bench or {}).get("unit", "ms")
    panels = [("ms", unit)]
    if any(r.cells[f"{L}:peak_gib"].value is not None for r in table.rows for L in lengths):
        panels.append(("peak_gib", "peak memory (GiB)"))          # a CPU run measures no peak memory
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False, constrained_layout=True)
    width = 0.8 / len(table.rows)
    x = np.arange(len(lengths))
    for panel, (suffix, ylabel) in zip(axes[0], panels):
        for i, row in enumerate(table.rows):
            cells = [row.cells[f"{L}:{suffix}"] for L in lengths]
            heights = [c.value if c.value is not None else 0.0 for c in cells]
            pos = x - 0.4 + width * (i + 0.5)
            panel.bar(pos, heights, width, label=legend_label(row.label))
            for p, c in zip(pos, [row.cells[f"{L}:ms"] for L in lengths]):
                if c.note and c.note != "-":
                    panel.text(p, 0, c.note, rotation=90, ha="center", va="bottom", fontsize=7, color="red")
            if suffix == "ms":
                for p, L, h in zip(pos, lengths, heights):
                    rel = row.cells[f"{L}:x_rope"].value
                    if rel is not None and h > 0:
                        panel.text(p, h, f"{rel:.2f}x", ha="center", va="bottom", fontsize=6)
        panel.set_xticks(x, [str(L) for L in lengths])
        panel.set_xlabel("sequence length")
        panel.set_ylabel(ylabel)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("\n".join(textwrap.wrap(table.heading, 60 * len(panels))), fontsize=9)
    return fig
