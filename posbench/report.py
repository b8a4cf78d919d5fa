"""``posbench compare``: read a tree of runs, build one table per task (encodings as rows, metrics as
columns, best value of each column marked, stderr shown), format it (markdown, csv, latex, json; the CLI
draws the terminal table with rich) and draw figures: 2-axis grids as heatmaps side by side with one shared
colour scale, 1-axis grids as curves.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posbench.results import Problem, ResultError, scan_runs

FORMATS = ("table", "markdown", "csv", "latex", "json")


@dataclass
class Cell:
    value: float | None
    stderr: float | None = None
    n: int | None = None
    best: bool = False


@dataclass
class Row:
    label: str
    encoding: str
    run_id: str
    path: str
    seed: Any
    cells: dict[str, Cell]
    train_s: float | None = None


@dataclass
class TaskTable:
    task: str
    primary: str | None
    columns: list[str]
    higher_is_better: dict[str, bool]
    rows: list[Row]
    runs: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Report:
    tables: list[TaskTable]
    problems: list[Problem]


def collect(root: Path | str, task: str | None = None) -> Report:
    """Read every run under ``root`` (optionally one task) into tables; unreadable runs go to ``problems``."""
    runs, problems = scan_runs(Path(root))
    if task is not None:
        runs = [r for r in runs if r.get("task") == task]
    by_task: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_task.setdefault(str(run["task"]), []).append(run)
    return Report([build_table(name, items) for name, items in sorted(by_task.items())], problems)


def build_table(task: str, runs: list[dict[str, Any]]) -> TaskTable:
    primary = next((r.get("primary_metric") for r in runs if r.get("primary_metric")), None)
    columns: list[str] = []
    hib: dict[str, bool] = {}
    for run in runs:
        for name, metric in run["metrics"].items():
            if name not in columns:
                columns.append(name)
                hib[name] = bool(metric.get("higher_is_better", True))
    if primary in columns:
        columns.remove(primary)
        columns.insert(0, primary)
    layout = next((r["evaluation"]["table_columns"] for r in runs if isinstance(r.get("evaluation"), dict)
                   and isinstance(r["evaluation"].get("table_columns"), list)), None)
    if layout:      # a task's own column order (scrolls: the paper's Table 1, then the score)
        columns = [c for c in layout if c in columns] + [c for c in columns if c not in layout]
    encodings = [str(r["encoding"]) for r in runs]
    rows = []
    for run in runs:
        enc = str(run["encoding"])
        label = enc
        if encodings.count(enc) > 1:
            seed = run.get("config", {}).get("seed", run.get("seeds", {}).get("torch"))
            label = f"{enc} (seed {seed}, {run.get('run_id', Path(run['_path']).name)})"
        cells = {}
        for name in columns:
            metric = run["metrics"].get(name)
            if isinstance(metric, dict):
                cells[name] = Cell(_num(metric.get("value")), _num(metric.get("stderr")), metric.get("n"))
            else:
                cells[name] = Cell(None)
        timings = run.get("timings") or {}
        rows.append(Row(label, enc, str(run.get("run_id", Path(run["_path"]).name)), run["_path"],
                        run.get("config", {}).get("seed"), cells, _num(timings.get("train_s"))))
    for name in columns:
        values = [r.cells[name].value for r in rows if r.cells[name].value is not None]
        if len(values) >= 1:
            best = max(values) if hib[name] else min(values)
            for r in rows:
                if r.cells[name].value is not None and r.cells[name].value == best:
                    r.cells[name].best = True
    if primary in columns:
        sign = -1 if hib[primary] else 1
        rows.sort(key=lambda r: (r.cells[primary].value is None,
                                 sign * (r.cells[primary].value or 0.0), r.label))
    else:
        rows.sort(key=lambda r: r.label)
    return TaskTable(task, primary, columns, hib, rows, runs)


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def fmt_value(x: float | None) -> str:
    if x is None:
        return "-"
    if x != 0 and (abs(x) >= 1e4 or abs(x) < 1e-2):
        return f"{x:.3g}"
    return f"{x:.2f}"


def fmt_cell(cell: Cell) -> str:
    text = fmt_value(cell.value)
    if cell.value is not None and cell.stderr is not None:
        text += f" ± {fmt_value(cell.stderr)}"
    return text


def header(name: str, hib: bool) -> str:
    return f"{name} {'↑' if hib else '↓'}"


# ---- text formats ------------------------------------------------------------------------------------------

def to_markdown(report: Report) -> str:
    parts = []
    for table in report.tables:
        cols = [header(c, table.higher_is_better[c]) for c in table.columns]
        lines = [f"### {table.task}", "", "| encoding | " + " | ".join(cols) + " | train s |",
                 "|---|" + "---:|" * (len(cols) + 1)]
        for row in table.rows:
            cells = [f"**{fmt_cell(row.cells[c])}**" if row.cells[c].best else fmt_cell(row.cells[c])
                     for c in table.columns]
            lines.append(f"| {row.label} | " + " | ".join(cells) + f" | {fmt_value(row.train_s)} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def to_csv(report: Report) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    names: list[str] = []
    for table in report.tables:
        names += [c for c in table.columns if c not in names]
    head = ["task", "encoding", "run_id", "seed"]
    for name in names:
        head += [name, f"{name}_stderr", f"{name}_n", f"{name}_best"]
    writer.writerow(head + ["train_s", "path"])
    for table in report.tables:
        for row in table.rows:
            line = [table.task, row.encoding, row.run_id, row.seed]
            for name in names:
                cell = row.cells.get(name, Cell(None))
                line += [_raw(cell.value), _raw(cell.stderr), _raw(cell.n), int(cell.best)]
            writer.writerow(line + [_raw(row.train_s), row.path])
    return buf.getvalue()


def _raw(x: Any) -> str:
    return "" if x is None else str(x)


def to_latex(report: Report) -> str:
    parts = []
    for table in report.tables:
        cols = [header(c, table.higher_is_better[c]).replace("_", r"\_").replace("↑", r"$\uparrow$")
                .replace("↓", r"$\downarrow$") for c in table.columns]
        lines = [r"\begin{table}[t]", r"\centering", r"\begin{tabular}{l" + "r" * len(cols) + "}", r"\toprule",
                 "Encoding & " + " & ".join(cols) + r" \\", r"\midrule"]
        for row in table.rows:
            cells = []
            for c in table.columns:
                cell = row.cells[c]
                text = fmt_value(cell.value)
                if cell.best:
                    text = rf"\textbf{{{text}}}"
                if cell.value is not None and cell.stderr is not None:
                    text += rf" {{\scriptsize $\pm$ {fmt_value(cell.stderr)}}}"
                cells.append(text)
            lines.append(row.label.replace("_", r"\_") + " & " + " & ".join(cells) + r" \\")
        lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{table.task}}}", r"\end{table}"]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def to_json(report: Report) -> str:
    data = {
        "tables": [{
            "task": t.task, "primary_metric": t.primary,
            "columns": [{"name": c, "higher_is_better": t.higher_is_better[c]} for c in t.columns],
            "rows": [{"label": r.label, "encoding": r.encoding, "run_id": r.run_id, "path": r.path, "seed": r.seed,
                      "train_s": r.train_s,
                      "metrics": {c: {"value": r.cells[c].value, "stderr": r.cells[c].stderr, "n": r.cells[c].n,
                                      "best": r.cells[c].best} for c in t.columns}} for r in t.rows],
        } for t in report.tables],
        "skipped": [{"path": str(p.path), "reason": p.reason} for p in report.problems],
    }
    return json.dumps(data, indent=2) + "\n"


def render_text(report: Report, fmt: str) -> str:
    formatters = {"markdown": to_markdown, "csv": to_csv, "latex": to_latex, "json": to_json}
    if fmt not in formatters:
        raise ResultError(f"unknown format '{fmt}'; formats: {', '.join(FORMATS)}")
    return formatters[fmt](report)


# ---- figures -----------------------------------------------------------------------------------------------

def plot(report: Report, out_dir: Path | str) -> list[Path]:
    """One PNG per (task, grid): 2-axis grids as heatmaps side by side with one colour scale, 1-axis grids
    as one curve per run. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for table in report.tables:
        grids: dict[str, list[tuple[Row, dict[str, Any]]]] = {}
        by_path = {run["_path"]: run for run in table.runs}
        for row in table.rows:
            for name, grid in (by_path[row.path].get("grids") or {}).items():
                if _grid_ok(grid):
                    grids.setdefault(name, []).append((row, grid))
        for name, items in grids.items():
            dims = len(items[0][1]["axes"])
            items = [(r, g) for r, g in items if len(g["axes"]) == dims]
            path = out_dir / f"{_safe(table.task)}_{_safe(name)}.png"
            if dims == 2:
                _heatmaps(table.task, name, items, path)
            elif dims == 1:
                _curves(table.task, name, items, path)
            else:
                continue
            written.append(path)
    return written


