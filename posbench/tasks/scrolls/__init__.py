"""The ``scrolls`` task: the seven SCROLLS data sets. Its folder: ``task.py``, ``data.py`` (the data sets' files and
prompts), ``metric.py`` (the official metrics), ``example_scores.py`` (the per-example scores compare pairs: no torch),
``presets.toml``.
"""
