"""The check a corpus task runs before training: is there a held-out split, and can both splits be read?

Training for hours and then finding that the corpus has no validation split, or that its documents are not
in the ``text`` field, wastes the run. :func:`check_splits` answers both before anything is trained: it finds
where the held-out documents come from and reads the first document of each split, raising one
:class:`DataError` line otherwise. Where the held-out documents come from:

* the built-in corpus: its own held-out files (1 in 16, by path digest);
* local files: files named validation/valid/val/dev/test (or under a directory of that name); without any,
  every ``holdout_every``-th document (0, k, 2k, ...) is held out and the training split is the rest;
* a hub data set: its ``validation`` split; a data set without one (FineWeb, the RedPajama sample) holds out
  every ``holdout_every``-th training document instead, and the result says so (``source_info.holdout``).
"""

from __future__ import annotations

from typing import Any

from posbench.data.errors import DataError


def check_splits(source) -> dict[str, Any]:
    """Find the held-out split of ``source`` and read one document of each split; returns
    ``{"validation": "builtin" | "files" | "split" | "held-out slice", "rule": str}``."""
    plan = dict(source.split_plan())
    for split in ("train", "validation"):
        try:
            next(iter(source.documents(split)))
        except StopIteration:
            which = "held-out" if split == "validation" else "training"
            raise DataError(f"the {which} split of '{source.spec}' is empty ({plan['rule']}); give the data "
                            f"{'a validation file or ' if split == 'validation' else ''}more documents") from None
    return plan
