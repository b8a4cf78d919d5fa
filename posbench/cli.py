"""The ``posbench`` command line: thin. Parses, calls the library, renders with rich.

Every user error is one line on stderr and exit code 2 (``user_errors()``); a non-finite loss is one line
and exit code 1; Ctrl-C says how to resume and exits 130. New commands are small functions registered on
``app`` (wrap their body in ``with user_errors():``).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    name="posbench", add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
    pretty_exceptions_enable=False, context_settings={"help_option_names": ["-h", "--help"]},
    help="Compare positional encodings for transformer LMs: same model, same data, same budget.\n\n"
         "[bold]Examples[/bold]\n\n"
         "  posbench run --encoding rope,tape --task arithmetic\n\n"
         "  posbench compare results --plots figures\n\n"
         "  posbench ls encodings")


def out() -> Console:
    return Console(highlight=False, soft_wrap=True)


def err() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def user_error_types() -> tuple[type[BaseException], ...]:
    from posbench.attention import BackendError
    from posbench.config import ConfigError
    from posbench.data.errors import DataError
    from posbench.encodings import EncodingOptionError
    from posbench.engine import CheckpointError, DeviceError
    from posbench.registry import UnknownNameError
    from posbench.results import ResultError

    return (ConfigError, UnknownNameError, DataError, ResultError, CheckpointError, DeviceError,
            EncodingOptionError, BackendError)


@contextmanager
def user_errors():
    """Known user-facing errors -> one line on stderr, exit code 2 (no traceback)."""
    from posbench.engine import NonFiniteLossError

    try:
        yield
    except user_error_types() as exc:
        err().print(f"[red]error:[/red] {one_line(exc)}")
        raise typer.Exit(2) from None
    except NonFiniteLossError as exc:
        err().print(f"[red]error:[/red] {one_line(exc)}")
        raise typer.Exit(1) from None


def one_line(exc: BaseException) -> str:
    text = exc.message if hasattr(exc, "message") else str(exc)
    return " ".join(str(text).split()) or type(exc).__name__


def split_names(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


# ---- run ---------------------------------------------------------------------------------------------------

RUN_EPILOG = """[bold]Examples[/bold]

  posbench run --encoding rope --task arithmetic

  posbench run --encoding rope,tape --task arithmetic --preset small --seed 1

  posbench run -e alibi -t arithmetic --preset tiny --set lr=3e-4 --set task.train_digits=4

  posbench run --resume results/arithmetic/rope/20250101-120000-ab12cd

  posbench run --task passkey --init results/pretrain/rope/20250101-120000-ab12cd
