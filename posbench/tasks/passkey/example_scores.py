"""The per-example scores behind ``passkey``'s accuracies (``compare --against`` pairs them trial by trial), from a
finished run's record and its predictions; no torch: compare reads them without building a model."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from posbench.evaluation.outcome import length_factor
from posbench.stats import ExampleScores, mean_recipe


def example_scores(record: Any, predictions: list[dict[str, Any]]) -> ExampleScores:
    """Every accuracy metric is the mean of the per-trial correctness over its cells (all cells hold the
    same number of trials); strata: the grid cells (longlora mode: the length points)."""
    info = record.evaluation
    correct = 100.0 * np.array([bool(p["correct"]) for p in predictions], dtype=float)
    seen: dict[tuple, int] = defaultdict(int)
    keys, strata = [], []
    if info.get("mode") == "longlora":
        names = {i: f"acc_{point['avg_tokens']}" for i, point in enumerate(info.get("points", []))}
        for p in predictions:
            strata.append(int(p["point"]))
            keys.append((int(p["point"]), int(p["seed"])))
        groups = {names.get(point, f"point {point}"): [s == point for s in strata] for point in set(strata)}
    else:
        train = int(info.get("train_length") or 0)
        for p in predictions:
            ident = (int(p["length"]), float(p["depth"]), int(p["key"]))
            keys.append((*ident, seen[ident]))
            seen[ident] += 1
            strata.append(ident[:2])
        lengths = [s[0] for s in strata]
        groups = {"accuracy_train_length": [L <= train for L in lengths],
                  "accuracy_beyond": [L > train for L in lengths]}
        groups.update({f"acc_{length_factor(L, train)}x": [x == L for x in lengths] for L in set(lengths)})
    terms = {"accuracy": correct}
    terms.update({name: np.where(np.array(mask, dtype=bool), correct, np.nan) for name, mask in groups.items()
                  if any(mask)})
    return ExampleScores(keys, strata, terms, {name: mean_recipe(name) for name in terms})
