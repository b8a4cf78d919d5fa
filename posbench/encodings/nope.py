"""NoPE: no positional signal at all; the causal mask is the only source of order information."""

from posbench.encodings.base import PositionalEncoding


class NoPE(PositionalEncoding):
    name = "nope"
    description = "no positional encoding (causal mask only)"
