"""The ``bench`` task: the speed benchmark of ``posbench bench``. Its folder: ``task.py`` (the task), ``speed.py``
(one timed step of each mode), ``presets.toml``.
"""

from posbench.tasks.bench.task import Bench

__all__ = ["Bench"]
