"""``compare --against NAME``: every other row's difference to the row of encoding NAME with the same
settings, per metric, with its 95% interval and p-value (``posbench.stats.paired_difference``).

Seeds are paired by number (seed s of one encoding with seed s of the other; seeds only one side has are left
out). Examples are paired when the task says how its metrics are built from its per-example results
(``Task.example_scores``: arithmetic, passkey, SCROLLS), every run of both rows scored the same examples (the
same keys) and those results rebuild the metric each run recorded; otherwise the metric is paired across
seeds only (perplexity), and a note says so. Each run's per-example scores are read once per compare
(``Comparison.scores``, from ``predictions``).
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Any

from posbench.report.comparison import Comparison
from posbench.report.structure import DifferenceRow, Row, TaskTable, num
from posbench.runs.record import RunRecord
from posbench.stats import ExampleScores, StratifiedBootstrap, paired_difference


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-3)      # recorded metrics may be rounded to 4 decimals


def example_functions(comparison: Comparison, a_runs: list[RunRecord], b_runs: list[RunRecord],
                      metric: str) -> dict[str, Any] | None:
    """The per-example pairing of ``metric`` between the runs (seed-aligned lists), or None. Each run's metric
    function is built once per order of examples (``comparison.aligned``): a run paired with many rows, or
    against several baselines, is the same object each time, so the bootstrap resamples it once."""
    memo = comparison.aligned
    runs = a_runs + b_runs
    scores = [comparison.scores(r) for r in runs]
    if any(s is None or metric not in s.metrics for s in scores):
        return None
    order = comparison.order(scores[0])              # every run's examples in the order of the first run's
    functions = []
    for s, run in zip(scores, runs):
        key = (str(run.path), metric, order)
        if key not in memo:
            memo[key] = _metric_function(s, run, metric, scores[0].keys)
        if memo[key] is None:
            return None
        functions.append(memo[key])
    return {"a_examples": functions[:len(a_runs)], "b_examples": functions[len(a_runs):],
            "strata": scores[0].strata}                 # the first run's own order: its strata as they are


def _metric_function(scores: ExampleScores, run: RunRecord, metric: str, order: list) -> partial | None:
    """``metric`` of the run as a function of bootstrap weights over the examples in ``order``; None when the run
    scored other examples or its per-example results do not rebuild the metric it recorded."""
    if len(scores.keys) != len(order) or set(scores.keys) != set(order):
        return None
    aligned = scores.aligned(order)
    recorded = value_of(run, metric)
    rebuilt = float(aligned.metric_under(metric))
    if recorded is None or not math.isfinite(rebuilt) or not _close(recorded, rebuilt):
        return None
    return partial(aligned.metric_under, metric)


def value_of(run: RunRecord, metric: str) -> float | None:
    found = run.metrics.get(metric)
    return num(found.value) if found is not None else None


def reference_for(row: Row, refs: list[Row]) -> Row | None:
    """The reference row with the same settings as ``row``, encoding aside (its first run's ``RunFacts.shared``)."""
    if not row.facts:
        return None
    core = row.facts[0].shared
    return next((ref for ref in refs if ref.facts and ref.facts[0].shared == core), None)


def add_differences(comparison: Comparison, table: TaskTable, reference: str) -> None:
    """``table``'s paired differences to the rows of ``reference`` (the module docstring), seeds paired by their
    runs' facts (``Row.facts``); ``comparison``: the resampling work, shared between baselines."""
    table.against = reference
    refs = [r for r in table.rows if r.encoding == reference]
    if not refs:
        table.notes.append(f"--against {reference}: no {reference} run in this table")
        return
    seeds_only: set[str] = set()
    for row in table.rows:
        if row.encoding == reference:
            continue
        ref = reference_for(row, refs)
        if ref is None:
            table.notes.append(f"--against {reference}: no {reference} row with the settings of {row.label}")
            continue
        a_by_seed = {str(facts.seed): r for r, facts in zip(ref.runs, ref.facts)}
        b_by_seed = {str(facts.seed): r for r, facts in zip(row.runs, row.facts)}
        common = sorted(set(a_by_seed) & set(b_by_seed))
        if not common:
            table.notes.append(f"--against {reference}: {row.label} shares no seed with {ref.label}")
            continue
        a_runs, b_runs = [a_by_seed[s] for s in common], [b_by_seed[s] for s in common]
        for metric in table.columns:
            a = [value_of(r, metric) for r in a_runs]
            b = [value_of(r, metric) for r in b_runs]
            if any(v is None for v in a + b):
                continue
            pairing = example_functions(comparison, a_runs, b_runs, metric) or {}
            if not pairing:
                seeds_only.add(metric)
            else:                                 # one draw of replicates per list of strata, for every pair
                strata = tuple(pairing["strata"])
                if strata not in comparison.bootstraps:
                    comparison.bootstraps[strata] = StratifiedBootstrap(strata)
                pairing["bootstrap"] = comparison.bootstraps[strata]
            difference = paired_difference(a, b, **pairing)
            across = sittings(a_runs, b_runs)
            if across:
                difference = dataclasses.replace(difference, basis=f"{difference.basis}; {across}")
            table.differences.append(DifferenceRow(row.label, metric, table.higher_is_better[metric], difference))
    if seeds_only:
        table.notes.append(f"paired across seeds only (no per-example results that rebuild them): "
                           f"{', '.join(m for m in table.columns if m in seeds_only)}")


def sittings(a_runs: list[RunRecord], b_runs: list[RunRecord]) -> str | None:
    """Where a pair of seed-aligned runs ran on different machines (``environment.device_name``) or from different
    code (the posbench package's tree, ``posbench.package_tree``, where both records have it, else their commits): ``"across machines"``, ``"across commits"`` or both;
    None when every pair shares both. A difference of such cells holds what the machines' or commits' rounding
    does too (a 0.2 perplexity gap moved with the CPU in the CPU study)."""
    machines = commits = False
    for a, b in zip(a_runs, b_runs):
        machines |= a.environment.get("device_name") != b.environment.get("device_name")
        both = "package_tree" in (a.posbench or {}) and "package_tree" in (b.posbench or {})
        commits |= code_of(a, both) != code_of(b, both)
    found = [name for name, flag in (("machines", machines), ("commits", commits)) if flag]
    return f"across {' and '.join(found)}" if found else None


def code_of(run: RunRecord, package: bool) -> str | None:
    facts = run.posbench or {}
    return facts.get("package_tree") if package else facts.get("git_commit")
