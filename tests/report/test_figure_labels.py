"""Perplexity figures stay readable for any row label and mark each row's own training length (issue 36, item 3):
with long labels (every comparison of extensions) the legend sits beside the axes inside the figure, covering
neither the curves nor the y label, the title fits the figure, and rows trained at 64 and 128 tokens get a dashed
line each. Checked on the drawn figure's boxes (pixels), not on a picture."""

from __future__ import annotations

import pytest

from posbench.report.figures import curves, pyplot
from posbench.report.structure import Row

LONG = ["llama+tape (seed 0, 20261127-101010-abcdef, lr 2e-5, 1,000 steps)",
        "llama+longlora (seed 0, 20261127-101011-abcdee, lr 2e-5, 1,000 steps)",
        "rope+yarn (seed 1, 20261127-101012-abcded)"]


def items(labels: list[str], trained: list[int]):
    out = []
    for i, (label, length) in enumerate(zip(labels, trained)):
        grid = {"metric": "ppl", "axes": [{"name": "length", "values": [64, 128, 256, 512, 1024]}],
                "values": [5.0 + i + j for j in range(5)], "meta": {"train_max": {"length": length}}}
        import numpy as np

        out.append((Row(label, label.split(" ")[0], "r", "p", 0, {}), grid, [np.array(grid["values"], float)]))
    return out


def boxes(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    legend = fig.legends[0] if fig.legends else ax.get_legend()
    return renderer, ax, legend


def inside(box, outer, slack: float = 1.0) -> bool:
    return box.x0 >= outer.x0 - slack and box.y0 >= outer.y0 - slack and box.x1 <= outer.x1 + slack \
        and box.y1 <= outer.y1 + slack


@pytest.mark.parametrize("n", [3, 9])
def test_long_labels_sit_beside_the_axes_inside_the_figure(n):
    labels = (LONG * 3)[:n]
    fig = curves("perplexity", "ppl_chunks", items(labels, [128] * n))
    try:
        renderer, ax, legend = boxes(fig)
        figure_box = fig.bbox
        legend_box = legend.get_window_extent(renderer)
        assert inside(legend_box, figure_box)                                  # nothing cut on any side
        assert not legend_box.overlaps(ax.get_window_extent(renderer))         # no curve covered
        assert not legend_box.overlaps(ax.yaxis.label.get_window_extent(renderer))
        assert inside(ax.title.get_window_extent(renderer), figure_box)
        assert not ax.title.get_window_extent(renderer).overlaps(legend_box)
        assert inside(ax.yaxis.label.get_window_extent(renderer), figure_box)
    finally:
        pyplot().close(fig)


def test_each_rows_training_length_is_marked():
    fig = curves("perplexity", "ppl_chunks", items(LONG[:2] + ["rope"], [64, 128, 128]))
    try:
        ax = fig.axes[0]
        vertical = sorted(line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"
                          and len(set(line.get_xdata())) == 1)
        assert vertical == [64, 128]
        assert "each row's training length" in ax.get_title().replace("\n", " ")
    finally:
        pyplot().close(fig)
    fig = curves("perplexity", "ppl_chunks", items(["rope", "alibi"], [256, 256]))
    try:
        renderer, ax, legend = boxes(fig)
        assert legend is ax.get_legend()                                          # short labels: inside
        grey = [line for line in ax.get_lines() if line.get_color() == "grey"]
        assert len(grey) == 1 and grey[0].get_xdata()[0] == 256
    finally:
        pyplot().close(fig)
