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

import typer
from typer.core import TyperCommand
from typer.models import OptionInfo

from posbench.cli.common import split_names
from posbench.cli.registry_help import RegistryHelp
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
            flag = flag_of(key, option)
            if not option.from_task and flag not in meanings:              # the task's own first
                meanings[flag] = [(section, key, option)]
    registry = task.model_source.encodings() if task is not None and encodings else {}
    chosen = {name: {key: option for key, option in declared(registry[name]).items() if not option.from_task}
              for name in encodings if registry.get(name) is not None}      # what the task gives: no flag
    plain: dict[str, list[tuple[str, str, Any]]] = {}            # --FLAG -> each chosen encoding's option of it
    for name, options in chosen.items():
        for key, option in options.items():
            flag = flag_of(key, option)
            meanings.setdefault(f"{name.replace('_', '-')}-{flag}", []).append((ONE_ENCODING + name, key, option))
            plain.setdefault(flag, []).append((ONE_ENCODING + name, key, option))
    for flag, owned in plain.items():
        if flag in meanings and meanings[flag][0][0] in FLAG_ORDER:
            continue                                  # a task, train or model setting's flag, whatever -e says
        if len({(key, reading(option)) for _, key, option in owned}) == 1:   # one flag for every encoding with it
            owned = [("encoding", owned[0][1], owned[0][2])]
        meanings.setdefault(flag, []).extend(owned)   # (else one name, two keys or types: two meanings)
    found = {flag: owned[0] for flag, owned in meanings.items() if len(owned) == 1}
    refused = {flag: (AMBIGUOUS, "", Ambiguous(ambiguity(flag, owned, found, chosen),
                                               all(true_or_false(option) for *_, option in owned)))
               for flag, owned in meanings.items() if len(owned) > 1}
    return found | refused


def flag_of(key: str, option: Any) -> str:
    """A setting's flag name (without ``--``): its ``flag``, else its key with dashes."""
    return option.flag or key.replace("_", "-")


def reading(option: Any) -> tuple:
    """How a flag's text is read: the default's type (and its items'), and a limit's own reading."""
    default = option.default
    items = type(default[0]) if isinstance(default, list) and default else None
    limit = type(option.limit) if isinstance(option.limit, (Switch, Fractions)) else None
    return type(default), items, limit


def ambiguity(flag: str, owned: list[tuple[str, str, Any]], found: dict[str, tuple[str, str, Any]],
              chosen: dict[str, dict[str, Any]]) -> str:
    """The line refusing ``--FLAG`` of several meanings (``owned``): each meaning with the flags (of ``found``) that
    set it or a part of it, nothing else, and the ``--set`` forms."""

    def sets(section: str, key: str) -> set[str]:      # the sections a flag of section.key sets
        if section == "encoding":                      # every chosen encoding's that declares it
            return {ONE_ENCODING + name for name, options in chosen.items() if key in options}
        return {section}

    described, forms, alone = [], [], []
    for section, key, _ in owned:
        mine = sets(section, key)
        flags = [f"--{f}" for f, (where, k, _) in found.items() if k == key and sets(where, k) <= mine]
        if section in FLAG_ORDER:
            what = f"{section}.{key}"
            forms.append(f"--set {section}.{key}=VALUE")
        else:
            what = f"{' and '.join(name for name in chosen if ONE_ENCODING + name in mine)}'s {key}"
        described.append(what + (f" ({', '.join(flags)})" if flags else ""))
        alone += flags
    forms.append("--set encoding.KEY=VALUE with that encoding alone in -e")
    return (f"--{flag} is ambiguous with -e {','.join(chosen)}: it is {' or '.join(described)}; say which with "
            f"{'those flags, or ' if alone else ''}{', or '.join(forms)}")


def true_or_false(option: Any) -> bool:
    return isinstance(option.default, bool) or isinstance(option.limit, Switch)


def slurm_declarations() -> dict[str, tuple[str, str, Any]]:
    """The sweep's executor settings (``SlurmOptions``) as flags: ``--partition gpu``."""
    return {key.replace("_", "-"): ("slurm", key, option) for key, option in declared(SlurmOptions).items()
            if key != "additional"}                  # a table: the study file's [slurm] only


#: ``ctx.meta`` keys: the click options made for this command line, each (option, setting) given, and every
#: option's every appearance in order
PARAMS, GIVEN, ORDER = (f"posbench.setting_flags.{name}" for name in ("params", "given", "order"))


def click_params(known: dict[str, tuple[str, str, Any]], *, taken: Iterable[str] = (),
                 short: dict[str, str] | None = None, hidden: Iterable[str] = (), panel: str = "Settings") -> list[Any]:
    """One click option per flag of ``known``, made by typer from a generated signature (as it makes a command's
    own), skipping ``taken`` names; each callback appends a typed ``Setting`` to ``ctx.meta[GIVEN]``."""
    taken, short, hidden = set(taken), short or {}, set(hidden)
    parameters = []
    for flag, (section, key, option) in known.items():
        if f"--{flag}" in taken or f"--no-{flag}" in taken:
            continue
        switch = option.switch if section == AMBIGUOUS else true_or_false(option)
        names = (f"--{flag}/--no-{flag}",) if switch else (f"--{flag}", *([short[flag]] if flag in short else []))
        if section == AMBIGUOUS:                        # given, it is refused
            info = OptionInfo(default=None, param_decls=names, callback=refuse(option.refusal), expose_value=False,
                              hidden=True)
        else:
            where = f"{'encoding' if section.startswith(ONE_ENCODING) else section}.{key}"
            default = ",".join(map(str, option.default)) if isinstance(option.default, list) else option.default
            default = "none" if default in ("", None) else str(default).lower() if switch else str(default)
            info = OptionInfo(default=None, param_decls=names, help=f"{option.help} ({where}, default {default})",
                              show_default=False, callback=reader(section, key, where, option), expose_value=False,
                              metavar=None if switch else metavar(option.default), hidden=flag in hidden,
                              rich_help_panel=panel)
        parameters.append(inspect.Parameter(f"setting_{len(parameters)}", inspect.Parameter.KEYWORD_ONLY,
                                            default=info, annotation=Optional[bool] if switch else Optional[str]))

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
            return
        names = option_names(ctx.command.get_params(ctx))
        if isinstance(value, str) and underscores_as_dashes(value.partition("=")[0]) in names:
            raise typer.BadParameter(f"needs a value ({value} is an option)")       # --warmup --timed-steps 2
        try:
            value = typed(where, value, option.default, option.limit)
        except UserError as exc:
            raise typer.BadParameter(str(exc)) from None
        ctx.meta[GIVEN].append((param, Setting(section, key, value)))

    return read