def _grid_ok(grid: Any) -> bool:
    return isinstance(grid, dict) and isinstance(grid.get("axes"), list) and isinstance(grid.get("values"), list) \
        and all(isinstance(a, dict) and "values" in a for a in grid["axes"])


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def _heatmaps(task: str, name: str, items: list[tuple[Row, dict[str, Any]]], path: Path) -> None:
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Rectangle

    arrays = [np.array([[np.nan if v is None else v for v in line] for line in g["values"]], dtype=float)
              for _, g in items]
    finite = [a[np.isfinite(a)] for a in arrays]
    values = np.concatenate(finite) if any(f.size for f in finite) else np.array([0.0, 1.0])
    unit = items[0][1].get("meta", {}).get("unit")
    vmin, vmax = (0.0, 100.0) if unit == "%" else (float(values.min()), float(values.max()))
    if vmin == vmax:
        vmax = vmin + 1.0
    cols = len(items)
    fig, axes = plt.subplots(1, cols, figsize=(3.4 * cols + 1.2, 3.6), squeeze=False, constrained_layout=True)
    image = None
    for ax, (row, grid), arr in zip(axes[0], items, arrays):
        ya, xa = grid["axes"][0], grid["axes"][1]
        image = ax.imshow(arr, origin="lower", cmap="viridis", vmin=vmin, vmax=vmax, aspect="auto",
                          extent=(-0.5, len(xa["values"]) - 0.5, -0.5, len(ya["values"]) - 0.5))
        mean = np.nanmean(arr) if np.isfinite(arr).any() else float("nan")
        ax.set_title(f"{row.label}\nmean {mean:.1f}", fontsize=9)
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
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.85, label=f"{name}" + (f" ({unit})" if unit else ""))
    fig.suptitle(f"{task}: {name}", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ticks(ax, values: list[Any], which: str) -> None:
    step = max(1, len(values) // 10)
    positions = list(range(0, len(values), step))
    labels = [str(values[i]) for i in positions]
    if which == "x":
        ax.set_xticks(positions, labels, fontsize=7)
    else:
        ax.set_yticks(positions, labels, fontsize=7)


def _curves(task: str, name: str, items: list[tuple[Row, dict[str, Any]]], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    axis = items[0][1]["axes"][0]
    for row, grid in items:
        xs = grid["axes"][0]["values"]
        ys = [float("nan") if v is None else v for v in grid["values"]]
        ax.plot(xs, ys, marker="o", label=row.label)
    ax.set_xlabel(axis["name"])
    ax.set_ylabel(items[0][1].get("metric", name))
    train_max = items[0][1].get("meta", {}).get("train_max") or {}
    if axis["name"] in train_max:
        ax.axvline(train_max[axis["name"]], color="grey", linestyle="--", linewidth=1)
    if all(isinstance(x, (int, float)) and x > 0 for x in axis["values"]) and \
            max(axis["values"]) / max(min(axis["values"]), 1e-9) > 16:
        ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
    ax.set_title(f"{task}: {name}", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
