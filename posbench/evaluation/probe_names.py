"""The names of the length probe's values (``posbench.evaluation.length_probe``): ``nll_<k>x``, the held-out loss
at k times the training length. Read by compare's tables and figures without the probe itself (no torch)."""

from __future__ import annotations

import re

PREFIX = "nll_"
NAME = re.compile(r"nll_([0-9]+(?:\.[0-9]+)?)x")


def probe_name(factor: float) -> str:
    """``nll_2x`` for 2 (``nll_1.5x`` for 1.5)."""
    return f"{PREFIX}{factor:g}x"


def is_length_loss(name: str) -> bool:
    """Whether a probe value is one of this probe's losses (not a percentage)."""
    return NAME.fullmatch(name) is not None


def factor_of(name: str) -> float:
    """The length factor of a probe value's name (``nll_4x`` -> 4.0)."""
    found = NAME.fullmatch(name)
    if found is None:
        raise ValueError(f"'{name}' is not a held-out loss of the length probe")
    return float(found.group(1))
