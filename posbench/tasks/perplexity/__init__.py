"""The ``perplexity`` task: perplexity against evaluation length. Its folder: ``task.py``, ``presets.toml``.
"""

from posbench.tasks.perplexity.task import Perplexity

__all__ = ["Perplexity"]
