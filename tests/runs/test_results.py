"""Run directories, atomic writes, the run record (result.json, schema 2) and reading trees of runs, including
records written by posbench before the one-pipeline redesign (schema 1, ``tests/fixtures/results-v1``)."""

import json
import os
from pathlib import Path

import pytest

from posbench.evaluation.outcome import Metric
from posbench.files import atomic_save, atomic_write_json, read_jsonl, write_jsonl
from posbench.runs import store
from posbench.runs.record import SCHEMA_VERSION, ResultError, RunRecord
from posbench.runs.store import load_record, new_run_dir, scan_runs

V1_TREE = Path(__file__).parents[1] / "fixtures" / "results-v1"


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


def test_non_finite_values_are_refused_or_nulled_and_infinities_kept(tmp_path):
    """NaN is no number (null); an infinity is a value (a perplexity beyond float range), written as strict JSON
    (1e999, which every JSON reader parses as infinity; ``Infinity`` is not JSON)."""
    assert Metric(float("nan"), float("inf"), 3).to_dict() == {"value": None, "stderr": float("inf"), "n": 3,
                                                               "higher_is_better": True}
    with pytest.raises(ValueError):
        atomic_write_json(tmp_path / "x.json", {"v": float("nan")})
    atomic_write_json(tmp_path / "y.json", {"v": [float("inf"), -float("inf"), 1.5], "s": "inf"})
    text = (tmp_path / "y.json").read_text()
    assert "Infinity" not in text and json.loads(text) == {"v": [float("inf"), -float("inf"), 1.5], "s": "inf"}


def test_run_ids_never_collide_and_never_overwrite(tmp_path, monkeypatch):
    dirs = {new_run_dir(tmp_path, "arithmetic", "rope") for _ in range(50)}
    assert len(dirs) == 50 and all(d.parent == tmp_path / "arithmetic" / "rope" for d in dirs)
    ids = iter(["20250101-000000-aaaaaa", "20250101-000000-aaaaaa", "20250101-000000-bbbbbb"])
    monkeypatch.setattr(store, "new_run_id", lambda: next(ids))
    first = new_run_dir(tmp_path, "t", "e")
    (first / "result.json").write_text("{}")
    second = new_run_dir(tmp_path, "t", "e")          # the same id comes up again: a fresh one is taken
    assert first.name.endswith("aaaaaa") and second.name.endswith("bbbbbb")
    assert (first / "result.json").read_text() == "{}"


def test_predictions_jsonl_roundtrip(tmp_path):
    rows = [{"i": i, "ok": i % 2 == 0} for i in range(5)]
    assert write_jsonl(tmp_path / "p.jsonl", iter(rows)) == 5
    assert read_jsonl(tmp_path / "p.jsonl") == rows


def good_result(task="arithmetic", encoding="rope", value=50.0, version=2):
    return {"schema_version": version, "task": task, "encoding": encoding, "run_id": f"r-{encoding}",
            "preset": "tiny", "config": {"task": task, "encoding": encoding, "preset": "tiny", "seed": 0},
            "metrics": {"accuracy": {"value": value, "stderr": 1.0, "n": 10, "higher_is_better": True}}}


def test_load_record_checks(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(ResultError, match="does not exist"):
        load_record(run)
    (run / "result.json").write_text("{not json")
    with pytest.raises(ResultError, match="not valid JSON"):
        load_record(run)
    (run / "result.json").write_text(json.dumps({"task": "x"}))
    with pytest.raises(ResultError, match="missing encoding, metrics"):
        load_record(run)
    (run / "result.json").write_text(json.dumps({**good_result(), "schema_version": 99}))
    with pytest.raises(ResultError, match="schema_version 99 is not one this posbench reads"):
        load_record(run)
    (run / "result.json").write_text(json.dumps(good_result()))
    record = load_record(run)
    assert isinstance(record, RunRecord) and record.encoding == "rope" and record.path == run
    assert record.metrics["accuracy"] == Metric(50.0, 1.0, 10, True)


def test_the_record_round_trips_through_its_one_writer(tmp_path):
    from posbench.runs.record import write_record

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "result.json").write_text(json.dumps(good_result()))
    record = load_record(tmp_path / "a")
    write_record(tmp_path / "b", record)
    again = load_record(tmp_path / "b")
    assert again.to_dict() == record.to_dict() and again.schema_version == SCHEMA_VERSION == 2


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
    assert [r.encoding for r in runs] == ["rope"]
    reasons = {p.path.name: p.reason for p in problems}
    assert set(reasons) == {"2", "3", "4"}
    assert "JSON" in reasons["2"] and "unfinished" in reasons["3"] and "half-written" in reasons["4"]
    with pytest.raises(ResultError, match="does not exist"):
        scan_runs(tmp_path / "missing")


