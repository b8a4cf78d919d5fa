"""Positional encodings: the contract (``PositionalEncoding``) and the registry (``ENCODINGS``).

Each encoding registers itself by subclassing when its module is imported: ``ENCODINGS[name]`` imports a built-in
one's module alone (``posbench/catalog.py`` names it), and listing the encodings, or asking for a name the catalog
does not know, imports every module in ``posbench/encodings/`` (``posbench.registry.import_folder``): a file dropped
into this folder needs no other edit. Third-party
encodings come through the ``posbench.encodings`` entry-point group or ``--plugins``.
"""

#: the modules posbench ships: their encodings are "built-in"; a file dropped in is listed as added
SHIPPED = ("abacus", "alibi", "base", "cope", "dape", "fire", "kerple", "nope", "randpe", "rope", "sandwich", "t5",
           "tape", "xpos")

from posbench.model.bias import ScoreBias  # noqa: E402
from posbench.encodings.base import ENCODINGS, PositionalEncoding  # noqa: E402

__all__ = ["ENCODINGS", "PositionalEncoding", "ScoreBias"]
