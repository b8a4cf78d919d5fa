"""The official SCROLLS metrics, implemented natively (no metric script is downloaded).

Per data set (``DATASET_TO_METRICS``, as in the ``metrics/scrolls.py`` of the ``tau/scrolls`` hub repo):

* QuALITY, ContractNLI: exact match after SQuAD normalisation (lower case, punctuation removed, the
  articles a/an/the removed, whitespace collapsed), max over the references of an example, mean, x100.
* NarrativeQA, Qasper: SQuAD token F1 (multiset overlap of normalised whitespace tokens; 0 when nothing
  overlaps, also when both sides are empty), max over references, mean, x100.
* GovReport, SummScreenFD, QMSum: ``rouge_score`` ROUGE-1/2/L (and Lsum) F-measure without stemming, x100,
  max over references per example, mean over examples per type, then the geometric mean of the rouge1,
  rouge2 and rougeL *means*.

Every value is rounded to 4 decimals like the official metric; the output carries the official keys
(``rouge/rouge1``, ..., ``exact_match``, ``f1``, ``num_predicted``, ``mean_prediction_length_characters``,
``scrolls_score``, ``display_keys``, ``display``). The official code splits sentences with NLTK's punkt
before ROUGE; that only changes rougeLsum (ROUGE-1/2/L tokenise on non-alphanumerics), so when punkt's data
is not installed a regular-expression splitter is used and rougeLsum (which no score uses) may differ.
"""

from __future__ import annotations

import json
import math
import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from posbench.data.errors import DataError

DATASET_TO_METRICS: dict[str, dict[str, Any]] = {
    "gov_report": {"metric": "rouge", "score_key": "rouge/geometric_mean",
                   "display_keys": ["rouge/rouge1", "rouge/rouge2", "rouge/rougeL"]},
    "summ_screen_fd": {"metric": "rouge", "score_key": "rouge/geometric_mean",
                       "display_keys": ["rouge/rouge1", "rouge/rouge2", "rouge/rougeL"]},
    "qmsum": {"metric": "rouge", "score_key": "rouge/geometric_mean",
              "display_keys": ["rouge/rouge1", "rouge/rouge2", "rouge/rougeL"]},
    "narrative_qa": {"metric": "f1", "score_key": "f1", "display_keys": ["f1"]},
    "qasper": {"metric": "f1", "score_key": "f1", "display_keys": ["f1"]},
    "quality": {"metric": "exact_match", "score_key": "exact_match", "display_keys": ["exact_match"]},
    "contract_nli": {"metric": "exact_match", "score_key": "exact_match", "display_keys": ["exact_match"]},
    "quality_hard": {"metric": "exact_match", "score_key": None, "display_keys": ["exact_match"]},
}
#: each data set's column in posbench's tables, in the paper's Table 1 order: QAS F1, CNLI EM, NQA F1, QuAL EM,
#: QMS Rgm, SumS Rgm, GovR Rgm
TABLE1 = (("qasper", "qasper_f1"), ("contract_nli", "contract_nli_em"), ("narrative_qa", "narrative_qa_f1"),
          ("quality", "quality_em"), ("qmsum", "qmsum_rgm"), ("summ_screen_fd", "summ_screen_fd_rgm"),
          ("gov_report", "gov_report_rgm"))
COLUMN = dict(TABLE1)
SCROLLS_DATASETS = ("gov_report", "summ_screen_fd", "qmsum", "narrative_qa", "qasper", "quality", "contract_nli")
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


class PredictionsError(DataError):
    """A predictions file that fails the official verifier's checks (one-line message)."""


# ------------------------------------------------------------------------------------------------------
# per-example scores

def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower, drop punctuation, drop articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, reference: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(reference))


def token_f1(prediction: str, reference: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


@lru_cache(maxsize=1)
def _rouge_scorer():
    from rouge_score import rouge_scorer  # rouge_score (and nltk): only a summary's score needs it

    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=False)


@lru_cache(maxsize=1)
def _sentence_splitter():
    try:
        import nltk  # nltk: optional (rouge_score's), a regex without it

        nltk.data.find("tokenizers/punkt_tab")
        return "nltk", nltk.sent_tokenize
    except Exception:   # noqa: BLE001 - no nltk data offline: fall back to a regex
        return "regex", lambda text: [s for s in re.split(r"(?<=[.!?])\s+", text) if s]


def rouge_postprocess(text: str) -> str:
    """One sentence per line (only rougeLsum looks at lines)."""
    return "\n".join(_sentence_splitter()[1](text))


