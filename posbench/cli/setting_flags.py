"""Every declared setting is also a flag: ``--steps 5`` is ``--set task.steps=5`` when the task declares ``steps``,
else ``--set train.steps=5``, else ``--set model.steps=5`` (the task's own option first, then train's, then
model's), and the chosen encoding's options are flags too: ``--theta 500000`` (when no task, train or model setting
has the name) or ``--rope-theta 500000`` (always; with several encodings it sets that one's only, where ``--theta``
sets every chosen encoding that declares ``theta``). Nothing is declared here: the flags are made, when the command
line is read, from the one declaration of each option (``posbench.options``: a task's ``OPTIONS``, ``TrainConfig``'s
and ``ModelConfig``'s fields), so their names, types, defaults, ranges and help cannot drift from what ``--set``,
presets and ``posbench ls`` use.

Each flag is a real option of the CLI library (``click_params``: typer makes it from a declaration, as it makes a
command's own), added to the command for one command line (``posbench.cli.registry_help.SettingFlags``), so click
reads them: ``--name value``, ``--name=value``, a value that starts with ``-`` (``--lr -1e-3``), underscores or
dashes (``--new_tokens``: the command's ``token_normalize_func``), a true / false setting as ``--name`` (true) or
``--no-name`` (false), an unknown flag refused with click's nearest names. Lists are comma-separated (``--lengths
1024,8192``). A flag becomes a typed ``Setting`` (section, key, value: read by its option's callback, once, as its
declaration's type; never text again), applied before the command line's own ``--set`` entries, so the one
precedence is: declared default < preset < --init model < study < flags < ``--set``. Of a flag given twice, the
last value counts; different flags come in the order click reads them (the order of their first appearance).

A setting's flag is its key with dashes, or its declaration's ``flag`` (bench's timed steps: ``--timed-steps``, as
``--steps`` is ``train.steps`` in every command).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Optional

import typer

from posbench.options import Switch

if TYPE_CHECKING:                       # (posbench.runs.config imports torch: read when flags are)
    from posbench.runs.config import Setting

#: the sections whose options are flags, in the order a name is looked up
SECTIONS = ("task", "train", "model")


#: the section of a flag that names its encoding (``--rope-theta``): "encoding:rope"
ONE_ENCODING = "encoding:"


def declarations(task_name: str | None, encodings: Iterable[str] = ()) -> dict[str, tuple[str, Any]]:
    """Flag name (dashes) -> (section, its ``Option``), for a run of task ``task_name`` (None: no task chosen yet,
    train's and model's flags only) with ``encodings`` (names
    of the task's registry: encodings, or extend's methods; an unknown name is refused by the registry, in one
    line). An encoding's option is always ``--NAME-KEY``; it is also ``--KEY`` unless that name is taken (a task,
    train or model setting, or another encoding's ``--NAME-KEY``: DAPE's ``fire_init_l`` is ``--dape-fire-init-l``
    when FIRE is chosen too) or the chosen encodings that declare it give it different types (DAPE's ``base`` is
    a name, Sandwich's a number)."""
    from posbench.options import declared

    owners = section_options(task_name)
    found: dict[str, tuple[str, Any]] = {}
    for section in SECTIONS:
        for key, option in owners[section].items():
            if not getattr(option, "from_task", False):
                found.setdefault(flag_name(key, option), (section, option))
    chosen = {name: {key: option for key, option in declared(cls).items()
                     if not getattr(option, "from_task", False)}          # what the task gives is no flag
              for name, cls in encoding_classes(task_name, encodings).items()}
    for name, options in chosen.items():
        for key, option in options.items():
            found[f"{name}-{key}".replace("_", "-")] = (ONE_ENCODING + name, option)
    for name, options in chosen.items():
        for key, option in options.items():
            flag = key.replace("_", "-")
            kinds = {type(o[key].default) for o in chosen.values() if key in o}
            if flag not in found and len(kinds) == 1:     # one meaning: no other setting's name, one type
                found[flag] = ("encoding", option)
    return found


def section_options(task_name: str | None) -> dict[str, dict[str, Any]]:
    """The declarations of the task's (none without a task), train's and model's settings, by section."""
    from posbench.options import declared
    from posbench.runs.config import model_options, task_class
    from posbench.train.config import TrainConfig

    return {"task": declared(task_class(task_name)) if task_name else {}, "train": declared(TrainConfig),
            "model": model_options()}


def flag_name(key: str, option: Any) -> str:
    """A setting's flag, without its dashes: its ``Option.flag`` if it has one (bench's ``steps`` is
    ``timed-steps``), else its key with dashes (``new_tokens``: ``new-tokens``)."""
    return getattr(option, "flag", "") or key.replace("_", "-")


def renamed_keys(task_name: str | None) -> dict[str, str]:
    """``timed_steps`` -> ``steps``: the key each setting whose flag is not its key's name sets."""
    return {flag.replace("-", "_"): key for options in section_options(task_name).values()
            for key, option in options.items() if (flag := getattr(option, "flag", ""))}


def encoding_classes(task_name: str | None, names: Iterable[str]) -> dict[str, Any]:
    """The classes of ``names`` in the registry the task's runs choose from (its model source's)."""
    from posbench.runs.config import task_class

    task = task_class(task_name) if task_name else None
    registry = task.model_source.encodings() if task is not None and names else {}
    return {name: registry.get(name) for name in names if registry.get(name) is not None}


def for_encoding(settings: list[Setting], task_name: str, name: str | None) -> list[Setting]:
    """The flags' settings (``given``) that apply to the run of encoding ``name``: an ``encoding`` setting when that
    encoding declares its key (``--theta`` with ``-e rope,alibi`` sets RoPE's theta, and ALiBi has none), an
    ``encoding:NAME`` one (``--rope-theta``) for that encoding only, every other as it is."""
    from posbench.options import declared

    cls = encoding_classes(task_name, [name] if name else []).get(name)
    own = set(declared(cls)) if cls is not None else set()
    kept = []
    for setting in settings:
        if setting.section == "encoding" and setting.key not in own:
            continue
        if setting.section.startswith(ONE_ENCODING):
            if setting.section != ONE_ENCODING + str(name):
                continue
            setting = setting._replace(section="encoding")
        kept.append(setting)
    return kept


def true_or_false(option: Any) -> bool:
    """Whether the setting may be given as ``--name`` alone (true) or ``--no-name`` (false)."""
    return isinstance(option.default, bool) or isinstance(option.limit, Switch)


def slurm_declarations() -> dict[str, tuple[str, Any]]:
    """The sweep's executor settings (``posbench.sweep.slurm.SlurmOptions``) as flags: ``--partition gpu``."""
    from posbench.options import declared
    from posbench.sweep.slurm import SlurmOptions

    return {key.replace("_", "-"): ("slurm", option) for key, option in declared(SlurmOptions).items()
            if key != "additional"}                  # a table: the study file's [slurm] only


# ---- the flags as click options ------------------------------------------------------------------------------

#: ``ctx.meta`` keys: the click options made for the command line being read, and the settings it gave
PARAMS = "posbench.setting_flags.params"
GIVEN = "posbench.setting_flags.given"

#: the panel of ``--help`` that lists them (by default)
PANEL = "Settings"


def click_params(known: dict[str, tuple[str, Any]], renamed: dict[str, str] | None = None, *,
                 taken: Iterable[str] = (), short: dict[str, str] | None = None,
                 hidden: Iterable[str] = (), panel: str = PANEL) -> list[Any]:
    """One click option per flag of ``known`` (flag name -> (section, its ``Option``)), made by typer as it makes
    a command's own: a parameter of a generated signature, which ``typer.main.get_command`` reads, whose default
    is a ``typer.models.OptionInfo`` (what typer's ``Option()`` returns; made here from a declaration, so no
    option is written by hand: tests/test_cli_options_once.py counts those). A true / false setting is
    ``--name/--no-name``, every other ``--name VALUE`` (a list: comma-separated). ``renamed``: ``renamed_keys``;
    ``taken``: the command's own option names (never a setting's); ``short``: a flag's short name (extend's
    ``-l``: ``--length``); ``hidden``: flags left out of ``--help`` (bench's ``--steps``, which it refuses);
    ``panel``: where ``--help`` lists them. Each option's callback reads its value as its declaration's type into
    a ``Setting`` appended to ``ctx.meta[GIVEN]``; the option puts nothing into ``ctx.params`` (the command's
    function never sees it)."""
    from typer.models import OptionInfo

    taken, short, hidden, renamed = set(taken), short or {}, set(hidden), renamed or {}
    parameters = []
    for flag, (section, option) in known.items():
        if f"--{flag}" in taken or f"--no-{flag}" in taken:
            continue
        key = setting_key(flag, section, renamed)
        where = f"{'encoding' if section.startswith(ONE_ENCODING) else section}.{key}"
        switch = true_or_false(option)
        names = (f"--{flag}/--no-{flag}",) if switch else (f"--{flag}", *([short[flag]] if flag in short else []))
        default = ",".join(map(str, option.default)) if isinstance(option.default, list) else option.default
        default = "none" if default in ("", None) else str(default).lower() if switch else str(default)
        info = OptionInfo(default=None, param_decls=names, help=f"{option.help} ({where}, default {default})",
                          show_default=False, callback=reader(section, key, where, option), expose_value=False,
                          metavar=None if switch else metavar(option.default), hidden=flag in hidden,
                          rich_help_panel=panel)
        parameters.append(inspect.Parameter(f"setting_{len(parameters)}", inspect.Parameter.KEYWORD_ONLY,
                                            default=info, annotation=Optional[bool] if switch else Optional[str]))
    if not parameters:
        return []

    def flags(**values: Any) -> None:                   # never called: typer reads its signature
        return None

    flags.__signature__ = inspect.Signature(parameters)
    flags.__annotations__ = {p.name: p.annotation for p in parameters}
    made = typer.Typer(add_completion=False)
    made.command()(flags)
    return list(typer.main.get_command(made).params)


def setting_key(flag: str, section: str, renamed: dict[str, str]) -> str:
    """The key the flag sets in its section: ``--timed-steps`` is bench's ``steps`` (``renamed``), ``--rope-theta``
    RoPE's ``theta``, every other its name with underscores."""
    name = flag.replace("-", "_")
    if section.startswith(ONE_ENCODING):
        return name.removeprefix(section.removeprefix(ONE_ENCODING).replace("-", "_") + "_")
    return renamed.get(name, name) if section in SECTIONS else name


def metavar(default: Any) -> str:
    """What a flag's value is, for ``--help``: INTEGER, NUMBER, TEXT, or a comma-separated list of them."""
    if isinstance(default, list):
        return f"{metavar(default[0]) if default else 'TEXT'},..."
    return "INTEGER" if isinstance(default, int) else "NUMBER" if isinstance(default, float) else "TEXT"


def reader(section: str, key: str, where: str, option: Any):
    """The callback of a flag's option: its value (None: not given) as ``option``'s type, a ``Setting``; a value of
    the wrong type is click's bad parameter (one line, exit code 2)."""

    def read(ctx: typer.Context, value: Any) -> None:
        from posbench.errors import UserError
        from posbench.runs.config import Setting, typed

        if value is None:
            return None
        if isinstance(value, str) and underscores_as_dashes(value.partition("=")[0]) in option_names(ctx):
            raise typer.BadParameter(f"needs a value ({value} is an option)")       # --warmup --timed-steps 2
        try:
            value = typed(where, value, option.default, option.limit)
        except UserError as exc:
            raise typer.BadParameter(str(exc)) from None
        ctx.meta.setdefault(GIVEN, []).append(Setting(section, key, value))
        return None

    return read


def option_names(ctx: Any) -> set[str]:
    """The names of every option of the command line's command, its settings flags too."""
    return {name for param in ctx.command.get_params(ctx) for name in (*param.opts, *param.secondary_opts)
            if name.startswith("-")}


def given(ctx: Any) -> list[Setting]:
    """The settings the command line gave as flags, typed, in the order click read them."""
    return list(ctx.meta.get(GIVEN, []))


def underscores_as_dashes(name: str) -> str:
    """click's ``token_normalize_func`` of a command with settings flags: ``--new_tokens`` is ``--new-tokens``."""
    return name.replace("_", "-")
