"""``compare --by-model`` when the models differ in size (issue 36, items 1 and 2): two models evaluated with the
same perplexity settings share the perplexity columns (their own settings identify the rows), and the CSV/JSON
rows say one seed, the model's, not the count of its runs."""

from __future__ import annotations

import csv
import io
import json

import pytest

from posbench.cli import main


@pytest.fixture(scope="module")
def two_sizes(tmp_path_factory):
    root = tmp_path_factory.mktemp("sizes")
    for extra in ([], ["--set", "model.d_model=64"]):
        assert main(["run", "-e", "rope", "-t", "pretrain", "-p", "tiny", "--quiet", "--out", str(root), *extra]) == 0
    for run in sorted((root / "pretrain").glob("*/*/result.json")):
        assert main(["run", "-t", "perplexity", "-p", "tiny", "--init", str(run.parent), "--quiet",
                     "--out", str(root)]) == 0
    return root


@pytest.mark.slow  # two_sizes: four tiny runs
def test_two_model_sizes_share_the_evaluations_columns(two_sizes, capsys):
    assert main(["compare", str(two_sizes), "--by-model", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| model"))
    assert "perplexity:ppl_1x" in header and "perplexity#" not in header
    rows = [line for line in out.splitlines() if line.startswith("| rope")]
    assert len(rows) == 2
    assert all(line.count(" - ") == 0 for line in rows)          # each model has every column, none empty
    names = [c.strip() for c in header.split("|")]
    cells = [[c.strip() for c in line.split("|")] for line in rows]
    for i, name in enumerate(names):
        if name.startswith("perplexity:ppl"):                    # one column compared across the two: one best
            # (eff_len, a length both models may reach, ties: both bold)
            assert sum(row[i].startswith("**") for row in cells) == 1, name


@pytest.mark.slow  # two_sizes: four tiny runs
def test_by_model_csv_and_json_say_the_models_seed(two_sizes, capsys):
    assert main(["compare", str(two_sizes), "--by-model", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 2 and all(r["seed"] == "0" and r["seeds"] == "1" for r in rows)
    assert main(["compare", str(two_sizes), "--by-model", "--format", "json"]) == 0
    table = json.loads(capsys.readouterr().out)["tables"][0]
    assert [(r["seed"], r["seeds"]) for r in table["rows"]] == [(0, 1), (0, 1)]
