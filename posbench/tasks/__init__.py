"""Tasks: the contract (``Task``, in ``base.py``) and the registry (``TASKS``).

Each task registers itself by subclassing ``Task`` when its module is imported: ``TASKS[name]`` imports a built-in
one's module alone (``posbench/catalog.py`` names it), and listing the tasks, or asking for a name the catalog does
not know, imports every module and folder in ``posbench/tasks/`` (``posbench.registry.import_folder``) and every
built-in task's module. A built-in task is a folder (``arithmetic/``: ``task.py``, ``presets.toml``, its data, its
metric and its per-example scores); importing the folder imports none of them, so that the parts that need no model
(a metric, the scores ``compare --against`` pairs) load without torch. A task dropped in as one file (``copy.py``,
presets in ``copy.toml``) needs no other edit. Third-party tasks come through the ``posbench.tasks`` entry-point
group or ``--plugins``.
"""

import importlib

#: the modules and folders posbench ships: their tasks are "built-in"; one dropped in is listed as added
SHIPPED = ("arithmetic", "base", "build_model", "corpus_task", "extend", "model_source", "passkey",
           "perplexity", "presets", "pretrain", "ruler", "scrolls")

#: the names this package gives, each from the module that defines it, imported when first asked for: the
#: contract imports torch, which what reads a task's pure parts (its metric, its per-example scores) never needs
LAZY = {"TASKS": "base", "IndexedStream": "base", "Phase": "base", "SeededStream": "base", "Task": "base",
        "PRESET_NAMES": "presets"}

__all__ = sorted(LAZY)


def __getattr__(name: str):
    if name not in LAZY:
        raise AttributeError(f"module 'posbench.tasks' has no attribute {name!r}")
    return getattr(importlib.import_module(f"posbench.tasks.{LAZY[name]}"), name)
