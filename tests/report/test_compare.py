"""compare: tables with the best value marked, every format, figures, and trees with broken runs."""

import csv
import math
import io
import json

import pytest

from posbench import report
from posbench.cli import main
from posbench.files import atomic_write_json


def fake_result(encoding, acc, ppl=None, task="arithmetic", seed=0, run_id=None):
    grid_vals = [[acc, acc / 2], [acc / 2, acc / 4]]
    data = {
        "schema_version": 1, "task": task, "encoding": encoding, "run_id": run_id or f"run-{encoding}-{seed}",
        "config": {"seed": seed}, "primary_metric": "accuracy", "timings": {"train_s": 12.5},
        "metrics": {"accuracy": {"value": acc, "stderr": 1.5, "n": 400, "higher_is_better": True},
                    "accuracy_id": {"value": min(100.0, acc * 2), "stderr": 0.5, "n": 100, "higher_is_better": True}},
        "grids": {"accuracy": {"metric": "accuracy", "higher_is_better": True,
                               "axes": [{"name": "len_a", "values": [1, 2]}, {"name": "len_b", "values": [1, 2]}],
                               "values": grid_vals, "stderr": None, "n": [[100, 100], [100, 100]],
                               "meta": {"train_max": {"len_a": 1, "len_b": 1}, "unit": "%"}}},
    }
    if ppl is not None:
        data["metrics"]["perplexity"] = {"value": ppl, "stderr": None, "n": 10, "higher_is_better": False}
        data["grids"]["ppl_by_length"] = {"metric": "perplexity", "higher_is_better": False,
                                          "axes": [{"name": "length", "values": [64, 128, 256]}],
                                          "values": [ppl, ppl * 1.5, None], "meta": {"train_max": {"length": 128}}}
    return data


def write_tree(root):
    """Two good arithmetic runs, a corrupt one, a half-written one and an unfinished one, plus a second task."""
    atomic_write_json(root / "arithmetic" / "rope" / "a" / "result.json", fake_result("rope", 40.0, ppl=9.0))
    atomic_write_json(root / "arithmetic" / "tape" / "b" / "result.json", fake_result("tape", 60.0, ppl=12.0))
    (root / "arithmetic" / "fire" / "c").mkdir(parents=True)
    (root / "arithmetic" / "fire" / "c" / "result.json").write_text('{"task": "arithmetic", "metr')
    half = root / "arithmetic" / "xpos" / "d"
    half.mkdir(parents=True)
    (half / "config.json").write_text("{}")
    (half / ".result.json.x1.tmp").write_text('{"task": "ari')
    (root / "arithmetic" / "nope" / "e").mkdir(parents=True)
    (root / "arithmetic" / "nope" / "e" / "config.json").write_text("{}")
    atomic_write_json(root / "other" / "rope" / "f" / "result.json", fake_result("rope", 10.0, task="other"))


def test_tables_mark_the_best_of_each_column(tmp_path):
    write_tree(tmp_path)
    rep = report.collect(tmp_path)
    assert [(t.task, t.kind) for t in rep.tables] == [("arithmetic", "metrics"), ("arithmetic", "by_length"),
                                                      ("other", "metrics"), ("other", "by_length")]
    table = rep.tables[0]
    # the effective lengths follow the task's own metrics (derived from its grid: tests/report/test_effective_length.py)
    assert table.columns == ["accuracy", "accuracy_id", "perplexity", "eff_len", "eff_len_abs"]
    assert [r.encoding for r in table.rows] == ["tape", "rope"]          # sorted by the primary metric
    tape, rope = table.rows
    assert tape.cells["accuracy"].best and not rope.cells["accuracy"].best
    assert rope.cells["perplexity"].best and not tape.cells["perplexity"].best   # lower is better
    assert tape.cells["accuracy_id"].best                                 # 100 vs 80
    assert len(rep.problems) == 3
    assert report.collect(tmp_path, task="other").tables[0].rows[0].encoding == "rope"


def test_by_run_gives_duplicate_encodings_distinct_labels(tmp_path):
    atomic_write_json(tmp_path / "t" / "rope" / "1" / "result.json", fake_result("rope", 1.0, seed=0))
    atomic_write_json(tmp_path / "t" / "rope" / "2" / "result.json", fake_result("rope", 2.0, seed=1))
    labels = [r.label for r in report.collect(tmp_path, by_run=True).tables[0].rows]
    assert len(set(labels)) == 2 and all(label.startswith("rope (seed") for label in labels)
    rows = report.collect(tmp_path).tables[0].rows            # by default the two seeds are one row
    assert [(r.label, len(r.runs), r.cells["accuracy"].value) for r in rows] == [("rope", 2, 1.5)]