"""


@app.command(epilog=RUN_EPILOG)
def run(
    encoding: Optional[str] = typer.Option(None, "--encoding", "-e",
                                           help="Encoding name, or several separated by commas (run in turn)."),
    task: Optional[str] = typer.Option(None, "--task", "-t", help="Task name ('posbench ls tasks')."),
    preset: Optional[str] = typer.Option(None, "--preset", "-p", help="tiny, small (default) or paper."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Training steps (overrides the preset)."),
    seed: int = typer.Option(0, "--seed", help="Seed for Python, NumPy, torch and the training data."),
    device: str = typer.Option("auto", "--device", help="auto (cuda, mps, cpu), cpu, cuda, cuda:N, mps."),
    out_dir: Path = typer.Option(Path("results"), "--out", "-o", help="Results root directory."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue a killed run directory."),
    init: Optional[Path] = typer.Option(None, "--init", help="Start from another run's checkpoint."),
    data: Optional[str] = typer.Option(None, "--data", help="Task data source (tasks that take one)."),
    datasets: Optional[str] = typer.Option(None, "--datasets", help="Task datasets, comma-separated."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="byte, bpe[:VOCAB] or a Hugging Face "
                                            "name/path (language-model tasks)."),
    sets: list[str] = typer.Option([], "--set", "-s", help="Override a config key: [section.]key=value "
                                   "(sections: model, encoding, train, task). Repeatable."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output."),
) -> None:
    """Train and evaluate one or more encodings on a task; writes results/<task>/<encoding>/<run-id>/."""
    from posbench.config import ConfigError, resolve_run_config
    from posbench.progress import NullReporter, RichReporter
    from posbench import runner

    with user_errors():
        reporter = NullReporter() if quiet else RichReporter(err())
        if resume is not None:
            if encoding or task or preset or steps is not None or sets or init or data or datasets or tokenizer:
                raise ConfigError("--resume continues a run with its own config; pass only --resume "
                                  "(and optionally --device)")
            outcome = runner.resume(resume, device=None if device == "auto" else device, reporter=reporter)
            show_outcome(outcome)
            return
        if task is None:
            raise ConfigError("--task is required ('posbench ls tasks' lists them)")
        names = split_names(encoding) if encoding else [None]
        if encoding is not None and not names:
            raise ConfigError("--encoding is empty")
        configs = [resolve_run_config(task, name, preset, steps=steps, seed=seed, device=device,
                                      init=str(init) if init is not None else None, sets=sets,
                                      task_flags={"data": data, "datasets": datasets, "tokenizer": tokenizer})
                   for name in names]
        for config in configs:
            try:
                outcome = runner.execute(config, out_dir, reporter=reporter, command=["posbench", *sys.argv[1:]])
            except KeyboardInterrupt:
                err().print("[yellow]interrupted[/yellow]; continue with: posbench run --resume "
                            f"{latest_run(out_dir, config.task, config.encoding)}")
                raise typer.Exit(130) from None
            show_outcome(outcome)
        if len(configs) > 1:
            out().print(f"compare them: posbench compare {out_dir / configs[0].task}")


def latest_run(root: Path, task: str, encoding: str) -> str:
    runs = sorted((root / task / encoding).glob("*"))
    return str(runs[-1]) if runs else str(root / task / encoding / "RUN_ID")


def show_outcome(outcome) -> None:
    result = outcome.result
    metrics = "  ".join(f"{name} {fmt_metric(m)}" for name, m in result["metrics"].items())
    timing = result["timings"]
    out().print(f"[bold]{result['task']}[/bold] / [bold]{result['encoding']}[/bold]: {metrics}  "
                f"(train {timing['train_s']:.0f}s, eval {timing['eval_s']:.0f}s) -> {outcome.run_dir}")


def fmt_metric(metric: dict) -> str:
    from posbench.report import Cell, fmt_cell

    return fmt_cell(Cell(metric.get("value"), metric.get("stderr")))


# ---- ls ----------------------------------------------------------------------------------------------------

LS_EPILOG = """[bold]Examples[/bold]

  posbench ls

  posbench ls encodings

  posbench ls presets
"""

LS_KINDS = ("encodings", "tasks", "presets")


@app.command("ls", epilog=LS_EPILOG)
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


def kv(mapping: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in mapping.items()) or "-"


# ---- compare -----------------------------------------------------------------------------------------------

COMPARE_EPILOG = """[bold]Examples[/bold]

  posbench compare results

  posbench compare results --task arithmetic --format markdown

  posbench compare results --format csv > table.csv

  posbench compare results --plots figures
