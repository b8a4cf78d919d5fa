"""Positional encodings: the contract (``PositionalEncoding``) and the registry (``ENCODINGS``).

Importing this package registers the built-in encodings; third-party ones come through the
``posbench.encodings`` entry-point group.
"""

from posbench.bias import ScoreBias
from posbench.encodings.base import ENCODINGS, PositionalEncoding
from posbench.encodings.options import Bound, EncodingOptionError, OneOf
from posbench.encodings import (  # noqa: F401  (registration)
    abacus, alibi, fire, kerple, nope, randpe, rope, sandwich, t5, tape, xpos)
from posbench.encodings import cope, dape  # noqa: F401,E402  (registration; dape builds its base from the registry)

__all__ = ["ENCODINGS", "Bound", "EncodingOptionError", "OneOf", "PositionalEncoding", "ScoreBias"]
