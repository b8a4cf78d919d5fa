"""``ModelConfig``: the model's options, each declared once with its default, range and help."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from posbench.options import Added, OneOf, OptionError, at_least, check_fields, option, positive

#: the fields that shape the backbone (docs/encodings.md, "Backbones"); their defaults are the pre-norm decoder
BACKBONE = ("norm", "norm_position", "mlp", "embedding_norm", "head_mlp", "recurrences", "eval_recurrences",
            "input_injection", "state_std", "init_scheme")

#: settings read under their current name: a run recorded at commit 30fcda1 (the protocols study's first cells) says
#: ``init`` for ``init_scheme``, renamed because ``run --init`` is another thing
RENAMED = {"init": "init_scheme"}
#: the attention backends (``posbench.model.attention`` registers one function under each name)
BACKEND_NAMES = ("eager", "flash_attn", "flex", "sdpa", "sdpa_split")


def check_passes(encoding: str, one_pass: bool, recurrences: int, eval_recurrences: int) -> None:
    """Refuse an encoding that runs on one pass of the blocks (``PositionalEncoding.one_pass``: TAPE) on a model
    that runs them more than once: the one line of the run's configuration (``posbench.runs.config``), bench's
    and the model's own."""
    if one_pass and max(recurrences, eval_recurrences) > 1:
        raise OptionError(f"encoding '{encoding}' runs on one pass of the blocks (its state after the last layer is "
                          f"discarded), not {max(recurrences, eval_recurrences)}: set model.recurrences to 1 and "
                          f"model.eval_recurrences to 0 or 1")


def current_names(model: dict[str, Any]) -> dict[str, Any]:
    """A recorded model section with every renamed setting under its current name."""
    return {RENAMED.get(key, key): value for key, value in model.items()}


@dataclass
class ModelConfig:
    """The model's options, each declared once (``posbench.options.option``) and checked alike from Python and
    from ``--set model.KEY=VALUE``; ``encoding_options`` are checked by the encoding when it is built."""

    vocab_size: int = option(256, "the vocabulary (set by the task)", at_least(1))
    d_model: int = option(128, "the width of the hidden states", at_least(1))
    n_layers: int = option(2, "decoder blocks", at_least(1))
    n_heads: int = option(4, "attention heads (d_model / n_heads must be even)", at_least(1))
    d_ff: int = option(0, "the gated MLP's width (0: 4 x d_model; the reference: 3072 for 768)", at_least(0))
    max_seq_len: int = option(256, "the training length (encodings that need it read it from here)", at_least(0))
    encoding: str = option("rope", "the positional encoding (posbench ls encodings)")
    encoding_options: dict[str, Any] = field(default_factory=dict)
    attention: str = option("auto", "the attention backend", OneOf(("auto", *BACKEND_NAMES)),
                            changes_results=False)       # every backend computes the same attention
    norm_eps: float = option(1e-5, "the norms' epsilon", positive())
    init_std: float = option(0.02, "the standard deviation of the N(0, std) initialisation", positive())
    # The backbone (docs/encodings.md, "Backbones"). The defaults are the pre-norm decoder; the arithmetic releases'
    # depth-recurrent class (zhuconv/arithmetic, mcleish7/arithmetic) is norm=layer, norm_position=post, mlp=geglu,
    # embedding_norm, head_mlp, input_injection, state_std=0.02, init_scheme=deepnorm, norm_eps=1e-12.
    norm: str = option("rms", "the norm: rms (RMSNorm, no bias) or layer (LayerNorm, with its bias)",
                       OneOf(("rms", "layer")), added=Added(2, "rms"))
    norm_position: str = option("pre", "pre: x + f(norm(x)); post: norm(x + f(x)) (the depth-recurrent class)",
                                OneOf(("pre", "post")), added=Added(2, "pre"))
    mlp: str = option("swiglu", "the gated MLP: swiglu (SiLU gate) or geglu (exact GELU gate)",
                      OneOf(("swiglu", "geglu")), added=Added(2, "swiglu"))
    embedding_norm: bool = option(False, "normalise the input embeddings (token and encoding's table) before "
                                         "the first block", added=Added(2, False))
    head_mlp: bool = option(False, "a gated MLP (no residual) between the last block and the final norm",
                            added=Added(2, False))
    recurrences: int = option(1, "how many times the n_layers blocks run, in turn, while training (weights "
                                 "shared)", at_least(1), added=Added(2, 1))
    eval_recurrences: int = option(0, "recurrences at evaluation (0: as while training)", at_least(0),
                                   added=Added(2, 0))
    input_injection: bool = option(False, "add the input embeddings to the hidden state at the entry of every "
                                          "recurrence, onto an initial state (zero, or N(0, state_std))",
                                  added=Added(2, False))
    state_std: float = option(0.0, "with input_injection: the std of the random initial state drawn at every "
                                   "training forward pass (0: zero); at evaluation it is zero", at_least(0),
                              added=Added(2, 0.0))
    init_scheme: str = option("normal", "the model's own weights: normal (N(0, init_std)) or deepnorm (Xavier normal, "
                                 "gain (8 L)^-1/4 but 1 for queries and keys; embeddings N(0, d_model^-1/2))",
                       OneOf(("normal", "deepnorm")), added=Added(2, "normal"))

    def __post_init__(self):
        check_fields(self, "model")
        if self.d_ff <= 0:
            self.d_ff = 4 * self.d_model
        if self.state_std > 0 and not self.input_injection:
            raise OptionError(f"model: state_std {self.state_std:g} draws the initial state that input_injection "
                              f"adds the embeddings to; set model.input_injection=true, or leave state_std at 0")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise OptionError(f"model: d_model {self.d_model} must split into {self.n_heads} heads of even size")

    @property
    def depth(self) -> int:
        """The most recurrences the model runs (a KV cache holds n_layers x depth layers)."""
        return max(self.recurrences, self.eval_recurrences)

    @property
    def embedding_std(self) -> float:
        """The token embeddings' init std (what a table added to them is drawn like)."""
        return self.d_model ** -0.5 if self.init_scheme == "deepnorm" else self.init_std

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
