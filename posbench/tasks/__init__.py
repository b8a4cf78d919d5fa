"""Tasks: the contract (``Task``, in ``base.py``) and the registry (``TASKS``).

Each task registers itself by subclassing ``Task`` when its module is imported: ``TASKS[name]`` imports a built-in
one's module alone (``posbench/catalog.py`` names it), and listing the tasks, or asking for a name the catalog does
not know, imports every module and folder in ``posbench/tasks/`` (``posbench.registry.import_folder``). A built-in
task is a folder (``arithmetic/``: ``task.py``, ``presets.toml``, its data and metric), and a task dropped in as one
file (``copy.py``, presets in ``copy.toml``) needs no other edit. Third-party tasks come through the ``posbench.tasks`` entry-point group or ``--plugins``.
"""

#: the modules and folders posbench ships: their tasks are "built-in"; one dropped in is listed as added
SHIPPED = ("arithmetic", "base", "build_model", "corpus_task", "extend", "model_source", "passkey",
           "perplexity", "presets", "pretrain", "ruler", "scrolls")

from posbench.tasks.base import TASKS, IndexedStream, Phase, SeededStream, Task  # noqa: E402
from posbench.tasks.presets import PRESET_NAMES  # noqa: E402

__all__ = ["PRESET_NAMES", "TASKS", "IndexedStream", "Phase", "SeededStream", "Task"]
