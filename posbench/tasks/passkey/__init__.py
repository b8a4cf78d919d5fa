"""The ``passkey`` task: LongLoRA's passkey retrieval on a length x depth grid. Its folder: ``task.py``,
``example_scores.py`` (the per-example scores compare pairs: no torch), ``presets.toml`` (the prompts are
``posbench.evaluation.passkey``, which ``posbench.hf.tiny`` shares).
"""