def refuse(message: str):
    def read(value: Any) -> None:
        if value is not None:
            raise typer.BadParameter(message)

    return read


def option_names(params: list[Any]) -> set[str]:
    return {name for param in params for name in (*param.opts, *param.secondary_opts) if name.startswith("-")}


def given(ctx: Any) -> list[Setting]:
    """The settings the command line gave as flags, typed, in the order of their last appearance."""
    return [setting for _, setting in ctx.meta.get(GIVEN, [])]


def underscores_as_dashes(name: str) -> str:
    """click's ``token_normalize_func``: ``--new_tokens`` is ``--new-tokens``."""
    return name.replace("_", "-")


class SettingFlags(TyperCommand):
    """A command whose settings are flags, made per command line (``flag_declarations`` of what it chose) and kept
    in ``ctx.meta``: the command object is shared by every command line the process reads."""

    choosers: ClassVar[tuple[str, ...]] = ()        # the options (``dest`` names) that decide which flags there are
    directories: ClassVar[tuple[str, ...]] = ("out_dir", "resume")   # options naming a directory: never empty text
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
        first = typer.Context(self, parent=ctx.parent, info_name=ctx.info_name, resilient_parsing=True,
                              ignore_unknown_options=True, token_normalize_func=ctx.token_normalize_func,
                              help_option_names=ctx.help_option_names)   # click keeps the first help option made
        names = {name for param in self.params if param.name in self.choosers for name in param.opts}
        words = [word for i, word in enumerate(args)
                 if not (NEGATIVE.match(word) and (i == 0 or args[i - 1] not in names))]
        values, _, _ = self.make_parser(first).parse_args(args=words)     # resilient: no usage error
        return {name: values.get(name) for name in self.choosers}

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        chosen = self.chosen(ctx, args)
        try:
            known = self.flag_declarations(chosen)
        except UserError as exc:                 # an unknown task or encoding: one line, exit code 2
            ctx.fail(str(exc))
        ctx.meta[PARAMS] = click_params(known, taken=option_names(self.params), short=self.short_flags,
                                        hidden=self.hidden_flags, panel=self.flags_panel)
        ctx.meta[GIVEN] = []
        try:
            rest = super().parse_args(ctx, args)
        except Exception as exc:        # click's usage errors, told by their public attributes
            if getattr(exc, "ctx", False) is None:          # "requires an argument": the command's, not posbench's
                exc.ctx = ctx
            raise                       # (an unknown option's suggestions: posbench.cli.suggestions.meant)
        # click calls each flag's callback once, in the order of its first appearance: sorted by its last, of two
        # flags of one setting the one given last counts (``--theta 1 --rope-theta 2 --theta 3``: 3)
        last = {id(param): i for i, param in enumerate(ctx.meta.pop(ORDER, []))}
        ctx.meta[GIVEN].sort(key=lambda given: last.get(id(given[0]), -1))
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
            for param in order:         # "" would be read as the path ".": the current directory, in silence
                if param.name in self.directories and opts.get(param.name) == "" and not ctx.resilient_parsing:
                    raise typer.BadParameter("empty text (for the current directory: .)", ctx=ctx, param=param)
            return opts, rest, order

        parser.parse_args = parse_args
        return parser

    def get_params(self, ctx: Any) -> list[Any]:
        return [*super().get_params(ctx), *ctx.meta.get(PARAMS, ())]


# ---- the commands with settings flags, and what decides each one's ----------------------------------------------

class RunCommand(SettingFlags, RegistryHelp):
    fills = {"encoding": "encodings_help", "task": "tasks_help", "preset": "presets_help"}
    choosers = ("task", "encoding")

    def flag_declarations(self, chosen: dict[str, Any]) -> dict[str, tuple[str, str, Any]]:
        return declarations(chosen["task"], split_names(chosen["encoding"] or ""))


class ExtendCommand(SettingFlags, RegistryHelp):
    fills = {"method": "methods_help", "preset": "extend_presets_help"}
    choosers = ("method",)
    short_flags = {"length": "-l"}

    def flag_declarations(self, chosen: dict[str, Any]) -> dict[str, tuple[str, str, Any]]:
        return declarations("extend", [chosen["method"]] if chosen["method"] else [])


class BenchCommand(SettingFlags):
    hidden_flags = ("steps",)                   # train.steps: bench refuses it (its timed steps are --timed-steps)

    def flag_declarations(self, chosen: dict[str, Any]) -> dict[str, tuple[str, str, Any]]:
        return declarations("bench")


class SweepCommand(SettingFlags):
    flags_panel = "Executor settings"

    def flag_declarations(self, chosen: dict[str, Any]) -> dict[str, tuple[str, str, Any]]:
        return slurm_declarations()
