"""A study page cannot drift from its data: each committed ``tables.md`` is exactly what ``posbench compare
RUNS --against rope --format markdown`` prints over the committed result files (studies/publish.py writes
both). And studies/publish.py copies a sweep's finished cells, only those, once.

Pages checked: the tiny study in tests/fixtures/study/ (2 encodings x 2 seeds x perplexity and passkey, tiny
presets), the CPU study's two versions in docs/studies/cpu/v1/ (issue 27) and docs/studies/cpu/v2/ (issue 34,
its page docs/studies/cpu.md), and the arithmetic study (issue 38) at 8,000 steps in docs/studies/arithmetic/8k/
(its page docs/studies/arithmetic.md) and at its first budget, 4,000 steps, in docs/studies/arithmetic/4k/ (its
page 4k.md beside it). When
compare's output changes on purpose, rewrite
them: ``python studies/publish.py results/studies/fixture tests/fixtures/study`` after its sweep (the command
is in its study.toml), or over the committed runs alone with ``write_page`` below.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "studies"))

import cost  # noqa: E402  (scripts of studies/, not a package)
import publish  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "study"
CPU = ROOT / "docs" / "studies" / "cpu"
CPU_V1, CPU_V2 = CPU / "v1", CPU / "v2"
ARITHMETIC = ROOT / "docs" / "studies" / "arithmetic"
ARITHMETIC_4K, ARITHMETIC_8K = ARITHMETIC / "4k", ARITHMETIC / "8k"
#: each published study's folder and its page
PAGES = {"cpu-v1": (CPU_V1, CPU / "v1.md"), "cpu-v2": (CPU_V2, ROOT / "docs" / "studies" / "cpu.md"),
         "arithmetic-4k": (ARITHMETIC_4K, ARITHMETIC / "4k.md"),
         "arithmetic-8k": (ARITHMETIC_8K, ROOT / "docs" / "studies" / "arithmetic.md"),
         "protocols": (ROOT / "docs" / "studies" / "protocols", ROOT / "docs" / "studies" / "protocols.md")}
#: how many tables each page quotes at least (a study in progress quotes more as its cells finish)
QUOTES = {"cpu-v1": 3, "cpu-v2": 1, "arithmetic-4k": 1, "arithmetic-8k": 1, "protocols": 2}
#: every published folder, the fixture's too; version 1 of the CPU study predates the probe, so it has no plateau.md
FOLDERS = {"fixture": FIXTURE, **{study: folder for study, (folder, _) in PAGES.items()}}
PROBED = [study for study in FOLDERS if study != "cpu-v1"]


def fixture_fast(studies) -> list:
    """The studies as parameters, each published study's marked slow: compare's bootstrap over 39 to 72 cells takes
    seconds to half a minute (the two arithmetic studies, with 10,000 paired examples a cell); the fixture's
    tables check the same code in a second in the fast tier."""
    return [pytest.param(study, marks=() if study == "fixture" else pytest.mark.slow) for study in studies]


@pytest.mark.parametrize("study", fixture_fast(FOLDERS))
def test_committed_tables_are_what_compare_prints(study):
    page = FOLDERS[study]
    assert (page / publish.RUNS).is_dir(), f"{page} has no committed runs"
    assert publish.tables(page / publish.RUNS) == (page / publish.TABLES).read_text()


def test_tables_made_in_one_process_are_what_the_compare_commands_print():
    """publish.tables makes every section from one Comparison (each run resampled once for both baselines): the
    same text as ``posbench compare`` run once per section, each in a fresh process (the committed-tables tests of
    the published studies read the former)."""
    runs = FIXTURE / publish.RUNS
    made = publish.tables(runs)
    assert made.count("## Against ") == 2                  # both baselines: the shared work is exercised
    assert made == publish.commands_tables(runs)


@pytest.mark.parametrize("study", PROBED)
def test_committed_plateau_verdicts_are_the_rule_over_the_runs(study):
    page = FOLDERS[study]
    assert publish.plateaus(page / publish.RUNS) == (page / publish.PLATEAU).read_text()


@pytest.mark.parametrize("study", FOLDERS)
def test_committed_cost_is_the_cells_measured_time(study):
    page = FOLDERS[study]
    assert cost.cost(page / publish.RUNS) == (page / publish.COST).read_text()


def test_a_resumed_cell_costs_at_least_its_training(tmp_path):
    """Records written before the rule kept a resumed run's last process alone in total_s (91 s for a cell that
    trained 902 s): its cost is its training, probes and evaluation, and a record that holds more keeps its own."""
    from posbench.runs.record import record_seconds

    resumed = {"timings": {"train_s": 901.6, "eval_s": 2.8, "total_s": 91.3},
               "training": {"train_s": 901.6, "probe_s": 10.0, "resumed_from": [2300]}}
    assert record_seconds(resumed) == pytest.approx(901.6 + 2.8 + 10.0, abs=1e-9)
    whole = {"timings": {"train_s": 650.1, "eval_s": 2.4, "total_s": 654.4}, "training": {"train_s": 650.1}}
    assert record_seconds(whole) == pytest.approx(654.4, abs=1e-9)
    assert record_seconds({"task": "passkey"}) is None
    runs = shutil.copytree(FIXTURE / publish.RUNS, tmp_path / publish.RUNS)
    path = runs / "passkey-rope-tiny-s0" / "result.json"
    record = json.loads(path.read_text())
    record["timings"].update(train_s=3000.0, eval_s=0.0, total_s=1.0)
    path.write_text(json.dumps(record))
    row = next(line for line in cost.cost(runs).split("### passkey", 1)[1].splitlines() if line.startswith("| rope |"))
    other = json.loads((runs / "passkey-rope-tiny-s1" / "result.json").read_text())["timings"]["total_s"]
    assert row.endswith(f"| {(3000.0 + other) / 60:.1f} |")


def test_a_page_copy_is_rewritten_and_unpaired_markers_refused():
    """Two copies of cost.md are both rewritten and the prose between them kept; an opening marker without its
    closing one is refused rather than rewritten across the prose."""
    page = "a\n<!-- cost.md -->\nold 1\n<!-- /cost.md -->\nprose\n<!-- cost.md -->\nold 2\n<!-- /cost.md -->\nb\n"
    fresh = publish.refresh_copy(page, "cost.md", "new\n")
    assert fresh == "a\n<!-- cost.md -->\nnew\n<!-- /cost.md -->\nprose\n<!-- cost.md -->\nnew\n<!-- /cost.md -->\nb\n"
    assert publish.refresh_copy(fresh, "plateau.md", "x\n") == fresh
    unclosed = page.replace("old 1\n<!-- /cost.md -->\n", "old 1\n")
    with pytest.raises(publish.PublishError, match="do not pair up"):
        publish.refresh_copy(unclosed, "cost.md", "new\n")
    with pytest.raises(publish.PublishError, match="do not pair up"):
        publish.refresh_copy("<!-- cost.md --> \nold\n<!-- /cost.md -->\n", "cost.md", "new\n")


def test_changes_without_an_interval_or_with_a_failing_compare(tmp_path, capsys):
    """A difference without an interval (one seed, nothing to pair) is said as such, not as 'no difference'; a
    compare that fails is one line and exit code 2."""
    import changes  # noqa: E402

    lone = {"verdict": "-", "difference": 1.234, "ci_low": None, "ci_high": None, "seeds": 1}
    assert changes.said(lone) == "no interval: +1.23 (1 seed(s))"
    assert changes.said({**lone, "ci_low": 0.5, "ci_high": 2.0, "verdict": "worse"}) == "worse: +1.23 [+0.50, +2.00]"
    (tmp_path / "empty").mkdir()
    assert changes.main([str(tmp_path / "empty"), str(FIXTURE / publish.RUNS)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: posbench compare ") and err.count("\n") == 1


def test_cost_sums_each_cells_total_time(tmp_path):
    """Independently of cost.py's grouping: the study's total is the sum of the records' total_s, and a cell's time
    raised by 600 s raises its encoding's total by 10 minutes and the study's by 1/6 h."""
    runs = shutil.copytree(FIXTURE / publish.RUNS, tmp_path / publish.RUNS)
    records = sorted(runs.glob("*/result.json"))
    seconds = sum(json.loads(p.read_text())["timings"]["total_s"] for p in records)
    text = cost.cost(runs)
    assert f"**In all: {len(records)} cells, {seconds / 3600:.2f} h of cell time.**" in text
    record = json.loads((runs / "perplexity-alibi-tiny-s0" / "result.json").read_text())
    before = sum(json.loads(p.read_text())["timings"]["total_s"] for p in records
                 if "perplexity-alibi" in p.parent.name)
    record["timings"]["total_s"] += 600.0
    (runs / "perplexity-alibi-tiny-s0" / "result.json").write_text(json.dumps(record))
    raised = cost.cost(runs)
    row = next(line for line in raised.split("### perplexity", 1)[1].splitlines() if line.startswith("| alibi |"))
    assert row.endswith(f"| {(before + 600.0) / 60:.1f} |")
    assert f"**In all: {len(records)} cells, {(seconds + 600.0) / 3600:.2f} h of cell time.**" in raised


@pytest.mark.parametrize("study", PAGES)
def test_the_cpu_pages_quote_their_tables_word_for_word(study):
    folder, text_page = PAGES[study]
    page = text_page.read_text()
    tables = (folder / publish.TABLES).read_text()
    blocks = [m.group(4).strip("\n") for m in publish.QUOTE.finditer(page)]
    assert len(blocks) >= QUOTES[study], f"{text_page} quotes fewer tables than it did"
    for block in blocks:
        assert block and block in tables, block[:200]
    assert publish.refresh_quotes(page, tables) == page, "rewrite the page: python studies/publish.py ..."
    for name in (publish.PLATEAU, publish.COST):
        if f"<!-- {name} -->" in page:
            assert publish.refresh_copy(page, name, (folder / name).read_text()) == page, f"rewrite {name}'s copy"


def test_a_quote_that_drifted_is_rewritten_and_an_unknown_one_refused():
    tables = "## Against rope\n\n### perplexity\n\n| a | b |\n|---|---|\n| rope | 1.00 |\n\n_note_\n"
    page = "text\n<!-- tables.md: rope ### perplexity -->\n| a | b |\n|---|---|\n| rope | 1.01 |\n<!-- /tables.md -->\nmore\n"
    fresh = publish.refresh_quotes(page, tables)
    assert fresh == page.replace("1.01", "1.00")
    assert publish.refresh_quotes(fresh, tables) == fresh
    with pytest.raises(publish.PublishError, match="passkey"):
        publish.refresh_quotes(page.replace("### perplexity", "### passkey"), tables)


def test_a_page_quotes_the_per_cell_table_from_every_run():
    """``runs`` names tables.md's last section (compare --by-run): the same heading under a baseline is another
    table, and each quote takes its own section's."""
    tables = ("## Against rope\n\n### passkey\n\n| encoding | acc |\n|---|---|\n| rope | 50.00 |\n\n"
              "## Every run\n\n### passkey\n\n| encoding | acc |\n|---|---|\n| rope (seed 0) | 40.00 |\n"
              "| rope (seed 1) | 60.00 |\n")
    page = ("<!-- tables.md: runs ### passkey -->\nold\n<!-- /tables.md -->\n"
            "<!-- tables.md: rope ### passkey -->\nold\n<!-- /tables.md -->\n")
    fresh = publish.refresh_quotes(page, tables)
    first, second = fresh.split("<!-- /tables.md -->")[:2]
    assert "rope (seed 0) | 40.00" in first and "rope (seed 1) | 60.00" in first and "50.00" not in first
    assert "| rope | 50.00 |" in second and "seed" not in second
    assert sorted(publish.sections(tables)) == ["rope", "runs"]
    committed = (FIXTURE / publish.TABLES).read_text()
    assert committed.count("## Every run") == 1 and "(seed 1" in publish.sections(committed)["runs"]


