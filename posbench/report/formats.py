"""Text formats of a report: markdown, csv, latex, json (the terminal table is ``terminal.py``)."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from posbench.report.structure import Cell, DifferenceRow, Report, TaskTable, num
from posbench.runs.record import ResultError

FORMATS = ("table", "markdown", "csv", "latex", "json")


def fmt_value(x: float | None) -> str:
    if x is None:
        return "-"
    if x != 0 and (abs(x) >= 1e4 or abs(x) < 1e-2):
        return f"{x:.3g}"
    return f"{x:.2f}"


def fmt_cell(cell: Cell) -> str:
    if cell.note:
        return cell.note + (f" ({cell.flag})" if cell.flag else "")
    text = fmt_value(cell.value)
    if cell.value is not None and cell.spread is not None:
        text += f" ± {fmt_value(cell.spread)}"
    return text + (f" ({cell.flag})" if cell.flag and cell.value is not None else "")


def fmt_signed(x: float | None) -> str:
    return "-" if x is None else ("+" if x > 0 else "") + fmt_value(x)


def fmt_p(p: float | None) -> str:
    if p is None:
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def fmt_interval(low: float | None, high: float | None) -> str:
    return "-" if low is None or high is None else f"[{fmt_signed(low)}, {fmt_signed(high)}]"


def header(name: str, hib: bool | None) -> str:
    """A column's header: its name and which way is better (``?``: not known, ``tables.direction_conflicts``)."""
    return f"{name} {'?' if hib is None else '↑' if hib else '↓'}"


def column_header(table: TaskTable, name: str) -> str:
    return header(table.column_label(name), table.higher_is_better[name])


def extra_columns(table: TaskTable) -> list[str]:
    """The columns after the metrics: seeds (when a row pools several) and training time (metric tables)."""
    if table.kind != "metrics":
        return []
    return (["seeds"] if table.multi_seed else []) + ["train s"]


def extra_cells(table: TaskTable, row) -> list[str]:
    if table.kind != "metrics":
        return []
    return ([str(len(row.runs))] if table.multi_seed else []) + [fmt_value(num(row.train_s))]


def difference_cells(d: DifferenceRow) -> list[str]:
    diff = d.difference
    return [d.label, d.metric, fmt_signed(diff.estimate), fmt_interval(diff.low, diff.high), fmt_p(diff.p),
            d.verdict, diff.basis]


DIFFERENCE_HEADER = ["encoding", "metric", "difference", "95% interval", "p", "", "paired over"]


def difference_title(table: TaskTable) -> str:
    return f"{table.heading}: difference to {table.against} (row minus {table.against})"


# ---- markdown ----------------------------------------------------------------------------------------------

def to_markdown(report: Report) -> str:
    parts = []
    for table in report.tables:
        cols = [column_header(table, c) for c in table.columns] + extra_columns(table)
        lines = [f"### {table.heading}", "", f"| {table.row_header} | " + " | ".join(cols) + " |",
                 "|---|" + "---:|" * len(cols)]
        for row in table.rows:
            cells = [f"**{fmt_cell(row.cells[c])}**" if row.cells[c].best else fmt_cell(row.cells[c])
                     for c in table.columns]
            lines.append(f"| {row.label} | " + " | ".join(cells + extra_cells(table, row)) + " |")
        for note in table.notes:
            lines += ["", f"_{note}_"]
        if table.differences:
            lines += ["", f"**{difference_title(table)}**", "",
                      "| " + " | ".join(h or "verdict" for h in DIFFERENCE_HEADER) + " |",
                      "|---|---|" + "---:|" * 3 + "---|---|"]
            lines += ["| " + " | ".join(difference_cells(d)) + " |" for d in table.differences]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


# ---- csv ---------------------------------------------------------------------------------------------------

def to_csv(report: Report) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    names: list[str] = []
    for table in report.tables:
        names += [c for c in table.columns if c not in names]
    against = any(t.differences for t in report.tables)
    head = ["task", "encoding", "label", "run_id", "seed", "seeds"]
    for name in names:
        head += [name, f"{name}_stderr", f"{name}_n", f"{name}_best", f"{name}_ci_low", f"{name}_ci_high",
                 f"{name}_seeds", f"{name}_flag"]
        if against:
            head += [f"{name}_diff", f"{name}_diff_low", f"{name}_diff_high", f"{name}_diff_p"]
    writer.writerow(head + ["train_s", "path"])
    for table in report.tables:
        diffs = {(d.label, d.metric): d.difference for d in table.differences}
        for row in table.rows:
            seed = row.seed if not isinstance(row.seed, list) else " ".join(map(str, row.seed))
            line = [table.heading, row.encoding, row.label, row.run_id, seed, row.seeds]
            for name in names:
                cell = row.cells.get(name, Cell(None))
                low = None if cell.half_width is None else cell.value - cell.half_width
                high = None if cell.half_width is None else cell.value + cell.half_width
                line += [_raw(cell.value) if cell.value is not None else _infinity(cell), _raw(cell.stderr),
                         _raw(cell.n), int(cell.best), _raw(low), _raw(high), cell.seeds if name in row.cells else "",
                         _raw(cell.flag)]
                if against:
                    d = diffs.get((row.label, name))
                    line += ["", "", "", ""] if d is None else [_raw(d.estimate), _raw(d.low), _raw(d.high),
                                                                _raw(d.p)]
            writer.writerow(line + [_raw(row.train_s), row.path])
    return buf.getvalue()


