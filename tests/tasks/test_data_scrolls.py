"""SCROLLS files: local layout, duplicate ids merged into a list of references, query split at a blank line."""

import json
from pathlib import Path

import pytest

from posbench.data import DataError
from posbench.tasks.scrolls.data import DATASETS, load_split, parse_datasets, prompt_parts, split_query

FIXTURES = Path(__file__).parents[1] / "fixtures" / "scrolls"


def test_local_copies_merge_duplicate_ids():
    val = load_split("qasper", "validation", FIXTURES)
    assert [ex.id for ex in val] == ["qa-v1", "qa-v2", "qa-v3"]
    assert val[0].outputs == ["BLEU", "BLEU score"] and val[0].pid == "qa-v1_0"
    # the query is split at the FIRST blank line; the document keeps later blank lines
    assert val[0].question == "What metric is reported?"
    assert val[0].text == "We report BLEU on the test set.\n\nSee the appendix."
    assert len(load_split("qasper", "train", FIXTURES)) == 4


def test_summaries_have_no_question_and_prompts():
    ex = load_split("gov_report", "validation", FIXTURES)[0]
    assert ex.question == "" and ex.text == ex.input
    doc, suffix = prompt_parts("gov_report", ex)
    assert doc == ex.input and suffix == "\n\nQuestion: What is a summary of the preceding text?\nAnswer:"
    nli = load_split("contract_nli", "validation", FIXTURES)[0]
    assert prompt_parts("contract_nli", nli)[1] == "\n\nHypothesis: Public information is not confidential.\nConclusion:"
    qa = load_split("qasper", "validation", FIXTURES)[1]
    assert prompt_parts("qasper", qa) == ("All experiments use English data.", "\n\nQuestion: What language?\nAnswer:")


def test_merge_and_split_rules(tmp_path):
    rows = [{"id": "a", "pid": "a0", "input": "q?\n\ndoc", "output": "x"},
            {"id": "b", "pid": "b0", "input": "q2\n\ndoc2", "output": "y"},
            {"id": "a", "pid": "a1", "input": "q?\n\ndoc", "output": "z"}]
    (tmp_path / "narrative_qa").mkdir()
    (tmp_path / "narrative_qa" / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    merged = load_split("narrative_qa", "validation", tmp_path)
    assert [(e.id, e.outputs) for e in merged] == [("a", ["x", "z"]), ("b", ["y"])]
    assert split_query("qmsum", "no blank line") == ("no blank line", "")
    assert split_query("summ_screen_fd", "a\n\nb") == ("", "a\n\nb")


def test_dataset_selection():
    assert parse_datasets(None) == list(DATASETS) and len(DATASETS) == 7
    assert parse_datasets("quality,qasper") == ["qasper", "quality"]      # official order
    with pytest.raises(DataError, match="unknown SCROLLS data set.*squad"):
        parse_datasets("qasper,squad")


def test_missing_local_files_and_offline_hub(tmp_path, monkeypatch):
    with pytest.raises(DataError, match="has no quality/ folder.*DIR/<dataset>"):
        load_split("quality", "validation", FIXTURES)
    (tmp_path / "qasper").mkdir()
    with pytest.raises(DataError, match="no qasper/validation.jsonl"):
        load_split("qasper", "validation", tmp_path)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataError) as err:
        load_split("qasper", "validation", None)
    assert "offline" in str(err.value) and "--data DIR" in str(err.value) and "\n" not in str(err.value)