def test_a_changed_result_file_changes_the_table(tmp_path):
    runs = shutil.copytree(FIXTURE / publish.RUNS, tmp_path / publish.RUNS)
    result = runs / "perplexity-alibi-tiny-s0" / "result.json"
    record = json.loads(result.read_text())
    record["metrics"]["ppl_2x"]["value"] += 1.0
    result.write_text(json.dumps(record))
    assert publish.tables(runs) != (FIXTURE / publish.TABLES).read_text()


def fake_sweep(root: Path, finished: list[str], unfinished: list[str]) -> Path:
    """A sweep output whose cells hold the fixture's runs (finished) or only a config.json (killed)."""
    for cell in finished + unfinished:
        run = root / "cells" / cell / "task" / "encoding" / "20261125-000000-abcdef"
        run.mkdir(parents=True)
        (run / "config.json").write_text("{}")
        if cell in finished:
            for name in publish.COPIED:
                if (FIXTURE / publish.RUNS / cell / name).is_file():
                    shutil.copyfile(FIXTURE / publish.RUNS / cell / name, run / name)
            (run / "checkpoint").mkdir()
    return root


@pytest.mark.slow  # publish: tables, figures, report
def test_publish_copies_finished_cells_once_and_leaves_checkpoints(tmp_path):
    sweep = fake_sweep(tmp_path / "sweep", ["passkey-rope-tiny-s0", "perplexity-rope-tiny-s1"], ["passkey-alibi-tiny-s0"])
    page = tmp_path / "page"
    runs = publish.finished_runs(sweep)
    assert sorted(runs) == ["passkey-rope-tiny-s0", "perplexity-rope-tiny-s1"]
    assert publish.copy_runs(runs, page) == 2
    assert sorted(p.name for p in (page / "runs" / "passkey-rope-tiny-s0").iterdir()) == ["predictions.jsonl",
                                                                                          "result.json"]
    assert sorted(p.name for p in (page / "runs" / "perplexity-rope-tiny-s1").iterdir()) == ["result.json"]
    assert publish.copy_runs(publish.finished_runs(sweep), page) == 0

    assert publish.main([str(sweep), str(page)]) == 0
    assert (page / "tables.md").read_text() == publish.tables(page / "runs")
    assert (page / "report.html").is_file() and any((page / "figures").glob("*.png"))


