"""Every command option is declared once (issue 50, item 2): a long flag is written in one ``typer.Option`` in all of
``posbench/cli`` (the shared ones in ``posbench/cli/shared_options.py``), there are at most 30 ``typer.Option`` /
``typer.Argument`` calls there, and an option several commands take has the same help in each."""

from __future__ import annotations

import ast
from collections import Counter, defaultdict
from pathlib import Path

import click
import typer

import posbench.cli
from posbench.cli.app import app

CLI = Path(posbench.cli.__file__).parent
MOST = 34          # 30 after issue 50; issue 56 added analyze's --factors and --tokens, compare's --eff; 59 --version


def declarations() -> list[tuple[str, list[str]]]:
    """(file, the declared names) of every ``typer.Option`` / ``typer.Argument`` call in posbench/cli."""
    found = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("Option", "Argument") and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id == "typer":
                names = [part for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                         for part in arg.value.split("/") if part.startswith("-")]
                found.append((path.name, names))
    return found


def test_at_most_30_options_and_arguments():
    count = len(declarations())
    assert 0 < count <= MOST, f"{count} typer.Option / typer.Argument calls in posbench/cli (at most {MOST})"


def test_no_long_flag_is_declared_twice():
    counts = Counter(name for _, names in declarations() for name in names if name.startswith("--"))
    twice = {name: n for name, n in counts.items() if n > 1}
    assert not twice, f"declared more than once (declare it once in posbench/cli/shared_options.py): {twice}"


def test_a_shared_option_reads_the_same_in_every_command():
    """Built as the app builds it: every command's --quiet, --set, --dry-run, ... has one help, one default, one
    set of names (the help ``run`` and ``extend`` fill from the registries is filled only when shown)."""
    seen: dict[str, dict[tuple, list[str]]] = defaultdict(lambda: defaultdict(list))
    group = typer.main.get_command(app)
    for command_name in group.list_commands(click.Context(group)):
        command = group.get_command(click.Context(group), command_name)
        for param in command.params:
            for name in param.opts:
                if name.startswith("--"):
                    facts = (tuple(param.opts), tuple(param.secondary_opts), getattr(param, "help", None))
                    seen[name][facts].append(command_name)
    shared = {name: variants for name, variants in seen.items() if sum(map(len, variants.values())) > 1}
    assert {"--quiet", "--set", "--dry-run", "--device", "--out", "--encoding", "--task", "--preset"} <= set(shared)
    differ = {name: dict(variants) for name, variants in shared.items() if len(variants) > 1}
    assert not differ, f"options whose names or help differ between commands: {differ}"
    assert set(seen["--quiet"][next(iter(seen["--quiet"]))]) == {"run", "extend", "bench", "check", "sweep"}