def test_every_format_renders(tmp_path):
    write_tree(tmp_path)
    rep = report.collect(tmp_path)
    md = report.render_text(rep, "markdown")
    assert "### arithmetic" in md and "**60.00 ± 1.50**" in md and "| rope |" in md
    every = list(csv.DictReader(io.StringIO(report.render_text(rep, "csv"))))
    rows = [r for r in every if "by the longer length" not in r["task"]]    # the by-length tables' rows apart
    assert {r["encoding"] for r in rows} == {"rope", "tape"} and len(rows) == 3 and len(every) == 6
    tape = next(r for r in rows if r["encoding"] == "tape")
    assert float(tape["accuracy"]) == 60.0 and tape["accuracy_best"] == "1" and tape["perplexity_best"] == "0"
    tex = report.render_text(rep, "latex")
    assert r"\textbf{60.00}" in tex and r"\begin{tabular}" in tex and r"accuracy\_id" in tex
    data = json.loads(report.render_text(rep, "json"))
    cell = data["tables"][0]["rows"][0]["metrics"]["accuracy"]
    assert {k: cell[k] for k in ("value", "stderr", "n", "best", "seeds")} == {"value": 60.0, "stderr": 1.5, "n": 400,
                                                                                "best": True, "seeds": 1}
    assert len(data["skipped"]) == 3


def test_plots_write_heatmap_grid_and_curves(tmp_path):
    write_tree(tmp_path / "runs")
    files = report.plot(report.collect(tmp_path / "runs"), tmp_path / "figs")
    names = sorted(p.name for p in files)
    assert names == ["arithmetic_accuracy.png", "arithmetic_ppl_by_length.png", "other_accuracy.png"]
    for path in files:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("fmt", ["table", "markdown", "csv", "latex", "json"])
