"""Positional encodings: the contract (``PositionalEncoding``) and the registry (``ENCODINGS``).

Importing this package imports every module in ``posbench/encodings/`` (``posbench.registry.import_folder``), so
each encoding registers itself by subclassing: a file dropped into this folder needs no other edit. Third-party
encodings come through the ``posbench.encodings`` entry-point group or ``--plugins``.
"""

#: the modules posbench ships: their encodings are "built-in"; a file dropped in is listed as added
SHIPPED = ("abacus", "alibi", "base", "cope", "dape", "fire", "kerple", "nope", "randpe", "rope", "sandwich", "t5",
           "tape", "xpos")

from posbench.model.bias import ScoreBias  # noqa: E402
from posbench.encodings.base import ENCODINGS, PositionalEncoding  # noqa: E402
from posbench.registry import import_folder  # noqa: E402

import_folder(__name__, __path__)

__all__ = ["ENCODINGS", "PositionalEncoding", "ScoreBias"]
