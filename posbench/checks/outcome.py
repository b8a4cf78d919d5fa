"""What a check returns: one line each, passed or failed, and the report of one encoding's or task's checks."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field


class CheckFailed(Exception):
    """Raised inside a check: its message is the one line that says what is wrong."""


@dataclass
class Check:
    name: str               # what is checked, e.g. "cache equals recomputation"
    passed: bool
    detail: str = ""        # the measurement, or why it failed (one line)

    def line(self, subject: str) -> str:
        status = "ok  " if self.passed else "FAIL"
        return f"{status}  {subject}: {self.name}" + (f": {self.detail}" if self.detail else "")


@dataclass
class Report:
    subject: str            # "encoding 'rope'", "task 'copy'"
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def lines(self) -> list[str]:
        return [c.line(self.subject) for c in self.checks]

    def run(self, name: str, fn: Callable[[], str | None]) -> bool:
        """Run one check: ``fn`` returns a detail line (or None) when it passes and raises ``CheckFailed`` (or
        anything else: a bug the check found) when it does not."""
        try:
            detail = fn() or ""
            self.checks.append(Check(name, True, detail))
            return True
        except Exception as exc:  # noqa: BLE001  (whatever the user's code raises is what the check found)
            self.checks.append(Check(name, False, failure(exc)))
        return False

    def guard(self, name: str, fn: Callable[[], None]) -> bool:
        """Run ``fn``, which adds checks of its own: when it raises, the checks it added stay, and one failed
        check ``name`` says what it raised."""
        try:
            fn()
            return True
        except Exception as exc:  # noqa: BLE001
            self.checks.append(Check(name, False, failure(exc)))
        return False

    def assert_ok(self) -> None:
        """For a test suite: an ``AssertionError`` listing every failed check."""
        if not self.passed:
            raise AssertionError("\n".join(c.line(self.subject) for c in self.failed))


def failure(exc: Exception) -> str:
    """The one line of a failed check: ``CheckFailed``'s message, or any other exception with where it was raised."""
    if isinstance(exc, CheckFailed):
        return one_line(str(exc))
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return one_line(f"{type(exc).__name__}: {exc} ({where.filename}:{where.lineno})")


def one_line(text: str) -> str:
    return " ".join(text.split())
