"""The SCROLLS metrics against hand-worked examples and the official metric's own docstring example."""

import json
import math

import pytest

from posbench.tasks.scrolls.metric import (PredictionsError, exact_match, normalize_answer, score_predictions_file, scrolls,
                              scrolls_score, token_f1, verify_predictions)


def test_official_docstring_example():
    # metrics/scrolls.py of the tau/scrolls hub repo documents these inputs and outputs
    predictions = ["exact match example", "hello there", "general kenobi"]
    references = [["exact match example"], ["hello", "hi there"], ["commander kenobi"]]
    for ds in ("gov_report", "qmsum", "summ_screen_fd"):
        assert scrolls(ds, predictions, references) == {
            "rouge/rouge1": 72.2222, "rouge/rouge2": 33.3333, "rouge/rougeL": 72.2222, "rouge/rougeLsum": 72.2222,
            "rouge/geometric_mean": 55.8136, "num_predicted": 3, "mean_prediction_length_characters": 14.6667,
            "scrolls_score": 55.8136, "display_keys": ["rouge/rouge1", "rouge/rouge2", "rouge/rougeL"],
            "display": [72.2222, 33.3333, 72.2222]}
    for ds in ("contract_nli", "quality"):
        assert scrolls(ds, predictions, references) == {
            "exact_match": 33.3333, "num_predicted": 3, "mean_prediction_length_characters": 14.6667,
            "scrolls_score": 33.3333, "display_keys": ["exact_match"], "display": [33.3333]}
    for ds in ("narrative_qa", "qasper"):
        assert scrolls(ds, predictions, references) == {
            "f1": 72.2222, "num_predicted": 3, "mean_prediction_length_characters": 14.6667,
            "scrolls_score": 72.2222, "display_keys": ["f1"], "display": [72.2222]}


def test_squad_normalisation_articles_and_punctuation():
    assert normalize_answer("The Cat, sat!") == "cat sat"
    assert normalize_answer("  An apple a day\tkeeps  THE doctor away. ") == "apple day keeps doctor away"
    assert normalize_answer("theatre anatomy") == "theatre anatomy"      # articles only as whole words
    assert normalize_answer("U.S.A.") == "usa"
    assert exact_match("the Answer.", "answer") == 1.0
    assert exact_match("Not mentioned", "Not-mentioned") == 0.0        # '-' is removed, not spaced: notmentioned
    assert exact_match("Entailment", "Contradiction") == 0.0


def test_token_f1_hand_worked():
    # pred tokens [quick, brown, fox], ref [quick, fox, jumps]: overlap 2 -> P = R = 2/3 -> F1 = 2/3
    assert token_f1("The quick brown fox", "quick fox jumps") == pytest.approx(2 / 3)
    # multiset overlap: pred [a.. no articles] [dog, dog, cat] vs [dog, cat, cat] -> overlap 2, P = R = 2/3
    assert token_f1("dog dog cat", "dog cat cat") == pytest.approx(2 / 3)
    # P = 1, R = 1/4 -> F1 = 2 * 1/4 / (5/4) = 0.4
    assert token_f1("paris", "paris france europe earth") == pytest.approx(0.4)
    assert token_f1("", "anything") == 0.0 and token_f1("", "") == 0.0   # SQuAD v1: no overlap -> 0


def test_max_over_references_and_empty_prediction():
    refs = [["Yes", "yes indeed"], ["three students", "3 students"], ["BLEU"]]
    preds = ["yes", "3 students.", ""]
    # EM: 1, 1, 0 -> 66.6667
    assert scrolls("quality", preds, refs)["exact_match"] == 66.6667
    # F1: max(1, 2/3) = 1; max(1/2, 1) = 1; 0 -> 66.6667
    assert scrolls("qasper", preds, refs)["f1"] == 66.6667
    empty = scrolls("gov_report", [""], [["a reference summary"]])
    assert empty["rouge/rouge1"] == 0 and empty["scrolls_score"] == 0
    assert empty["mean_prediction_length_characters"] == 0


def test_rouge_geometric_mean_is_taken_on_the_corpus_means():
    preds = ["alpha beta gamma", "delta epsilon"]
    refs = [["alpha beta gamma"], ["delta zeta"]]
    out = scrolls("qmsum", preds, refs)
    # example 1 is perfect (100, 100, 100); example 2: unigram P = R = 1/2 -> 50, no shared bigram -> 0, LCS 1 -> 50
    assert (out["rouge/rouge1"], out["rouge/rouge2"], out["rouge/rougeL"]) == (75.0, 50.0, 75.0)
    assert out["rouge/geometric_mean"] == round((75.0 * 50.0 * 75.0) ** (1 / 3), 4) == 65.5185
    # not the mean of per-example geometric means, which would be (100 + 0) / 2 = 50
    assert out["scrolls_score"] != 50.0


def test_rouge_uses_no_stemmer_and_max_over_references():
    # with a stemmer "running" and "runs" would match; without one they do not
    assert scrolls("gov_report", ["running"], [["runs"]])["rouge/rouge1"] == 0.0
    out = scrolls("gov_report", ["the cat sat"], [["a dog ran", "the cat sat"]])
    assert out["rouge/rouge1"] == 100.0


def test_dict_inputs_and_scrolls_score():
    out = scrolls("contract_nli", {"b": "Entailment", "a": "x"}, {"a": ["Contradiction"], "b": ["Entailment"]})
    assert out["exact_match"] == 50.0
    seven = dict(gov_report=10, summ_screen_fd=20, qmsum=30, narrative_qa=40, qasper=50, quality=60, contract_nli=70)
    assert scrolls_score(seven) == {"value": 40.0, "datasets": list(seven), "complete": True}
    part = scrolls_score({"qasper": 10.0, "quality": 20.0})
    assert part["value"] == 15.0 and not part["complete"]
    assert math.isnan(scrolls_score({})["value"])


def test_file_scorer_and_its_validation_errors(tmp_path):
    refs = {"id1": ["Yes"], "id2": ["No", "no way"]}

    def write(obj):
        path = tmp_path / "preds.json"
        path.write_text(json.dumps(obj))
        return path

    assert score_predictions_file("quality", write({"id1": "yes", "id2": "maybe"}), refs)["exact_match"] == 50.0
    with pytest.raises(PredictionsError, match=r"1 id\(s\) missing from the predictions: 'id2'"):
        score_predictions_file("quality", write({"id1": "yes"}), refs)
    with pytest.raises(PredictionsError, match=r"1 id\(s\) in the predictions are not in the references: 'id3'"):
        score_predictions_file("quality", write({"id1": "yes", "id2": "no", "id3": "x"}), refs)
    with pytest.raises(PredictionsError, match=r"not strings \(ids 'id2'\)"):
        score_predictions_file("quality", write({"id1": "yes", "id2": 7}), refs)
    with pytest.raises(PredictionsError, match="must be a JSON object"):
        score_predictions_file("quality", write(["yes", "no"]), refs)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PredictionsError, match="not valid JSON"):
        score_predictions_file("quality", bad, refs)
    for err_call in (lambda: verify_predictions({"x": "y"}, ["a"]),):
        with pytest.raises(PredictionsError) as err:
            err_call()
        assert "\n" not in str(err.value)


def test_unknown_dataset_and_length_mismatch():
    from posbench.data import DataError

    with pytest.raises(DataError, match="unknown SCROLLS data set"):
        scrolls("squad", ["a"], [["a"]])
    with pytest.raises(DataError, match="2 predictions but 1 reference"):
        scrolls("qasper", ["a", "b"], [["a"]])
