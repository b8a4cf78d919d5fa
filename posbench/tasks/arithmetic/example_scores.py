"""The per-example scores behind ``arithmetic``'s accuracies (``compare --against`` pairs them example by example),
from a finished run's record and its predictions; no torch: compare reads them without building a model."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from posbench.stats import ExampleScores, mean_recipe


def example_scores(record: Any, predictions: list[dict[str, Any]]) -> ExampleScores:
    """accuracy / _id / _ood as means of the per-example correctness (every grid cell has the same number
    of examples, so the mean of the cells is the mean of the examples); strata: the grid cells."""
    train = int(record.config.task_options["train_digits"])
    seen: dict[tuple, int] = defaultdict(int)
    keys, cells, inside = [], [], []
    for p in predictions:
        cell = (int(p["len_a"]), int(p["len_b"]))
        ident = (*cell, str(p["a"]), str(p["b"]))
        keys.append((*ident, seen[ident]))
        seen[ident] += 1
        cells.append(cell)
        inside.append(cell[0] <= train and cell[1] <= train)
    correct = 100.0 * np.array([bool(p["correct"]) for p in predictions], dtype=float)
    inside_arr = np.array(inside, dtype=bool)
    terms = {"all": correct, "id": np.where(inside_arr, correct, np.nan),
             "ood": np.where(inside_arr, np.nan, correct)}
    return ExampleScores(keys, cells, terms, {"accuracy": mean_recipe("all"), "accuracy_id": mean_recipe("id"),
                                               "accuracy_ood": mean_recipe("ood")})
