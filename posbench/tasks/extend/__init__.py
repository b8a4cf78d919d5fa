"""The ``extend`` task: the context extension of a pretrained Llama (``posbench extend``). Its folder: ``task.py``,
``presets.toml``.
"""
