"""Encoding options: defaults, types and valid ranges, checked once when an encoding is built.

An encoding declares ``defaults`` (each option's default value, whose type is the option's type) and
``limits`` (each non-boolean option's valid range: ``Bound`` for numbers, ``OneOf`` for names). A value of
the wrong type or outside its range is an ``EncodingOptionError``: one line, exit code 2 on the command line,
before any training starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from posbench.errors import UserError


class EncodingOptionError(UserError):
    """A bad encoding option; ``str()`` is one line."""


@dataclass(frozen=True)
class Bound:
    """A numeric range; ``None`` leaves that side open-ended. ``strict`` excludes the end itself."""

    low: float | None = None
    high: float | None = None
    low_strict: bool = False
    high_strict: bool = False

    def admits(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_strict else value < self.low):
            return False
        if self.high is not None and (value >= self.high if self.high_strict else value > self.high):
            return False
        return True

    def describe(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_strict else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_strict else '<='} {self.high:g}")
        return " and ".join(parts) or "finite"


def positive() -> Bound:
    return Bound(low=0, low_strict=True)


def at_least(low: float) -> Bound:
    return Bound(low=low)


@dataclass(frozen=True)
class OneOf:
    choices: tuple[str, ...]

    def admits(self, value: Any) -> bool:
        return value in self.choices

    def describe(self) -> str:
        return "one of " + ", ".join(self.choices)


def resolve_options(name: str, defaults: dict[str, Any], given: dict[str, Any],
                    limits: dict[str, Bound | OneOf] | None = None) -> dict[str, Any]:
    """Merge ``given`` over ``defaults``, refusing unknown keys, values of the wrong type and values outside
    ``limits``."""
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        valid = ", ".join(sorted(defaults)) or "none"
        raise EncodingOptionError(f"encoding '{name}' has no option {', '.join(unknown)}; valid options: {valid}")
    resolved = dict(defaults)
    for key, value in given.items():
        resolved[key] = coerce(name, key, value, defaults[key])
    for key, limit in (limits or {}).items():
        value = resolved[key]
        if value is not None and not limit.admits(value):
            raise EncodingOptionError(f"encoding '{name}' option {key}={value!r} is out of range: "
                                      f"it must be {limit.describe()}")
    return resolved


def coerce(name: str, key: str, value: Any, default: Any) -> Any:
    """``value`` (often a string from the command line) as the type of ``default``."""
    if default is None or value is None:
        return value
    kind = type(default)
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in {"true", "false", "1", "0", "yes", "no"}:
            return value.lower() in {"true", "1", "yes"}
    elif kind in (int, float):
        if isinstance(value, bool):
            pass
        elif isinstance(value, (int, float)) and (kind is float or float(value).is_integer()):
            return kind(value)
        elif isinstance(value, str):
            try:
                return kind(value)
            except ValueError:
                pass
    elif isinstance(value, kind):
        return value
    raise EncodingOptionError(
        f"encoding '{name}' option {key}={value!r} must be of type {kind.__name__}")
