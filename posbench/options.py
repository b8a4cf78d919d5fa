"""The one vocabulary of settings. Every value a user sets (a flag, ``--set section.key=value``, a preset's entry,
``ModelConfig(...)``) is declared once as an ``Option`` (default, whose type is the setting's; one line of help;
``limit``; the facts compare reads) and typed and range-checked here, from the command line and Python alike. An
encoding, task or method declares ``OPTIONS = {"theta": Option(10000.0, "the rotary base", positive())}``; a
dataclass (``ModelConfig``, ``TrainConfig``) the same ``Option`` as a field, ``option(...)``. The ideas:
docs/extending.md.

Spellings: booleans ``true/false, yes/no, on/off, 1/0`` (any case); integers ``3`` or ``3.0`` (not ``3.5``); floats
in any Python spelling; lists comma-separated. Errors are one line (``OptionError``).
"""

from __future__ import annotations

import dataclasses
import decimal
import difflib
import math
import operator
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from posbench.errors import ConfigError

TRUE_WORDS = frozenset({"true", "yes", "on", "1"})
FALSE_WORDS = frozenset({"false", "no", "off", "0"})
AUTO = "auto"


class OptionError(ConfigError):
    """A bad option: unknown, of the wrong type or out of range; ``str()`` is one line."""


