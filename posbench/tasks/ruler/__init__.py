"""The ``ruler`` task: RULER's retrieval tasks. Its folder: ``task.py``; the offline generator: ``kinds.py`` (kinds
and defaults), ``haystack.py`` (exact length, depth, slots), ``niah.py``, ``vt.py``, ``templates.py``,
``values.py``, ``examples.py`` (one example from a seed), ``training.py``; the metric: ``scoring.py``; the
per-example scores compare pairs (no torch): ``example_scores.py``; ``presets.toml``.
"""