def test_records_written_before_the_redesign_still_read():
    """Every run of a tree written by the previous posbench (schema 1: arithmetic over two seeds, pretrain,
    perplexity from --init, passkey, SCROLLS, an extend run and a perplexity run of its model, a benchmark)."""
    runs, problems = scan_runs(V1_TREE)
    assert problems == [] and len(runs) == 12
    assert {r.schema_version for r in runs} == {1}
    by_task = {}
    for run in runs:
        by_task.setdefault(run.task, []).append(run)
    assert sorted(by_task) == ["arithmetic", "bench", "extend", "passkey", "perplexity", "pretrain", "scrolls"]
    bench = by_task["bench"][0]
    assert bench.bench is not None and {c["encoding"] for c in bench.bench["cells"]} == {"rope", "alibi"}
    assert bench.config.task_options["lengths"] == [32] and bench.preset == "small"
    extend = by_task["extend"][0]
    assert extend.encoding == extend.config.label == "llama+lora" and extend.model["base_model"]["model_type"] == "llama"
    arithmetic = sorted(by_task["arithmetic"], key=lambda r: (r.encoding, r.seed))
    assert [(r.encoding, r.seed) for r in arithmetic] == [("alibi", 0), ("alibi", 1), ("rope", 0), ("rope", 1)]
    assert arithmetic[0].grids["accuracy"].axes[0].name == "len_a" and arithmetic[0].loss_history
    evaluated = [r for r in by_task["perplexity"] if r.init_given]
    assert len(evaluated) == 2 and {r.encoding for r in evaluated} == {"rope", "llama+lora"}


def test_a_real_run_writes_the_schema(tmp_path):
    from posbench.runs import runner
    from posbench.runs.config import resolve_run_config

    cfg = resolve_run_config("arithmetic", "alibi", "tiny", seed=3, sets=["steps=3"])
    outcome = runner.execute(cfg, tmp_path)
    data = json.loads((outcome.run_dir / "result.json").read_text())
    assert outcome.run_dir.parent == tmp_path / "arithmetic" / "alibi"
    for key in ("schema_version", "run_id", "posbench", "environment", "seeds", "config", "model", "data",
                "training", "timings", "metrics", "grids", "primary_metric", "predictions", "created", "finished"):
        assert key in data, key
    assert data["schema_version"] == 2
    assert data["posbench"]["version"] and "git_commit" in data["posbench"]
    # device "auto": whichever this machine has (the result names it, and its torch build)
    from posbench.train.device import pick_device

    assert data["environment"]["torch"] and data["environment"]["device"] == str(pick_device("auto"))
    if data["environment"]["device"] == "cpu":     # the CPU's model and the kernels' instruction set, e.g. "AMD EPYC (AVX512)"
        import torch

        assert data["environment"]["device_name"].endswith(f" ({torch.backends.cpu.get_cpu_capability()})")
    assert data["seeds"] == {"python": 3, "numpy": 3, "torch": 3, "data": 3, "eval": 42}
    assert data["config"]["model_config"]["encoding"] == "alibi" and data["config"]["train"]["steps"] == 3
    assert data["config"]["label"] == "alibi" and data["config"]["source"] is None
    assert data["data"]["hash"] and data["model"]["checkpoint_sha256"]
    for metric in data["metrics"].values():
        assert set(metric) == {"value", "stderr", "n", "higher_is_better"}
    grid = data["grids"]["accuracy"]
    assert [a["name"] for a in grid["axes"]] == ["len_a", "len_b"] and len(grid["values"]) == 3
    assert len(read_jsonl(outcome.run_dir / "predictions.jsonl")) == data["n_predictions"] == 9 * 8
    found = sorted(p.name for p in outcome.run_dir.iterdir())
    patched = "code.patch" in found                  # a checkout with changes keeps them (posbench.runs.code)
    assert [n for n in found if n != "code.patch"] == ["checkpoint", "config.json", "predictions.jsonl", "result.json"]
    assert (data["posbench"].get("patch") == "code.patch") == patched
    assert load_record(outcome.run_dir).to_dict() == outcome.record.to_dict()


