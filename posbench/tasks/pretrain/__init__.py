"""The ``pretrain`` task: language-model pre-training on a corpus. Its folder: ``task.py``, ``presets.toml``.
"""

from posbench.tasks.pretrain.task import Pretrain

__all__ = ["Pretrain"]
