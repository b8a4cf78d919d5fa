"""Metrics. ``scrolls(dataset, predictions, references)`` is the official SCROLLS metric of one data set."""

from posbench.metrics.scrolls_metric import (
    DATASET_TO_METRICS,
    PredictionsError,
    exact_match,
    normalize_answer,
    rouge_fmeasures,
    score_predictions_file,
    scrolls,
    scrolls_score,
    token_f1,
    verify_predictions,
)

__all__ = ["DATASET_TO_METRICS", "PredictionsError", "exact_match", "normalize_answer", "rouge_fmeasures",
           "score_predictions_file", "scrolls", "scrolls_score", "token_f1", "verify_predictions"]
