"""compare with hostile or odd input (issue 48, items 3, 8, 9 and 10): every file it reads is bounded (a gzip bomb
counts what it inflates to) and skipped in one line past its bound; a label from a record is drawn as it is, never
as mathtext; a predictions path from a record that leaves the run's folder is never read, and said; a value that
is not a number, a record without its settings and an incomplete SCROLLS score are said or marked, never passed
over; and no number or header is cut at 80 columns."""

from __future__ import annotations

import gzip
import json
import os
import random
import tracemalloc
from types import SimpleNamespace

import pytest

from posbench import report
from posbench.cli import main
from posbench.report import predictions
from tests.report.test_compare import arithmetic_metrics, arithmetic_predictions, make_run


def paired_tree(root, seeds=2):
    """rope and tape, ``seeds`` seeds each, arithmetic runs whose predictions rebuild their metrics."""
    rng = random.Random(0)
    dirs = {}
    for seed in range(seeds):
        for enc, p_right in (("rope", 0.4), ("tape", 0.7)):
            pattern = [rng.random() < p_right for _ in range(16)]
            dirs[enc, seed] = make_run(root, "arithmetic", enc, seed, arithmetic_metrics(pattern),
                                       task_options={"train_digits": 1}, predictions=arithmetic_predictions(pattern))
    return dirs


def accuracy_basis(root) -> str:
    table = report.collect(root, against="rope").tables[0]
    return next(d.difference.basis for d in table.differences if d.metric == "accuracy")


# ---- item 3: bounds -------------------------------------------------------------------------------------------

def test_the_bounds_are_generous_for_real_runs():
    from posbench.files import MAX_PREDICTIONS_BYTES, MAX_PREDICTIONS_ROWS, MAX_RESULT_BYTES

    assert MAX_RESULT_BYTES == 64 * 2**20 and MAX_PREDICTIONS_BYTES == 256 * 2**20
    assert MAX_PREDICTIONS_ROWS >= 5 * 40 * 40 * 100        # the paper preset's arithmetic grid, 5 times over