@pytest.mark.parametrize("name, args", [("default", []), ("by-model", ["--by-model"]), ("by-run", ["--by-run"]),
                                        ("against-rope-arithmetic", ["--against", "rope", "--task", "arithmetic"])])
def test_compare_reads_old_records_exactly_as_the_old_posbench_did(name, args, capsys):
    """``compare --format json`` over the schema-1 tree gives what the posbench that wrote it gave
    (``tests/fixtures/results-v1-compare``, made by that version with the tree's path as ``{TREE}``): every row,
    value, interval and difference. Three things follow compare's rules of today instead, which are tested in
    test_compare and test_by_model_sizes: which cells are marked best (ties with the best are marked alike since
    issue 24), the notes under the tables, and ``--by-model``'s columns and seeds (since issue 36 two models of
    different sizes evaluated alike share their columns, and a model's row names its seed; by-model.json was
    rewritten then, its values unchanged). And the arithmetic table's by-length table, added since (issue 38,
    tests/report/test_by_length.py), is left out, as is the flag of the tree's incomplete SCROLLS score (issue 48)."""
    from posbench.cli import main

    assert main(["compare", str(V1_TREE.resolve()), *args, "--format", "json"]) == 0
    got = capsys.readouterr().out.replace(str(V1_TREE.resolve()), "{TREE}")
    expected = (V1_TREE.parent / "results-v1-compare" / f"{name}.json").read_text()
    assert _without_rules(json.loads(got)) == _without_rules(json.loads(expected))


def _without_rules(report: dict) -> dict:
    report["tables"] = [t for t in report["tables"] if t["kind"] != "by_length"]   # added since (test_by_length)
    for table in report["tables"]:
        table.pop("notes")
        # the effective lengths, derived from the grids since issue 56 (tests/report/test_effective_length.py)
        if isinstance(table.get("columns"), list):
            table["columns"] = [c for c in table["columns"]
                                if not str(c.get("name") if isinstance(c, dict) else c).split(":")[-1].startswith("eff_len")]
        for key in ("differences", "rows"):
            if key == "differences" and isinstance(table.get(key), list):
                table[key] = [d for d in table[key] if not str(d.get("metric", "")).startswith("eff_len")]
        for row in table.get("rows") or []:
            for name in [m for m in row.get("metrics", {}) if m.split(":")[-1].startswith("eff_len")]:
                del row["metrics"][name]
        for row in table["rows"]:
            for cell in row["metrics"].values():
                cell.pop("best")
                cell.pop("flag", None)          # since issue 48 (the tree's SCROLLS score is incomplete)
    return report


def test_the_cpu_model_is_read_from_cpuinfo_and_falls_back_to_the_platform(tmp_path, monkeypatch):
    import platform

    from posbench.train.device import cpu_model

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC  9654 96-Core Processor\n"
                       "processor\t: 1\nmodel name\t: AMD EPYC  9654 96-Core Processor\n")
    assert cpu_model(str(cpuinfo)) == "AMD EPYC 9654 96-Core Processor"      # the first CPU's, spaces folded
    monkeypatch.setattr(platform, "processor", lambda: "")
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    cpuinfo.write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")                  # no model name (an ARM kernel)
    assert cpu_model(str(cpuinfo)) == "aarch64"
    assert cpu_model(str(tmp_path / "absent")) == "aarch64"                      # no /proc (macOS, Windows)


def test_the_record_names_the_commit_the_run_started_from_not_one_made_while_it_trained(tmp_path, monkeypatch):
    from posbench.runs import record, runner
    from posbench.runs.config import resolve_run_config

    from posbench.runs import code

    checkout = {"git_commit": "a" * 40, "git_dirty": False}
    monkeypatch.setattr(code, "capture", lambda repo=None: code.CodeState(dict(checkout)))
    monkeypatch.setattr(runner, "capture", code.capture)

    def commit_meanwhile(step, model, loss):        # someone commits in the checkout while the run trains
        checkout.update(git_commit="b" * 40, git_dirty=True)

    cfg = resolve_run_config("arithmetic", "alibi", "tiny", seed=0, sets=["steps=2"])
    outcome = runner.execute(cfg, tmp_path, callbacks=(commit_meanwhile,))
    data = json.loads((outcome.run_dir / "result.json").read_text())
    assert checkout["git_commit"] == "b" * 40                   # the callback ran
    assert data["posbench"]["git_commit"] == "a" * 40 and data["posbench"]["git_dirty"] is False