def _raw(x: Any) -> str:
    return "" if x is None else str(x)


def _infinity(cell: Cell) -> str:
    """``inf`` / ``-inf`` for a value beyond float range (its note says so; a mean over seeds one of which is
    infinite is infinite too), else empty."""
    word = (cell.note or "").split(" ", 1)[0]
    return word if word in ("inf", "-inf") else ""


# ---- latex -------------------------------------------------------------------------------------------------

def _tex(text: str) -> str:
    return (text.replace("\\", r"\textbackslash{}").replace("_", r"\_").replace("%", r"\%").replace("&", r"\&")
            .replace("#", r"\#").replace("↑", r"$\uparrow$").replace("↓", r"$\downarrow$")
            .replace("±", r"$\pm$").replace("×", r"$\times$"))


def to_latex(report: Report) -> str:
    parts = []
    for table in report.tables:
        cols = [_tex(column_header(table, c)) for c in table.columns] + extra_columns(table)
        lines = [r"\begin{table}[t]", r"\centering", r"\begin{tabular}{l" + "r" * len(cols) + "}", r"\toprule",
                 _tex(table.row_header.capitalize()) + " & " + " & ".join(cols) + r" \\", r"\midrule"]
        for row in table.rows:
            cells = []
            for c in table.columns:
                cell = row.cells[c]
                text = _tex(cell.note) if cell.note else fmt_value(cell.value)
                if cell.best:
                    text = rf"\textbf{{{text}}}"
                if cell.value is not None and cell.spread is not None:
                    text += rf" {{\scriptsize $\pm$ {fmt_value(cell.spread)}}}"
                if cell.flag and (cell.value is not None or cell.note):
                    text += rf" {{\scriptsize ({_tex(cell.flag)})}}"
                cells.append(text)
            lines.append(_tex(row.label) + " & " + " & ".join(cells + extra_cells(table, row)) + r" \\")
        caption = _tex(table.heading) + ("" if not table.notes else ". " + _tex(" ".join(table.notes)))
        lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{caption}}}", r"\end{table}"]
        if table.differences:
            lines += ["", r"\begin{table}[t]", r"\centering", r"\begin{tabular}{llrrrll}", r"\toprule",
                      " & ".join(_tex(h) for h in DIFFERENCE_HEADER) + r" \\", r"\midrule"]
            lines += [" & ".join(_tex(c) for c in difference_cells(d)) + r" \\" for d in table.differences]
            lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{_tex(difference_title(table))}}}",
                      r"\end{table}"]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


# ---- json --------------------------------------------------------------------------------------------------

def cell_dict(cell: Cell) -> dict[str, Any]:
    low = None if cell.half_width is None else cell.value - cell.half_width
    high = None if cell.half_width is None else cell.value + cell.half_width
    data = {"value": cell.value, "stderr": cell.stderr, "n": cell.n, "best": cell.best, "seeds": cell.seeds,
            "ci_low": low, "ci_high": high, "values": cell.values}
    if cell.note:
        data["note"] = cell.note
    if cell.flag:
        data["flag"] = cell.flag
    return data


def table_dict(t: TaskTable) -> dict[str, Any]:
    return {
        "task": t.task, "title": t.heading, "kind": t.kind, "primary_metric": t.primary,
        "columns": [{"name": c, "label": t.column_label(c), "higher_is_better": t.higher_is_better[c]}
                    for c in t.columns],
        "rows": [{"label": r.label, "encoding": r.encoding, "run_id": r.run_id, "path": r.path, "seed": r.seed,
                  "seeds": r.seeds, "settings": r.settings, "runs": [str(run.path) for run in r.runs],
                  "train_s": r.train_s, "metrics": {c: cell_dict(r.cells[c]) for c in t.columns}} for r in t.rows],
        "notes": t.notes,
        "against": t.against,
        "differences": [{"label": d.label, "metric": d.metric, "higher_is_better": d.higher_is_better,
                         "verdict": d.verdict, **d.difference.to_dict()} for d in t.differences],
    }


def to_json(report: Report) -> str:
    data = {"tables": [table_dict(t) for t in report.tables],
            "skipped": [{"path": str(p.path), "reason": p.reason} for p in report.problems]}
    if report.warnings:
        data["warnings"] = list(report.warnings)
    return json.dumps(data, indent=2, default=str) + "\n"


def render_text(report: Report, fmt: str) -> str:
    formatters = {"markdown": to_markdown, "csv": to_csv, "latex": to_latex, "json": to_json}
    if fmt not in formatters:
        raise ResultError(f"unknown format '{fmt}'; formats: {', '.join(FORMATS)}")
    return formatters[fmt](report)