def test_a_gzip_bomb_is_read_no_further_than_the_bound(tmp_path):
    from posbench.files import TooLarge, read_jsonl

    bomb = tmp_path / "predictions.jsonl.gz"
    line = b'{"x": "' + b"a" * 1000 + b'"}\n'
    with gzip.open(bomb, "wb", compresslevel=1) as fh:
        for _ in range(32):                                     # 32 MB inflated, some 100 KB on disk
            fh.write(line * (2**20 // len(line)))
    assert bomb.stat().st_size < 2**20
    tracemalloc.start()
    try:
        with pytest.raises(TooLarge, match="inflates to more than 1 MB"):
            read_jsonl(bomb, limit=2**20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20                                     # never held whole
    one_line = tmp_path / "one.jsonl"                           # one endless line is bounded too
    one_line.write_bytes(b'"' + b"x" * (3 * 2**20) + b'"\n')
    with pytest.raises(TooLarge):
        read_jsonl(one_line, limit=2**20)
    rows = tmp_path / "rows.jsonl"                              # and so is the number of rows (each a dict)
    rows.write_text('{}\n' * 10 + "\n \n")
    assert len(read_jsonl(rows, max_rows=10)) == 10
    with pytest.raises(TooLarge, match="holds more than 9 lines"):
        read_jsonl(rows, max_rows=9)


def test_predictions_that_inflate_past_the_bound_are_skipped_in_one_line(tmp_path, capsys, monkeypatch):
    dirs = paired_tree(tmp_path)
    assert accuracy_basis(tmp_path) == "2 seeds x 16 examples"
    monkeypatch.setattr(predictions, "MAX_PREDICTIONS_BYTES", 4096)
    bombed = dirs["tape", 1]
    rows = (bombed / "predictions.jsonl").read_text()
    (bombed / "predictions.jsonl").unlink()
    with gzip.open(bombed / "predictions.jsonl.gz", "wt") as fh:
        fh.write(rows + "\n" * 8192)                            # the same rows, then 8 KB of blank lines
    assert accuracy_basis(tmp_path) == "2 seeds (paired t)"
    assert main(["compare", str(tmp_path), "--against", "rope", "--format", "markdown"]) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "predictions.jsonl.gz" in line]
    assert said == [f"note: {bombed}: predictions.jsonl.gz inflates to more than 4,096 bytes, the most posbench "
                    f"reads of it; not read, paired across seeds only"]


def test_a_result_json_past_the_bound_is_skipped_in_one_line(tmp_path, capsys, monkeypatch):
    import posbench.runs.store as store

    dirs = paired_tree(tmp_path, seeds=1)
    huge = dirs["tape", 0] / "result.json"
    data = json.loads(huge.read_text())
    data["training"]["padding"] = "x" * 300_000
    huge.write_text(json.dumps(data))
    monkeypatch.setattr(store, "MAX_RESULT_BYTES", 200_000)
    assert main(["compare", str(tmp_path), "--format", "markdown"]) == 0
    captured = capsys.readouterr()
    assert "| rope |" in captured.out and "| tape |" not in captured.out
    assert f"  {dirs['tape', 0]}: result.json is more than 200,000 bytes, the most posbench reads of it" in \
        captured.err.splitlines()


# ---- item 8: labels drawn as they are ---------------------------------------------------------------------------

def test_labels_with_dollars_and_underscores_are_drawn_as_they_are(tmp_path, capsys):
    from posbench.report.figures import pyplot, table_figures

    grid = {"ppl_by_length": {"metric": "ppl$", "higher_is_better": False,
                              "axes": [{"name": "length $n$", "values": [64, 128]}], "values": [5.0, 6.0],
                              "meta": {"train_max": {"length $n$": 64}}}}
    names = ["$\\notacommand{$", "_hidden", "rope"]
    for name in names:
        for seed in range(2):
            make_run(tmp_path, "perplexity", name.strip("$_\\{") or "x", seed, {"ppl$": 5.0 + seed},
                     grids=grid, loss=[[1, 3.0], [2, 2.0]], hib={"ppl$": False}, extra={"encoding": name})
    out = tmp_path.parent / "out"
    assert main(["compare", str(tmp_path), "--plots", str(out / "figs"), "--html", str(out / "r.html")]) == 0
    assert "Traceback" not in capsys.readouterr().err and (out / "r.html").is_file()
    figures = dict(table_figures(report.collect(tmp_path).tables[0]))
    for stem in ("perplexity_ppl_by_length", "perplexity_loss"):
        fig = figures[stem]
        fig.canvas.draw()                                       # draws every text: none is parsed as math
        legend = fig.legends[0] if fig.legends else fig.axes[0].get_legend()
        shown = [t.get_text().split(" (")[0] for t in legend.get_texts()]
        assert sorted(shown) == sorted(["$\\notacommand{$", " _hidden", "rope"])
        pyplot().close(fig)


# ---- item 9: a predictions path from a record ------------------------------------------------------------------

@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink"])
def test_predictions_outside_the_run_folder_are_never_read(tmp_path, capsys, how):
    root = tmp_path / "runs"
    dirs = paired_tree(root)
    victim = dirs["tape", 1]
    outside = tmp_path / "elsewhere.jsonl"                  # valid predictions: read, they would pair examples
    (victim / "predictions.jsonl").rename(outside)
    record = json.loads((victim / "result.json").read_text())
    if how == "absolute":
        record["predictions"] = str(outside)
    elif how == "dotdot":
        record["predictions"] = os.path.relpath(outside, victim)
    else:
        (victim / "predictions.jsonl").symlink_to(outside)
    (victim / "result.json").write_text(json.dumps(record))
    assert accuracy_basis(root) == "2 seeds (paired t)"
    assert main(["compare", str(root), "--against", "rope", "--format", "markdown"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if str(victim) in line]
    assert len(lines) == 1 and lines[0].endswith("paired across seeds only")
    assert ("absolute path" if how == "absolute" else "lead outside the run's folder") in lines[0]


def test_predictions_inside_the_folder_by_any_path_are_read(tmp_path, capsys):
    dirs = paired_tree(tmp_path)
    run = dirs["tape", 1]
    (run / "sub").mkdir()
    (run / "predictions.jsonl").rename(run / "sub" / "p.jsonl")
    record = json.loads((run / "result.json").read_text())
    record["predictions"] = "sub/../sub/p.jsonl"
    (run / "result.json").write_text(json.dumps(record))
    assert accuracy_basis(tmp_path) == "2 seeds x 16 examples"
    (run / "sub" / "p.jsonl").write_text('{"len_a": 1, "len_b"')       # unreadable: said, not swallowed
    assert main(["compare", str(tmp_path), "--against", "rope", "--format", "markdown"]) == 0
    assert f"note: {run}: p.jsonl is unreadable" in capsys.readouterr().err


# ---- item 10: never silently wrong ------------------------------------------------------------------------------

def test_a_value_that_is_not_a_number_is_said_and_not_counted_as_a_seed(tmp_path, capsys):
    make_run(tmp_path, "arithmetic", "rope", 0, {"accuracy": 40.0, "loss": 1.0})
    bad = make_run(tmp_path, "arithmetic", "rope", 1, {"accuracy": 44.0, "loss": 1.2})
    record = json.loads((bad / "result.json").read_text())
    record["metrics"]["accuracy"]["value"] = "high"
    (bad / "result.json").write_text(json.dumps(record))
    assert main(["compare", str(tmp_path), "--format", "markdown"]) == 0
    captured = capsys.readouterr()
    assert f"note: {bad}: metric 'accuracy' has the value 'high', not a number; left out of its row" in \
        captured.err.splitlines()
    assert "| rope | **40.00 (1 of 2 seeds)** | **1.10 ± 1.27** | 2 |" in captured.out
    cell = report.collect(tmp_path).tables[0].rows[0].cells["accuracy"]
    assert (cell.value, cell.seeds, cell.flag) == (40.0, 1, "1 of 2 seeds")
    data = json.loads(report.render_text(report.collect(tmp_path), "json"))
    assert data["tables"][0]["rows"][0]["metrics"]["accuracy"]["seeds"] == 1 and data["warnings"]
    assert main(["compare", str(tmp_path), "--format", "tidy"]) == 0
    assert "metric 'accuracy' has the value 'high'" in capsys.readouterr().err


def test_a_grid_value_that_is_not_a_number_is_said_and_drawn_as_missing(tmp_path, capsys):
    grid = {"accuracy": {"metric": "accuracy", "higher_is_better": True,
                         "axes": [{"name": "len_a", "values": [1, 2]}, {"name": "len_b", "values": [1, 2]}],
                         "values": [[50.0, "high"], [20.0, 10.0]], "meta": {"train_max": {"len_a": 1, "len_b": 1}}}}
    ragged = {"ppl": {"metric": "ppl", "axes": [{"name": "length", "values": [64, 128]}], "values": [[1.0], 2.0]}}
    run = make_run(tmp_path, "arithmetic", "rope", 0, {"accuracy": 40.0}, grids={**grid, **ragged})
    figures = tmp_path.parent / "figures"
    assert main(["compare", str(tmp_path), "--format", "markdown", "--plots", str(figures)]) == 0
    captured = capsys.readouterr()
    assert "| rope | **50.00** | **15.00** |" in captured.out         # by length: the cell left out, said
    assert f"note: {run}: grid 'accuracy' has 1 value(s) that are not numbers (first: 'high'); left out, as " \
           f"missing" in captured.err.splitlines()
    assert f"note: {run}: grid 'ppl' does not hold one dimension per axis; left out" in captured.err.splitlines()
    assert (figures / "arithmetic_accuracy.png").is_file()


def test_a_record_without_its_config_is_skipped_in_one_line(tmp_path, capsys):
    for enc in ("rope", "tape"):
        for seed in range(2):
            make_run(tmp_path, "arithmetic", enc, seed, {"accuracy": 40.0 + seed, "loss": 1.0})
    bare = make_run(tmp_path, "arithmetic", "fire", 0, {"accuracy": 50.0, "loss": 1.0})
    record = json.loads((bare / "result.json").read_text())
    del record["config"]
    (bare / "result.json").write_text(json.dumps(record))
    assert main(["compare", str(tmp_path), "--format", "markdown"]) == 0
    captured = capsys.readouterr()
    rows = [line for line in captured.out.splitlines() if line.startswith("| ") and "encoding" not in line]
    assert [row.split(" | ")[0] for row in rows] == ["| rope", "| tape"]        # labels without settings: no
    assert "[" not in captured.out and "rows differ" not in captured.out        # row of dashes sets them apart
    assert [line for line in captured.err.splitlines() if str(bare) in line] == \
        [f"  {bare}: no 'config' object (the run's settings), so compare cannot tell which runs it pools with or "
         f"what sets it apart"]


def long_label_tree(root):
    for enc, off in (("rope", 0.0), ("alibi_long_name", 0.0031), ("randpe", -0.0042)):
        for lr in (1e-3, 3e-4):
            for seed in range(2):
                make_run(root, "perplexity", enc, seed,
                         {"ppl_sliding_8x": 5.0 + off + 0.0013 * seed * (1 + off * 100), "ppl_sliding_16x": 6.0 + off},
                         train={"lr": lr, "warmup_steps_long": 10 if lr > 5e-4 else 20},
                         hib={"ppl_sliding_8x": False, "ppl_sliding_16x": False})


@pytest.mark.parametrize("width", [80, 100, 60, 40])
def test_no_number_or_header_is_ever_cut(tmp_path, capsys, monkeypatch, width):
    long_label_tree(tmp_path)
    monkeypatch.setenv("COLUMNS", str(width))
    assert main(["compare", str(tmp_path), "--against", "rope"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= width
    if width >= 60:              # tables: every number and header whole on its line
        from posbench.report.formats import difference_cells, fmt_cell

        table = report.collect(tmp_path, against="rope").tables[0]
        lines = out.splitlines()
        for d in table.differences:
            _, metric, estimate, interval, p, verdict, _ = difference_cells(d)
            assert any(metric in line and estimate in line and interval in line and p in line for line in lines)
        for row in table.rows:
            for cell in row.cells.values():
                assert any(fmt_cell(cell) in line for line in lines)
    if width >= 80:              # the differences as tables (narrower: one line each)
        words = " ".join(out.replace("│", " ").replace("┃", " ").split())
        assert "95% interval" in words and "verdict" in words and "difference" in words


def scrolls_run(root, seed, complete):
    datasets = ["qasper", "quality"] if not complete else \
        ["qasper", "contract_nli", "narrative_qa", "quality", "qmsum", "summ_screen_fd", "gov_report"]
    return make_run(root, "scrolls", "rope", seed, {"scrolls_score": 21.5 + seed},
                    task_options={"datasets": datasets},
                    extra={"evaluation": {"scrolls_score": {"value": 21.5 + seed, "datasets": datasets,
                                                            "complete": complete}}})


def test_an_incomplete_scrolls_score_is_marked_in_the_run_line_and_in_compare(tmp_path, capsys):
    from posbench.cli.run import show_outcome
    from posbench.runs.store import load_record

    incomplete = scrolls_run(tmp_path / "part", 0, complete=False)
    complete = scrolls_run(tmp_path / "whole", 0, complete=True)
    show_outcome(SimpleNamespace(main=True, record=load_record(incomplete), run_dir=incomplete))
    show_outcome(SimpleNamespace(main=True, record=load_record(complete), run_dir=complete))
    lines = capsys.readouterr().out.splitlines()
    assert "scrolls_score 21.50 (incomplete)" in lines[0] and "scrolls_score 21.50  (train" in lines[1]
    assert main(["compare", str(tmp_path / "part"), "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| rope | **21.50 (incomplete)** |" in out
    assert "_incomplete: scrolls_score of 1 run(s) (over qasper, quality only)" in out
    assert main(["compare", str(tmp_path / "part"), "--format", "csv"]) == 0
    assert ",incomplete," in capsys.readouterr().out
    assert main(["compare", str(tmp_path / "whole"), "--format", "markdown"]) == 0
    assert "| rope | **21.50** |" in capsys.readouterr().out
