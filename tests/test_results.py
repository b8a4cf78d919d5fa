"""Run directories, atomic writes, the result.json schema and reading trees of runs."""

import json
import os

import pytest

from posbench import results
from posbench.results import (Metric, ResultError, atomic_save, atomic_write_json, load_result, new_run_dir,
                              read_predictions, scan_runs, write_predictions)


def test_atomic_write_replaces_whole_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "a" / "result.json"
    atomic_write_json(path, {"x": 1})
    atomic_write_json(path, {"x": 2})
    assert json.loads(path.read_text()) == {"x": 2}
    assert os.listdir(path.parent) == ["result.json"]


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "result.json"
    atomic_write_json(path, {"good": True})

    def crash(tmp):
        tmp.write_text("{half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        atomic_save(path, crash)
    assert json.loads(path.read_text()) == {"good": True}
    assert os.listdir(tmp_path) == ["result.json"]


def test_non_finite_values_are_refused_or_nulled(tmp_path):
    assert Metric(float("nan"), float("inf"), 3).to_dict() == {"value": None, "stderr": None, "n": 3,
                                                               "higher_is_better": True}
    with pytest.raises(ValueError):
        atomic_write_json(tmp_path / "x.json", {"v": float("nan")})


def test_run_ids_never_collide_and_never_overwrite(tmp_path, monkeypatch):
    dirs = {new_run_dir(tmp_path, "arithmetic", "rope") for _ in range(50)}
    assert len(dirs) == 50 and all(d.parent == tmp_path / "arithmetic" / "rope" for d in dirs)
    ids = iter(["20250101-000000-aaaaaa", "20250101-000000-aaaaaa", "20250101-000000-bbbbbb"])
    monkeypatch.setattr(results, "new_run_id", lambda: next(ids))
    first = new_run_dir(tmp_path, "t", "e")
    (first / "result.json").write_text("{}")
    second = new_run_dir(tmp_path, "t", "e")          # the same id comes up again: a fresh one is taken
    assert first.name.endswith("aaaaaa") and second.name.endswith("bbbbbb")
    assert (first / "result.json").read_text() == "{}"


def test_predictions_jsonl_roundtrip(tmp_path):
    rows = [{"i": i, "ok": i % 2 == 0} for i in range(5)]
    assert write_predictions(tmp_path / "p.jsonl", iter(rows)) == 5
    assert read_predictions(tmp_path / "p.jsonl") == rows


def good_result(task="arithmetic", encoding="rope", value=50.0):
    return {"schema_version": 1, "task": task, "encoding": encoding, "run_id": f"r-{encoding}",
            "metrics": {"accuracy": {"value": value, "stderr": 1.0, "n": 10, "higher_is_better": True}}}


def test_load_result_checks(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(ResultError, match="does not exist"):
        load_result(run)
    (run / "result.json").write_text("{not json")
    with pytest.raises(ResultError, match="not valid JSON"):
        load_result(run)
    (run / "result.json").write_text(json.dumps({"task": "x"}))
    with pytest.raises(ResultError, match="missing encoding, metrics"):
        load_result(run)
    (run / "result.json").write_text(json.dumps({**good_result(), "schema_version": 99}))
    with pytest.raises(ResultError, match="newer"):
        load_result(run)
    (run / "result.json").write_text(json.dumps(good_result()))
    assert load_result(run)["encoding"] == "rope"


def test_scan_runs_lists_good_and_skips_bad(tmp_path):
    good = tmp_path / "arithmetic" / "rope" / "1"
    corrupt = tmp_path / "arithmetic" / "tape" / "2"
    unfinished = tmp_path / "arithmetic" / "tape" / "3"
    half = tmp_path / "arithmetic" / "tape" / "4"
    for d in (good, corrupt, unfinished, half):
        d.mkdir(parents=True)
    atomic_write_json(good / "result.json", good_result())
    (corrupt / "result.json").write_text('{"task": "arithmetic", "enc')
    (unfinished / "config.json").write_text("{}")
    (half / "config.json").write_text("{}")
    (half / ".result.json.abc.tmp").write_text('{"task"')
    runs, problems = scan_runs(tmp_path)
    assert [r["encoding"] for r in runs] == ["rope"]
    reasons = {p.path.name: p.reason for p in problems}
    assert set(reasons) == {"2", "3", "4"}
    assert "JSON" in reasons["2"] and "unfinished" in reasons["3"] and "half-written" in reasons["4"]
    with pytest.raises(ResultError, match="does not exist"):
        scan_runs(tmp_path / "missing")


def test_a_real_run_writes_the_schema(tmp_path):
    from posbench import runner
    from posbench.config import resolve_run_config

    cfg = resolve_run_config("arithmetic", "alibi", "tiny", seed=3, sets=["steps=3"])
    outcome = runner.execute(cfg, tmp_path)
    data = load_result(outcome.run_dir)
    assert outcome.run_dir.parent == tmp_path / "arithmetic" / "alibi"
    for key in ("schema_version", "run_id", "posbench", "environment", "seeds", "config", "model", "data",
                "training", "timings", "metrics", "grids", "primary_metric", "predictions", "created", "finished"):
        assert key in data, key
    assert data["posbench"]["version"] and "git_commit" in data["posbench"]
    # device "auto": whichever this machine has (the result names it, and its torch build)
    from posbench.engine import pick_device

    assert data["environment"]["torch"] and data["environment"]["device"] == str(pick_device("auto"))
    assert data["seeds"] == {"python": 3, "numpy": 3, "torch": 3, "data": 3, "eval": 42}
    assert data["config"]["model_config"]["encoding"] == "alibi" and data["config"]["train"]["steps"] == 3
    assert data["data"]["hash"] and data["model"]["checkpoint_sha256"]
    for metric in data["metrics"].values():
        assert set(metric) == {"value", "stderr", "n", "higher_is_better"}
    grid = data["grids"]["accuracy"]
    assert [a["name"] for a in grid["axes"]] == ["len_a", "len_b"] and len(grid["values"]) == 3
    assert len(read_predictions(outcome.run_dir / "predictions.jsonl")) == data["n_predictions"] == 9 * 8
    assert sorted(p.name for p in outcome.run_dir.iterdir()) == ["checkpoint", "config.json",
                                                                "predictions.jsonl", "result.json"]
