"""Text from a study file as it may reach a SLURM job script or an error line: its control characters, and a value
shown on one line."""

from __future__ import annotations

import unicodedata
from typing import Any


def control_character(text: str) -> str | None:
    """The first control character of ``text`` (a newline, a tab, a NUL, ...) as ``U+000A``, or None."""
    found = next((c for c in text if unicodedata.category(c) == "Cc"), None)
    return None if found is None else f"U+{ord(found):04X}"


def shown_list(value: Any, width: int = 60) -> str:
    """``value`` as Python writes it, cut to ``width`` characters (a list of a thousand seeds stays one line)."""
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."
