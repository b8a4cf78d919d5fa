"""The ``posbench`` command line: thin. Parses, calls the library, renders with rich.

Each command is a function in its own module of ``posbench/cli/`` (``run``, ``ls``, ``compare``, ``score``...),
registered on ``app`` below. Every error is one line on stderr, printed by ``cli.common.print_error``:
exit code 2 for bad input, 1 for the machine (disk full, permission, a lost process) and for a non-finite loss
(``cli.common.user_errors``); Ctrl-C says how to resume and exits 130.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import typer
from typer.core import TyperCommand, TyperGroup

import posbench
from posbench.cli import setting_flags
from posbench.cli.common import err, out, print_error, user_errors
from posbench.cli.suggestions import meant
from posbench.registry import add_plugins, plugin_names
from posbench.runs.code import capture

#: every command, in the order ``posbench --help`` lists them: name -> (its module in ``posbench/cli/``, the name of
#: its epilog there, the name of its command class in ``setting_flags`` or None). A command's module is imported
#: only when the command runs or shows its own help (``LazyCommands``): ``posbench --help`` imports none of them
COMMANDS = {
    "run": ("run", "RUN_EPILOG", "RunCommand"),
    "ls": ("ls", "LS_EPILOG", None),
    "extend": ("extend", "EXTEND_EPILOG", "ExtendCommand"),
    "compare": ("compare", "COMPARE_EPILOG", None),
    "score": ("score", "SCORE_EPILOG", None),
    "bench": ("bench", "BENCH_EPILOG", "BenchCommand"),
    "export": ("export", "EXPORT_EPILOG", None),
    "sweep": ("sweep", "SWEEP_EPILOG", "SweepCommand"),
    "check": ("check", "CHECK_EPILOG", None),
    "analyze": ("analyze", "ANALYZE_EPILOG", None),
}


class LazyCommands(TyperGroup):
    """The group of ``posbench``'s commands, each built from its module when it is called for (``COMMANDS``); the
    list in ``posbench --help`` reads each command's summary from its module's source (``listed_summary``)."""

    listing = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.commands = dict.fromkeys(COMMANDS)        # the names, for the did-you-mean of an unknown command

    def list_commands(self, ctx) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx, name: str):
        if name not in COMMANDS:
            return None
        if self.listing:
            return TyperCommand(name, short_help=listed_summary(name))
        return built(name)

    def format_help(self, ctx, formatter) -> None:
        self.listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self.listing = False


app = typer.Typer(cls=LazyCommands, 
    name="posbench", add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
    pretty_exceptions_enable=False, context_settings={"help_option_names": ["-h", "--help"]},
    help="Compare positional encodings for transformer LMs: same model, same data, same budget.\n\n"
         "[bold]Examples[/bold]\n\n"
         "  posbench run --encoding rope,tape --task arithmetic\n\n"
         "  posbench compare results --plots figures\n\n"
         "  posbench sweep study.toml --jobs 2\n\n"
         "  posbench ls encodings\n\n"
         "  posbench --plugins my_encoding run --encoding mine --task arithmetic")


def show_version(value: bool) -> None:
    """``--version``: the version and the code posbench runs from (``version_line``), then exit 0."""
    if value:
        out().print(version_line(), markup=False, highlight=False)
        raise typer.Exit(0)


def version_line() -> str:
    """``posbench VERSION from DIR (commit HASH[, with changes not committed])``: the version, the directory the
    package is imported from, and the git commit of that checkout, as a run records them (``posbench_info``), or
    that it is no git checkout."""
    facts = {"version": posbench.__version__, **capture().facts}
    commit = facts.get("git_commit")
    code = (f"commit {commit}{', with changes not committed' if facts.get('git_dirty') else ''}" if commit else
            "not a git checkout: no commit known")
    return f"posbench {facts['version']} from {Path(posbench.__file__).resolve().parent} ({code})"


@app.callback()
def plugins(modules: list[str] = typer.Option(
        [], "--plugins", metavar="MODULE",
        help="import MODULE (a module name, or a .py file) before the command: its encodings, tasks and methods "
             "register themselves; repeatable or comma-separated; also the environment variable POSBENCH_PLUGINS."
        ), version: bool = typer.Option(
        False, "--version", is_eager=True, callback=show_version,
        help="print the version and the commit posbench was installed from, and exit.")) -> None:
    """Compare positional encodings for transformer LMs."""
    with user_errors():
        add_plugins([name for value in modules for name in plugin_names(value)])


def summary(fn) -> str:
    """A command's line in ``posbench --help``: its docstring's first paragraph as one line (the terminal wraps it at
    its width, never where the docstring's source lines end)."""
    return " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())


def listed_summary(name: str) -> str:
    """A command's line in ``posbench --help`` without importing its module: its function's docstring, read from the
    module's source (what ``summary`` makes of the function itself)."""
    module = COMMANDS[name][0]
    tree = ast.parse((Path(__file__).with_name(f"{module}.py")).read_text())
    fn = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name)
    return " ".join((ast.get_docstring(fn, clean=False) or "").strip().split("\n\n")[0].split())