@pytest.mark.slow  # compare twice, gzipped and plain
def test_large_predictions_are_published_gzipped_and_read_back_alike(tmp_path, monkeypatch):
    """Over GZIP_ABOVE bytes, predictions.jsonl is kept as predictions.jsonl.gz (the same bytes decompressed, the same
    file every time); compare pairs examples from it as from the plain file, and restore.py writes the plain file
    back."""
    import gzip

    import restore  # noqa: E402  (a script of studies/)

    monkeypatch.setattr(publish, "GZIP_ABOVE", 10)
    cells = ["passkey-rope-tiny-s0", "passkey-alibi-tiny-s0", "passkey-rope-tiny-s1", "passkey-alibi-tiny-s1"]
    sweep = fake_sweep(tmp_path / "sweep", cells, [])
    page = tmp_path / "page"
    assert publish.copy_runs(publish.finished_runs(sweep), page) == 4
    for cell in cells:
        kept = page / "runs" / cell / "predictions.jsonl.gz"
        assert not (page / "runs" / cell / "predictions.jsonl").exists()
        assert gzip.decompress(kept.read_bytes()) == (FIXTURE / "runs" / cell / "predictions.jsonl").read_bytes()
    first = (page / "runs" / cells[0] / "predictions.jsonl.gz").read_bytes()
    assert publish.copy_runs(publish.finished_runs(sweep), page) == 0       # nothing changed: nothing rewritten
    assert (page / "runs" / cells[0] / "predictions.jsonl.gz").read_bytes() == first
    plain = tmp_path / "plain"
    for cell in cells:
        shutil.copytree(FIXTURE / "runs" / cell, plain / cell)
    assert publish.compare(page / "runs", "--against", "rope", "--format", "markdown") == \
        publish.compare(plain, "--against", "rope", "--format", "markdown")
    assert "examples" in publish.compare(page / "runs", "--against", "rope", "--format", "markdown")
    out = tmp_path / "out"
    restore.restore(page, out)
    for cell, run in publish.finished_runs(out).items():
        assert (run / "predictions.jsonl").read_bytes() == (FIXTURE / "runs" / cell / "predictions.jsonl").read_bytes()
    monkeypatch.setattr(publish, "GZIP_ABOVE", 10 ** 9)                  # published plain again: one form only
    (sweep / "cells" / cells[0]).rename(tmp_path / "moved")
    fake_sweep(tmp_path / "sweep", [cells[0]], [])
    next((sweep / "cells" / cells[0]).rglob("predictions.jsonl")).write_text('{"changed": 1}\n')
    assert publish.copy_runs(publish.finished_runs(sweep), page) == 1
    assert sorted(p.name for p in (page / "runs" / cells[0]).iterdir()) == ["predictions.jsonl", "result.json"]


