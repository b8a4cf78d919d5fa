"""Say when ``torch.compile`` gave up: past dynamo's recompile limit (8 graphs per function by default), a compiled
function runs unfused (eager) for every later shape, with one logged warning that a run's own output can bury.
A run watches for it (``EagerFallbacks``) and says so once, in its log and in its ``result.json``
(``environment.compile_fallbacks``: the functions that fell back), so that a time or a memory figure is never
read as a compiled one's when it was not."""

from __future__ import annotations

import logging
import re

#: the loggers dynamo reports a hit recompile limit on
LOGGERS = ("torch._dynamo.convert_frame", "torch._dynamo")
HIT = re.compile(r"hit config\.(\w+)")
FUNCTION = re.compile(r"function: '([^']+)' \(([^)]+)\)")


class EagerFallbacks(logging.Handler):
    """A context manager: inside, every recompile-limit hit is collected (``found``: 'name (file:line), limit')."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001  (a malformed record is not ours to report)
            return
        hit = HIT.search(message)
        if hit is None:
            return
        where = FUNCTION.search(message)
        what = f"{where.group(1)} ({where.group(2)})" if where else "a compiled function"
        entry = f"{what}: {hit.group(1)}"
        if entry not in self.found:
            self.found.append(entry)

    def __enter__(self) -> "EagerFallbacks":
        for name in LOGGERS:
            logging.getLogger(name).addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        for name in LOGGERS:
            logging.getLogger(name).removeHandler(self)

    def note(self) -> str | None:
        """The one line a run prints, or None."""
        if not self.found:
            return None
        return ("note: torch.compile hit its recompile limit, so these ran unfused (eager) for their later shapes: "
                + "; ".join(self.found))
