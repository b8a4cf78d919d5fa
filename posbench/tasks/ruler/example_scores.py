"""The per-example scores behind ``ruler``'s metrics (``compare --against`` pairs them example by example), from a
finished run's record and its predictions; no torch: compare reads them without building a model."""

from __future__ import annotations

from typing import Any

import numpy as np

from posbench.evaluation.outcome import length_factor
from posbench.stats import ExampleScores, mean_recipe


def example_scores(record: Any, predictions: list[dict[str, Any]]) -> ExampleScores:
    """Every metric is the mean of the per-example scores over its examples; strata: kind, length, depth."""
    train = int(record.evaluation.get("train_length") or 0)
    keys = [str(p["key"]) for p in predictions]
    strata = [(p["kind"], int(p["length"]), float(p["depth"])) for p in predictions]
    scores = 100.0 * np.array([float(p["score"]) for p in predictions])
    terms = {"ruler": scores}
    for name in {p["kind"] for p in predictions}:
        terms[name] = np.where([p["kind"] == name for p in predictions], scores, np.nan)
    for length in {int(p["length"]) for p in predictions}:
        mask = [int(p["length"]) == length for p in predictions]
        terms[f"ruler_{length_factor(length, train)}x"] = np.where(mask, scores, np.nan)
    return ExampleScores(keys, strata, terms, {name: mean_recipe(name) for name in terms})