"""


@app.command(epilog=COMPARE_EPILOG)
def compare(
    directory: Path = typer.Argument(..., help="A results tree (any depth)."),
    task: Optional[str] = typer.Option(None, "--task", "-t", help="Only this task."),
    fmt: str = typer.Option("table", "--format", "-f", help="table, markdown, csv, latex or json."),
    plots: Optional[Path] = typer.Option(None, "--plots", help="Write figures (PNG) to this directory."),
) -> None:
    """One table per task (encodings as rows, best value of each column in bold, ± stderr) and figures."""
    from posbench import report as rep
    from posbench.results import ResultError

    with user_errors():
        if fmt not in rep.FORMATS:
            from posbench.registry import UnknownNameError

            raise UnknownNameError("format", fmt, list(rep.FORMATS))
        if not directory.exists():
            raise ResultError(f"results directory {directory} does not exist")
        result = rep.collect(directory, task)
        if not result.tables:
            where = f" for task '{task}'" if task else ""
            skipped = f" ({len(result.problems)} unreadable, listed above)" if result.problems else ""
            show_problems(result.problems)
            raise ResultError(f"no finished runs{where} under {directory}{skipped}")
        if fmt == "table":
            console = out()
            for table in result.tables:
                console.print(rich_table(table))
        else:
            sys.stdout.write(rep.render_text(result, fmt))
        show_problems(result.problems)
        if plots is not None:
            for path in rep.plot(result, plots):
                err().print(f"wrote {path}")


def rich_table(table) -> Table:
    from posbench.report import fmt_cell, fmt_value, header

    title = f"{table.task}" + (f"  (sorted by {table.primary})" if table.primary else "")
    rt = Table(title=title, title_justify="left")
    rt.add_column("encoding")
    for col in table.columns:
        rt.add_column(header(col, table.higher_is_better[col]), justify="right")
    rt.add_column("train s", justify="right")
    for row in table.rows:
        cells = [f"[bold green]{fmt_cell(row.cells[c])}[/bold green]" if row.cells[c].best
                 else fmt_cell(row.cells[c]) for c in table.columns]
        rt.add_row(row.label, *cells, fmt_value(row.train_s))
    return rt


def show_problems(problems) -> None:
    if problems:
        console = err()
        console.print(f"[yellow]skipped {len(problems)} unreadable run(s):[/yellow]")
        for problem in problems:
            console.print(f"  {problem.path}: {problem.reason}", markup=False)


# ---- score (SCROLLS predictions files; the command lives in cli_score.py) ----------------------------------

def _register_score() -> None:
    from posbench.cli_score import SCORE_EPILOG, score

    app.command("score", epilog=SCORE_EPILOG)(score)


_register_score()


# ---- commands defined in other modules ---------------------------------------------------------------------

def _register_extra_commands() -> None:
    """Commands that live beside a subsystem (``posbench score`` in ``cli_score.py``)."""
    try:
        from posbench.cli_score import SCORE_EPILOG, score
    except ImportError:
        return
    app.command("score", epilog=SCORE_EPILOG)(score)


_register_extra_commands()


# ---- entry point -------------------------------------------------------------------------------------------

def _click_exceptions():
    """Click's exception classes (typer >= 0.20 vendors click as ``typer._click``; older typer uses click)."""
    modules = []
    try:
        from typer._click import exceptions as vendored
        modules.append(vendored)
    except ImportError:
        pass
    try:
        import click.exceptions as real
        modules.append(real)
    except ImportError:
        pass
    usage = tuple(m.UsageError for m in modules)
    no_args = tuple(getattr(m, "NoArgsIsHelpError", None) for m in modules
                    if getattr(m, "NoArgsIsHelpError", None) is not None)
    exits = tuple({typer.Exit, *(getattr(m, "Exit", typer.Exit) for m in modules)})
    aborts = tuple({typer.Abort, *(getattr(m, "Abort", typer.Abort) for m in modules)})
    return usage, no_args, exits, aborts


def main(argv: list[str] | None = None) -> int:
    """Console-script entry: click usage errors also become one line and exit code 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    usage, no_args, exits, aborts = _click_exceptions()
    try:
        code = app(args=args, prog_name="posbench", standalone_mode=False)
    except no_args as exc:
        exc.show() if hasattr(exc, "show") else None
        return 0
    except usage as exc:
        ctx = getattr(exc, "ctx", None)
        command = f"{ctx.command_path} --help" if ctx is not None else "posbench --help"
        err().print(f"[red]error:[/red] {one_line_text(exc.format_message())} (see '{command}')")
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


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