def test_publish_errors_are_one_line(tmp_path, capsys):
    assert publish.main([str(tmp_path), str(tmp_path / "page")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "cells/" in err


@pytest.mark.parametrize("study, cells", [  # each a fresh process; one in the fast tier
    pytest.param("cpu.toml", 72, marks=pytest.mark.slow), pytest.param("cpu-v1.toml", 72, marks=pytest.mark.slow),
    ("arithmetic-cpu.toml", 39), pytest.param("arithmetic-cpu-8k.toml", 39, marks=pytest.mark.slow)])
def test_the_cpu_study_file_plans_every_cell(study, cells):
    """The CPU study files are valid sweep studies: 12 encodings x 2 tasks x 3 seeds (arithmetic: 13 x 1 x 3), every
    cell's settings checked; the arithmetic study at 8,000 steps likewise."""
    proc = subprocess.run([sys.executable, "-m", "posbench", "sweep", str(ROOT / "studies" / study),
                           "--dry-run", "--jobs", "2", "--out", "/nonexistent/posbench-plan-only"],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert f"plan: {cells} cells" in proc.stdout


def test_restore_puts_published_cells_back_where_a_sweep_finds_them_finished(tmp_path):
    """A later sitting: the published runs restored into an empty output are finished cells to publish.py (and so
    to the sweep, which reads the same files); a second restore changes nothing."""
    import restore  # noqa: E402  (a script of studies/)

    out = tmp_path / "out"
    cells = restore.restore(FIXTURE, out)
    assert cells == sorted(p.name for p in (FIXTURE / publish.RUNS).iterdir())
    assert sorted(publish.finished_runs(out)) == cells
    for cell, run in publish.finished_runs(out).items():
        assert (run / "result.json").read_bytes() == (FIXTURE / publish.RUNS / cell / "result.json").read_bytes()
        assert (run / "config.json").is_file()
    assert restore.restore(FIXTURE, out) == []
    proc = subprocess.run([sys.executable, "-m", "posbench", "sweep", str(FIXTURE / "study.toml"), "--dry-run",
                           "--out", str(out)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("│ complete │") == len(cells)


def test_committed_changes_from_v1_are_the_means_of_both_versions():
    import changes  # noqa: E402  (a script of studies/)

    assert changes.report(CPU_V1 / publish.RUNS, CPU_V2 / publish.RUNS) == (CPU_V2 / "changes.md").read_text()


def test_changes_are_the_difference_of_the_means(tmp_path):
    """Against itself every change is +0.00; a value raised by 3 in one of two seeds moves the mean by 1.5."""
    import changes  # noqa: E402

    same = changes.changes(FIXTURE / publish.RUNS, FIXTURE / publish.RUNS)
    assert "| rope |" in same and all(line.split("|")[4].strip() in ("+0.00", "-0.00", "change", "---:")
                                      for line in same.splitlines() if line.startswith("| "))
    runs = shutil.copytree(FIXTURE / publish.RUNS, tmp_path / publish.RUNS)
    result = runs / "perplexity-alibi-tiny-s0" / "result.json"
    record = json.loads(result.read_text())
    record["metrics"]["ppl_2x"]["value"] += 3.0
    result.write_text(json.dumps(record))
    moved = changes.changes(FIXTURE / publish.RUNS, runs)
    section = moved.split("### perplexity: ppl_2x", 1)[1].split("###", 1)[0]
    assert "| +1.50 | 2 / 2 |" in [line for line in section.splitlines() if line.startswith("| alibi")][0]


def test_a_verdict_that_moved_is_listed_with_both_differences(tmp_path):
    """Against itself no verdict moves; ALiBi's ppl_2x raised to RoPE's plus 5.0 and 5.2 (seeds 0, 1) becomes worse
    than RoPE by 5.1 (the mean of the paired differences), and only that pair is listed against RoPE."""
    import changes  # noqa: E402

    same = changes.moved(FIXTURE / publish.RUNS, FIXTURE / publish.RUNS)
    counts = [line for line in same.splitlines() if "verdicts moved" in line]
    assert "| encoding |" not in same and len(counts) == 4          # two tasks x two baselines
    assert all(re.match(r"^0 of [1-9]\d* verdicts moved", line) for line in counts), counts
    runs = shutil.copytree(FIXTURE / publish.RUNS, tmp_path / publish.RUNS)
    for seed, gap in ((0, 5.0), (1, 5.2)):
        rope = json.loads((runs / f"perplexity-rope-tiny-s{seed}" / "result.json").read_text())
        path = runs / f"perplexity-alibi-tiny-s{seed}" / "result.json"
        record = json.loads(path.read_text())
        record["metrics"]["ppl_2x"]["value"] = rope["metrics"]["ppl_2x"]["value"] + gap
        path.write_text(json.dumps(record))
    section = changes.moved(FIXTURE / publish.RUNS, runs).split("### perplexity: against rope", 1)[1].split("###")[0]
    rows = [line for line in section.splitlines() if line.startswith("| alibi")]
    assert len(rows) == 1 and rows[0].startswith("| alibi | ppl_2x | no difference: ")
    assert "| worse: +5.10 [" in rows[0] and rows[0].endswith("| 2 / 2 |")
