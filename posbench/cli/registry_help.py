"""Help text built from the registries: the encodings, tasks, presets and extension methods that ``--help``
names are whatever is registered (a plugin's too), read when the help is shown.

Importing the registries takes seconds (torch and every encoding), so the option's help is filled in only when
the command's help is formatted, not when the command line is built: ``posbench compare`` never pays for it.
A command whose help names registered things is registered with ``cls=`` one of the classes below.

The commands whose settings are flags (``run``, ``extend``, ``bench``, ``sweep``) are ``SettingFlags``: the flags of
the command line being read are click options made from the settings' declarations (``posbench.cli.setting_flags``),
listed by ``--help`` in a panel of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from typer.core import TyperCommand


class RegistryHelp(TyperCommand):
    """A command whose options' help is made from the registries when the help is shown (``fills``: option
    name -> a function returning the help text)."""

    fills: ClassVar[dict[str, Callable[[], str]]] = {}

    def format_help(self, ctx: Any, formatter: Any) -> None:
        for param in self.params:
            make = self.fills.get(param.name or "")
            if make is not None:
                param.help = make()
        return super().format_help(ctx, formatter)


def listing(names: list[str], last: str = "or") -> str:
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def encodings_help() -> str:
    from posbench.encodings import ENCODINGS

    return (f"Encoding name, or several separated by commas (run in turn): {listing(sorted(ENCODINGS))} "
            f"('posbench ls encodings').")


def tasks_help() -> str:
    from posbench.tasks import TASKS

    return f"Task name: {listing(sorted(TASKS))} ('posbench ls tasks')."


def presets_help() -> str:
    from posbench.tasks import PRESET_NAMES, TASKS
    from posbench.tasks.presets import presets_of

    names = list(PRESET_NAMES) + sorted({p for t in TASKS.values() for p in presets_of(t)} - set(PRESET_NAMES))
    defaults = {name: cls.default_preset for name, cls in TASKS.items() if presets_of(cls)}
    usual = max(set(defaults.values()), key=list(defaults.values()).count)
    others = ", ".join(f"{t}: {p}" for t, p in sorted(defaults.items()) if p != usual)
    return (f"Preset: {listing(names)} (default: {usual}" + (f"; {others}" if others else "") +
            "; 'posbench ls presets' gives each one's time).")


def methods_help() -> str:
    from posbench.hf.methods import METHODS

    free = [name for name, cls in METHODS.items() if not cls.trains]
    return (f"The extension method: {listing(list(METHODS))}" +
            (f"; {listing(free, 'and')}: training-free (0 steps)" if free else "") + "; docs/pretrained.md.")


def extend_presets_help() -> str:
    from posbench.tasks import TASKS
    from posbench.tasks.presets import presets_of

    extend = TASKS["extend"]
    names = [f"{p} (default)" if p == extend.default_preset else p for p in presets_of(extend)]
    return f"Preset: {listing(names)}; 'posbench ls presets' gives each one's steps and time."


#: ``ctx.meta`` key: every option's every appearance on the command line, in order (click's parser's)
ORDER = "posbench.registry_help.order"


class SettingFlags(RegistryHelp):
    """A command whose settings are flags (``posbench.cli.setting_flags``): real click options, made for each
    command line from the declarations of the settings it can set (``flag_declarations``: those of a run of the
    task and encodings it names) and added to the command's own for that command line only (``get_params``, from
    ``ctx.meta``: the command object is shared by every command line read in the process, and never changes).
    Click then reads the whole command line, and the options' callbacks give the typed settings
    (``setting_flags.given(ctx)``). What decides the flags (``-t``, ``-e``, ``--method``) is read from the words
    before click reads them (``chosen``), and checked against what click read."""

    #: the options whose values decide which flags there are (their ``dest`` names), as ``chosen`` reads them
    choosers: ClassVar[dict[str, tuple[str, ...]]] = {}
    #: a flag's short name
    short_flags: ClassVar[dict[str, str]] = {}
    #: flags left out of the help
    hidden_flags: ClassVar[tuple[str, ...]] = ()
    #: the panel of the help that lists them
    flags_panel: ClassVar[str] = "Settings"

    def __init__(self, *args: Any, context_settings: dict[str, Any] | None = None, **kwargs: Any) -> None:
        from posbench.cli.setting_flags import underscores_as_dashes

        settings = {"token_normalize_func": underscores_as_dashes, **(context_settings or {})}
        super().__init__(*args, context_settings=settings, **kwargs)

    def flag_declarations(self, chosen: dict[str, str | None]) -> tuple[dict[str, tuple[str, Any]], dict[str, str]]:
        """The flags (``setting_flags.declarations``) and their renamed keys for the ``chosen`` values."""
        raise NotImplementedError

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        from posbench.cli.setting_flags import GIVEN, GIVEN_BY, PARAMS, click_params, in_order_given
        from posbench.errors import UserError

        chosen = {name: given_value(args, names) for name, names in self.choosers.items()}
        try:
            known, renamed = self.flag_declarations(chosen)
        except UserError as exc:                 # an unknown task or encoding: one line, exit code 2
            ctx.fail(str(exc))
        own = {name for param in self.params for name in (*param.opts, *param.secondary_opts)}
        ctx.meta[PARAMS] = click_params(known, renamed, taken=own, short=self.short_flags,
                                       hidden=self.hidden_flags, panel=self.flags_panel)
        ctx.meta[GIVEN], ctx.meta[GIVEN_BY] = [], []
        try:
            rest = super().parse_args(ctx, args)
        except Exception as exc:        # click's usage errors, told by their public attributes
            if getattr(exc, "ctx", False) is None:          # "requires an argument": the command's, not posbench's
                exc.ctx = ctx
            raise                       # (an unknown option's suggestions: posbench.cli.app.main, from ``meant``)
        in_order_given(ctx, ctx.meta.pop(ORDER, []))     # of two flags of one setting, the one given last
        read = {name: ctx.params.get(name) for name in self.choosers}
        if read != chosen and not ctx.resilient_parsing:
            names = ", ".join(self.choosers[name][-1] for name in read if read[name] != chosen[name])
            ctx.fail(f"give {names} as its own word (--name VALUE or --name=VALUE): the settings flags depend on it")
        return rest

    def make_parser(self, ctx: Any) -> Any:
        """Click's parser, which also keeps the order of every option's every appearance (``ctx.meta[ORDER]``):
        click gives its options' callbacks the order of their first appearances only."""
        parser = super().make_parser(ctx)
        parse = parser.parse_args

        def parse_args(args: list[str]) -> Any:
            opts, rest, order = parse(args=args)
            ctx.meta[ORDER] = list(order)
            return opts, rest, order

        parser.parse_args = parse_args
        return parser

    def get_params(self, ctx: Any) -> list[Any]:
        from posbench.cli.setting_flags import PARAMS

        return [*super().get_params(ctx), *ctx.meta.get(PARAMS, ())]


