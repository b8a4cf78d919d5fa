"""The ``passkey`` task: LongLoRA's passkey retrieval on a length x depth grid. Its folder: ``task.py``,
``presets.toml`` (the prompts are ``posbench.evaluation.passkey``, which ``posbench.hf.tiny`` shares).
"""
