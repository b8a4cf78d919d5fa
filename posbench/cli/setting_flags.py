"""Every declared setting is also a flag: ``--steps 5`` is ``--set task.steps=5`` when the task declares ``steps``,
else ``--set train.steps=5``, else ``--set model.steps=5`` (the task's own option first, then train's, then
model's), and the chosen encoding's options are flags too: ``--theta 500000`` (when no task, train or model setting
has the name) or ``--rope-theta 500000`` (always; with several encodings it sets that one's only, where ``--theta``
sets every chosen encoding that declares ``theta``). A flag never changes its meaning with the encodings chosen: one
that would mean two settings at once (``--fire-init-l`` with ``-e dape,fire``: DAPE's ``fire_init_l`` and FIRE's
``init_l``) is refused in one line that names the flags and the ``--set`` form that say which. Nothing is declared
here: the flags are made, when the command line is read, from the one declaration of each option
(``posbench.options``: a task's ``OPTIONS``, ``TrainConfig``'s and ``ModelConfig``'s fields), so their names, types,
defaults, ranges and help cannot drift from what ``--set``, presets and ``posbench ls`` use.

Each flag is a real option of the CLI library (``click_params``: typer makes it from a declaration, as it makes a
command's own), added to the command for one command line (``posbench.cli.registry_help.SettingFlags``), so click
reads them: ``--name value``, ``--name=value``, a value that starts with ``-`` (``--lr -1e-3``), underscores or
dashes (``--new_tokens``: the command's ``token_normalize_func``), a true / false setting as ``--name`` (true) or
``--no-name`` (false), an unknown flag refused with click's nearest names. Lists are comma-separated (``--lengths
1024,8192``). A flag becomes a typed ``Setting`` (section, key, value: read by its option's callback, once, as its
declaration's type; never text again), applied before the command line's own ``--set`` entries, so the one
precedence is: declared default < preset < --init model < study < flags < ``--set``. Of a flag given twice, the
last value counts, and so of two flags that set one setting (``--theta 1 --rope-theta 2 --theta 3``: 3): the flags
come in the order of their last appearance on the command line.

A setting's flag is its key with dashes, or its declaration's ``flag`` (bench's timed steps: ``--timed-steps``, as
``--steps`` is ``train.steps`` in every command).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

import typer

from posbench.options import Fractions, Switch

if TYPE_CHECKING:                       # (posbench.runs.config imports torch: read when flags are)
    from posbench.runs.config import Setting

#: the sections whose options are flags, in the order a name is looked up
SECTIONS = ("task", "train", "model")


#: the section of a flag that names its encoding (``--rope-theta``): "encoding:rope"
ONE_ENCODING = "encoding:"


def declarations(task_name: str | None, encodings: Iterable[str] = ()) -> dict[str, tuple[str, Any]]:
    """Flag name (dashes) -> (section, its ``Option``), for a run of task ``task_name`` (None: no task chosen yet,
    train's and model's flags only) with ``encodings`` (names of the task's registry: encodings, or extend's
    methods; an unknown name is refused by the registry, in one line). An encoding's option is always
    ``--NAME-KEY``; it is also ``--KEY`` unless a task, train or model setting has that name (that setting's flag
    it stays). A flag never changes its meaning with the encodings chosen: a name that means two things at once
    (DAPE's ``fire_init_l`` and FIRE's ``init_l``, ``--fire-init-l``, with ``-e dape,fire``; DAPE's ``base``, a
    name, and Sandwich's, a number) is ``AMBIGUOUS``: its option is the one line that refuses it, naming the flags
    and the ``--set`` form that say which."""
    from posbench.options import declared

    owners = section_options(task_name)
    meanings: dict[str, list[tuple[str, str, Any]]] = {}         # flag -> (section, key, option), each meaning
    for section in SECTIONS:
        for key, option in owners[section].items():
            flag = flag_name(key, option)
            if not getattr(option, "from_task", False) and flag not in meanings:    # the task's own first
                meanings[flag] = [(section, key, option)]
    chosen = {name: {key: option for key, option in declared(cls).items()
                     if not getattr(option, "from_task", False)}          # what the task gives is no flag
              for name, cls in encoding_classes(task_name, encodings).items()}
    for name, options in chosen.items():
        for key, option in options.items():
            meanings.setdefault(f"{name}-{key}".replace("_", "-"), []).append((ONE_ENCODING + name, key, option))
    plain: dict[str, list[tuple[str, str, Any]]] = {}           # --KEY -> (encoding, key, option), each
    for name, options in chosen.items():
        for key, option in options.items():
            plain.setdefault(key.replace("_", "-"), []).append((name, key, option))
    for flag, owned in plain.items():
        if flag in meanings and meanings[flag][0][0] in SECTIONS:
            continue                                  # a task, train or model setting's flag, whatever -e says
        if len({reading(option) for _, _, option in owned}) == 1:     # every encoding that declares it
            meanings.setdefault(flag, []).append(("encoding", owned[0][1], owned[0][2]))
        else:                                                          # one name, two types: two meanings
            meanings.setdefault(flag, []).extend((ONE_ENCODING + name, key, option) for name, key, option in owned)
    found = {flag: (owned[0][0], owned[0][2]) for flag, owned in meanings.items() if len(owned) == 1}
    for flag, owned in meanings.items():
        if len(owned) > 1:
            found[flag] = (AMBIGUOUS, Ambiguous(ambiguity(flag, owned, found, chosen),
                                                all(true_or_false(option) for _, _, option in owned)))
    return found


#: the section of a flag that means several settings with the chosen encodings (its option: an ``Ambiguous``)
AMBIGUOUS = "ambiguous"


class Ambiguous(NamedTuple):
    """What stands for the option of an ``AMBIGUOUS`` flag: the line that refuses it, and whether it is given as
    ``--name`` / ``--no-name`` (every setting it may mean is true / false) or ``--name VALUE``."""

    refusal: str
    switch: bool


def reading(option: Any) -> tuple:
    """How a flag's text is read as the option's value: its type (a list's: its items' too), and its limit's own
    reading (``Switch``: true, false or auto; ``Fractions``)."""
    default = option.default
    items = type(default[0]) if isinstance(default, list) and default else None
    limit = type(option.limit) if isinstance(option.limit, (Switch, Fractions)) else None
    return type(default), items, limit


def ambiguity(flag: str, owned: list[tuple[str, str, Any]], found: dict[str, tuple[str, Any]],
              chosen: dict[str, dict[str, Any]]) -> str:
    """The one line that refuses ``--FLAG`` where it means several settings (``owned``: section, key, option;
    ``chosen``: the encodings' options): each meaning with the flags that give it alone, and the ``--set`` form."""
    described, sets, flags = [], [], False
    for section, key, option in owned:
        if section in SECTIONS:                                    # a task, train or model setting
            what, alone = f"{section}.{key}", [f for f, (where, o) in found.items() if o is option]
            sets.append(f"--set {section}.{key}=VALUE")
        else:
            declaring = [name for name, options in chosen.items() if key in options]
            owners = [section.removeprefix(ONE_ENCODING)] if section.startswith(ONE_ENCODING) else declaring
            what = f"{' and '.join(owners)}'s {key}"
            alone = [f for f, (where, o) in found.items()
                     if (where.startswith(ONE_ENCODING) and where.removeprefix(ONE_ENCODING) in owners
                         and o is chosen[where.removeprefix(ONE_ENCODING)].get(key))
                     or (where == "encoding" and declaring == owners and o is option)]
        described.append(what + (f" ({', '.join('--' + f for f in alone)})" if alone else ""))
        flags = flags or bool(alone)
    sets.append("--set encoding.KEY=VALUE with that encoding alone in -e")
    return (f"--{flag} is ambiguous with -e {','.join(chosen)}: it is {' or '.join(described)}; say which with "
            f"{'those flags, or ' if flags else ''}{', or '.join(sets)}")


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
GIVEN_BY = "posbench.setting_flags.given_by"          # the click option that gave each of them

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
        if section == AMBIGUOUS:                        # given, it is refused (``option``: an ``Ambiguous``)
            info = OptionInfo(default=None, param_decls=(f"--{flag}/--no-{flag}",) if option.switch else
                              (f"--{flag}",), callback=refuse(option.refusal), expose_value=False, hidden=True)
            parameters.append(inspect.Parameter(f"setting_{len(parameters)}", inspect.Parameter.KEYWORD_ONLY,
                                                default=info,
                                                annotation=Optional[bool] if option.switch else Optional[str]))
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

    def read(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> None:
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
        ctx.meta.setdefault(GIVEN_BY, []).append(param)
        return None

    return read


def refuse(message: str):
    """The callback of a flag that is ``AMBIGUOUS`` with the chosen encodings: given, click's bad parameter."""

    def read(value: Any) -> None:
        if value is not None:
            raise typer.BadParameter(message)
        return None

    return read


def in_order_given(ctx: Any, order: list[Any]) -> None:
    """The settings the flags gave (``ctx.meta[GIVEN]``, in the order click processed the flags: each flag's first
    appearance) put in the order of each flag's last appearance in ``order`` (click's parser's: every appearance of
    every option), so that of two flags that set one setting the one given last counts (``--theta 1 --rope-theta 2
    --theta 3``: 3), as of one flag given twice."""
    settings, params = ctx.meta.get(GIVEN, []), ctx.meta.get(GIVEN_BY, [])
    last = {id(param): i for i, param in enumerate(order)}
    ranked = sorted(range(len(settings)), key=lambda i: last.get(id(params[i]), -1) if i < len(params) else -1)
    ctx.meta[GIVEN] = [settings[i] for i in ranked]


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