#: the most options an unknown option's suggestion names
MOST_MEANT = 6


def meant(name: str, nearest: list[str], ctx: Any) -> list[str]:
    """What the unknown long option ``name`` may have meant, of every option of the command line being read (the
    command's own and the settings flags made for it: ``ctx``'s command's ``get_params``), best first: those whose
    name begins it or that it begins (``--output``: ``--out``; ``--step``: ``--steps``; ``--warmup``:
    ``--warmup-ratio`` and ``--warmup-steps``), else those whose words are part of its words or hold them all
    (``--num-steps``: ``--steps``; ``--seq-len``: ``--max-seq-len``), else those it spells the initials of or
    that spell its initials (``--learning-rate``: ``--lr``; ``--bs``: ``--batch-size``), else those whose help names
    it (``described``: ``--results`` is ``--out``, "Results root directory", where click's nearest spelling is
    ``--resume``), else click's ``nearest`` spellings."""
    options = long_options(ctx)
    typed = name.lstrip("-")
    for related in (begins, shares_words, initials):
        found = [option for option in options if related(typed, option.lstrip("-"))]
        if found:
            return found[:MOST_MEANT]
    return described(name, ctx) or list(nearest)


def long_options(ctx: Any) -> list[str]:
    """The long options of the command line's command (``--x`` and ``--no-x``), its settings flags too; not those
    its help hides."""
    return [name for param in ctx.command.get_params(ctx) if not getattr(param, "hidden", False)
            for name in (*param.opts, *param.secondary_opts) if name.startswith("--")]


