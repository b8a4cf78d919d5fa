"""How ``posbench ls`` draws: each listing one table when it fits the console, else the table without its long
column, which follows as one wrapped line per row; and what a task's presets are, row by row (``preset_rows``),
from the catalog alone unless a task beyond it may be registered. Shared by ``posbench.cli.ls`` (the listings) and
``posbench.cli.ls_detail`` (one of them, in full)."""

from __future__ import annotations

from typing import Any

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from posbench import catalog
from posbench.cli.common import kv
from posbench.registry import beyond_catalog, built_in


def plain_table(headers: list[str], rows: list[list[str]], wrap: bool = True) -> Table:
    table = Table()
    for name in headers:
        table.add_column(Text(name), no_wrap=not wrap)
    for row in rows:
        table.add_row(*[Text(str(c)) for c in row])
    return table


def fits(table: Table, width: int) -> bool:
    """Whether ``table`` is drawn whole within ``width`` (as ``report.terminal.fits`` measures; the report package
    reads records, which ``ls`` has none of)."""
    console = Console(width=100_000)
    return Measurement.get(console, console.options, table).maximum <= width


def named_lines(pairs: list[tuple[str, str]]) -> list[RenderableType]:
    return [Text.assemble((f"  {name}: ", "bold"), text) for name, text in pairs]


def listing(title: str, headers: list[str], rows: list[list[str]], width: int) -> list[RenderableType]:
    """The whole table if it fits; else the table without its last column, which follows as lines."""
    full = plain_table(headers, rows, wrap=False)
    if fits(full, width):
        return [Text(title, style="bold"), full]
    short = plain_table(headers[:-1], [r[:-1] for r in rows])
    return [Text(title, style="bold"), short, Text(f"{headers[-1]}:", style="bold"),
            *named_lines([(r[0], r[-1]) for r in rows])]


def task_entry(name: str) -> dict[str, Any]:
    """What ``posbench.cli.ls.entries`` says of one task, or of the benchmark (``bench``)."""
    if name == catalog.BENCH["name"]:
        return catalog.BENCH
    if not beyond_catalog("task") and name in built_in("task"):
        return built_in("task")[name]
    from posbench.runs.config import task_class     # a task beyond the catalog: its class (torch)
    from posbench.tasks.presets import catalog_summary  # as above: the task's package (torch)

    return catalog_summary(task_class(name))


def fmt_seconds(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def fmt_expected(expected: Any) -> str:
    """A preset's optional ``expected`` key (see ``posbench/tasks/base.py``) in a few words; ``-`` without."""
    if not isinstance(expected, dict) or not isinstance(expected.get("seconds"), (int, float)):
        return "-"
    text = fmt_seconds(float(expected["seconds"]))
    if expected.get("hardware"):
        text += f" on {expected['hardware']}"
    if expected.get("how"):
        text += f" ({expected['how']})"
    return text


def preset_rows(name: str) -> list[dict[str, str]]:
    entry = task_entry(name)
    base_model, base_train = catalog.MODEL["defaults"], catalog.TRAIN["defaults"]
    rows = []
    for preset, sections in entry["presets"].items():
        model = {**base_model, **sections.get("model", {})}
        train = {**base_train, **sections.get("train", {})}
        shape = f"{model['n_layers']}L x {model['d_model']}d, {model['n_heads']}h" + (
            f", ff {model['d_ff']}" if model["d_ff"] else "")
        seq = str(model["max_seq_len"]) if model["max_seq_len"] else "auto"
        expected = sections.get("expected")
        note = expected.get("note") if isinstance(expected, dict) else None
        rows.append({
            "task": name, "preset": preset + ("*" if preset == entry["default_preset"] else ""),
            "model": shape + f", seq {seq}", "shape": shape, "seq": seq,
            "train": f"{train['steps']} steps, batch {train['batch_size']}, lr {train['lr']:g}",
            "steps": f"{train['steps']} x {train['batch_size']}", "lr": f"{train['lr']:g}",
            "expected": fmt_expected(expected), "note": f"; {note}" if note else "",
            "time": fmt_seconds(float(expected["seconds"])) if fmt_expected(expected) != "-" else "-",
            "options": kv({**entry["defaults"], **sections.get("task", {})}),
        })
    return rows
