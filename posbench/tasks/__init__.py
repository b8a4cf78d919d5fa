"""Tasks: the contract (``Task``, in ``base.py``) and the registry (``TASKS``).

Each task registers itself by subclassing ``Task`` when its module is imported: ``TASKS[name]`` imports a built-in
one's module alone (``posbench/catalog.py`` names it), and listing the tasks, or asking for a name the catalog does
not know, imports every module and folder in ``posbench/tasks/``, and every module of each folder
(``posbench.registry.import_folder``). A built-in task is a folder (``arithmetic/``: ``task.py``, ``presets.toml``,
its data, its metric and its per-example scores); importing the folder imports none of them, so that the parts
that need no model (a metric, the scores ``compare --against`` pairs) load without torch. A task dropped in as one
file (``copy.py``, presets in ``copy.toml``) or as a folder needs no other edit. Third-party tasks come through the
``posbench.tasks`` entry-point group or ``--plugins``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:                       # what the names below are, for type checkers and editors
    from posbench.tasks.base import TASKS, IndexedStream, Phase, SeededStream, Task
    from posbench.tasks.presets import PRESET_NAMES

#: the modules and folders posbench ships: their tasks are "built-in"; one dropped in is listed as added
SHIPPED = ("arithmetic", "base", "build_model", "corpus_task", "extend", "model_source", "passkey",
           "perplexity", "presets", "pretrain", "ruler", "scrolls")

#: each name this package gives -> the module that defines it, imported when the name is first asked for: the
#: contract imports torch, which what reads a task's pure parts (its metric, its per-example scores) never needs
_LAZY = {"TASKS": "base", "IndexedStream": "base", "Phase": "base", "SeededStream": "base", "Task": "base",
         "PRESET_NAMES": "presets"}

__all__ = ["PRESET_NAMES", "SHIPPED", "TASKS", "IndexedStream", "Phase", "SeededStream", "Task"]


def __getattr__(name: str):
    """``TASKS``, ``Task``, ... from their modules, at their first use (``_LAZY``)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"posbench.tasks.{_LAZY[name]}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
