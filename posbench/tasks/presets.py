"""A task's presets: named recipes (``tiny``, ``small``, ``gpu``, ``paper``, a study's own) from the TOML file beside
the task's module (``preset_path``) or the class's ``presets`` dict. A preset is a table of section sub-tables
(``model``, ``train``, ``task``, ``encoding``) over the defaults, ``extends = "task.preset"``, and ``expected``
(``seconds``, ``hardware``, ``how`` = measured | estimated, ``note``).
"""

from __future__ import annotations

import inspect
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

from posbench.catalog_entry import summary_of
from posbench.errors import ConfigError
from posbench.options import SECTIONS
from posbench.tasks.base import TASKS

PRESET_NAMES = ("tiny", "small", "gpu", "paper")
PRESET_SECTIONS = (*SECTIONS, "expected")


def preset_of(task: Any, name: str) -> dict[str, dict[str, Any]]:
    table = presets_of(task)
    if name not in table:
        raise ConfigError(f"task '{task.name}' has no preset '{name}'; presets: {', '.join(table) or 'none'}")
    return table[name]


def catalog_summary(task: Any) -> dict[str, Any]:
    """What the catalog says of a task (``catalog_entry.summary_of``), with its version, default preset, presets and
    the module of its per-example scores (``example_scorer``)."""
    return {**summary_of(task), "version": task.version, "default_preset": task.default_preset,
            "presets": presets_of(task), "example_scorer": task.example_scorer}


def presets_of(task: Any) -> dict[str, dict[str, Any]]:
    return task.presets or load_presets(str(preset_path(task)), task.name)


def preset_path(task: Any) -> Path:
    """``presets.toml`` beside a task folder's ``task.py``; ``<module>.toml`` beside a one-file task."""
    module = Path(inspect.getfile(task))
    return module.with_name("presets.toml") if module.name == "task.py" else module.with_suffix(".toml")


@cache
def load_presets(path: str, task_name: str) -> dict[str, dict[str, Any]]:
    """Presets from a TOML file; ``extends`` merges another task's (or this file's) preset under one, by section."""
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