# ---- ranges ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Bound:
    """A numeric range; ``None`` leaves that side open-ended. ``strict`` excludes the end itself."""

    low: float | None = None
    high: float | None = None
    low_strict: bool = False
    high_strict: bool = False

    def admits(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if isinstance(value, float) and not math.isfinite(value):      # (an int is finite, however large)
            return False
        return ((self.low is None or (value > self.low if self.low_strict else value >= self.low))
                and (self.high is None or (value < self.high if self.high_strict else value <= self.high)))

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


def between(low: float, high: float) -> Bound:
    return Bound(low=low, high=high)


@dataclass(frozen=True)
class OneOf:
    choices: tuple[str, ...]

    def admits(self, value: Any) -> bool:
        return value in self.choices

    def describe(self) -> str:
        return "one of " + ", ".join(str(c) for c in self.choices)


@dataclass(frozen=True)
class Each:
    """Every item of a list within ``item``, and at least ``min_items`` items."""

    item: Bound | OneOf
    min_items: int = 1

    def admits(self, value: Any) -> bool:
        return isinstance(value, list) and len(value) >= self.min_items and all(self.item.admits(v) for v in value)

    def describe(self) -> str:
        many = f"at least {self.min_items} item{'s' if self.min_items != 1 else ''}, each " if self.min_items else ""
        return f"a list of {many}{self.item.describe()}"


@dataclass(frozen=True)
class Fractions(Each):
    """``Each`` for numbers whole or not (``1,1.5,2``): a whole one kept an integer, a fraction a float."""

    def parse(self, where: str, value: Any) -> list[int | float]:
        return [whole_or_fraction(where, item) for item in items_of(where, value)]


@dataclass(frozen=True)
class Switch:
    """true, false or auto (the default decides by itself)."""

    def parse(self, where: str, value: Any) -> bool | str:
        if isinstance(value, bool) or value == AUTO:
            return value
        word = str(value).strip().lower()
        if word == AUTO:
            return AUTO
        if word in TRUE_WORDS or word in FALSE_WORDS:
            return word in TRUE_WORDS
        raise OptionError(f"{where}={value!r}: expected true, false or auto")

    def admits(self, value: Any) -> bool:
        return isinstance(value, bool) or value == AUTO

    def describe(self) -> str:
        return "true, false or auto"


Limit = Bound | OneOf | Each | Switch


# ---- coercion ----------------------------------------------------------------------------------------------

def coerce(where: str, value: Any, default: Any) -> Any:
    """``value`` (often text) as the type of ``default``; ``where`` names the option in the error."""
    if value is None or default is None:
        return value
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        word = str(value).strip().lower() if isinstance(value, (str, int)) else None
        if word in TRUE_WORDS or word in FALSE_WORDS:
            return word in TRUE_WORDS
        raise OptionError(f"{where}={value!r}: expected true or false")
    if isinstance(default, int):
        return integer(where, value)
    if isinstance(default, float):
        return _number(where, value, "a number")
    if isinstance(default, (list, tuple)):
        items = items_of(where, value)
        return [coerce(where, item, default[0]) for item in items] if default else list(items)
    if isinstance(default, str):
        if isinstance(value, str):
            return value
        raise OptionError(f"{where}={value!r}: expected text")
    if isinstance(value, type(default)):
        return value
    raise OptionError(f"{where}={value!r}: expected {type(default).__name__}")


def items_of(where: str, value: Any) -> Any:
    """A list's items: comma-separated text split, a list or tuple as it is."""
    items = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise OptionError(f"{where}={value!r}: expected a list (comma-separated)")
    return items


def whole_or_fraction(where: str, value: Any) -> int | float:
    """A number as an integer when it is whole (``2``, ``"2"``, ``2.0``), else as a float (``1.5``)."""
    number = _exact(where, value, "a number")
    return integer(where, number) if isinstance(number, int) or number.is_integer() else number


MAX_INTEGER = 2**63 - 1      # a 64-bit signed integer's (what NumPy, torch and their files hold)
EXACT_FLOAT = 2**53          # beyond it a float's whole numbers are not all exact (9007199254740993.0 is ...992)
BEYOND_64_BITS = "an integer setting is a 64-bit integer (-2**63 to 2**63 - 1)"


def integer(where: str, value: Any) -> int:
    """``value`` as an integer, exactly: text read as written (``"9007199254740993"``, ``"1e3"``), never through a
    float; a float whole and at most 2**53; within a 64-bit integer's range."""
    number = _exact(where, value, "an integer")
    if isinstance(number, float):
        if not number.is_integer():
            raise OptionError(f"{where}={value!r}: expected an integer")
        if abs(number) > EXACT_FLOAT:
            raise OptionError(f"{where}={value!r}: beyond 2**53 a float may not be the integer written; write it in "
                              f"digits")
        number = int(number)
    if not -MAX_INTEGER - 1 <= number <= MAX_INTEGER:
        raise OptionError(f"{where}={shown(value)} is out of range: {BEYOND_64_BITS}")
    return number


def _exact(where: str, value: Any, kind: str) -> int | float:
    """A number as given: an integer (or text of a whole number: ``1_000``, ``3.0``, ``1e3``) exactly, else a float;
    a whole number far beyond 64 bits is refused before it is built (``1e999999999``)."""
    if isinstance(value, bool) or (isinstance(value, str) and not value.isascii()):    # (int("٣") is 3)
        raise OptionError(f"{where}={value!r}: expected {kind}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
        try:
            written = decimal.Decimal(value)
        except (decimal.InvalidOperation, ValueError):
            written = None
        if written is not None and written.is_finite():
            if written != written.to_integral_value():     # 3.0000000000000000001 is no integer, as a float is
                if kind == "an integer":
                    raise OptionError(f"{where}={shown(value)}: expected an integer")
            elif written.adjusted() > 19:                  # over 20 digits: no 64-bit integer, whatever it is
                raise OptionError(f"{where}={shown(value)} is out of range: {BEYOND_64_BITS}")
            else:
                return int(written)
    if not isinstance(value, float):
        try:
            return operator.index(value)                   # an integer of another kind (NumPy's)
        except TypeError:
            pass
    return _number(where, value, kind)


def shown(value: Any, most: int = 40) -> str:
    """``repr(value)``, cut to ``most`` characters (a number of thousands of digits in an error)."""
    text = repr(value)
    return text if len(text) <= most else f"{text[:most - 3]}..."


def _number(where: str, value: Any, kind: str) -> float:
    if isinstance(value, bool) or (isinstance(value, str) and not value.isascii()):
        raise OptionError(f"{where}={value!r}: expected {kind}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise OptionError(f"{where}={value!r}: expected {kind}") from None


def check(where: str, value: Any, limit: Limit | None) -> None:
    """Refuse ``value`` outside ``limit`` (None values pass), and a number that is not finite without one."""
    if limit is not None and value is not None and not limit.admits(value):
        raise OptionError(f"{where}={value!r} is out of range: it must be {limit.describe()}")
    if limit is None and isinstance(value, float) and not math.isfinite(value):
        raise OptionError(f"{where}={value!r} is out of range: it must be finite")


def typed(where: str, value: Any, default: Any, limit: Limit | None = None) -> Any:
    """``value`` as the type of ``default``, or as its limit reads it (``Switch``, ``Fractions``); range unchecked."""
    return limit.parse(where, value) if isinstance(limit, (Switch, Fractions)) else coerce(where, value, default)


def parse(where: str, value: Any, default: Any, limit: Limit | None = None) -> Any:
    """Type, then range-check: the whole treatment of one option."""
    value = typed(where, value, default, limit)
    check(where, value, limit)
    return value


def resolve(owner: str, options: dict[str, Option], given: dict[str, Any], *, label: str | None = None
            ) -> dict[str, Any]:
    """``given`` over the declared defaults, every value typed and range-checked, the defaults too. ``owner`` names
    the set in the unknown-key error; ``label`` prefixes each key in value errors (default: ``owner`` + `` option ``)."""
    unknown = sorted(set(given) - set(options))
    if unknown:
        raise OptionError(f"{owner} has no option {', '.join(unknown)}{did_you_mean(unknown[0], options)}; "
                          f"valid options: {', '.join(sorted(options)) or 'none'}")
    prefix = f"{owner} option " if label is None else label
    resolved = {key: option.default for key, option in options.items()}
    for key, value in given.items():
        resolved[key] = parse(f"{prefix}{key}", value, options[key].default, options[key].limit)
    for key, option in options.items():
        if key in given:
            continue
        if isinstance(option.limit, Switch):
            resolved[key] = option.limit.parse(f"{prefix}{key}", resolved[key])
        check(f"{prefix}{key}", resolved[key], option.limit)
    return resolved


def did_you_mean(key: str, known: Any) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


# ---- declarations ------------------------------------------------------------------------------------------

#: the sections of a run's settings, each setting named ``section.key``
SECTIONS = ("model", "encoding", "train", "task")
#: the field of a run's record (``RunConfig``, config.json) that holds each section, in the record's order
RECORDED_SECTIONS = {"model": "model", "train": "train", "encoding": "encoding_options", "task": "task_options"}
#: another name of a section: extend's ``method.KEY`` is ``encoding.KEY``
SYNONYMS = {"method": "encoding"}
#: the section of a setting of one named encoding (``--rope-theta``: ``encoding:rope``), where several are chosen
ONE_ENCODING = "encoding:"


class Setting(NamedTuple):
    """One typed setting; ``section`` may be ``ONE_ENCODING`` + a name."""

    section: str
    key: str
    value: Any


class Added(NamedTuple):
    """A setting added later: a record of schema ``schema`` or later holding it at ``before`` (every earlier run's
    value) compares as the records that lack it."""

    schema: int
    before: Any


@dataclass(frozen=True)
class Option:
    """One option: a default (its type the option's), one line of help, a limit. ``from_task``: only the task gives
    it (``Task.encoding_context``; Abacus's ``digit_ids``), never ``--set``; ``task_optional``: a task may give none
    (the default stands). ``changes_results``: False where it changes speed, not results (compare pools runs
    differing in it). ``added``: see ``Added``."""

    default: Any
    help: str
    limit: Limit | None = None
    from_task: bool = False
    task_optional: bool = False
    changes_results: bool = True
    added: Added | None = None
    flag: str = ""      # the flag's name where not the key's (bench's timed ``steps``: ``--timed-steps``)

    def describe(self) -> str:
        if self.limit is not None:
            return self.limit.describe()
        return "true or false" if isinstance(self.default, bool) else "any"


def option(default: Any, help: str, limit: Limit | None = None, *, changes_results: bool = True,
           added: Added | None = None) -> Any:
    """A dataclass field that is an ``Option`` (``ModelConfig``, ``TrainConfig``), read back by ``declared``."""
    return dataclasses.field(default=default, metadata={"option": Option(default, help, limit,
                                                                         changes_results=changes_results,
                                                                         added=added)})


def declared(owner: Any) -> dict[str, Option]:
    """The options of a ``Configurable`` class (its ``OPTIONS``) or of a dataclass declared with ``option``."""
    if dataclasses.is_dataclass(owner):
        return {f.name: f.metadata["option"] for f in dataclasses.fields(owner) if "option" in f.metadata}
    return dict(getattr(owner, "OPTIONS", {}))


def check_fields(instance: Any, section: str) -> None:
    """Type and range-check a dataclass's ``option`` fields in place (errors name ``section.key``)."""
    options = declared(type(instance))
    values = resolve(section, options, {key: getattr(instance, key) for key in options}, label=f"{section}.")
    for key, value in values.items():
        setattr(instance, key, value)


class Configurable:
    """A class configured by name (an encoding, a task, a method): ``kind``, ``name``, ``OPTIONS``."""

    kind: ClassVar[str] = "owner"
    name: ClassVar[str] = ""
    OPTIONS: ClassVar[dict[str, Option]] = {}
    option_label: ClassVar[str | None] = None     # a value error's name of KEY: None, "<kind> '<name>' option KEY"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        old = [key for key in ("defaults", "limits", "option_help", "options")
               if isinstance(cls.__dict__.get(key), dict)]
        if old:
            raise TypeError(f"{cls.kind} '{cls.__dict__.get('name', cls.__qualname__)}' declares its options in "
                            f"{', '.join(old)}; declare each once in OPTIONS = {{key: Option(default, help, "
                            f"limit)}} (posbench.options)")

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {key: o.default for key, o in cls.OPTIONS.items()}

    @classmethod
    def resolve(cls, given: dict[str, Any]) -> dict[str, Any]:
        """``given`` over the defaults, typed and range-checked, then ``check_options``."""
        resolved = resolve(f"{cls.kind} '{cls.name}'", cls.OPTIONS, given, label=cls.option_label)
        cls.check_options(resolved)
        return resolved

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        """Constraints between options (each one's own range is its ``limit``); raise ``OptionError``."""
