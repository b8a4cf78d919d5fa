"""``posbench ls``: list encodings, tasks and presets."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from posbench.commands.common import kv, out, user_errors

LS_EPILOG = """[bold]Examples[/bold]

  posbench ls

  posbench ls encodings

  posbench ls presets
"""

LS_KINDS = ("encodings", "tasks", "presets")


def ls(what: Optional[str] = typer.Argument(None, help="encodings, tasks or presets (default: all).")) -> None:
    """List encodings, tasks and presets: name, description, origin (built-in or plugin), key defaults."""
    with user_errors():
        if what is not None and what not in LS_KINDS:
            from posbench.registry import UnknownNameError

            raise UnknownNameError("listing", what, list(LS_KINDS))
        kinds = [what] if what else list(LS_KINDS)
        console = out()
        for kind in kinds:
            console.print({"encodings": encodings_table, "tasks": tasks_table, "presets": presets_table}[kind]())


def encodings_table() -> Table:
    from posbench.encodings import ENCODINGS

    table = Table(title="encodings", title_justify="left")
    for col in ("name", "description", "origin", "options (defaults)"):
        table.add_column(col)
    for name in ENCODINGS:
        cls = ENCODINGS[name]
        table.add_row(name, cls.description, ENCODINGS.origin(name), kv(cls.defaults))
    return table


def tasks_table() -> Table:
    from posbench.tasks import TASKS

    table = Table(title="tasks", title_justify="left")
    for col in ("name", "description", "origin", "presets", "options (defaults)"):
        table.add_column(col)
    for name in TASKS:
        cls = TASKS[name]
        presets = ", ".join(f"{p}*" if p == cls.default_preset else p for p in cls.presets)
        table.add_row(name, cls.description, TASKS.origin(name), presets, kv(cls.options))
    return table


def presets_table() -> Table:
    from posbench.config import model_defaults, train_defaults
    from posbench.tasks import TASKS

    table = Table(title="presets (* default; every key can be changed with --set section.key=value)",
                  title_justify="left")
    for col in ("task", "preset", "model", "train", "task options"):
        table.add_column(col)
    base_model, base_train = model_defaults(), train_defaults()
    for name in TASKS:
        cls = TASKS[name]
        for preset, sections in cls.presets.items():
            model = {**base_model, **sections.get("model", {})}
            train = {**base_train, **sections.get("train", {})}
            model_text = (f"{model['n_layers']}L x {model['d_model']}d, {model['n_heads']} heads"
                          + (f", ff {model['d_ff']}" if model["d_ff"] else "")
                          + (f", seq {model['max_seq_len']}" if model["max_seq_len"] else ""))
            train_text = f"{train['steps']} steps, batch {train['batch_size']}, lr {train['lr']:g}"
            table.add_row(name, preset + ("*" if preset == cls.default_preset else ""), model_text, train_text,
                          kv({**cls.options, **sections.get("task", {})}))
    return table
