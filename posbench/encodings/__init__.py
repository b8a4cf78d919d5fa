"""Positional encodings: the contract (``PositionalEncoding``) and the registry (``ENCODINGS``).

Importing this package imports every module in ``posbench/encodings/`` (``posbench.registry.import_folder``), so
each encoding registers itself by subclassing: a file dropped into this folder needs no other edit. Third-party
encodings come through the ``posbench.encodings`` entry-point group or ``--plugins``.
"""

from posbench.model.bias import ScoreBias
from posbench.encodings.base import ENCODINGS, PositionalEncoding
from posbench.registry import import_folder

import_folder(__name__, __path__)

__all__ = ["ENCODINGS", "PositionalEncoding", "ScoreBias"]
