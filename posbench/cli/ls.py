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
from rich.table import Table
from rich.text import Text

from posbench.cli.common import kv, out, user_errors

LS_EPILOG = """[bold]Examples[/bold]

  posbench ls

  posbench ls encodings

  posbench ls encodings rope          (its options: default, range, help)

  posbench ls tasks arithmetic        (its options, version and presets)

  posbench ls presets
"""

LS_KINDS = ("encodings", "tasks", "presets", "methods")


def ls(words: Optional[list[str]] = typer.Argument(
        None, metavar="WHAT [NAME]", help="WHAT: encodings, tasks, presets or methods (default: all); NAME: one "
        "encoding, task or method, its options in full (a task's presets with 'presets').")) -> None:
    """List encodings, tasks, presets and extension methods: name, description, origin (built-in or plugin), key
    defaults, each preset's expected time. With a NAME: that one's every option (default, range, help)."""
    with user_errors():
        from posbench.errors import ConfigError
        from posbench.registry import UnknownNameError

        if words and len(words) > 2:
            raise ConfigError(f"ls takes WHAT and NAME at most; got {' '.join(words)}")
        what, name = ([*(words or []), None, None])[:2]

        if what is not None and what not in LS_KINDS:
            raise UnknownNameError("listing", what, list(LS_KINDS))
        console = out()
        if name is not None:
            if what not in DETAILS:
                raise UnknownNameError("listing with a name", str(what), list(DETAILS))
            for item in DETAILS[what](name):
                console.print(item, soft_wrap=False)
            return
        kinds = [what] if what else list(LS_KINDS)
        listings = {"encodings": encodings_listing, "tasks": tasks_listing, "presets": presets_listing,
                    "methods": methods_listing}
        for kind in kinds:
            for item in listings[kind](console.width):
                console.print(item, soft_wrap=False)


def _table(headers: list[str], rows: list[list[str]], wrap: bool = True) -> Table:
    table = Table()
    for name in headers:
        table.add_column(Text(name), no_wrap=not wrap)
    for row in rows:
        table.add_row(*[Text(str(c)) for c in row])
    return table


def _fits(table: Table, width: int) -> bool:
    from posbench.report.terminal import fits

    return fits(table, width)


def _lines(pairs: list[tuple[str, str]]) -> list[RenderableType]:
    return [Text.assemble((f"  {name}: ", "bold"), text) for name, text in pairs]


def _listing(title: str, headers: list[str], rows: list[list[str]], width: int) -> list[RenderableType]:
    """The whole table if it fits; else the table without its last column, which follows as lines."""
    full = _table(headers, rows, wrap=False)
    if _fits(full, width):
        return [Text(title, style="bold"), full]
    short = _table(headers[:-1], [r[:-1] for r in rows])
    return [Text(title, style="bold"), short, Text(f"{headers[-1]}:", style="bold"),
            *_lines([(r[0], r[-1]) for r in rows])]


def encodings_listing(width: int) -> list[RenderableType]:
    from posbench.encodings import ENCODINGS

    rows = [[name, ENCODINGS[name].description, ENCODINGS.origin(name), kv(ENCODINGS[name].defaults())]
            for name in ENCODINGS]
    return _listing("encodings", ["name", "description", "origin", "options (defaults)"], rows, width)


def tasks_listing(width: int) -> list[RenderableType]:
    from posbench.tasks import TASKS
    from posbench.tasks.presets import presets_of

    rows = []
    for name in TASKS:
        cls = TASKS[name]
        presets = ", ".join(f"{p}*" if p == cls.default_preset else p for p in presets_of(cls))
        rows.append([name, cls.description, TASKS.origin(name), presets, kv(cls.defaults())])
    return _listing("tasks", ["name", "description", "origin", "presets", "options (defaults)"], rows, width)


def methods_listing(width: int) -> list[RenderableType]:
    from posbench.hf.methods import METHODS

    rows = [[name, METHODS[name].description, kv(METHODS[name].defaults())] for name in METHODS]
    return _listing("methods (posbench extend --method)", ["name", "description", "options (defaults)"], rows,
                    width)


# ---- one of them, in full ------------------------------------------------------------------------------------

def option_rows(cls: Any) -> list[list[str]]:
    """One row per declared option: name, default, valid range, help."""
    from posbench.options import declared

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
                                  *_lines(facts)]
    rows = option_rows(cls)
    if not rows:
        return head + [Text("  no options")]
    return head + _listing("options", ["option", "default", "range", "help"], rows, out().width)[1:]


def encoding_detail(name: str) -> list[RenderableType]:
    from posbench.encodings import ENCODINGS

    cls = ENCODINGS.get(name)
    return detail("encoding", cls, [("origin", f"{ENCODINGS.origin(name)}, {cls.__module__}.{cls.__qualname__}"),
                                    ("set with", f"--{name}-KEY VALUE (run's flag; --KEY too where no task, train or model "
                                                 f"setting has the name: --eps is AdamW's), --set encoding.KEY=VALUE, "
                                                 "or ModelConfig(encoding_options=...)")])


