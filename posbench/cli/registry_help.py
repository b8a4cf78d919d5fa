"""Help filled in from the registries (a plugin's too) when the help is shown, not when the command line is built:
importing them takes seconds (torch), which ``posbench compare`` never pays (``posbench.cli.registry_texts`` makes
it). The command classes below name what decides their settings flags (``posbench.cli.setting_flags``); ``meant``:
what an unknown option may have meant.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from typer.core import TyperCommand

from posbench.cli.common import split_names
from posbench.cli.setting_flags import SettingFlags, declarations, slurm_declarations


class RegistryHelp(TyperCommand):
    """A command whose options' help is made when shown (``fills``: option name -> the name of the function of
    ``posbench.cli.registry_texts`` giving it)."""

    fills: ClassVar[dict[str, str]] = {}

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from posbench.cli import registry_texts  # torch: this help names every registered class

        for param in self.params:
            make = self.fills.get(param.name or "")
            if make is not None:
                param.help = getattr(registry_texts, make)()
        return super().format_help(ctx, formatter)


MOST_MEANT = 6      # the most options a suggestion names


def meant(name: str, nearest: list[str], ctx: Any) -> list[str]:
    """What the unknown long option ``name`` may have meant, of the command line's options (its flags too), best
    first: a name beginning the other (``--step``: ``--steps``), else sharing words (``--num-steps``), else
    initials (``--learning-rate``: ``--lr``), else help naming it (``--results``: ``--out``), else ``nearest``."""
    options = long_options(ctx)
    typed = name.lstrip("-")
    for related in (begins, shares_words, initials):
        found = [option for option in options if related(typed, option.lstrip("-"))]
        if found:
            return found[:MOST_MEANT]
    return described(name, ctx) or list(nearest)


def long_options(ctx: Any) -> list[str]:
    """The long options of the command line's command (its flags too), but those its help hides."""
    return [name for param in ctx.command.get_params(ctx) if not getattr(param, "hidden", False)
            for name in (*param.opts, *param.secondary_opts) if name.startswith("--")]


def begins(typed: str, option: str) -> bool:
    """Whether one name begins the other at a word's end or in at least three letters (extend's ``--r``: none)."""
    short, long = sorted((typed, option), key=len)
    return short != long and long.startswith(short) and (len(short) >= 3 or long[len(short)] == "-")


def shares_words(typed: str, option: str) -> bool:
    a, b = set(typed.split("-")) - {""}, set(option.split("-")) - {""}
    return bool(a) and bool(b) and (a < b or b < a)


def initials(typed: str, option: str) -> bool:
    def spelled(words: str, letters: str) -> bool:
        parts = [w for w in words.split("-") if w]
        return len(parts) > 1 and "".join(w[0] for w in parts) == letters.replace("-", "")
    return spelled(typed, option) or spelled(option, typed)


def described(name: str, ctx: Any) -> list[str]:
    """The options whose help has a word starting with ``name`` (4 letters or more; ``--results``: ``--out``)."""
    word = name.lstrip("-").replace("-", " ")
    if len(word) < 4:
        return []
    pattern = re.compile(rf"\b{re.escape(word)}", re.IGNORECASE)
    return [next(opt for opt in param.opts if opt.startswith("--")) for param in ctx.command.get_params(ctx)
            if getattr(param, "help", None) and pattern.search(param.help) and not getattr(param, "hidden", False)
            and any(opt.startswith("--") for opt in param.opts)][:3]


class RunHelp(SettingFlags, RegistryHelp):
    fills = {"encoding": "encodings_help", "task": "tasks_help", "preset": "presets_help"}
    choosers = ("task", "encoding")

    def flag_declarations(self, chosen: dict[str, Any]) -> dict[str, tuple[str, str, Any]]:
        return declarations(chosen["task"], split_names(chosen["encoding"] or ""))


class ExtendHelp(SettingFlags, RegistryHelp):
    fills = {"method": "methods_help", "preset": "extend_presets_help"}
    choosers = ("method",)
    short_flags = {"length": "-l"}

    def flag_declarations(self, chosen: dict[str, Any]) -> dict[str, tuple[str, str, Any]]:
        return declarations("extend", [chosen["method"]] if chosen["method"] else [])


class BenchHelp(SettingFlags):
    hidden_flags = ("steps",)                   # train.steps: bench refuses it (its timed steps are --timed-steps)

    def flag_declarations(self, chosen: dict[str, Any]) -> dict[str, tuple[str, str, Any]]:
        return declarations("bench")


class SweepHelp(SettingFlags):
    flags_panel = "Executor settings"

    def flag_declarations(self, chosen: dict[str, Any]) -> dict[str, tuple[str, str, Any]]:
        return slurm_declarations()
