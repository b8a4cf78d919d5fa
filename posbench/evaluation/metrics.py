"""The metric registry: every metric a task records is declared once, here, with what ``compare`` needs to know
about it.

A declaration (``MetricSpec``) belongs to one task and names one metric, or a family of them through ``{n}`` (a
number: ``ppl_{n}x`` covers ``ppl_2x`` and ``ppl_1.5x``). It says

- ``better``: ``"higher"`` or ``"lower"`` (accuracy or perplexity): compare's arrows (↑ ↓), its ranking, its
  bold best value and the "better" / "worse" of ``--against`` follow it;
- ``pool``: how a row's seeds pool; ``"mean"``, the only one, is the mean of the seeds' values with the 95%
  Student-t interval over seeds (``posbench.stats.seed_interval``). Perplexity pools so too: the mean of the
  seeds' perplexities, not the exponential of their mean loss;
- ``description``: one line;
- ``per_example``: the task's ``example_scores`` rebuilds the metric from a run's predictions, so ``compare
  --against`` pairs two encodings example by example (else across seeds only).

A task declares its metrics with ``register_metric`` when its module is imported (each built-in task in its
``task.py``; a plugin task in its own file, docs/extending.md). The runner records each metric with its declared
direction (``result.json``'s ``higher_is_better``), and compare reads the declaration; a metric no declaration
covers (a run of a plugin compare was not given, a name no task declares any more) keeps the direction its record
gives. The same declaration made twice (a module imported again) is one; another declaration of the same name for
the same task is refused in one line (``MetricError``).
"""

from __future__ import annotations

import difflib
import importlib
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from posbench import catalog
from posbench.errors import UserError
from posbench.evaluation.outcome import Metric
from posbench.registry import beyond_catalog
from posbench.stats import seed_interval

#: how a row's seeds pool: name -> function of the seeds' values (an object with ``mean``, ``half_width``, ``n``)
POOLS: dict[str, Callable[[list[float]], Any]] = {"mean": seed_interval}
DIRECTIONS = ("higher", "lower")
#: what ``{n}`` stands for in a family's name: a number (``2``, ``1.5``)
NUMBER = r"[0-9]+(?:\.[0-9]+)?"


class MetricError(UserError):
    """A declaration that cannot be taken (a duplicate, a direction or a pool that does not exist); one line."""


@dataclass(frozen=True)
class MetricSpec:
    task: str
    name: str                        # a metric's name, or a family's: ``ppl_{n}x``
    better: str                      # "higher" or "lower"
    description: str
    pool: str = "mean"
    per_example: bool = False
    origin: str = field(default="", compare=False)      # the module that declared it (for the duplicate's line)

    @property
    def higher_is_better(self) -> bool:
        return self.better == "higher"

    @property
    def family(self) -> bool:
        return "{n}" in self.name

    def matches(self, name: str) -> bool:
        return pattern(self.name).fullmatch(name) is not None

    def line(self) -> str:
        """One line for a listing: the name, which way is better, the pooling, the description."""
        paired = "; per example" if self.per_example else ""
        return f"{self.name} ({self.better} is better; seeds: {self.pool}{paired}): {self.description}"


def pattern(name: str) -> re.Pattern:
    return re.compile(NUMBER.join(re.escape(part) for part in name.split("{n}")))


