"""The ``pretrain`` task: language-model pre-training on a corpus. Its folder: ``task.py``, ``presets.toml``.
"""
