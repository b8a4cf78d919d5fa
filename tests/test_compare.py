"""compare: tables with the best value marked, every format, figures, and trees with broken runs."""

import csv
import io
import json

import pytest

from posbench import report
from posbench.cli import main
from posbench.results import atomic_write_json


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
    assert [t.task for t in rep.tables] == ["arithmetic", "other"]
    table = rep.tables[0]
    assert table.columns == ["accuracy", "accuracy_id", "perplexity"]
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
    rows = list(csv.DictReader(io.StringIO(report.render_text(rep, "csv"))))
    assert {r["encoding"] for r in rows} == {"rope", "tape"} and len(rows) == 3
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
