"""Where an encoding breaks, end to end on tiny runs (two encodings, two seeds, the length probe on): ``posbench
analyze`` writes each run's analysis.json (refusing to replace one without --force, and runs that have no held-out
text or no weights, each in one line); ``posbench compare --plots`` draws the loss by position, the extrapolation
curves, the attention profiles and the head maps; ``posbench.results`` gives each as a frame whose numbers are the
records' own; ``load_run`` gives the model that reproduces the run's perplexity."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from posbench.analysis.record import ANALYSIS_FILE, ANALYSIS_VERSION, STATS
from posbench.cli import main
from posbench.evaluation.perplexity import evaluate
from posbench.results import attention_frame, load_run, positions_frame, probe_frame

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("breaks")
    assert main(["run", "-e", "rope,alibi", "-t", "perplexity", "-p", "tiny", "-q", "--steps", "8", "--seeds", "2",
                 "--set", "train.probe_every=4", "--set", "task.protocols=chunks", "--out", str(root)]) == 0
    return root


def runs(root):
    return sorted(p.parent for p in root.rglob("result.json") if "checkpoint" not in p.parts)


def test_analyze_writes_a_record_per_run_and_keeps_it(tree, capsys):
    dirs = runs(tree)
    assert len(dirs) == 4
    assert main(["analyze", *map(str, dirs), "--tokens", "512"]) == 0
    for run_dir in dirs:
        record = json.loads((run_dir / ANALYSIS_FILE).read_text())
        assert record["analysis_version"] == ANALYSIS_VERSION
        assert [entry["factor"] for entry in record["lengths"]] == [1.0, 2.0, 4.0]       # the run's own lengths
        for entry in record["lengths"]:
            assert entry["contexts"] == 512 // entry["length"]
            for stat in STATS:
                assert len(entry[stat]) == len(record["layers"]) == 2
        assert record["posbench"]["git_commit"]
    capsys.readouterr()
    assert main(["analyze", str(dirs[0])]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("error:") and "--force" in line and "\n" not in line


def test_analyze_refuses_runs_it_cannot_read_in_one_line(tree, tmp_path, capsys):
    assert main(["run", "-e", "rope", "-t", "arithmetic", "-p", "tiny", "-q", "--steps", "2", "--set",
                 "task.eval_samples=2", "--out", str(tmp_path)]) == 0
    arithmetic = runs(tmp_path)[0]
    copy = tmp_path / "copy"
    shutil.copytree(runs(tree)[0], copy)
    (copy / "checkpoint" / "model.safetensors").unlink()
    capsys.readouterr()
    for target, words in ((arithmetic, "no held-out text"), (copy, "no trained weights"),
                          (tmp_path / "missing", "not a finished run")):
        assert main(["analyze", str(target), "--force"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and words in err and "\n" not in err
    assert main(["analyze", str(runs(tree)[0]), "--factors", "0,2", "--force"]) == 2


def test_compare_draws_every_figure(tree, tmp_path, capsys):
    if not any((d / ANALYSIS_FILE).exists() for d in runs(tree)):
        assert main(["analyze", *map(str, runs(tree)), "--tokens", "512"]) == 0
    figures = tmp_path / "figures"
    assert main(["compare", str(tree), "--plots", str(figures), "--html", str(tmp_path / "r.html")]) == 0
    names = {p.name for p in figures.glob("*.png")}
    assert {"perplexity_loss_by_position.png", "perplexity_extrapolation.png", "perplexity_attention_distance.png",
            "perplexity_heads_rigidity_1x.png", "perplexity_heads_entropy_4x.png",
            "perplexity_heads_first_token_4x.png"} <= names
    assert "perplexity_probe_nll_1x.png" not in names          # losses are not drawn as a percentage probe
    out = capsys.readouterr().out
    assert "eff_len" in out
    assert (tmp_path / "r.html").read_text().count("<img") >= len(names)


def test_the_frames_hold_the_records_numbers(tree):
    positions = positions_frame(tree)
    record = json.loads((runs(tree)[0] / "result.json").read_text())
    result = next(r for r in record["evaluation"]["results"] if r["length"] == 128)
    rows = positions[(positions.run_id == record["run_id"]) & (positions.length == 128)]
    by_position = result["by_position"]
    assert list(rows.tokens) == by_position["tokens"]
    assert list(rows.nll) == pytest.approx([s / n for s, n in zip(by_position["nll_sum"], by_position["tokens"])])
    total = (rows.nll * rows.tokens).sum() / rows.tokens.sum()
    assert total == pytest.approx(math.log(record["metrics"]["ppl_2x"]["value"]), rel=1e-9)
    probes = probe_frame(tree)
    mine = probes[probes.run_id == record["run_id"]]
    assert sorted(set(mine.step)) == [4, 8] and sorted(set(mine.factor)) == [1.0, 2.0, 4.0]
    if any((d / ANALYSIS_FILE).exists() for d in runs(tree)):
        heads = attention_frame(tree)
        assert set(STATS) <= set(heads.columns) and heads.rigidity.between(-1e-9, 1 + 1e-9).all()


def test_load_run_reproduces_the_recorded_perplexity(tree):
    run = load_run(runs(tree)[0])
    result = evaluate(run.model, run.tokens, run.train_length, "chunks", batch_size=8)
    assert result.perplexity == pytest.approx(run.record.metrics["ppl_1x"].value, rel=1e-6)
    assert isinstance(run.tokens, torch.Tensor) and run.tokens.dtype == torch.long


@pytest.mark.parametrize("spoil", ["analysis", "positions", "probe"])
def test_compare_draws_around_records_not_in_the_shape_posbench_writes(tree, tmp_path, capsys, spoil):
    """A hand-edited analysis.json, loss-by-position or probe history is left out of the figures, never a
    traceback: compare still writes the rest."""
    copy = tmp_path / "tree"
    shutil.copytree(tree, copy)
    run = runs(copy)[0]
    if not (run / ANALYSIS_FILE).exists():
        assert main(["analyze", str(run), "--tokens", "512"]) == 0
    if spoil == "analysis":
        record = json.loads((run / ANALYSIS_FILE).read_text())
        record["lengths"][0]["rigidity"] = "high"
        record["lengths"][-1]["mass"] = [[1, 2]]
        (run / ANALYSIS_FILE).write_text(json.dumps(record))
    else:
        record = json.loads((run / "result.json").read_text())
        if spoil == "positions":
            record["evaluation"]["results"][0]["by_position"] = {"edges": [0, 1], "nll_sum": "x", "tokens": [1]}
        else:
            record["training"]["probe_history"] = [[4, {"nll_1x": "x"}], "junk", [8]]
        (run / "result.json").write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["compare", str(copy), "--plots", str(tmp_path / "figures")]) == 0
    assert (tmp_path / "figures" / "perplexity_ppl_chunks.png").exists()
