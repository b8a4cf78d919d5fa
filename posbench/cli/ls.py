"""``posbench ls``: list encodings, tasks, presets and extension methods; ``posbench ls KIND NAME`` shows one of
them with every option it declares (default, valid range, help).

Each listing is one table when it fits the console; when it does not (a pipe or an 80-column terminal),
the long column (options) leaves the table and follows it as one wrapped line per row, so that no row is
cut or spread over many lines.
"""

from __future__ import annotations

from typing import Any, Optional

import typer
from rich.console import RenderableType
from rich.text import Text

from posbench import catalog
from posbench.catalog_entry import summary_of
from posbench.cli.common import kv, out, user_errors
from posbench.cli.listing import fits, listing, named_lines, plain_table, preset_rows, task_entry
from posbench.errors import ConfigError
from posbench.registry import UnknownNameError, beyond_catalog, built_in, registry_of

LS_EPILOG = """[bold]Examples[/bold]

  posbench ls

  posbench ls encodings

  posbench ls encodings rope          (its options: default, range, help)

  posbench ls tasks arithmetic        (its options, version and presets)

  posbench ls presets
"""

LS_KINDS = ("encodings", "tasks", "presets", "methods")
DETAIL_KINDS = ("encodings", "tasks", "methods", "presets")        # with a NAME (posbench.cli.ls_detail.DETAILS)


def ls(words: Optional[list[str]] = typer.Argument(
        None, metavar="WHAT [NAME]", help="WHAT: encodings, tasks, presets or methods (default: all); NAME: one "
        "encoding, task or method, its options in full (a task's presets with 'presets').")) -> None:
    """List encodings, tasks, presets and extension methods: name, description, origin (built-in or plugin), key
    defaults, each preset's expected time. With a NAME: that one's every option (default, range, help)."""
    with user_errors():
        if words and len(words) > 2:
            raise ConfigError(f"ls takes WHAT and NAME at most; got {' '.join(words)}")
        what, name = ([*(words or []), None, None])[:2]

        if what is not None and what not in LS_KINDS:
            raise UnknownNameError("listing", what, list(LS_KINDS))
        console = out()
        if name is not None:
            if what not in DETAIL_KINDS:
                raise UnknownNameError("listing with a name", str(what), list(DETAIL_KINDS))
            from posbench.cli.ls_detail import DETAILS  # torch: a NAME is shown from its class itself

            for item in DETAILS[what](name):
                console.print(item, soft_wrap=False)
            return
        kinds = [what] if what else list(LS_KINDS)
        listings = {"encodings": encodings_listing, "tasks": tasks_listing, "presets": presets_listing,
                    "methods": methods_listing}
        for kind in kinds:
            for item in listings[kind](console.width):
                console.print(item, soft_wrap=False)


def entries(kind: str) -> list[tuple[str, dict[str, Any], str]]:
    """Every registered ``kind`` (encoding, task, method): name, what the catalog says of it (``summary_of``) and
    its origin. The catalog alone, importing nothing, unless a class beyond it may be registered (a plugin, a file
    dropped into a folder: ``registry.beyond_catalog``); then the registry, every class imported."""
    if not beyond_catalog(kind):
        return [(name, entry, "built-in") for name, entry in built_in(kind).items()]
    registry = registry_of(kind)
    return [(name, task_entry(name) if kind == "task" else summary_of(registry[name]), registry.origin(name))
            for name in registry]


def presets_line(entry: dict[str, Any]) -> str:
    return ", ".join(f"{p}*" if p == entry["default_preset"] else p for p in entry["presets"])


def encodings_listing(width: int) -> list[RenderableType]:
    rows = [[name, e["description"], origin, kv(e["defaults"])] for name, e, origin in entries("encoding")]
    return listing("encodings", ["name", "description", "origin", "options (defaults)"], rows, width)


def tasks_listing(width: int) -> list[RenderableType]:
    rows = [[name, e["description"], origin, presets_line(e), kv(e["defaults"])]
            for name, e, origin in entries("task")]
    return listing("tasks", ["name", "description", "origin", "presets", "options (defaults)"], rows, width)


def methods_listing(width: int) -> list[RenderableType]:
    rows = [[name, e["description"], kv(e["defaults"])] for name, e, _ in entries("method")]
    return listing("methods (posbench extend --method)", ["name", "description", "options (defaults)"], rows, width)


PRESETS_TITLE = ("presets (* default; tiny is a smoke test: its numbers do not compare encodings; every key can be "
                 "changed with --set section.key=value)")


def presets_listing(width: int) -> list[RenderableType]:
    """One table of every task's presets when it fits; else a compact table per task, each preset's expected
    time and hardware and its task options as lines below it."""
    headers = ["task", "preset", "model", "train", "expected time", "task options"]
    keys = ["task", "preset", "model", "train", "expected", "options"]
    owners = [name for name, _, _ in entries("task")] + [catalog.BENCH["name"]]     # bench's presets too (posbench bench --size)
    every = [row for name in owners for row in preset_rows(name)]
    full = plain_table(headers, [[r[k] for k in keys] for r in every], wrap=False)
    if fits(full, width):
        return [Text(PRESETS_TITLE, style="bold"), full]
    out: list[RenderableType] = [Text(PRESETS_TITLE, style="bold")]
    for name in owners:
        rows = preset_rows(name)
        table = plain_table(["preset", "model", "seq", "steps x batch", "lr", "time"],
                            [[r["preset"], r["shape"], r["seq"], r["steps"], r["lr"], r["time"]] for r in rows])
        out += [Text(f"{name}", style="bold"), table,
                *named_lines([(r["preset"], f"expected {r['expected']}{r['note']}; task options: {r['options']}")
                              for r in rows])]
    return out
