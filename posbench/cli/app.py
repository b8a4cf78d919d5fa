"""The ``posbench`` command line: thin. Parses, calls the library, renders with rich.

Each command is a function in its own module of ``posbench/cli/`` (``run``, ``ls``, ``compare``, ``score``...),
registered on ``app`` below. Every error is one line on stderr, printed by ``cli.common.print_error``:
exit code 2 for bad input, 1 for the machine (disk full, permission, a lost process) and for a non-finite loss
(``cli.common.user_errors``); Ctrl-C says how to resume and exits 130.
"""

from __future__ import annotations

import sys

import typer

from posbench.cli import analyze, bench, check, compare, export, extend, ls, run, score, sweep
from posbench.cli.common import err, out, print_error, user_errors
from posbench.cli.registry_help import BenchHelp, ExtendHelp, RunHelp, SweepHelp, meant

app = typer.Typer(
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
    from pathlib import Path

    import posbench
    from posbench.runs.code import capture      # not posbench.runs.record: no torch for a version line

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
    from posbench.registry import add_plugins, plugin_names

    with user_errors():
        add_plugins([name for value in modules for name in plugin_names(value)])


def summary(fn) -> str:
    """A command's line in ``posbench --help``: its docstring's first paragraph as one line (the terminal wraps it at
    its width, never where the docstring's source lines end)."""
    return " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())


def command(name: str, fn, epilog: str, **kwargs) -> None:
    app.command(name, epilog=epilog, short_help=summary(fn), **kwargs)(fn)


command("run", run.run, run.RUN_EPILOG, cls=RunHelp)
command("ls", ls.ls, ls.LS_EPILOG)
command("extend", extend.extend, extend.EXTEND_EPILOG, cls=ExtendHelp)
command("compare", compare.compare, compare.COMPARE_EPILOG)
command("score", score.score, score.SCORE_EPILOG)
command("bench", bench.bench, bench.BENCH_EPILOG, cls=BenchHelp)
command("export", export.export, export.EXPORT_EPILOG)
command("sweep", sweep.sweep, sweep.SWEEP_EPILOG, cls=SweepHelp)
command("check", check.check, check.CHECK_EPILOG)
command("analyze", analyze.analyze, analyze.ANALYZE_EPILOG)


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
        import click.exceptions as real
        usage.add(real.UsageError)
        exits.add(real.Exit)
        aborts.add(real.Abort)
    except ImportError:
        pass
    return tuple(usage), tuple(exits), tuple(aborts)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry: click usage errors also become one line and exit code 2; an unknown option's line
    names the options of the command line being read it may have meant (``registry_help.meant``)."""
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
