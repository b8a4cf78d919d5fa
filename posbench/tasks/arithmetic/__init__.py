"""The ``arithmetic`` task: McLeish et al.'s addition with reversed digits. Its folder: ``task.py`` (the task, its
data stream and its accuracy grid), ``example_scores.py`` (the per-example scores compare pairs: no torch),
``presets.toml``.
"""
