"""The per-example scores behind the SCROLLS scores (``compare --against`` pairs them example by example), from a
finished run's record and its predictions; no torch: compare reads them without building a model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from posbench.stats import ExampleScores, Recipe
from posbench.tasks.scrolls.metric import COLUMN, DATASET_TO_METRICS, TABLE1, exact_match, rouge_fmeasures, token_f1


def example_scores(record: Any, predictions: list[dict[str, Any]]) -> ExampleScores:
    """Per example the official score against its best reference (EM or F1 x100; for the ROUGE data sets
    ROUGE-1, -2 and -L separately, whose means the geometric mean combines); ``scrolls_score`` is the mean
    of the data sets' scores. Strata: the data sets."""
    datasets = [d for d, _ in TABLE1 if any(p["dataset"] == d for p in predictions)]
    keys = [(p["dataset"], str(p["id"])) for p in predictions]
    strata = [p["dataset"] for p in predictions]
    terms: dict[str, np.ndarray] = {}
    recipes: dict[str, Recipe] = {}
    for dataset in datasets:
        rows = [(i, p) for i, p in enumerate(predictions) if p["dataset"] == dataset]
        kind = DATASET_TO_METRICS[dataset]["metric"]
        names = [f"{dataset}:{k}" for k in ("rouge1", "rouge2", "rougeL")] if kind == "rouge" else [dataset]
        for name in names:
            terms[name] = np.full(len(predictions), np.nan)
        for i, p in rows:
            if kind == "rouge":
                per_ref = [rouge_fmeasures(p["prediction"], r) for r in p["references"]]
                for name in names:
                    terms[name][i] = max(s[name.split(":")[1]] for s in per_ref)
            else:
                fn = token_f1 if kind == "f1" else exact_match
                terms[dataset][i] = 100.0 * max(fn(p["prediction"], r) for r in p["references"])
        recipes[COLUMN[dataset]] = Recipe(tuple(names), _geometric_mean if kind == "rouge" else None)
    parts = [recipes[COLUMN[d]] for d in datasets]
    recipes["scrolls_score"] = Recipe(tuple(t for r in parts for t in r.terms), _mean_of_parts(parts))
    return ExampleScores(keys, strata, terms, recipes)


def _geometric_mean(means: np.ndarray) -> np.ndarray:
    return np.cbrt(means[..., 0] * means[..., 1] * means[..., 2])


def _mean_of_parts(parts: list) -> Callable[[np.ndarray], np.ndarray]:
    """``scrolls_score`` from the concatenated term means of the data sets: the mean of their scores."""
    def combine(means: np.ndarray) -> np.ndarray:
        scores, start = [], 0
        for recipe in parts:
            scores.append(recipe.value(means[..., start:start + len(recipe.terms)]))
            start += len(recipe.terms)
        return np.mean(scores, axis=0)
    return combine
