"""``ModelConfig``: the model's options, each declared once with its default, range and help."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from posbench.model.attention import BACKENDS
from posbench.options import OneOf, OptionError, at_least, check_fields, option, positive


@dataclass
class ModelConfig:
    """The model's options, each declared once (``posbench.options.option``) and checked alike from Python and
    from ``--set model.KEY=VALUE``; ``encoding_options`` are checked by the encoding when it is built."""

    vocab_size: int = option(256, "the vocabulary (set by the task)", at_least(1))
    d_model: int = option(128, "the width of the hidden states", at_least(1))
    n_layers: int = option(2, "decoder blocks", at_least(1))
    n_heads: int = option(4, "attention heads (d_model / n_heads must be even)", at_least(1))
    d_ff: int = option(0, "the SwiGLU MLP's width (0: 4 x d_model; the reference: 3072 for 768)", at_least(0))
    max_seq_len: int = option(256, "the training length (encodings that need it read it from here)", at_least(0))
    encoding: str = option("rope", "the positional encoding (posbench ls encodings)")
    encoding_options: dict[str, Any] = field(default_factory=dict)
    attention: str = option("auto", "the attention backend", OneOf(("auto", *sorted(BACKENDS))))
    norm_eps: float = option(1e-5, "RMSNorm's epsilon", positive())
    init_std: float = option(0.02, "the standard deviation of the N(0, std) initialisation", positive())

    def __post_init__(self):
        check_fields(self, "model")
        if self.d_ff <= 0:
            self.d_ff = 4 * self.d_model
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise OptionError(f"model: d_model {self.d_model} must split into {self.n_heads} heads of even size")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
