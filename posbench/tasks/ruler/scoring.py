"""RULER's scoring (``scripts/eval/evaluate.py`` and ``scripts/eval/synthetic/constants.py``) and the
per-example record a task writes to ``predictions.jsonl``.

A prediction is first cleaned as RULER's ``postprocess_pred``: stripped, every control character
(``\\x00``-``\\x1f``) replaced by a newline, stripped again. Then, case-insensitively:

* ``string_match_all``: the fraction of the expected strings that occur in the prediction (niah, vt);
* ``string_match_part``: 1 if any expected string occurs in it, else 0 (RULER's QA tasks).

RULER reports a task as the mean over examples x 100, rounded to 2 decimals (``ruler_score``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from posbench.tasks.ruler import kinds

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess(prediction: str) -> str:
    return _CONTROL.sub("\n", prediction.strip()).strip()


def string_match_all(prediction: str, answers: Sequence[str]) -> float:
    text = postprocess(prediction).lower()
    return sum(1.0 for a in answers if a.lower() in text) / len(answers)


def string_match_part(prediction: str, answers: Sequence[str]) -> float:
    text = postprocess(prediction).lower()
    return max(1.0 if a.lower() in text else 0.0 for a in answers)


METRICS = {"string_match_all": string_match_all, "string_match_part": string_match_part}


def metric_name(kind: str) -> str:
    return kinds.METRIC[kinds.family(kind)]


def score(kind: str, prediction: str, answers: Sequence[str]) -> float:
    """The example's score in [0, 1] with the kind's RULER metric."""
    return METRICS[metric_name(kind)](prediction, answers)


def ruler_score(metric: str, predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """RULER's task score: ``metric`` averaged over the examples, x 100, rounded to 2 decimals."""
    fn = METRICS[metric]
    return round(sum(fn(p, r) for p, r in zip(predictions, references)) / len(predictions) * 100, 2)


def example_key(kind: str, length: int, depth: Any, trial: int) -> str:
    """The key that pairs one example across encodings (same kind, length, depth and trial number)."""
    return f"{kind}|{length}|{depth_label(depth)}|{trial}"


def depth_label(depth: Any) -> str:
    if depth is None:
        return "random"
    if isinstance(depth, (int, float)):
        return f"{float(depth):g}"
    return "[" + ",".join(f"{float(d):g}" for d in depth) + "]"


def prediction_record(example, prediction: str, trial: int) -> dict[str, Any]:
    """One ``predictions.jsonl`` row: the pairing ``key``, the cell, the answers, the decoded prediction, its
    score and where every needle sat."""
    meta = example.meta
    value = score(example.kind, prediction, example.answers)
    return {
        "key": example_key(example.kind, meta["length"], meta["depth"], trial),
        "kind": example.kind, "length": meta["length"], "depth": meta["depth"], "trial": trial,
        "seed": meta["seed"], "prompt_sha256": meta["prompt_sha256"],
        "answers": list(example.answers), "prediction": prediction,
        "metric": metric_name(example.kind), "score": value, "correct": value == 1.0,
        "needle_depths": [round(n["depth"], 6) for n in meta["needles"] if n["role"] in ("target", "chain0")],
    }
