"""Text sources: every kind of local file, the built-in corpus, and hub names without a network."""

import gzip
import json

import pytest

from posbench.data import DataError
from posbench.data import corpus
from posbench.data.sources import looks_like_hub_name, open_source

DOCS = [f"document number {i}\nwith two lines ✓" for i in range(40)]


def _write_jsonl(path, docs, field="text"):
    path.write_text("".join(json.dumps({field: d, "meta": i}) + "\n" for i, d in enumerate(docs)), encoding="utf-8")


def _all(src):
    return list(src.documents("train")), list(src.documents("validation"))


def test_jsonl_file_and_deterministic_holdout(tmp_path):
    _write_jsonl(tmp_path / "corpus.jsonl", DOCS)
    src = open_source(str(tmp_path / "corpus.jsonl"))
    assert src.kind == "local"
    train, val = _all(src)
    assert sorted(train + val) == sorted(DOCS) and val and train
    assert set(train).isdisjoint(val)
    assert _all(open_source(str(tmp_path / "corpus.jsonl"))) == (train, val)   # same split every time
    assert "0 mod 20" in src.describe()["holdout"]


def test_json_parquet_txt_and_gzip_give_the_same_documents(tmp_path):
    import pandas as pd

    (tmp_path / "c.json").write_text(json.dumps([{"text": d} for d in DOCS]), encoding="utf-8")
    pd.DataFrame({"text": DOCS}).to_parquet(tmp_path / "c.parquet")
    with gzip.open(tmp_path / "c.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in DOCS)
    expected = _all(open_source(str(tmp_path / "c.json")))
    assert sorted(expected[0] + expected[1]) == sorted(DOCS)
    assert _all(open_source(str(tmp_path / "c.parquet"))) == expected
    assert _all(open_source(str(tmp_path / "c.jsonl.gz"))) == expected
    # a .txt file is one document
    (tmp_path / "t.txt").write_text("line one\nline two\n", encoding="utf-8")
    t = open_source(str(tmp_path / "t.txt"))
    assert list(t.documents("train")) + list(t.documents("validation")) == ["line one\nline two\n"]


def test_directory_with_named_splits(tmp_path):
    d = tmp_path / "data"
    (d / "sub").mkdir(parents=True)
    _write_jsonl(d / "train.jsonl", DOCS[:10])
    (d / "sub" / "more.txt").write_text("a text file\n", encoding="utf-8")
    _write_jsonl(d / "validation.jsonl", DOCS[10:13])
    train, val = _all(open_source(str(d)))
    assert sorted(train) == sorted(DOCS[:10] + ["a text file\n"])
    assert val == DOCS[10:13]
    assert open_source(str(d)).describe()["files"] == ["sub/more.txt", "train.jsonl", "validation.jsonl"]


def test_text_field_option_and_missing_field(tmp_path):
    _write_jsonl(tmp_path / "c.jsonl", DOCS, field="content")
    src = open_source(str(tmp_path / "c.jsonl"), text_field="content")
    assert sorted(sum(_all(src), [])) == sorted(DOCS)
    with pytest.raises(DataError, match="no 'text' field.*--set task.text_field=NAME"):
        list(open_source(str(tmp_path / "c.jsonl")).documents("train"))


def test_builtin_corpus_is_deterministic_and_split():
    src = open_source(None)
    assert src.kind == "builtin" and src.spec == "stdlib"
    train = list(zip(range(20), src.documents("train")))
    again = list(zip(range(20), open_source("stdlib").documents("train")))
    assert train == again
    files = corpus.stdlib_files()
    assert len(files) > 200
    assert all("test" not in rel.split("/")[:-1] for rel, _ in files)
    held = sum(h for _, h in files)
    assert 0 < held < len(files) / 5
    desc = src.describe()
    assert desc["name"] == "stdlib" and desc["python"] and desc["files"] == len(files)


def test_hub_names_offline_say_what_to_pass(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    for name in ("allenai/c4", "c4", "pg19", "hoskinson-center/proof-pile", "allenai/c4:en"):
        assert looks_like_hub_name(name)
        src = open_source(name)
        assert src.kind == "hub"
        with pytest.raises(DataError) as err:
            next(src.documents("train"))
        msg = str(err.value)
        assert "\n" not in msg and "--data PATH" in msg and "--data stdlib" in msg
    assert open_source("c4").hub_name == "allenai/c4" and open_source("c4").hub_config == "en"


def test_missing_paths_and_bad_files(tmp_path):
    assert not looks_like_hub_name("data/train.jsonl")
    with pytest.raises(DataError, match="no such file or directory"):
        open_source(str(tmp_path / "nope.jsonl"))
    with pytest.raises(DataError, match="no such file"):
        open_source("./relative/dir")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported file type"):
        open_source(str(tmp_path / "x.csv"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no"):
        open_source(str(tmp_path / "empty"))
