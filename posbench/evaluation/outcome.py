"""What a task's evaluation returns: metrics with their standard errors, grids over one or more axes
(heatmaps, curves), per-example predictions, and extra facts for the record."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Metric:
    value: float | None
    stderr: float | None = None
    n: int | None = None
    higher_is_better: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"value": finite(self.value), "stderr": finite(self.stderr), "n": self.n,
                "higher_is_better": self.higher_is_better}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Metric:
        return cls(as_number(data.get("value")), as_number(data.get("stderr")), data.get("n"),
                   bool(data.get("higher_is_better", True)))


@dataclass
class Axis:
    name: str
    values: list[Any]


@dataclass
class Grid:
    """A metric over one or more axes (operand lengths, context length x depth, ...)."""

    metric: str
    axes: list[Axis]
    values: list[Any]                              # nested lists in axis order; None = not evaluated
    stderr: list[Any] | None = None
    n: list[Any] | None = None
    higher_is_better: bool = True
    meta: dict[str, Any] = field(default_factory=dict)   # e.g. {"train_max": {"len_a": 5, "len_b": 5}}

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "higher_is_better": self.higher_is_better,
                "axes": [asdict(a) for a in self.axes], "values": finite_nested(self.values),
                "stderr": finite_nested(self.stderr), "n": self.n, "meta": self.meta}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Grid:
        axes = [Axis(str(a.get("name")), list(a.get("values") or [])) for a in data.get("axes") or []]
        return cls(str(data.get("metric", "")), axes, as_number(data.get("values") or []),
                   as_number(data.get("stderr")), data.get("n"), bool(data.get("higher_is_better", True)),
                   dict(data.get("meta") or {}))


@dataclass
class Evaluation:
    """What ``Task.evaluate`` returns."""

    metrics: dict[str, Metric]
    primary: str | None                            # the headline metric (compare sorts and plots by it)
    grids: dict[str, Grid] = field(default_factory=dict)
    predictions: Iterable[dict[str, Any]] = ()     # one JSON-able dict per sample -> predictions.jsonl
    info: dict[str, Any] = field(default_factory=dict)   # extra facts recorded under result["evaluation"]


def mean_stderr(values: list[float]) -> float | None:
    """Standard error of a mean with the sample standard deviation (as lm-evaluation-harness)."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return math.sqrt(var / n)


def length_factor(length: int, train: int) -> str:
    """A length as a multiple of the training length, as a metric's name writes it (``acc_2x``, ``ruler_1.5x``):
    ``2`` for 2.0, ``1.5``; ``0`` when the training length is unknown (0)."""
    f = length / train if train else 0
    return str(int(f)) if f == int(f) else f"{f:g}"


def as_number(x: Any) -> Any:
    """A value read from JSON as a number compare can use: an integer beyond float64's range (the JSON integer 1
    followed by 400 zeros) is an infinity of its sign, like the float 1e400; lists element by element; anything
    else unchanged."""
    if isinstance(x, list):
        return [as_number(v) for v in x]
    if isinstance(x, int) and not isinstance(x, bool):
        try:
            return float(x)
        except OverflowError:
            return math.inf if x > 0 else -math.inf
    return x


def finite(x: Any) -> Any:
    """``x``, except NaN (no number: None). An infinity stays: a perplexity beyond float64's range is ``inf``,
    written to JSON as the number ``1e999`` (``posbench.files``) and read back as ``inf``."""
    if isinstance(x, float) and math.isnan(x):
        return None
    return x


def finite_nested(x: Any) -> Any:
    if isinstance(x, list):
        return [finite_nested(v) for v in x]
    return finite(x)
