"""The held-out split is found (or its absence reported) before anything is trained."""

import gzip
import json

import pytest

from posbench.cli import main
from posbench.runs.config import resolve_run_config
from posbench.data import DataError
from posbench.data.sources import open_source
from posbench.data.splits import check_splits
from posbench.tasks.pretrain.task import Pretrain


def _jsonl(path, texts, field="text"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({field: t}) + "\n" for t in texts))


def test_named_files_a_held_out_slice_or_the_builtin_corpus(tmp_path):
    _jsonl(tmp_path / "a" / "train.jsonl", [f"t{i}" for i in range(5)])
    _jsonl(tmp_path / "a" / "validation.jsonl", ["v0"])
    assert check_splits(open_source(str(tmp_path / "a")))["validation"] == "files"
    _jsonl(tmp_path / "b" / "part-0.jsonl", [f"t{i}" for i in range(5)])
    plan = check_splits(open_source(str(tmp_path / "b")))
    assert plan == {"validation": "held-out slice", "rule": "documents whose index is 0 mod 20"}
    assert check_splits(open_source("stdlib"))["validation"] == "builtin"


def test_the_hub_naming_of_held_out_shards_is_recognised(tmp_path):
    """C4's shards are c4-train.00000-of-01024.json.gz and c4-validation.00000-of-00008.json.gz."""
    base = tmp_path / "c4" / "en"
    base.mkdir(parents=True)
    for name, texts in (("c4-train.00000-of-01024.json.gz", ["a", "b"]),
                        ("c4-validation.00000-of-00008.json.gz", ["held"])):
        with gzip.open(base / name, "wt") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    src = open_source(str(base))
    assert check_splits(src)["validation"] == "files"
    assert list(src.documents("validation")) == ["held"] and list(src.documents("train")) == ["a", "b"]


@pytest.mark.parametrize("layout, message", [
    ({"train.jsonl": ["a", "b"], "validation.jsonl": []}, "held-out split .* is empty"),
    ({"validation.jsonl": ["a"]}, "training split .* is empty"),
    ({"train.jsonl": [""], "validation.jsonl": ["v"]}, "training split .* is empty"),
])
def test_an_empty_split_is_one_line_before_training(tmp_path, layout, message):
    for name, texts in layout.items():
        _jsonl(tmp_path / "d" / name, texts)
    with pytest.raises(DataError, match=message) as err:
        check_splits(open_source(str(tmp_path / "d")))
    assert "\n" not in str(err.value)


def test_the_task_checks_in_validate_before_any_run_directory(tmp_path, capsys):
    _jsonl(tmp_path / "d" / "train.jsonl", [f"document {i} " * 50 for i in range(40)])
    _jsonl(tmp_path / "d" / "validation.jsonl", [])
    cfg = resolve_run_config("pretrain", "rope", "tiny", sets=[f"task.data={tmp_path / 'd'}"])
    with pytest.raises(DataError, match="held-out split"):
        Pretrain(cfg).validate()
    # a missing text field too: found before training, not after it
    _jsonl(tmp_path / "e" / "train.jsonl", ["x" * 100] * 5, field="content")
    code = main(["run", "-e", "rope", "-t", "pretrain", "-p", "tiny", "--data", str(tmp_path / "e"),
                 "-o", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "no 'text' field" in err and len(err.strip().splitlines()) == 1
    assert "pass --set task.text_field=NAME" in err          # an option that exists (main named --text-field)
    assert not (tmp_path / "out").exists()
    # and what it names works
    cfg = resolve_run_config("pretrain", "rope", "tiny", sets=[f"task.data={tmp_path / 'e'}",
                                                               "task.text_field=content"])
    assert cfg.task_options["text_field"] == "content"