def begins(typed: str, option: str) -> bool:
    """Whether one of the two names begins the other: at a word's end (``lr``, ``lr-rate``), or in at least three
    letters (``out``, ``output``), so that a one-letter option (extend's ``--r``) begins no word."""
    short, long = sorted((typed, option), key=len)
    return short != long and long.startswith(short) and (len(short) >= 3 or long[len(short)] == "-")


def shares_words(typed: str, option: str) -> bool:
    """Whether the words of one of the two names are some of the other's (``steps``, ``num-steps``)."""
    a, b = set(typed.split("-")) - {""}, set(option.split("-")) - {""}
    return bool(a) and bool(b) and (a < b or b < a)


def initials(typed: str, option: str) -> bool:
    """Whether one of the two names is the initials of the other's words (``lr``, ``learning-rate``)."""
    def spelled(words: str, letters: str) -> bool:
        parts = [w for w in words.split("-") if w]
        return len(parts) > 1 and "".join(w[0] for w in parts) == letters.replace("-", "")
    return spelled(typed, option) or spelled(option, typed)


def described(name: str, ctx: Any) -> list[str]:
    """The options of the command line (``ctx``'s command's, its settings flags too) whose help has a word that
    starts with the unknown option's ``name`` (at least 4 letters): ``--results`` is ``--out`` ("Results root
    directory")."""
    import re

    word = name.lstrip("-").replace("-", " ")
    if len(word) < 4:
        return []
    pattern = re.compile(rf"\b{re.escape(word)}", re.IGNORECASE)
    return [next(opt for opt in param.opts if opt.startswith("--")) for param in ctx.command.get_params(ctx)
            if getattr(param, "help", None) and pattern.search(param.help) and not getattr(param, "hidden", False)
            and any(opt.startswith("--") for opt in param.opts)][:3]


def given_value(args: list[str], names: tuple[str, ...]) -> str | None:
    """The value the command line gives the option spelled ``names`` (``-t x``, ``--task x``, ``--task=x``,
    ``-tx``; of several, the last, as click keeps), read before click reads the command line."""
    found, i = None, 0
    while i < len(args) and args[i] != "--":
        word = args[i]
        long = next((n for n in names if n.startswith("--") and word.startswith(n + "=")), None)
        short = next((n for n in names if len(n) == 2 and word.startswith(n) and len(word) > 2), None)
        if word in names and i + 1 < len(args):
            found, i = args[i + 1], i + 2
            continue
        if long is not None:
            found = word[len(long) + 1:]
        elif short is not None and not word.startswith("--"):
            found = word[2:]
        i += 1
    return found


class RunHelp(SettingFlags):
    fills = {"encoding": encodings_help, "task": tasks_help, "preset": presets_help}
    choosers = {"task": ("-t", "--task"), "encoding": ("-e", "--encoding")}

    def flag_declarations(self, chosen: dict[str, str | None]) -> tuple[dict[str, tuple[str, Any]], dict[str, str]]:
        from posbench.cli.common import split_names
        from posbench.cli.setting_flags import declarations, renamed_keys

        task = chosen["task"]
        return declarations(task, split_names(chosen["encoding"] or "")), renamed_keys(task)


class ExtendHelp(SettingFlags):
    fills = {"method": methods_help, "preset": extend_presets_help}
    choosers = {"method": ("--method",)}
    short_flags = {"length": "-l"}

    def flag_declarations(self, chosen: dict[str, str | None]) -> tuple[dict[str, tuple[str, Any]], dict[str, str]]:
        from posbench.cli.setting_flags import declarations, renamed_keys

        return declarations("extend", [chosen["method"]] if chosen["method"] else []), renamed_keys("extend")


class BenchHelp(SettingFlags):
    hidden_flags = ("steps",)                   # train.steps: bench refuses it (its timed steps are --timed-steps)

    def flag_declarations(self, chosen: dict[str, str | None]) -> tuple[dict[str, tuple[str, Any]], dict[str, str]]:
        from posbench.cli.setting_flags import declarations, renamed_keys

        return declarations("bench"), renamed_keys("bench")


class SweepHelp(SettingFlags):
    flags_panel = "Executor settings"

    def flag_declarations(self, chosen: dict[str, str | None]) -> tuple[dict[str, tuple[str, Any]], dict[str, str]]:
        from posbench.cli.setting_flags import slurm_declarations

        return slurm_declarations(), {}
