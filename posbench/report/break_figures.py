"""Figures of where an encoding breaks (one row of a table = one encoding, its seeds pooled, 95% interval shaded):

* ``<task>_loss_by_position[_sliding].png``: the loss at each token position of the longest evaluation every run
  has (``posbench.report.by_position``), one curve per row, positions on a log axis, the training length dashed;
* ``<task>_extrapolation.png``: the held-out loss at each evaluation length against the training step (the
  length probe), one panel per row, one curve per length: where the long lengths part from 1x, and when;
* ``<task>_attention_distance.png`` (runs that ``posbench analyze`` read): the attention weight per key at each
  distance, the mean over layers and heads, one panel per window length, one curve per row;
* ``<task>_heads_<stat>_<k>x.png``: a layer x head map of entropy, first-token mass and rigidity per row (the mean
  over its seeds, each cell's value written in it), at the shortest and the longest analysed length.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from posbench.report import attention, by_position
from posbench.report.figure_style import (TITLE_WIDTH, legend_label, log2_axis, place_legend, pyplot, series_axes,
                                          series_style, wrapped)
from posbench.report.structure import TaskTable

PANELS_PER_ROW = 4


def break_figures(table: TaskTable) -> Iterator[tuple[str, Any]]:
    """``(file stem suffix, figure)`` of the figures above that the table's runs have data for."""
    lengths = by_position.longest_evaluations(table.runs)
    for protocol, length in sorted(lengths.items()):
        fig = loss_by_position(table, protocol, length)
        if fig is not None:
            yield "loss_by_position" + ("" if protocol == "chunks" else f"_{protocol}"), fig
    fig = extrapolation(table)
    if fig is not None:
        yield "extrapolation", fig
    found = [(row, attention.analyses(row.runs)) for row in table.rows]
    found = [(row, items) for row, items in found if items]
    factors = attention.shared_factors([items for _, items in found])
    if not factors:
        return
    fig = distance_profiles(found, factors)
    if fig is not None:
        yield "attention_distance", fig
    for factor in sorted({factors[0], factors[-1]}):
        for stat in HEAD_MAPS:
            fig = head_maps(found, factor, stat)
            if fig is not None:
                yield f"heads_{stat}_{factor:g}x", fig


def loss_by_position(table: TaskTable, protocol: str, length: int) -> Any | None:
    series = [(row, by_position.position_curve(row.runs, protocol, length)) for row in table.rows]
    series = [(row, curve) for row, curve in series if curve is not None]
    if not series:
        return None
    fig, ax, shade = series_axes(len(series))
    for i, (row, curve) in enumerate(series):
        style = {k: v for k, v in series_style(i).items() if k != "marker"}
        label = row.label + (f" ({curve.seeds} seeds)" if curve.seeds > 1 else "")
        (line,) = ax.plot(curve.x, curve.mean, label=legend_label(label), **style)
        if curve.low is not None:
            ax.fill_between(curve.x, np.clip(curve.low, 0, None), curve.high, color=line.get_color(), alpha=shade,
                            linewidth=0)
    trained = {by_position.train_length(run) for row, _ in series for run in row.runs} - {None}
    for value in trained:
        ax.axvline(value, color="grey", linestyle="--", linewidth=1)
    log2_axis(ax)
    ax.set_xlabel("token position (query index in the window)")
    ax.set_ylabel("mean loss (nats per token)")
    place_legend(ax, len(series))
    shaded = any(curve.seeds > 1 for _, curve in series)
    ax.set_title(wrapped(f"{table.task}: loss by position in windows of {length} tokens ({protocol})"
                                 + (", mean over seeds, 95% interval shaded" if shaded else "")
                                 + ("; dashed: the training length" if trained else ""), TITLE_WIDTH),
                 fontsize=9)
    return fig


