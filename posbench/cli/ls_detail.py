"""``posbench ls KIND NAME``: one encoding, task or method with every option it declares (default, valid range,
help), or one task's presets. It reads the classes themselves (torch): ``posbench ls`` imports this module only when
a NAME is given."""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.text import Text

from posbench.cli.common import out
from posbench.cli.listing import listing, named_lines, plain_table, preset_rows
from posbench.encodings import ENCODINGS
from posbench.errors import ConfigError
from posbench.hf.methods import METHODS
from posbench.options import declared
from posbench.runs.config import BENCH
from posbench.tasks import TASKS
from posbench.tasks.presets import presets_of


def option_rows(cls: Any) -> list[list[str]]:
    """One row per declared option: name, default, valid range, help."""
    return [[key, "(the task gives it)" if o.from_task else show(o.default), o.describe(), o.help]
            for key, o in declared(cls).items()]


def show(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(show(v) for v in value) or "(empty)"
    if isinstance(value, float):
        return f"{value:g}"
    return repr(value) if value == "" else str(value)


def detail(kind: str, cls: Any, facts: list[tuple[str, str]]) -> list[RenderableType]:
    """The title, the facts, and the options: one table if it fits, else the table without the help, which
    follows it as one line per option."""
    head: list[RenderableType] = [Text.assemble((f"{kind} {cls.name}", "bold"), f": {cls.description}"),
                                  *named_lines(facts)]
    rows = option_rows(cls)
    if not rows:
        return head + [Text("  no options")]
    return head + listing("options", ["option", "default", "range", "help"], rows, out().width)[1:]


def encoding_detail(name: str) -> list[RenderableType]:
    cls = ENCODINGS.get(name)
    return detail("encoding", cls, [("origin", f"{ENCODINGS.origin(name)}, {cls.__module__}.{cls.__qualname__}"),
                                    ("set with", f"--{name}-KEY VALUE (run's flag; --KEY too where no task, train or model "
                                                 f"setting has the name: --eps is AdamW's), --set encoding.KEY=VALUE, "
                                                 "or ModelConfig(encoding_options=...)")])


def task_detail(name: str) -> list[RenderableType]:
    if name == BENCH:
        raise ConfigError("bench is not a task: 'posbench bench --help' lists its settings, 'posbench ls presets "
                          "bench' its presets")
    cls = TASKS.get(name)
    presets = ", ".join(f"{p}*" if p == cls.default_preset else p for p in presets_of(cls)) or "none"
    return detail("task", cls, [("origin", f"{TASKS.origin(name)}, {cls.__module__}.{cls.__qualname__}"),
                                ("version", str(cls.version)), ("presets", f"{presets} (* the default)"),
                                ("set with", "--set task.KEY=VALUE")])


def method_detail(name: str) -> list[RenderableType]:
    cls = METHODS.get(name)
    return detail("method", cls, [("trains", "yes" if cls.trains else "nothing (--steps 0)"),
                                  ("set with", "--set method.KEY=VALUE")])


def presets_detail(name: str) -> list[RenderableType]:
    if name not in TASKS and name != BENCH:
        holders = [task for task in sorted(TASKS) if name in presets_of(TASKS[task])]
        if holders:
            raise ConfigError(f"'{name}' is a preset, not a task: 'posbench ls presets TASK' shows a task's presets "
                              f"(the tasks with a '{name}': {', '.join(holders)}); 'posbench ls presets' shows every "
                              f"task's")
    rows = preset_rows(name)
    table = plain_table(["preset", "model", "seq", "steps x batch", "lr", "time"],
                        [[r["preset"], r["shape"], r["seq"], r["steps"], r["lr"], r["time"]] for r in rows])
    tiny = "; tiny is a smoke test: its numbers do not compare encodings" if any(
        r["preset"].rstrip("*") == "tiny" for r in rows) else ""
    return [Text(f"presets of task {name} (* default{tiny})", style="bold"), table,
            *named_lines([(r["preset"], f"expected {r['expected']}{r['note']}; task options: {r['options']}")
                          for r in rows])]


DETAILS = {"encodings": encoding_detail, "tasks": task_detail, "methods": method_detail, "presets": presets_detail}
