"""The model: one decoder for every encoding, its attention backends and its decoding.

- ``config.py``: ``ModelConfig``, the model's options;
- ``transformer.py``: ``Transformer``, the decoder (blocks, attention layer, MLP), which calls the encoding's hooks;
- ``attention.py``: the attention backends (eager, SDPA, FlexAttention, flash-attn), one function, equal results;
- ``query_blocks.py``: causal attention on the CPU in blocks of queries;
- ``bias.py``: ``ScoreBias``, a logit bias written once for every backend;
- ``generate.py``: KV caches (growing and static) and greedy decoding, compiled or not.

The encodings (``posbench.encodings``) import ``bias.py`` and ``generate.py``; ``transformer.py`` never imports
the encodings: it looks an encoding up in ``posbench.registry.ENCODINGS``, where they register (the registry imports
an encoding's module at the first lookup of its name), or takes one built (``Transformer(cfg, encoding)``). So either package
can be imported first, and every import runs down.
"""

from posbench.model.config import ModelConfig

__all__ = ["ModelConfig", "Transformer"]


def __getattr__(name: str):
    """``Transformer`` is imported when first asked for: reading a run's model section (``config.py``) needs no
    torch, and ``posbench compare`` reads records alone."""
    if name == "Transformer":
        from posbench.model.transformer import Transformer  # torch: only what builds a model asks for it
        return Transformer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