def task_detail(name: str) -> list[RenderableType]:
    from posbench.errors import ConfigError
    from posbench.runs.config import BENCH
    from posbench.tasks import TASKS
    from posbench.tasks.presets import presets_of

    if name == BENCH:
        raise ConfigError("bench is not a task: 'posbench bench --help' lists its settings, 'posbench ls presets "
                          "bench' its presets")
    cls = TASKS.get(name)
    presets = ", ".join(f"{p}*" if p == cls.default_preset else p for p in presets_of(cls)) or "none"
    return detail("task", cls, [("origin", f"{TASKS.origin(name)}, {cls.__module__}.{cls.__qualname__}"),
                                ("version", str(cls.version)), ("presets", f"{presets} (* the default)"),
                                ("set with", "--set task.KEY=VALUE")])


def method_detail(name: str) -> list[RenderableType]:
    from posbench.hf.methods import METHODS

    cls = METHODS.get(name)
    return detail("method", cls, [("trains", "yes" if cls.trains else "nothing (--steps 0)"),
                                  ("set with", "--set method.KEY=VALUE")])


def presets_detail(name: str) -> list[RenderableType]:
    from posbench.runs.config import BENCH
    from posbench.tasks import TASKS
    from posbench.tasks.presets import presets_of

    if name not in TASKS and name != BENCH:
        holders = [task for task in sorted(TASKS) if name in presets_of(TASKS[task])]
        if holders:
            from posbench.errors import ConfigError

            raise ConfigError(f"'{name}' is a preset, not a task: 'posbench ls presets TASK' shows a task's presets "
                              f"(the tasks with a '{name}': {', '.join(holders)}); 'posbench ls presets' shows every "
                              f"task's")
    rows = preset_rows(name)
    table = _table(["preset", "model", "seq", "steps x batch", "lr", "time"],
                   [[r["preset"], r["shape"], r["seq"], r["steps"], r["lr"], r["time"]] for r in rows])
    tiny = "; tiny is a smoke test: its numbers do not compare encodings" if any(
        r["preset"].rstrip("*") == "tiny" for r in rows) else ""
    return [Text(f"presets of task {name} (* default{tiny})", style="bold"), table,
            *_lines([(r["preset"], f"expected {r['expected']}{r['note']}; task options: {r['options']}")
                     for r in rows])]


DETAILS = {"encodings": encoding_detail, "tasks": task_detail, "methods": method_detail, "presets": presets_detail}


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


PRESETS_TITLE = ("presets (* default; tiny is a smoke test: its numbers do not compare encodings; every key can be "
                 "changed with --set section.key=value)")


def preset_rows(name: str) -> list[dict[str, str]]:
    from posbench.runs.config import model_defaults, task_class, train_defaults
    from posbench.tasks.presets import presets_of

    cls = task_class(name)
    base_model, base_train = model_defaults(), train_defaults()
    rows = []
    for preset, sections in presets_of(cls).items():
        model = {**base_model, **sections.get("model", {})}
        train = {**base_train, **sections.get("train", {})}
        shape = f"{model['n_layers']}L x {model['d_model']}d, {model['n_heads']}h" + (
            f", ff {model['d_ff']}" if model["d_ff"] else "")
        seq = str(model["max_seq_len"]) if model["max_seq_len"] else "auto"
        expected = sections.get("expected")
        note = expected.get("note") if isinstance(expected, dict) else None
        rows.append({
            "task": name, "preset": preset + ("*" if preset == cls.default_preset else ""),
            "model": shape + f", seq {seq}", "shape": shape, "seq": seq,
            "train": f"{train['steps']} steps, batch {train['batch_size']}, lr {train['lr']:g}",
            "steps": f"{train['steps']} x {train['batch_size']}", "lr": f"{train['lr']:g}",
            "expected": fmt_expected(expected), "note": f"; {note}" if note else "",
            "time": fmt_seconds(float(expected["seconds"])) if fmt_expected(expected) != "-" else "-",
            "options": kv({**cls.defaults(), **sections.get("task", {})}),
        })
    return rows


def presets_listing(width: int) -> list[RenderableType]:
    """One table of every task's presets when it fits; else a compact table per task, each preset's expected
    time and hardware and its task options as lines below it."""
    from posbench.runs.config import BENCH
    from posbench.tasks import TASKS

    headers = ["task", "preset", "model", "train", "expected time", "task options"]
    keys = ["task", "preset", "model", "train", "expected", "options"]
    owners = [*TASKS, BENCH]                      # bench's presets too (posbench bench --size)
    every = [row for name in owners for row in preset_rows(name)]
    full = _table(headers, [[r[k] for k in keys] for r in every], wrap=False)
    if _fits(full, width):
        return [Text(PRESETS_TITLE, style="bold"), full]
    out: list[RenderableType] = [Text(PRESETS_TITLE, style="bold")]
    for name in owners:
        rows = preset_rows(name)
        table = _table(["preset", "model", "seq", "steps x batch", "lr", "time"],
                       [[r["preset"], r["shape"], r["seq"], r["steps"], r["lr"], r["time"]] for r in rows])
        out += [Text(f"{name}", style="bold"), table,
                *_lines([(r["preset"], f"expected {r['expected']}{r['note']}; task options: {r['options']}")
                         for r in rows])]
    return out