def test_cli_compare_renders_a_tree_with_broken_runs(tmp_path, capsys, fmt):
    write_tree(tmp_path)
    code = main(["compare", str(tmp_path), "--format", fmt, "--plots", str(tmp_path / "figs")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "tape" in captured.out and "rope" in captured.out
    assert "skipped 3 unreadable run(s)" in captured.err
    assert "fire" in captured.err and "half-written" in captured.err and "unfinished" in captured.err
    assert (tmp_path / "figs" / "arithmetic_accuracy.png").exists()


def test_cli_compare_only_broken_runs_is_an_error(tmp_path, capsys):
    (tmp_path / "x" / "rope" / "1").mkdir(parents=True)
    (tmp_path / "x" / "rope" / "1" / "result.json").write_text("garbage")
    assert main(["compare", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no finished runs" in err and "Traceback" not in err


# ---- seeds, settings, paired differences, bench runs, models, width ---------------------------------------

def make_run(root, task, encoding, seed, metrics, *, train=None, encoding_options=None, task_options=None,
             init=None, stderr=None, predictions=None, grids=None, loss=None, finished="2026-01-01T00:00:00",
             extra=None, hib=None):
    """A made-up finished run written as results.py lays it out; returns its directory."""
    parent = root / task / encoding
    run_id = f"{encoding}-s{seed}-{len(list(parent.glob('*'))) if parent.exists() else 0}"
    run_dir = root / task / encoding / run_id
    config = {"task": task, "encoding": encoding, "preset": "small", "seed": seed, "device": "auto", "init": init,
              "model": {"d_model": 64, "n_layers": 2, "attention": "auto"}, "encoding_options": encoding_options or {},
              "train": {"steps": 100, "lr": 1e-3, "threads": 0, **(train or {})}, "task_options": task_options or {}}
    data = {"schema_version": 1, "run_id": run_id, "task": task, "encoding": encoding, "preset": "small",
            "status": "complete", "finished": finished, "command": ["posbench", "run", "-e", encoding],
            "posbench": {"version": "0.1.0", "git_commit": "abc123", "git_dirty": False},
            "environment": {"device": "cpu", "device_name": "x86_64", "precision": "fp32", "torch": "2.13.0"},
            "config": config, "init": {"run": init, "checkpoint_sha256": "0"} if init else None,
            "metrics": {name: {"value": value, "stderr": (stderr or {}).get(name), "n": 4,
                               "higher_is_better": (hib or {}).get(name, True)} for name, value in metrics.items()},
            "primary_metric": next(iter(metrics)), "timings": {"train_s": 10.0 + seed},
            "grids": grids or {}, "training": {"loss_history": loss or []}, **(extra or {})}
    if predictions is not None:
        (run_dir).mkdir(parents=True, exist_ok=True)
        (run_dir / "predictions.jsonl").write_text("".join(json.dumps(p) + "\n" for p in predictions))
        data["predictions"] = "predictions.jsonl"
    atomic_write_json(run_dir / "result.json", data)
    return run_dir


def test_seeds_are_pooled_into_one_row_with_a_student_t_interval(tmp_path, capsys):
    for seed, (r, t) in enumerate([(40.0, 50.0), (42.0, 52.0), (47.0, 54.0)]):
        make_run(tmp_path, "arithmetic", "rope", seed, {"accuracy": r})
        make_run(tmp_path, "arithmetic", "tape", seed, {"accuracy": t})
    table = report.collect(tmp_path).tables[0]
    tape, rope = table.rows
    assert (tape.label, len(tape.runs), rope.label, len(rope.runs)) == ("tape", 3, "rope", 3)
    # by hand: rope mean 43, s = sqrt(13); tape mean 52, s = 2; half-width t(0.975, 2) s / sqrt(3), t = 4.302653
    assert rope.cells["accuracy"].value == pytest.approx(43.0)
    assert rope.cells["accuracy"].half_width == pytest.approx(4.302653 * math.sqrt(13) / math.sqrt(3), rel=1e-6)
    assert tape.cells["accuracy"].half_width == pytest.approx(4.302653 * 2 / math.sqrt(3), rel=1e-6)
    assert tape.cells["accuracy"].best and tape.cells["accuracy"].seeds == 3
    md = report.render_text(report.collect(tmp_path), "markdown")
    assert "| rope | 43.00 ± 8.96 | 3 |" in md and "95% Student-t interval over seeds" in md
    assert len(report.collect(tmp_path, by_run=True).tables[0].rows) == 6
    assert main(["compare", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "seeds" in out and "43.00 ± 8.96" in out


def test_runs_that_differ_in_any_other_setting_are_never_pooled(tmp_path):
    make_run(tmp_path, "arithmetic", "rope", 0, {"accuracy": 40.0})
    make_run(tmp_path, "arithmetic", "rope", 1, {"accuracy": 44.0})
    make_run(tmp_path, "arithmetic", "rope", 0, {"accuracy": 90.0}, train={"steps": 200})
    make_run(tmp_path, "arithmetic", "tape", 0, {"accuracy": 50.0})
    make_run(tmp_path, "arithmetic", "alibi", 0, {"accuracy": 30.0}, encoding_options={"x": 1})
    table = report.collect(tmp_path).tables[0]
    rows = {r.label: r for r in table.rows}
    assert set(rows) == {"rope [train.steps=100]", "rope [train.steps=200]", "tape [train.steps=100]",
                         "alibi [train.steps=100]"}
    short, long = rows["rope [train.steps=100]"], rows["rope [train.steps=200]"]
    assert len(short.runs) == 2 and short.cells["accuracy"].value == 42
    assert len(long.runs) == 1 and long.cells["accuracy"].value == 90
    assert any("rows differ in train.steps" in note for note in table.notes)
    # encoding options set rows apart only between runs of the same encoding
    make_run(tmp_path / "b", "arithmetic", "rope", 0, {"accuracy": 1.0}, encoding_options={"theta": 500.0})
    make_run(tmp_path / "b", "arithmetic", "rope", 0, {"accuracy": 2.0}, encoding_options={"theta": 10000.0})
    make_run(tmp_path / "b", "arithmetic", "alibi", 0, {"accuracy": 3.0})
    labels = sorted(r.label for r in report.collect(tmp_path / "b").tables[0].rows)
    assert labels == ["alibi", "rope [encoding.theta=10000]", "rope [encoding.theta=500]"]


def test_settings_that_only_change_speed_pool_and_repeated_seeds_count_once(tmp_path):
    make_run(tmp_path, "arithmetic", "rope", 0, {"accuracy": 40.0}, train={"threads": 1})
    make_run(tmp_path, "arithmetic", "rope", 1, {"accuracy": 44.0}, train={"threads": 2, "compile": True},
             extra={"environment": {"device": "cuda", "precision": "fp32"}})
    make_run(tmp_path, "arithmetic", "rope", 1, {"accuracy": 46.0}, finished="2026-02-01T00:00:00")   # a rerun
    table = report.collect(tmp_path).tables[0]
    (row,) = table.rows
    assert row.label == "rope" and len(row.runs) == 2 and row.cells["accuracy"].values == [40.0, 46.0]
    assert any("1 repeated run(s) of a seed left out" in n for n in table.notes)
    # a different precision is a different experiment
    make_run(tmp_path, "arithmetic", "rope", 2, {"accuracy": 10.0}, extra={"environment": {"precision": "bf16"}})
    assert sorted(r.label for r in report.collect(tmp_path).tables[0].rows) == ["rope [precision=bf16]",
                                                                               "rope [precision=fp32]"]


def test_runs_started_from_the_seeds_of_one_pretraining_pool(tmp_path):
    for enc in ("rope", "alibi"):
        for seed in (0, 1):
            base = make_run(tmp_path, "pretrain", enc, seed, {"val_ppl": 5.0 + seed}, hib={"val_ppl": False})
            make_run(tmp_path, "perplexity", enc, 0, {"ppl_1x": 6.0 + seed + (enc == "rope")}, init=str(base),
                     hib={"ppl_1x": False})
    tables = {t.task: t for t in report.collect(tmp_path).tables}
    rows = tables["perplexity"].rows
    assert [(r.label, len(r.runs)) for r in rows] == [("alibi", 2), ("rope", 2)]
    assert rows[0].cells["ppl_1x"].value == pytest.approx(6.5) and rows[0].cells["ppl_1x"].best
    from posbench.report.best import RULE

    assert tables["perplexity"].notes[1:] == [RULE]     # the interval note and the rule: no setting differs


def arithmetic_predictions(pattern):
    """Predictions of a made-up arithmetic run: cells (1,1) (1,2) (2,1) (2,2), 4 examples each, correct where
    ``pattern`` (16 booleans) says."""
    rows, k = [], 0
    for la in (1, 2):
        for lb in (1, 2):
            for i in range(4):
                rows.append({"len_a": la, "len_b": lb, "a": str(10 * la + i), "b": str(lb + i), "prompt": "",
                             "target": "", "prediction": "", "correct": bool(pattern[k])})
                k += 1
    return rows


def arithmetic_metrics(pattern):
    acc = 100.0 * sum(pattern) / 16
    idd = 100.0 * sum(pattern[:4]) / 4                    # train_digits 1: only cell (1, 1) is in distribution
    return {"accuracy": acc, "accuracy_id": idd, "accuracy_ood": 100.0 * sum(pattern[4:]) / 12}


def test_against_pairs_by_seed_and_by_example(tmp_path, capsys):
    rng = __import__("random").Random(0)
    for seed in range(3):
        for enc, p_right in (("rope", 0.4), ("tape", 0.7)):
            pattern = [rng.random() < p_right for _ in range(16)]
            make_run(tmp_path, "arithmetic", enc, seed, {**arithmetic_metrics(pattern), "loss": 1.0 + seed},
                     task_options={"train_digits": 1}, predictions=arithmetic_predictions(pattern))
    table = report.collect(tmp_path, against="rope").tables[0]
    diffs = {d.metric: d for d in table.differences}
    assert set(diffs) == {"accuracy", "accuracy_id", "accuracy_ood", "loss"} and table.against == "rope"
    tape, rope = (next(r for r in table.rows if r.encoding == e) for e in ("tape", "rope"))
    expected = sum(b.metrics["accuracy"].value - a.metrics["accuracy"].value
                   for a, b in zip(rope.runs, tape.runs)) / 3
    acc = diffs["accuracy"].difference
    assert acc.estimate == pytest.approx(expected) and acc.basis == "3 seeds x 16 examples"
    assert acc.low < acc.estimate < acc.high and 0 <= acc.p <= 1
    assert diffs["loss"].difference.basis == "3 seeds (paired t)" and diffs["loss"].difference.estimate == 0
    assert any("paired across seeds only" in n and "loss" in n for n in table.notes)
    data = json.loads(report.render_text(report.collect(tmp_path, against="rope"), "json"))
    assert {d["metric"] for d in data["tables"][0]["differences"]} == set(diffs)
    rows = list(csv.DictReader(io.StringIO(report.render_text(report.collect(tmp_path, against="rope"), "csv"))))
    assert next(r for r in rows if r["encoding"] == "tape")["accuracy_diff"] != ""
    assert main(["compare", str(tmp_path), "--against", "rope"]) == 0
    assert "difference to rope" in capsys.readouterr().out
    assert main(["compare", str(tmp_path), "--against", "fire"]) == 2
    err = capsys.readouterr().err
    assert "no fire run" in err and "Traceback" not in err


def test_against_falls_back_to_seeds_when_examples_do_not_rebuild_the_metric(tmp_path):
    pattern = [True] * 8 + [False] * 8
    for seed in range(2):
        make_run(tmp_path, "arithmetic", "rope", seed, arithmetic_metrics(pattern), task_options={"train_digits": 1},
                 predictions=arithmetic_predictions(pattern))
        wrong = {**arithmetic_metrics(pattern), "accuracy": 99.0}        # disagrees with its predictions
        make_run(tmp_path, "arithmetic", "tape", seed, wrong, task_options={"train_digits": 1},
                 predictions=arithmetic_predictions(pattern))
    diffs = {d.metric: d.difference for d in report.collect(tmp_path, against="rope").tables[0].differences}
    assert diffs["accuracy"].basis == "2 seeds (paired t)" and diffs["accuracy"].estimate == pytest.approx(49.0)
    assert diffs["accuracy_id"].basis == "2 seeds x 16 examples" and diffs["accuracy_id"].estimate == 0


def bench_result(run_id="20260101-000000-abcdef"):
    cells = []
    for enc, factor in (("rope", 1.0), ("alibi", 1.1), ("tape", 1.3)):
        for length, base in ((1024, 78.8), (8192, 700.0)):
            oom = enc == "tape" and length == 8192
            cells.append({"encoding": enc, "length": length, "batch": 16, "status": "oom" if oom else "ok",
                          "ms": None if oom else base * factor, "ms_all": [], "tokens_per_s": 1.0,
                          "mfu": None if oom else 0.186 / factor, "peak_gib": None if oom else 18.5 * factor,
                          "x_rope": None if oom else factor, "params": 123456, "error": None})
    return {"schema_version": 1, "run_id": run_id, "task": "bench", "encoding": "rope,alibi,tape", "preset": "small",
            "status": "complete", "created": "", "finished": "", "command": ["posbench", "bench"], "posbench": {},
            "environment": {}, "metrics": {},
            "config": {"encodings": ["rope", "alibi", "tape"], "size": "small", "batch": [16, 1],
                       "lengths": [1024, 8192],
                       "mode": "train", "compile": True, "device": "cuda", "precision": "bf16", "warmup": 3,
                       "steps": 10, "model": {}},
            "bench": {"device_name": "NVIDIA H100 80GB HBM3", "peak_tflops": 989.0, "peak_source": "datasheet",
                      "timer": "cuda events", "unit": "ms/step", "cells": cells}}


def test_a_bench_run_is_the_efficiency_table(tmp_path, capsys, monkeypatch):
    atomic_write_json(tmp_path / "bench" / "train" / "r1" / "result.json", bench_result())
    (table,) = report.collect(tmp_path).tables
    assert table.kind == "bench" and [r.label for r in table.rows] == ["rope", "alibi", "tape"]
    tape = table.rows[2].cells
    assert tape["8192:ms"].note == "OOM" and tape["1024:ms"].value == pytest.approx(78.8 * 1.3)
    assert tape["1024:mfu"].value == pytest.approx(18.6 / 1.3) and table.rows[0].cells["1024:ms"].best
    assert "NVIDIA H100" in table.heading and "batch 16,1" in table.heading and "bf16" in table.heading
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["compare", str(tmp_path), "--plots", str(tmp_path / "figs")]) == 0
    captured = capsys.readouterr()
    assert "OOM" in captured.out and "×RoPE" in captured.out and "8192 ms" in captured.out
    assert max(len(line) for line in captured.out.splitlines()) <= 80
    assert (tmp_path / "figs" / "bench_train_20260101-000000-abcdef.png").is_file()
    md = report.render_text(report.collect(tmp_path), "markdown")
    assert "| tape | 102.44 |" in md and "OOM" in md


def test_by_model_puts_every_task_of_one_model_in_one_row(tmp_path, capsys):
    rope = make_run(tmp_path, "pretrain", "rope", 0, {"val_ppl": 5.3}, hib={"val_ppl": False})
    llama = make_run(tmp_path, "extend", "llama", 0, {"val_ppl": 4.1}, hib={"val_ppl": False},
                     extra={"label": "llama+lora"})
    for base, ppl, acc in ((rope, 13.4, 20.0), (llama, 6.0, 90.0)):
        make_run(tmp_path, "perplexity", "x", 0, {"ppl_1x": ppl - 1, "ppl_8x": ppl}, init=str(base),
                 hib={"ppl_1x": False, "ppl_8x": False})
        make_run(tmp_path, "passkey", "x", 0, {"accuracy": acc}, init=str(base))
    (table,) = report.collect_models(tmp_path).tables
    assert [r.label for r in table.rows] == ["llama+lora", "rope"]
    assert {"passkey:accuracy", "perplexity:ppl_1x", "perplexity:ppl_8x", "pretrain:val_ppl",
            "extend:val_ppl"} == set(table.columns)
    llama_row, rope_row = table.rows
    assert llama_row.cells["perplexity:ppl_8x"].value == 6.0 and llama_row.cells["passkey:accuracy"].best
    assert rope_row.cells["pretrain:val_ppl"].value == 5.3 and rope_row.cells["extend:val_ppl"].value is None
    assert main(["compare", str(tmp_path), "--by-model"]) == 0
    out = capsys.readouterr().out
    assert "llama+lora" in out and "perplexity:ppl_8x" in out
    assert main(["compare", str(tmp_path), "--by-model", "--against", "rope"]) == 2


def test_by_model_gives_each_extension_of_a_base_model_its_own_row(tmp_path, capsys):
    """``extend --method tape|yarn|ntk`` on one Llama, each extension and the Llama itself evaluated by
    ``perplexity``: four rows (the Llama, llama+ntk, llama+tape, llama+yarn), every cell that run's own value
    (the extend runs are models of their own, not seeds of the base model's row; ntk trained 0 steps, the
    others 2, which no longer splits the extend column)."""
    base = tmp_path / "tiny-llama"
    base.mkdir()
    (base / "config.json").write_text('{"model_type": "llama"}')
    hf = {"run": str(base), "kind": "hf", "label": "llama"}
    extended, ppl_8x = {}, {"llama": 90.0, "llama+tape": 11.0, "llama+yarn": 13.0, "llama+ntk": 17.0}
    for method, val_ppl, steps in (("tape", 12.0, 2), ("yarn", 14.0, 2), ("ntk", 18.0, 0)):
        label = f"llama+{method}"
        extended[label] = make_run(tmp_path, "extend", label, 0, {"val_ppl": val_ppl}, init=str(base),
                                   train={"steps": steps}, hib={"val_ppl": False}, extra={"init": hf})
    for label, ppl in ppl_8x.items():
        init = extended.get(label, base)
        make_run(tmp_path, "perplexity", label, 0, {"ppl_8x": ppl}, init=str(init), hib={"ppl_8x": False},
                 extra={"init": {"run": str(init), "kind": "extended" if init != base else "hf", "label": label}})
    (table,) = report.collect_models(tmp_path).tables
    cells = {row.label: {c: row.cells[c].value for c in table.columns} for row in table.rows}
    assert table.columns == ["extend:val_ppl", "perplexity:ppl_8x"]
    assert cells == {"llama": {"extend:val_ppl": None, "perplexity:ppl_8x": 90.0},
                     "llama+ntk": {"extend:val_ppl": 18.0, "perplexity:ppl_8x": 17.0},
                     "llama+tape": {"extend:val_ppl": 12.0, "perplexity:ppl_8x": 11.0},
                     "llama+yarn": {"extend:val_ppl": 14.0, "perplexity:ppl_8x": 13.0}}
    assert all(len(row.runs) == (1 if row.label == "llama" else 2) for row in table.rows)
    assert main(["compare", str(tmp_path), "--by-model", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| llama+tape | **12.00** | **11.00** |" in out and "| llama | - | 90.00 |" in out


def perplexity_tree(root, encodings=("rope", "alibi", "randpe")):
    names = [f"ppl_{k}x" for k in (1, 2, 4, 8)] + [f"ppl_sliding_{k}x" for k in (1, 2, 4, 8)]
    for i, enc in enumerate(encodings):
        for seed in range(2):
            make_run(root, "perplexity", enc, seed, {n: 5.0 + i + j + 0.1 * seed for j, n in enumerate(names)},
                     hib=dict.fromkeys(names, False))
    return names


@pytest.mark.parametrize("width", [80, 60])
def test_compare_at_80_columns_keeps_every_name_whole(tmp_path, capsys, monkeypatch, width):
    names = perplexity_tree(tmp_path, ("rope", "alibi", "randpe", "xpos", "fire", "nope", "tape", "t5"))
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(["compare", str(tmp_path), "--against", "rope"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= width
    words = set(out.replace("│", " ").replace("┃", " ").split())
    for name in names + ["rope", "alibi", "randpe", "xpos", "fire", "nope", "tape", "t5"]:
        assert name in words, name


def test_a_wide_terminal_gets_the_whole_table(tmp_path, capsys, monkeypatch):
    names = perplexity_tree(tmp_path)
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["compare", str(tmp_path)]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if "encoding" in line)
    assert all(name in header for name in names)               # one table, every metric a column


def test_figures_average_the_seeds(tmp_path):
    from posbench.report import figures

    def grid(v):
        return {"accuracy": {"metric": "accuracy", "higher_is_better": True,
                             "axes": [{"name": "len_a", "values": [1, 2]}, {"name": "len_b", "values": [1, 2]}],
                             "values": [[v, v / 2], [None, 0.0]], "meta": {"unit": "%"}},
                "ppl": {"metric": "perplexity", "axes": [{"name": "length", "values": [64, 128]}],
                        "values": [v, 2 * v], "meta": {"train_max": {"length": 64}}}}
    for seed, v in enumerate((40.0, 60.0, 80.0)):
        make_run(tmp_path, "arithmetic", "rope", seed, {"accuracy": v}, grids=grid(v),
                 loss=[[0, 3.0 + seed], [10, 2.0], [20, 1.0 + seed]])
    table = report.collect(tmp_path).tables[0]
    made = dict(figures.figures(report.collect(tmp_path)))
    assert set(made) == {"arithmetic_accuracy", "arithmetic_ppl", "arithmetic_loss"}
    shown = made["arithmetic_accuracy"].axes[0].images[0].get_array()
    assert shown[0][0] == pytest.approx(60.0) and shown[0][1] == pytest.approx(30.0) and shown[1][1] == 0.0
    assert "3 seeds" in made["arithmetic_accuracy"].axes[0].get_title()
    ppl_axes = made["arithmetic_ppl"].axes[0]
    assert list(ppl_axes.lines[0].get_ydata()) == [60.0, 120.0]
    assert len(ppl_axes.collections) == 1                       # the 95% band over seeds
    loss_line = made["arithmetic_loss"].axes[0].lines[0]
    assert list(loss_line.get_xdata()) == [0, 10, 20] and list(loss_line.get_ydata()) == [4.0, 2.0, 2.0]
    assert len(table.rows) == 1
    import matplotlib.pyplot as plt
    for fig in made.values():
        plt.close(fig)


def test_the_frame_has_a_row_per_run_and_metric_and_its_means_are_compares(tmp_path, capsys):
    """``posbench.results.frame``: a seeds x encodings tree gives one row per run and metric, every resolved
    setting as a column; the mean over seeds it gives equals the value in compare's row (exactly, up to float
    summation order: 1e-12)."""
    import io

    import pandas as pd

    from posbench.results import frame

    values = {"rope": [40.0, 44.0, 47.0], "tape": [50.0, 53.0, 59.0]}
    for encoding, accs in values.items():
        for seed, acc in enumerate(accs):
            make_run(tmp_path, "arithmetic", encoding, seed, {"accuracy": acc, "loss": 1.0 + seed},
                     task_options={"train_digits": 5})
    df = frame(tmp_path)
    assert len(df) == 2 * 3 * 2 and set(df["metric"]) == {"accuracy", "loss"}
    assert df.groupby(["run_id", "metric"]).size().max() == 1
    assert {"model.d_model", "train.lr", "task.train_digits", "seed", "value", "stderr", "n"} <= set(df.columns)
    means = df[df.metric == "accuracy"].groupby("encoding")["value"].mean()
    table = report.collect(tmp_path).tables[0]
    for row in table.rows:
        assert means[row.encoding] == pytest.approx(row.cells["accuracy"].value, abs=1e-12)
        assert means[row.encoding] == pytest.approx(sum(values[row.encoding]) / 3, abs=1e-12)
    assert main(["compare", str(tmp_path), "--format", "tidy"]) == 0
    tidy = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert len(tidy) == 12 and list(tidy.columns[:4]) == ["run_id", "task", "encoding", "seed"]


@pytest.mark.parametrize("rope_seeds, tied", [((4.0, 6.0), True), ((3.8, 5.8), False)])
def test_best_is_marked_only_where_the_difference_to_it_is_significant(tmp_path, capsys, rope_seeds, tied):
    """Two seeds each, equal sample variances s^2 = 2: the Welch statistic of the difference d has variance
    2/2 + 2/2 = 2 and 2 degrees of freedom, whose 97.5% quantile is 4.3027 (t table); so a mean within
    4.3027 * sqrt(2) = 6.085 of the best (d = 6: t = 4.243, p = 0.051) is tied with it and marked alike, and one
    6.2 away (t = 4.384, p = 0.048) is not. The rule is written under the table."""
    for seed, (tape, rope) in enumerate(zip((10.0, 12.0), rope_seeds)):
        make_run(tmp_path, "arithmetic", "tape", seed, {"accuracy": tape})
        make_run(tmp_path, "arithmetic", "rope", seed, {"accuracy": rope})
    (table,) = report.collect(tmp_path).tables
    assert [(r.label, r.cells["accuracy"].best) for r in table.rows] == [("tape", True), ("rope", tied)]
    assert any("p >= 0.05" in note for note in table.notes)
    assert main(["compare", str(tmp_path), "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| tape | **11.00 ± 12.71** |" in out
    assert ("| rope | **" in out) == tied and "p >= 0.05" in out


@pytest.mark.parametrize("other, tied", [(47.3, True), (47.2, False)])
def test_one_run_each_is_tested_on_the_evaluation_standard_errors(tmp_path, other, tied):
    """One seed each, standard errors 1: z = d / sqrt(2) against 1.96 (d = 2.7: z = 1.909; d = 2.8: z = 1.980)."""
    make_run(tmp_path, "arithmetic", "tape", 0, {"accuracy": 50.0}, stderr={"accuracy": 1.0})
    make_run(tmp_path, "arithmetic", "rope", 0, {"accuracy": other}, stderr={"accuracy": 1.0})
    (table,) = report.collect(tmp_path).tables
    assert [r.cells["accuracy"].best for r in table.rows] == [True, tied]


def test_the_issue_example_overlapping_intervals_are_both_marked(tmp_path):
    """35.13 ± 27.29 against 36.83 ± 16.71 (3 seeds each): the intervals overlap almost wholly, both are bold."""
    for seed, (a, b) in enumerate([(30.0, 20.0), (36.0, 36.5), (44.5, 48.89)]):
        make_run(tmp_path, "arithmetic", "tape", seed, {"accuracy": a})
        make_run(tmp_path, "arithmetic", "rope", seed, {"accuracy": b})
    (table,) = report.collect(tmp_path).tables
    assert all(r.cells["accuracy"].best for r in table.rows)


def test_shaded_intervals_stay_where_the_quantity_can_be(tmp_path):
    """Two seeds give t = 12.71, so a loss of 0.1 and 1.5 at one step has the interval 0.8 ± 8.89: the shaded
    band must stop at zero (a cross-entropy is never negative), and an accuracy band in % at 0 and 100."""
    from matplotlib.collections import PolyCollection

    from posbench.report.figures import pyplot, table_figures

    grid = {"accuracy": {"metric": "accuracy", "higher_is_better": True, "axes": [{"name": "len", "values": [1, 2]}],
                         "meta": {"unit": "%"}}}
    for seed, (loss, acc) in enumerate([(0.1, 99.0), (1.5, 60.0)]):
        make_run(tmp_path, "arithmetic", "rope", seed, {"accuracy": acc}, loss=[[1, 3.0], [2, loss]],
                 grids={"accuracy": {**grid["accuracy"], "values": [acc, acc / 2]}})
    (table,) = report.collect(tmp_path).tables
    figures = dict(table_figures(table))
    assert set(figures) == {"arithmetic_accuracy", "arithmetic_loss"}
    for stem, (low, high) in (("arithmetic_loss", (0.0, float("inf"))), ("arithmetic_accuracy", (0.0, 100.0))):
        (band,) = [c for c in figures[stem].axes[0].collections if isinstance(c, PolyCollection)]
        ys = band.get_paths()[0].vertices[:, 1]
        assert ys.min() == pytest.approx(low) and ys.max() <= high, stem
        line = figures[stem].axes[0].lines[0].get_ydata()
        assert list(line) == pytest.approx([3.0, 0.8] if stem == "arithmetic_loss" else [79.5, 39.75])
    for fig in figures.values():
        pyplot().close(fig)


def test_twelve_encodings_get_twelve_different_lines_and_a_legend_beside_them(tmp_path):
    """matplotlib's default cycle has ten colours: the 11th and 12th series repeated the 1st and 2nd (DAPE and
    NoPE both blue in the CPU study's first figure). Every series must look different, by colour or line."""
    from posbench.report.figures import pyplot, series_style, table_figures

    styles = [tuple(sorted(series_style(i).items())) for i in range(40)]
    assert len(set(styles)) == 40
    grid = {"metric": "ppl", "higher_is_better": False, "axes": [{"name": "len", "values": [1, 2]}]}
    names = [f"enc{i:02d}" for i in range(12)]
    for i, name in enumerate(names):
        make_run(tmp_path, "arithmetic", name, 0, {"accuracy": float(i)}, loss=[[1, 3.0], [2, 2.0]],
                 grids={"ppl": {**grid, "values": [float(i), float(i) + 1]}})
    figures = dict(table_figures(report.collect(tmp_path).tables[0]))
    for stem in ("arithmetic_ppl", "arithmetic_loss"):
        ax = figures[stem].axes[0]
        looks = {(line.get_color(), line.get_linestyle()) for line in ax.lines if line.get_label() in names}
        assert len(looks) == 12, stem
        fig = figures[stem]
        fig.canvas.draw()
        legend = fig.legends[0] if fig.legends else ax.get_legend()         # beside the axes: a figure legend
        assert legend is not None and legend.get_window_extent().x0 > ax.get_window_extent().x1 - 1, stem
    for fig in figures.values():
        pyplot().close(fig)


def test_many_encodings_heatmaps_wrap_four_to_a_line_on_one_scale(tmp_path):
    """Twelve encodings' heatmaps side by side made a figure 12 times wider than tall (the CPU study's passkey
    figure): they wrap four to a line; each keeps its title and values, and one colour bar serves them all."""
    from posbench.report.figures import pyplot, table_figures

    grid = {"metric": "accuracy", "higher_is_better": True, "meta": {"unit": "%"},
            "axes": [{"name": "length", "values": [8, 16]}, {"name": "depth", "values": [0.0, 0.5, 1.0]}]}
    for n in (12, 3):
        names = [f"enc{i:02d}" for i in range(n)]
        for i, name in enumerate(names):
            make_run(tmp_path / str(n), "passkey", name, 0, {"accuracy": float(i)},
                     grids={"accuracy": {**grid, "values": [[float(i)] * 3, [float(i) / 2] * 3]}})
        fig = dict(table_figures(report.collect(tmp_path / str(n)).tables[0]))["passkey_accuracy"]
        maps = [ax for ax in fig.axes if ax.images]
        assert len(maps) == n
        assert sorted(ax.get_title().split("\n")[0] for ax in maps) == names
        lines = {round(ax.get_position().y0, 3) for ax in maps}
        columns = {round(ax.get_position().x0, 3) for ax in maps}
        assert (len(lines), len(columns)) == ((3, 4) if n == 12 else (1, 3))
        assert {ax.images[0].get_clim() for ax in maps} == {(0.0, 100.0)}
        assert len(fig.axes) == n + 1                     # the heatmaps and one colour bar, no empty panels
        width, height = fig.get_size_inches()
        assert width / height < 2 if n == 12 else width / height < 4
        pyplot().close(fig)


def test_compare_never_overwrites_a_report_or_a_figure_without_force(tmp_path, capsys):
    """``--html`` over an existing file and ``--plots`` into a directory holding a figure of the same name: one
    line, exit 2, nothing written (the tables are not even printed); ``--force`` replaces them; a --plots
    directory that holds other files is used as it is."""
    runs = tmp_path / "runs"
    for seed in (0, 1):
        make_run(runs, "arithmetic", "rope", seed, {"accuracy": 40.0 + seed}, loss=[[1, 3.0], [2, 2.0 + seed]])
    page, figures = tmp_path / "report.html", tmp_path / "figures"
    page.write_text("my notes")
    figures.mkdir()
    (figures / "arithmetic_loss.png").write_bytes(b"my figure")
    (figures / "other.txt").write_text("mine")
    for args, what in ((["--html", str(page)], "report.html already exists"),
                       (["--plots", str(figures)], "arithmetic_loss.png")):
        assert main(["compare", str(runs), *args]) == 2
        captured = capsys.readouterr()
        assert captured.err.startswith("error:") and what in captured.err and "--force" in captured.err
        assert len(captured.err.strip().splitlines()) == 1 and "arithmetic" not in captured.out
    assert page.read_text() == "my notes" and (figures / "arithmetic_loss.png").read_bytes() == b"my figure"
    assert sorted(p.name for p in figures.iterdir()) == ["arithmetic_loss.png", "other.txt"]
    assert main(["compare", str(runs), "--html", str(page), "--plots", str(figures), "--force"]) == 0
    capsys.readouterr()
    assert page.read_text().startswith("<!DOCTYPE html>")
    assert (figures / "arithmetic_loss.png").read_bytes()[:4] == b"\x89PNG" and (figures / "other.txt").exists()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "other.txt").write_text("mine")
    assert main(["compare", str(runs), "--plots", str(fresh)]) == 0
    assert sorted(p.name for p in fresh.iterdir()) == ["arithmetic_loss.png", "other.txt"]
