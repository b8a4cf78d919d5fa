"""The command line's adapter to the settings (``posbench.options``): each declared setting is a click option, made
for the command line being read; nothing is declared here. A flag's name is its key with dashes, or its ``flag``.

``--steps 5`` is ``task.steps`` if the task declares it, else ``train.steps``, else ``model.steps`` (``FLAG_ORDER``);
``--rope-theta`` sets that encoding's option, ``--theta`` every chosen encoding's that declares it (unless a task,
train or model setting has the name). A flag that would mean two settings with the encodings chosen is refused in
one line naming the flags and ``--set`` forms that say which. Each flag's callback types its value once into a
``Setting`` (``given(ctx)``), in the order of each flag's last appearance, applied before ``--set``. What decides
the flags (``-t``, ``-e``, ``--method``) is read by click in a first, resilient parse (``SettingFlags.chosen``).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable
from typing import Any, ClassVar, NamedTuple, Optional

import click
import typer
from typer.core import TyperCommand
from typer.models import OptionInfo

from posbench.errors import UserError
from posbench.options import ONE_ENCODING, Fractions, Setting, Switch, declared, typed
from posbench.sweep.slurm import SlurmOptions

#: the sections whose options are flags, in the order a name is looked up
FLAG_ORDER = ("task", "train", "model")
#: a negative number (``-1e-3``, ``-.5``): a value, never an option
NEGATIVE = re.compile(r"-\.?[0-9]")
#: the section of a flag that means several settings with the chosen encodings (its option: an ``Ambiguous``)
AMBIGUOUS = "ambiguous"


class Ambiguous(NamedTuple):
    """The option of an ``AMBIGUOUS`` flag: the line that refuses it; ``switch``: given as ``--name/--no-name``."""

    refusal: str
    switch: bool


def declarations(task_name: str | None, encodings: Iterable[str] = ()) -> dict[str, tuple[str, str, Any]]:
    """Flag name -> (section, key, ``Option``) for a run of ``task_name`` (None: train's and model's flags only) with
    ``encodings`` (of the task's registry); a name of two meanings is ``AMBIGUOUS``."""
    from posbench.runs.config import section_options, task_class   # imports torch: read when flags are made

    task = task_class(task_name) if task_name else None
    owners = section_options(task)
    meanings: dict[str, list[tuple[str, str, Any]]] = {}         # flag -> (section, key, option), each meaning
    for section in FLAG_ORDER:
        for key, option in owners[section].items():
            flag = flag_name(key, option)
            if not option.from_task and flag not in meanings:              # the task's own first
                meanings[flag] = [(section, key, option)]
    registry = task.model_source.encodings() if task is not None and encodings else {}
    chosen = {name: {key: option for key, option in declared(registry[name]).items() if not option.from_task}
              for name in encodings if registry.get(name) is not None}      # what the task gives: no flag
    plain: dict[str, list[tuple[str, str, Any]]] = {}           # --KEY -> (encoding, key, option), each
    for name, options in chosen.items():
        for key, option in options.items():
            meanings.setdefault(f"{name}-{key}".replace("_", "-"), []).append((ONE_ENCODING + name, key, option))
            plain.setdefault(key.replace("_", "-"), []).append((name, key, option))
    for flag, owned in plain.items():
        if flag in meanings and meanings[flag][0][0] in FLAG_ORDER:
            continue                                  # a task, train or model setting's flag, whatever -e says
        if len({reading(option) for _, _, option in owned}) == 1:     # every encoding that declares it
            meanings.setdefault(flag, []).append(("encoding", owned[0][1], owned[0][2]))
        else:                                                          # one name, two types: two meanings
            meanings.setdefault(flag, []).extend((ONE_ENCODING + name, key, option) for name, key, option in owned)
    found = {flag: owned[0] for flag, owned in meanings.items() if len(owned) == 1}
    for flag, owned in meanings.items():
        if len(owned) > 1:
            found[flag] = (AMBIGUOUS, "", Ambiguous(ambiguity(flag, owned, found, chosen),
                                                    all(true_or_false(option) for _, _, option in owned)))
    return found


def reading(option: Any) -> tuple:
    """How a flag's text is read: the default's type (and its items'), and a limit's own reading."""
    default = option.default
    items = type(default[0]) if isinstance(default, list) and default else None
    limit = type(option.limit) if isinstance(option.limit, (Switch, Fractions)) else None
    return type(default), items, limit


def ambiguity(flag: str, owned: list[tuple[str, str, Any]], found: dict[str, tuple[str, str, Any]],
              chosen: dict[str, dict[str, Any]]) -> str:
    """The line refusing ``--FLAG`` of several meanings (``owned``): each meaning with the flags that give it alone,
    and the ``--set`` forms."""
    described, sets, flags = [], [], False
    for section, key, option in owned:
        if section in FLAG_ORDER:                                  # a task, train or model setting
            what, alone = f"{section}.{key}", [f for f, (where, _, o) in found.items() if o is option]
            sets.append(f"--set {section}.{key}=VALUE")
        else:
            declaring = [name for name, options in chosen.items() if key in options]
            owners = [section.removeprefix(ONE_ENCODING)] if section.startswith(ONE_ENCODING) else declaring
            what = f"{' and '.join(owners)}'s {key}"
            alone = [f for f, (where, _, o) in found.items()
                     if (where.startswith(ONE_ENCODING) and where.removeprefix(ONE_ENCODING) in owners
                         and o is chosen[where.removeprefix(ONE_ENCODING)].get(key))
                     or (where == "encoding" and declaring == owners and o is option)]
        described.append(what + (f" ({', '.join('--' + f for f in alone)})" if alone else ""))
        flags = flags or bool(alone)
    sets.append("--set encoding.KEY=VALUE with that encoding alone in -e")
    return (f"--{flag} is ambiguous with -e {','.join(chosen)}: it is {' or '.join(described)}; say which with "
            f"{'those flags, or ' if flags else ''}{', or '.join(sets)}")


def flag_name(key: str, option: Any) -> str:
    return option.flag or key.replace("_", "-")


def true_or_false(option: Any) -> bool:
    return isinstance(option.default, bool) or isinstance(option.limit, Switch)


def slurm_declarations() -> dict[str, tuple[str, str, Any]]:
    """The sweep's executor settings (``SlurmOptions``) as flags: ``--partition gpu``."""
    return {key.replace("_", "-"): ("slurm", key, option) for key, option in declared(SlurmOptions).items()
            if key != "additional"}                  # a table: the study file's [slurm] only


#: ``ctx.meta`` keys: the click options made for this command line, the settings given, the option that gave each,
#: and every option's every appearance in order
PARAMS, GIVEN, GIVEN_BY, ORDER = (f"posbench.setting_flags.{name}" for name in ("params", "given", "given_by", "order"))


def click_params(known: dict[str, tuple[str, str, Any]], *, taken: Iterable[str] = (),
                 short: dict[str, str] | None = None, hidden: Iterable[str] = (), panel: str = "Settings") -> list[Any]:
    """One click option per flag of ``known``, made by typer from a generated signature (as it makes a command's
    own), skipping ``taken`` names; each callback appends a typed ``Setting`` to ``ctx.meta[GIVEN]``."""
    taken, short, hidden = set(taken), short or {}, set(hidden)
    parameters = []
    for flag, (section, key, option) in known.items():
        if f"--{flag}" in taken or f"--no-{flag}" in taken:
            continue
        if section == AMBIGUOUS:                        # given, it is refused (``option``: an ``Ambiguous``)
            switch = option.switch
            info = OptionInfo(default=None, param_decls=(f"--{flag}/--no-{flag}",) if switch else (f"--{flag}",),
                              callback=refuse(option.refusal), expose_value=False, hidden=True)
        else:
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


def metavar(default: Any) -> str:
    if isinstance(default, list):
        return f"{metavar(default[0]) if default else 'TEXT'},..."
    return "INTEGER" if isinstance(default, int) else "NUMBER" if isinstance(default, float) else "TEXT"


def reader(section: str, key: str, where: str, option: Any):
    """A flag's callback: its value typed into a ``Setting``; a bad value is click's bad parameter (exit code 2)."""

    def read(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> None:
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
    """The callback of an ``AMBIGUOUS`` flag: given, click's bad parameter."""

    def read(value: Any) -> None:
        if value is not None:
            raise typer.BadParameter(message)
        return None

    return read


def in_order_given(ctx: Any, order: list[Any]) -> None:
    """The flags' settings (in click's order: each flag's first appearance) in the order of each flag's last, so
    that of two flags of one setting the one given last counts (``--theta 1 --rope-theta 2 --theta 3``: 3)."""
    settings, params = ctx.meta.get(GIVEN, []), ctx.meta.get(GIVEN_BY, [])
    last = {id(param): i for i, param in enumerate(order)}
    ranked = sorted(range(len(settings)), key=lambda i: last.get(id(params[i]), -1) if i < len(params) else -1)
    ctx.meta[GIVEN] = [settings[i] for i in ranked]


def option_names(ctx: Any) -> set[str]:
    return {name for param in ctx.command.get_params(ctx) for name in (*param.opts, *param.secondary_opts)
            if name.startswith("-")}


def given(ctx: Any) -> list[Setting]:
    """The settings the command line gave as flags, typed, in the order of their last appearance."""
    return list(ctx.meta.get(GIVEN, []))


def underscores_as_dashes(name: str) -> str:
    """click's ``token_normalize_func``: ``--new_tokens`` is ``--new-tokens``."""
    return name.replace("_", "-")


class SettingFlags(TyperCommand):
    """A command whose settings are flags, made per command line (``flag_declarations`` of what it chose) and kept
    in ``ctx.meta``: the command object is shared by every command line the process reads."""

    choosers: ClassVar[tuple[str, ...]] = ()        # the options (``dest`` names) that decide which flags there are
    short_flags: ClassVar[dict[str, str]] = {}
    hidden_flags: ClassVar[tuple[str, ...]] = ()
    flags_panel: ClassVar[str] = "Settings"

    def __init__(self, *args: Any, context_settings: dict[str, Any] | None = None, **kwargs: Any) -> None:
        settings = {"token_normalize_func": underscores_as_dashes, **(context_settings or {})}
        super().__init__(*args, context_settings=settings, **kwargs)

    def flag_declarations(self, chosen: dict[str, Any]) -> dict[str, tuple[str, str, Any]]:
        raise NotImplementedError

    def chosen(self, ctx: Any, args: list[str]) -> dict[str, Any]:
        """The choosers' values, from a first, resilient parse: the flags not yet made are unknown options, left
        aside, and so is a negative number (``--lr -1e-3``; click would read ``-e -3``) unless a chooser's."""
        first = click.Context(self, parent=ctx.parent, info_name=ctx.info_name, resilient_parsing=True,
                              ignore_unknown_options=True, token_normalize_func=ctx.token_normalize_func,
                              help_option_names=ctx.help_option_names)   # click keeps the first help option made
        names = {name for param in self.params if param.name in self.choosers for name in param.opts}
        words = [word for i, word in enumerate(args)
                 if not (NEGATIVE.match(word) and (i == 0 or args[i - 1] not in names))]
        try:
            values, _, _ = self.make_parser(first).parse_args(args=words)
        except click.UsageError:
            values = {}
        return {name: values.get(name) for name in self.choosers}

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        chosen = self.chosen(ctx, args)
        try:
            known = self.flag_declarations(chosen)
        except UserError as exc:                 # an unknown task or encoding: one line, exit code 2
            ctx.fail(str(exc))
        own = {name for param in self.params for name in (*param.opts, *param.secondary_opts)}
        ctx.meta[PARAMS] = click_params(known, taken=own, short=self.short_flags, hidden=self.hidden_flags,
                                        panel=self.flags_panel)
        ctx.meta[GIVEN], ctx.meta[GIVEN_BY] = [], []
        try:
            rest = super().parse_args(ctx, args)
        except Exception as exc:        # click's usage errors, told by their public attributes
            if getattr(exc, "ctx", False) is None:          # "requires an argument": the command's, not posbench's
                exc.ctx = ctx
            raise                       # (an unknown option's suggestions: posbench.cli.app.main)
        in_order_given(ctx, ctx.meta.pop(ORDER, []))     # of two flags of one setting, the one given last
        differ = [name for name in self.choosers if ctx.params.get(name) != chosen[name]]
        if differ and not ctx.resilient_parsing:
            names = ", ".join(max(p.opts, key=len) for p in self.params if p.name in differ)
            ctx.fail(f"give {names} as its own word (--name VALUE or --name=VALUE): the settings flags depend on it")
        return rest

    def make_parser(self, ctx: Any) -> Any:
        """Click's parser, also keeping every option's every appearance in order (click's callbacks: first only)."""
        parser = super().make_parser(ctx)
        parse = parser.parse_args

        def parse_args(args: list[str]) -> Any:
            opts, rest, order = parse(args=args)
            ctx.meta[ORDER] = list(order)
            return opts, rest, order

        parser.parse_args = parse_args
        return parser

    def get_params(self, ctx: Any) -> list[Any]:
        return [*super().get_params(ctx), *ctx.meta.get(PARAMS, ())]
