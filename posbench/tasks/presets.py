"""A task's presets: named recipes (``tiny``, ``small``, ``gpu``, ``paper``, and a study's own), read from the
TOML file beside the task's module (``presets.toml`` beside a task folder's ``task.py``, ``<module>.toml`` beside a
one-file task) or given as the task class's ``presets`` dict. Each preset is a table of ``model``, ``train``,
``task`` (and ``encoding``) sub-tables overriding the built-in defaults, ``extends = "task.preset"`` to start from
another preset, and an ``expected`` table (``seconds``, ``hardware``, ``how`` = measured | estimated, ``note``).

The task declares them; reading, merging and choosing them is this module's job (``preset_of``, ``presets_of``),
so the ``Task`` class holds only what the task is.
"""

from __future__ import annotations

import inspect
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

from posbench.errors import ConfigError

PRESET_NAMES = ("tiny", "small", "gpu", "paper")
PRESET_SECTIONS = ("model", "train", "task", "encoding", "expected")


def preset_of(task: Any, name: str) -> dict[str, dict[str, Any]]:
    """Preset ``name`` of the task class ``task``; one line naming the presets there are when it has none so
    called."""
    table = presets_of(task)
    if name not in table:
        raise ConfigError(f"task '{task.name}' has no preset '{name}'; presets: {', '.join(table) or 'none'}")
    return table[name]


def presets_of(task: Any) -> dict[str, dict[str, Any]]:
    """The task class's ``presets``, or those of the TOML file beside its module (``preset_path``)."""
    return task.presets or load_presets(str(preset_path(task)), task.name)


def preset_path(task: Any) -> Path:
    """``presets.toml`` beside a task folder's ``task.py``; ``<module>.toml`` beside a one-file task."""
    module = Path(inspect.getfile(task))
    return module.with_name("presets.toml") if module.name == "task.py" else module.with_suffix(".toml")


@cache
def load_presets(path: str, task_name: str) -> dict[str, dict[str, Any]]:
    """Presets of task ``task_name`` from a TOML file; ``extends = "task.preset"`` merges another task's (or this
    file's) preset under this one, section by section."""
    from posbench.tasks.base import TASKS

    file = Path(path)
    if not file.is_file():
        return {}
    with open(file, "rb") as fh:
        raw = tomllib.load(fh)
    table: dict[str, dict[str, Any]] = {}
    for name, preset in raw.items():
        if not isinstance(preset, dict):
            raise ConfigError(f"{file.name}: preset '{name}' is {type(preset).__name__} {preset!r}, not a table: write "
                              f"[{name}] and under it {', '.join(PRESET_SECTIONS)} (each a table of settings, "
                              f"e.g. train = {{ steps = 20 }}) or extends = \"task.preset\"")
        base: dict[str, Any] = {}
        if "extends" in preset:
            task, _, other = str(preset["extends"]).partition(".")
            source = raw if task == task_name else presets_of(TASKS.get(task))
            if other not in source:
                raise ConfigError(f"{file.name}: preset '{name}' extends unknown '{preset['extends']}'")
            base = source[other]
        merged = {section: {**base.get(section, {}), **preset.get(section, {})}
                  for section in PRESET_SECTIONS if section in base or section in preset}
        unknown = sorted(set(preset) - set(PRESET_SECTIONS) - {"extends"})
        if unknown:
            raise ConfigError(f"{file.name}: preset '{name}' has unknown sections {unknown}; valid: "
                              f"{', '.join(PRESET_SECTIONS)}, extends")
        table[name] = merged
    return table