def rouge_fmeasures(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE F-measures x100 of one prediction against one reference (no stemming)."""
    scores = _rouge_scorer().score(rouge_postprocess(reference), rouge_postprocess(prediction))
    return {k: scores[k].fmeasure * 100 for k in ROUGE_TYPES}


# ------------------------------------------------------------------------------------------------------
# corpus scores

def _as_lists(predictions: Sequence[str] | Mapping[str, str],
              references: Sequence[Sequence[str]] | Mapping[str, Sequence[str]]):
    if isinstance(predictions, Mapping):
        if not isinstance(references, Mapping):
            raise DataError("predictions given as {id: prediction} need references as {id: [references]}")
        verify_predictions(predictions, references.keys())
        ids = list(predictions)
        return [predictions[i] for i in ids], [list(references[i]) for i in ids]
    preds, refs = list(predictions), [list(r) if not isinstance(r, str) else [r] for r in references]
    if len(preds) != len(refs):
        raise DataError(f"{len(preds)} predictions but {len(refs)} reference lists")
    if not preds:
        raise DataError("no predictions to score")
    for r in refs:
        if not r:
            raise DataError("every example needs at least one reference")
    return preds, refs


def scrolls(dataset: str, predictions, references) -> dict[str, Any]:
    """The official SCROLLS metric of ``dataset`` over ``predictions`` (list of strings or {id: str}) and
    ``references`` (list of lists of strings or {id: [str]}). Returns the official keys; ``scrolls_score``
    is the data set's score (ROUGE geometric mean, F1 or EM, x100)."""
    if dataset not in DATASET_TO_METRICS:
        raise DataError(f"unknown SCROLLS data set '{dataset}'; valid: {', '.join(DATASET_TO_METRICS)}")
    preds, refs = _as_lists(predictions, references)
    spec = DATASET_TO_METRICS[dataset]
    out: dict[str, Any] = {}
    if spec["metric"] == "rouge":
        sums = dict.fromkeys(ROUGE_TYPES, 0.0)
        for p, rs in zip(preds, refs):
            per_ref = [rouge_fmeasures(p, r) for r in rs]
            for k in ROUGE_TYPES:
                sums[k] += max(s[k] for s in per_ref)
        means = {k: sums[k] / len(preds) for k in ROUGE_TYPES}
        means["geometric_mean"] = (means["rouge1"] * means["rouge2"] * means["rougeL"]) ** (1.0 / 3.0)
        out.update({f"rouge/{k}": v for k, v in means.items()})
    elif spec["metric"] == "f1":
        out["f1"] = 100.0 * sum(max(token_f1(p, r) for r in rs) for p, rs in zip(preds, refs)) / len(preds)
    else:
        out["exact_match"] = 100.0 * sum(max(exact_match(p, r) for r in rs)
                                         for p, rs in zip(preds, refs)) / len(preds)
    out["num_predicted"] = len(preds)
    out["mean_prediction_length_characters"] = sum(len(p) for p in preds) / len(preds)
    out = {k: round(v, 4) for k, v in out.items()}
    out["scrolls_score"] = out[spec["score_key"]] if spec["score_key"] else None
    out["display_keys"] = list(spec["display_keys"])
    out["display"] = [out[k] for k in spec["display_keys"]]
    return out


def scrolls_score(per_dataset: Mapping[str, float]) -> dict[str, Any]:
    """The benchmark's SCROLLS score: the unweighted mean of the seven data sets' scores.

    With fewer than seven, ``value`` is the mean of those given and ``complete`` is False."""
    present = [d for d in SCROLLS_DATASETS if d in per_dataset and per_dataset[d] is not None]
    value = sum(per_dataset[d] for d in present) / len(present) if present else math.nan
    return {"value": round(value, 4), "datasets": present, "complete": len(present) == len(SCROLLS_DATASETS)}


# ------------------------------------------------------------------------------------------------------
# predictions files ({id: prediction}), checked like the official verifier

def _few(ids: Iterable[str], n: int = 5) -> str:
    ids = sorted(ids)
    head = ", ".join(repr(i) for i in ids[:n])
    return head + (f" and {len(ids) - n} more" if len(ids) > n else "")


def verify_predictions(predictions: Any, reference_ids: Iterable[str]) -> None:
    """Raise :class:`PredictionsError` unless ``predictions`` is ``{id: str}`` with exactly the reference ids."""
    if not isinstance(predictions, Mapping):
        raise PredictionsError(f"predictions must be a JSON object {{id: prediction}}, "
                               f"got {type(predictions).__name__}")
    bad = [k for k, v in predictions.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise PredictionsError(f"{len(bad)} prediction(s) are not strings (ids {_few(map(str, bad))}); "
                               f"every value must be a string")
    ref = set(reference_ids)
    missing, extra = ref - set(predictions), set(predictions) - ref
    if missing:
        raise PredictionsError(f"{len(missing)} id(s) missing from the predictions: {_few(missing)}")
    if extra:
        raise PredictionsError(f"{len(extra)} id(s) in the predictions are not in the references: {_few(extra)}")


def load_predictions_file(path: str | Path) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PredictionsError(f"no such predictions file: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PredictionsError(f"{path} is not valid JSON: {exc}") from None


def score_predictions_file(dataset: str, predictions_path: str | Path,
                           references: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """Score a ``{id: prediction}`` JSON file against ``{id: [references]}`` after verifying it."""
    predictions = load_predictions_file(predictions_path)
    verify_predictions(predictions, references.keys())
    return scrolls(dataset, predictions, references)