class MetricRegistry:
    """The declarations of every task's metrics, by task. Reading it first takes the built-in tasks' declarations
    from ``posbench.catalog`` (no torch), or, where a task beyond the catalog may be registered
    (``registry.beyond_catalog``), imports the tasks (the built-in ones, the plugins, the entry points), whose
    modules declare their metrics."""

    def __init__(self, tasks_package: str = "posbench.tasks"):
        self.tasks_package = tasks_package
        self._specs: dict[str, list[MetricSpec]] = {}
        self._loaded = False

    # ---- declaring ------------------------------------------------------------------------------------------
    def add(self, spec: MetricSpec) -> MetricSpec:
        check(spec)
        declared = self._specs.setdefault(spec.task, [])
        for other in declared:
            clash = other.name == spec.name or (other.family and other.matches(spec.name)) \
                or (spec.family and spec.matches(other.name))
            if not clash:
                continue
            if other == spec:
                return other                   # the same declaration again: a module imported twice
            how = "already declared" if other.name == spec.name else f"covered by '{other.name}'" \
                if other.family else f"already declared as '{other.name}', which '{spec.name}' covers"
            raise MetricError(f"metric '{spec.name}' of task '{spec.task}' is {how} ({other.better} is better, "
                              f"by {other.origin or 'an earlier declaration'}); a metric is declared once")
        declared.append(spec)
        return spec

    def remove(self, task: str, name: str | None = None) -> None:
        """Forget a task's declarations (``name``: one of them); used by tests and notebooks that redefine a task."""
        if name is None:
            self._specs.pop(task, None)
        else:
            self._specs[task] = [s for s in self._specs.get(task, []) if s.name != name]

    # ---- reading --------------------------------------------------------------------------------------------
    def find(self, task: str, name: str) -> MetricSpec | None:
        """The declaration that covers metric ``name`` of ``task`` (a name before a family), or None."""
        self._load()
        declared = self._specs.get(str(task), [])
        exact = next((s for s in declared if s.name == name), None)
        return exact or next((s for s in declared if s.family and s.matches(name)), None)

    def get(self, task: str, name: str) -> MetricSpec:
        """``find``, or a one-line ``MetricError`` that lists the task's declared metrics."""
        found = self.find(task, name)
        if found is None:
            names = [s.name for s in self.of(task)]
            close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            listed = f"Declared: {', '.join(names)}." if names else "It declares none."
            raise MetricError(f"task '{task}' declares no metric '{name}'.{hint} {listed}")
        return found

    def declared(self, task: str) -> list[MetricSpec]:
        """The declarations of ``task`` made so far, without reading any (``posbench.catalog_build`` takes the
        built-in tasks' from their own modules, which it has imported)."""
        return list(self._specs.get(str(task), []))

    def of(self, task: str) -> list[MetricSpec]:
        """The task's declarations, in the order they were made."""
        self._load()
        return list(self._specs.get(str(task), []))

    def higher_is_better(self, task: str, name: str, recorded: Any = True) -> bool:
        """Which way metric ``name`` of ``task`` is better: as declared, else as its record says (``recorded``)."""
        found = self.find(task, name)
        return found.higher_is_better if found is not None else bool(recorded)

    def pooling(self, task: str, name: str) -> Callable[[list[float]], Any]:
        """How a row pools the seeds' values of metric ``name`` (an undeclared one: the mean)."""
        found = self.find(task, name)
        return POOLS[found.pool if found is not None else "mean"]

    def per_example(self, task: str, name: str) -> bool:
        """Whether ``compare --against`` may pair metric ``name`` example by example: declared ``per_example``;
        an undeclared one may (the task's ``example_scores`` says whether it rebuilds it)."""
        found = self.find(task, name)
        return found is None or found.per_example

    def as_declared(self, task: str, metrics: Mapping[str, Metric]) -> dict[str, Metric]:
        """The metrics of a run of ``task``, each declared one with its declared direction (what the record
        keeps); one no declaration covers stays as the task gave it."""
        out = {}
        for name, metric in metrics.items():
            found = self.find(task, name)
            out[name] = metric if found is None else replace(metric, higher_is_better=found.higher_is_better)
        return out

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True               # first: a task's module declares its metrics while it is imported
        try:
            if self.tasks_package == "posbench.tasks" and not beyond_catalog("task"):
                for entry in catalog.METRICS:        # the built-in tasks' declarations, read without importing them
                    self.add(MetricSpec(**entry))
                return
            tasks = importlib.import_module(self.tasks_package)      # the built-in tasks declare theirs
            len(tasks.TASKS)                                         # the plugins and the entry points theirs
        except Exception:
            self._loaded = False
            raise


def check(spec: MetricSpec) -> None:
    where = f"metric '{spec.name}' of task '{spec.task}'"
    if not spec.task or not isinstance(spec.task, str) or not spec.name or not isinstance(spec.name, str):
        raise MetricError(f"a metric needs a task and a name (non-empty text), got {spec.task!r}, {spec.name!r}")
    if re.search(r"[{}]", spec.name.replace("{n}", "")):
        raise MetricError(f"{where}: a family's name holds '{{n}}' (a number) and no other braces")
    if spec.better not in DIRECTIONS:
        raise MetricError(f"{where}: better is {spec.better!r}; valid: {', '.join(DIRECTIONS)}")
    if spec.pool not in POOLS:
        raise MetricError(f"{where}: pool is {spec.pool!r}; valid: {', '.join(POOLS)}")
    if not isinstance(spec.description, str) or not spec.description.strip() or "\n" in spec.description:
        raise MetricError(f"{where} needs a description of one line")


#: every task's metrics
METRICS = MetricRegistry()


def register_metric(task: str, name: str, *, better: str, description: str, pool: str = "mean",
                    per_example: bool = False) -> MetricSpec:
    """Declare metric ``name`` (or the family ``name`` with ``{n}``, a number) of ``task``: ``better`` is
    "higher" or "lower", ``pool`` how seeds pool ("mean"), ``per_example`` whether the task's ``example_scores``
    rebuilds it from a run's predictions. Returns the declaration; refuses another one of the same name."""
    caller = sys._getframe(1).f_globals.get("__name__", "")
    return METRICS.add(MetricSpec(task, name, better, description, pool, per_example, origin=caller))