def built(name: str):
    """The click command of ``name``, from its module (imported now), as typer builds a command of an app."""
    module_name, epilog, help_class = COMMANDS[name]
    module = importlib.import_module(f"posbench.cli.{module_name}")
    fn = getattr(module, name)
    one = typer.Typer(add_completion=False, rich_markup_mode="rich", pretty_exceptions_enable=False)
    kwargs = {"cls": getattr(setting_flags, help_class)} if help_class else {}
    one.command(name, epilog=getattr(module, epilog), short_help=summary(fn), **kwargs)(fn)
    return typer.main.get_command(one)


def __getattr__(name: str):
    """``posbench.cli.app.run`` and the like: the command's module, imported when first asked for."""
    if name in COMMANDS:
        return importlib.import_module(f"posbench.cli.{COMMANDS[name][0]}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- entry point -------------------------------------------------------------------------------------------

def _click_exceptions():
    """Click's exception classes, reached through public names only: typer >= 0.20 runs a copy of click inside
    itself (under a private module name) whose ``UsageError`` is the base of typer's public ``BadParameter`` and
    whose exits and aborts are typer's public ``Exit`` and ``Abort``; an older typer runs click itself, whose
    classes come from click. ``NoArgsIsHelpError`` (a ``UsageError``: a group called without a command) is told
    apart by its name, as neither library exports it."""
    usage = {next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")}
    exits, aborts = {typer.Exit}, {typer.Abort}
    try:
        import click.exceptions as real  # click itself, where typer runs it (optional)
        usage.add(real.UsageError)
        exits.add(real.Exit)
        aborts.add(real.Abort)
    except ImportError:
        pass
    return tuple(usage), tuple(exits), tuple(aborts)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry: click usage errors also become one line and exit code 2; an unknown option's line
    names the options of the command line being read it may have meant (``suggestions.meant``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    usage, exits, aborts = _click_exceptions()
    try:
        code = app(args=args, prog_name="posbench", standalone_mode=False)
    except usage as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":         # 'posbench' alone: the help, exit 0
            exc.show()
            return 0
        ctx = getattr(exc, "ctx", None)
        if ctx is not None and getattr(exc, "possibilities", None) is not None and hasattr(exc, "option_name"):
            exc.possibilities = meant(exc.option_name, exc.possibilities, ctx)       # no such option
        command = f"{ctx.command_path} --help" if ctx is not None else "posbench --help"
        print_error(f"{one_line_text(exc.format_message())} (see '{command}')")
        return 2
    except exits as exc:
        return int(getattr(exc, "exit_code", 0) or 0)
    except aborts:
        err().print("[yellow]aborted[/yellow]")
        return 130
    except KeyboardInterrupt:
        err().print("[yellow]interrupted[/yellow]")
        return 130
    return code if isinstance(code, int) else 0


def one_line_text(text: str) -> str:
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
