"""The parts of the commands' help that name every registered class (encodings, tasks and their presets,
extension methods), a plugin's too: made from the registries, which import torch and every class. Only a
command's help that shows them imports this module (``posbench.cli.registry_help.RegistryHelp``)."""

from __future__ import annotations

from posbench.encodings import ENCODINGS
from posbench.hf.methods import METHODS
from posbench.tasks import PRESET_NAMES, TASKS
from posbench.tasks.presets import presets_of


def listing(names: list[str], last: str = "or") -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def encodings_help() -> str:
    return (f"Encoding name, or several separated by commas (run in turn): {listing(sorted(ENCODINGS))} "
            f"('posbench ls encodings').")


def tasks_help() -> str:
    return f"Task name: {listing(sorted(TASKS))} ('posbench ls tasks')."


def presets_help() -> str:
    names = list(PRESET_NAMES) + sorted({p for t in TASKS.values() for p in presets_of(t)} - set(PRESET_NAMES))
    defaults = {name: cls.default_preset for name, cls in TASKS.items() if presets_of(cls)}
    usual = max(set(defaults.values()), key=list(defaults.values()).count)
    others = ", ".join(f"{t}: {p}" for t, p in sorted(defaults.items()) if p != usual)
    return (f"Preset: {listing(names)} (default: {usual}" + (f"; {others}" if others else "") +
            "; 'posbench ls presets' gives each one's time).")


def methods_help() -> str:
    free = [name for name, cls in METHODS.items() if not cls.trains]
    return (f"The extension method: {listing(list(METHODS))}" +
            (f"; {listing(free, 'and')}: training-free (0 steps)" if free else "") + "; docs/pretrained.md.")


def extend_presets_help() -> str:
    extend = TASKS["extend"]
    names = [f"{p} (default)" if p == extend.default_preset else p for p in presets_of(extend)]
    return f"Preset: {listing(names)}; 'posbench ls presets' gives each one's steps and time."
