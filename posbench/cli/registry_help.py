"""Help text built from the registries: the encodings, tasks, presets and extension methods that ``--help``
names are whatever is registered (a plugin's too), read when the help is shown.

Importing the registries takes seconds (torch and every encoding), so the option's help is filled in only when
the command's help is formatted, not when the command line is built: ``posbench compare`` never pays for it.
A command whose help names registered things is registered with ``cls=`` one of the classes below.
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


class SettingFlags(RegistryHelp):
    """A command that reads settings as flags (``posbench.cli.setting_flags``) from click's extra arguments, which
    it lets through (unknown options and extra words). Before click parses, ``--name VALUE`` of a name the command
    does not declare becomes ``--name=VALUE``: click then leaves it whole (a value such as ``-1e-3`` is not read as
    short options, and a positional argument after it, the sweep's study file, stays positional)."""

    def __init__(self, *args: Any, context_settings: dict[str, Any] | None = None, **kwargs: Any) -> None:
        lets_through = {"allow_extra_args": True, "ignore_unknown_options": True}
        super().__init__(*args, context_settings={**lets_through, **(context_settings or {})}, **kwargs)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        import re

        from posbench.cli.setting_flags import own_options

        own = own_options(self)
        joined, i = [], 0
        while i < len(args):
            word = args[i]
            value = args[i + 1] if i + 1 < len(args) else None
            if word.startswith("--") and "=" not in word and word not in own and word != "--" and value is not None \
                    and (not value.startswith("-") or re.fullmatch(r"-\.?\d.*", value)):
                joined.append(f"{word}={value}")
                i += 2
                continue
            joined.append(word)
            i += 1
        return super().parse_args(ctx, joined)


class SettingsHelp(SettingFlags):
    """A command whose settings are flags made from their declarations (``posbench.cli.setting_flags``): their list
    (``listing``; by default those of a run of ``task``) is appended to the epilog when the help is shown."""

    task: ClassVar[str] = ""

    def listing(self) -> str:
        from posbench.cli.setting_flags import flags_help, own_options

        return flags_help(self.task, own_options(self))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from rich.markup import escape

        if not getattr(self, "_listed", False):
            self.epilog = (self.epilog or "") + "\n" + escape(self.listing())
            self._listed = True
        return super().format_help(ctx, formatter)


class SweepHelp(SettingsHelp):
    def listing(self) -> str:
        from posbench.cli.setting_flags import flags_help, slurm_declarations

        return flags_help("", known=slurm_declarations())


class BenchHelp(SettingsHelp):
    task = "bench"

    def listing(self) -> str:
        from posbench.cli.setting_flags import flags_help, own_options

        return flags_help(self.task, {*own_options(self), "--steps"})      # train.steps: bench refuses it


class RunHelp(SettingFlags):
    fills = {"encoding": encodings_help, "task": tasks_help, "preset": presets_help}


class ExtendHelp(SettingsHelp):
    task = "extend"
    fills = {"method": methods_help, "preset": extend_presets_help}
