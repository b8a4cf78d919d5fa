"""``compare --html FILE``: the whole report as one self-contained HTML file.

Tables, notes, paired differences, every figure (PNG embedded as base64 ``data:`` URIs) and every run's
provenance (command, commit, device, precision, seed, times, directory). No script, no external style sheet,
font or image: the file opens offline in any browser and can be mailed or attached as it is.
"""

from __future__ import annotations

import base64
import html
import shlex
from datetime import datetime, timezone
from typing import Any

from posbench.report.figures import pyplot, png_bytes, table_figures
from posbench.report.formats import (DIFFERENCE_HEADER, column_header, difference_cells, difference_title,
                                     extra_cells, extra_columns, fmt_cell)
from posbench.report.structure import Report, TaskTable
from posbench.runs.record import RunRecord

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem auto; max-width: 72rem;
       padding: 0 1rem; color: #1b1b1b; line-height: 1.4; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; margin-top: 2.2rem; border-bottom: 1px solid #ddd; }
h3 { font-size: 1rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: 0.6rem 0; font-size: 0.85rem; }
th, td { border: 1px solid #d0d0d0; padding: 0.25rem 0.55rem; white-space: nowrap; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.best { font-weight: 700; color: #126b2a; }
p.note { color: #555; font-size: 0.85rem; margin: 0.2rem 0; }
figure { margin: 1rem 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.8rem; color: #555; }
table.provenance td { font-size: 0.78rem; }
td.wrap { white-space: normal; min-width: 14rem; max-width: 28rem; overflow-wrap: break-word; }
"""


def _e(text: Any) -> str:
    return html.escape("" if text is None else str(text))


def _cell(text: Any, cls: str) -> str:
    """A table cell. Cells never break inside a word; a ``wrap`` cell (a command, a path) breaks between words
    and after each ``/``."""
    shown = _e(text).replace("/", "/<wbr>") if "wrap" in cls.split() else _e(text)
    return f'<td class="{cls}">{shown}</td>'


def _table(headers: list[str], rows: list[list[tuple[str, str]]], cls: str = "") -> str:
    """``rows``: lists of (text, css class)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(t, c) for t, c in row) + "</tr>" for row in rows)
    return f'<div class="scroll"><table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def metrics_html(table: TaskTable) -> str:
    headers = [table.row_header, *[column_header(table, c) for c in table.columns], *extra_columns(table)]
    rows = []
    for row in table.rows:
        cells = [(row.label, "")]
        cells += [(fmt_cell(row.cells[c]), "num best" if row.cells[c].best else "num") for c in table.columns]
        cells += [(text, "num") for text in extra_cells(table, row)]
        rows.append(cells)
    return _table(headers, rows, "metrics")


def differences_html(table: TaskTable) -> str:
    if not table.differences:
        return ""
    rows = [[(t, "num" if 2 <= i <= 4 else "") for i, t in enumerate(difference_cells(d))]
            for d in table.differences]
    return f"<h3>{_e(difference_title(table))}</h3>" + _table([h or "verdict" for h in DIFFERENCE_HEADER], rows,
                                                               "differences")


def figures_html(table: TaskTable) -> str:
    plt = pyplot()
    parts = []
    for stem, fig in table_figures(table):
        data = base64.b64encode(png_bytes(fig)).decode("ascii")
        plt.close(fig)
        parts.append(f'<figure><img alt="{_e(stem)}" src="data:image/png;base64,{data}">'
                     f"<figcaption>{_e(stem)}</figcaption></figure>")
    return "".join(parts)


def _command(run: RunRecord) -> str:
    return shlex.join(str(c) for c in run.command) if run.command else "-"


def provenance_rows(report: Report) -> list[list[tuple[str, str]]]:
    seen, rows = set(), []
    for table in report.tables:
        for run in table.runs:
            if run.path in seen:
                continue
            seen.add(run.path)
            pb, env = run.posbench, run.environment
            commit = str(pb.get("git_commit") or "-")[:12] + (" (dirty)" if pb.get("git_dirty") else "")
            device = " ".join(str(x) for x in (env.get("device"), env.get("device_name")) if x) or "-"
            if run.bench is not None:
                device = str(run.bench.get("device_name") or device)
            seed = run.seed if run.seed is not None else "-"
            rows.append([(run.task, ""), (run.encoding, ""), (seed, "num"), (run.run_id, ""),
                         (_command(run), "wrap"), (commit, ""), (device, ""), (env.get("precision", "-"), ""),
                         (env.get("torch", "-"), ""), (run.finished or "-", ""), (str(run.path), "wrap")])
    return rows


def to_html(report: Report, *, source: str = "", command: str = "") -> str:
    made = datetime.now(timezone.utc).isoformat(timespec="seconds")
    body = [f"<h1>posbench report</h1><p class=\"note\">{_e(source)} &middot; made {_e(made)}"
            + (f" with <code>{_e(command)}</code>" if command else "") + "</p>"]
    for table in report.tables:
        body.append(f"<section><h2>{_e(table.heading)}</h2>")
        body.append(metrics_html(table))
        body += [f'<p class="note">{_e(n)}</p>' for n in table.notes]
        body.append(differences_html(table))
        body.append(figures_html(table))
        body.append("</section>")
    body.append("<section><h2>provenance</h2>")
    body.append(_table(["task", "encoding", "seed", "run", "command", "commit", "device", "precision", "torch",
                        "finished", "directory"], provenance_rows(report), "provenance"))
    if report.problems:
        body.append("<h3>skipped (unreadable) runs</h3><ul>"
                    + "".join(f"<li>{_e(p.path)}: {_e(p.reason)}</li>" for p in report.problems) + "</ul>")
    body.append("</section>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            "<link rel=\"icon\" href=\"data:,\">"
            f"<title>posbench report</title><style>{STYLE}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")
