"""The options checks, shared by encodings and tasks: every option declared with a default, a range and help,
and every value outside its range refused in one line by the path a user takes (``build``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from posbench.checks.outcome import CheckFailed, Report
from posbench.errors import UserError
from posbench.options import Bound, Each, OneOf, Option, Switch, declared


def check_options(report: Report, owner: Any, build: Callable[[dict[str, Any]], Any]) -> None:
    """``build(options)`` makes the owner from those options the way a user does (a model, a run configuration)
    and must raise a one-line ``UserError`` for any bad one."""
    report.run("options declared with a default, a range and help", lambda: declared_well(owner))
    report.run("options refused out of range, in one line", lambda: refused(owner, build))


def declared_well(owner: Any) -> str:
    options = declared(owner)
    for key, o in options.items():
        if not isinstance(o, Option):
            raise CheckFailed(f"option {key} is declared as {type(o).__name__}, not Option(default, help, limit)")
        if not str(o.help).strip():
            raise CheckFailed(f"option {key} has no help")
        if o.limit is None and numeric(o.default):
            raise CheckFailed(f"option {key}={o.default!r} declares no range (Bound, OneOf or Each)")
        if o.limit is not None and not o.from_task and not o.limit.admits(o.default):
            raise CheckFailed(f"option {key}'s default {o.default!r} is outside its range ({o.limit.describe()})")
    return f"{len(options)} option{'s' if len(options) != 1 else ''}"


def numeric(value: Any) -> bool:
    """A number, or a list of numbers: what needs a range (free text and lists of names need none)."""
    if isinstance(value, list):
        return bool(value) and all(numeric(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def refused(owner: Any, build: Callable[[dict[str, Any]], Any], *, unknown: bool = True) -> str:
    """The defaults are accepted; an unknown key (``unknown``) and a value just outside each option's range are
    refused by ``build`` with a one-line ``UserError``."""
    try:
        build({})
    except UserError as exc:
        raise CheckFailed(f"the defaults themselves are refused: {exc}") from None
    tried = 0
    probes = [("no_such_option", 1)] if unknown else []
    for key, value in [*probes, *((k, out_of_range(o)) for k, o in declared(owner).items())]:
        if value is None:
            continue
        tried += 1
        try:
            build({key: value})
        except UserError as exc:
            if "\n" in str(exc) or not str(exc).strip():
                raise CheckFailed(f"{key}={value!r} is refused, but not in one line: {str(exc)!r}") from None
            continue
        raise CheckFailed(f"{key}={value!r} is accepted, out of its range")
    return f"{tried} bad values refused"


def out_of_range(o: Option) -> Any:
    """A value just outside the option's range (None when any value of its type is valid: free text)."""
    limit, default = o.limit, o.default
    if limit is None:
        return "maybe" if isinstance(default, bool) else None
    if isinstance(limit, Switch):
        return "maybe"
    if isinstance(limit, OneOf):
        return "not-" + "-".join(str(c) for c in limit.choices)
    if isinstance(limit, Each):
        if limit.min_items > 0:
            return []
        item = out_of_range(Option(default[0] if default else 0, "item", limit.item))
        return None if item is None else [item]
    if isinstance(limit, Bound):
        integer = isinstance(default, int) and not isinstance(default, bool)
        if limit.low is not None:
            value = limit.low if limit.low_strict else limit.low - 1
            value = math.floor(value) if integer else float(value)
        elif limit.high is not None:
            value = limit.high if limit.high_strict else limit.high + 1
            value = math.ceil(value) if integer else float(value)
        else:
            return None if integer else math.nan
        return value if not limit.admits(value) else None
    return None