def extrapolation(table: TaskTable) -> Any | None:
    plt = pyplot()
    panels = [(row, by_position.probe_curves(row.runs)) for row in table.rows]
    panels = [(row, curves) for row, curves in panels if curves]
    if not panels:
        return None
    cols = min(len(panels), PANELS_PER_ROW)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols + 1.5, 2.9 * rows + 0.6), squeeze=False,
                             sharex=True, sharey=True, constrained_layout=True)
    for ax in axes.ravel()[len(panels):]:
        ax.remove()
    factors = sorted({f for _, curves in panels for f in curves})
    colours = {f: f"C{i % 10}" for i, f in enumerate(factors)}
    finite = [v for _, curves in panels for c in curves.values() for v in c.mean if np.isfinite(v)]
    for ax, (row, curves) in zip(axes.ravel(), panels):
        for factor, curve in curves.items():
            ax.plot(curve.x, curve.mean, color=colours[factor], label=f"{factor:g}x")
            if curve.low is not None:
                ax.fill_between(curve.x, np.clip(curve.low, 0, None), curve.high, color=colours[factor], alpha=0.2,
                                linewidth=0)
        seeds = max(c.seeds for c in curves.values())
        ax.set_title(wrapped(row.label + (f" ({seeds} seeds)" if seeds > 1 else ""), 40), fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel("held-out loss (nats)", fontsize=8)
    if finite:                                    # the early steps' losses would flatten every later difference
        low, high = min(finite), float(np.percentile(finite, 95))
        axes.ravel()[0].set_ylim(low - 0.05 * (high - low), high + 0.1 * (high - low))
    handles, labels = axes.ravel()[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="outside right upper", title="length")
    fig.suptitle(wrapped(f"{table.task}: held-out loss at each evaluation length during training (the "
                                 f"length probe, train.probe_every)", 90), fontsize=10)
    return fig


#: the statistics drawn as layer x head maps, with their ranges
HEAD_MAPS = {"entropy": (0.0, 1.0), "first_token": (0.0, 1.0), "rigidity": (0.0, 1.0)}


def distance_profiles(found: list[tuple[Any, list[dict[str, Any]]]], factors: list[float]) -> Any | None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(factors), figsize=(3.6 * len(factors) + 1.8, 3.6), squeeze=False,
                             sharey=True, constrained_layout=True)
    drawn = False
    for ax, factor in zip(axes[0], factors):
        for i, (row, items) in enumerate(found):
            curve = attention.distance_profile(items, factor)
            if curve is None:
                continue
            style = {k: v for k, v in series_style(i).items() if k != "marker"}
            label = row.label + (f" ({curve.seeds} seeds)" if curve.seeds > 1 else "")
            (line,) = ax.plot(curve.x, curve.mean, label=legend_label(label), **style)
            if curve.low is not None:
                low = np.where(np.asarray(curve.low) > 0, curve.low, np.nan)
                ax.fill_between(curve.x, low, curve.high, color=line.get_color(), alpha=0.15, linewidth=0)
            drawn = True
        log2_axis(ax)
        log2_axis(ax, "y", base=10)
        trained = {a.get("train_length") for _, items in found for a in items} - {None}
        for value in trained:
            ax.axvline(value, color="grey", linestyle="--", linewidth=1)
        ax.set_title(f"windows of {factor:g}x the training length", fontsize=9)
        ax.set_xlabel("distance to the key (tokens)", fontsize=8)
    if not drawn:
        plt.close(fig)
        return None
    axes[0][0].set_ylabel("attention weight per key (mean over layers, heads)", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, [wrapped(label, 28) for label in labels], fontsize=7, loc="outside right upper")
    fig.suptitle("where the heads attend: attention per key against distance (posbench analyze); dashed: the "
                 "training length", fontsize=10)
    return fig


def head_maps(found: list[tuple[Any, list[dict[str, Any]]]], factor: float, stat: str) -> Any | None:
    maps = [(row, attention.head_map(items, factor, stat), len(items)) for row, items in found]
    maps = [(row, values, n) for row, values, n in maps if values is not None]
    if not maps:
        return None
    plt = pyplot()
    cols = min(len(maps), PANELS_PER_ROW)
    rows = -(-len(maps) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.9 * cols + 1.2, 2.6 * rows + 0.7), squeeze=False,
                             constrained_layout=True)
    for ax in axes.ravel()[len(maps):]:
        ax.remove()
    low, high = HEAD_MAPS[stat]
    image = None
    for ax, (row, values, seeds) in zip(axes.ravel(), maps):
        image = ax.imshow(values, cmap="viridis", vmin=low, vmax=high, aspect="auto")
        for (layer, head), value in np.ndenumerate(values):
            if np.isfinite(value):
                ax.text(head, layer, f"{value:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if value < (low + high) / 2 else "black")
        ax.set_title(helpers_title(row.label, seeds), fontsize=8)
        ax.set_xlabel("head", fontsize=7)
        ax.set_ylabel("layer", fontsize=7)
        ax.set_xticks(range(values.shape[1]))
        ax.set_yticks(range(values.shape[0]))
        ax.tick_params(labelsize=6)
    fig.colorbar(image, ax=axes.ravel()[:len(maps)].tolist(), shrink=0.85, label=stat)
    fig.suptitle(f"{stat} per layer and head, windows of {factor:g}x the training length (posbench analyze)",
                 fontsize=9)
    return fig


def helpers_title(label: str, seeds: int) -> str:
    return wrapped(label + (f" (mean of {seeds} seeds)" if seeds > 1 else ""), 34)
