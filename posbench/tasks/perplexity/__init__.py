"""The ``perplexity`` task: perplexity against evaluation length. Its folder: ``task.py``, ``presets.toml``.
"""
