"""End to end through the CLI with tiny presets: pretrain -> perplexity / passkey / scrolls from its
checkpoint, then compare over all of them (tables, Table 1 layout, curves and heatmaps), plus one-line errors."""

import json
from pathlib import Path

import pytest

from posbench.cli import main
from posbench.tasks.presets import preset_of

FIXTURES = Path(__file__).parents[1] / "fixtures" / "scrolls"


def _run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _only_run(root: Path, task: str, encoding: str) -> Path:
    runs = sorted((root / task / encoding).iterdir())
    assert len(runs) == 1
    return runs[0]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return tmp_path_factory.mktemp("long_results")


@pytest.mark.slow  # a run per long task
def test_pretrain_then_every_long_task_then_compare(results, capsys, tmp_path):
    out = str(results)
    code, stdout, stderr = _run(capsys, "run", "-e", "rope", "-t", "pretrain", "-p", "tiny", "-o", out, "-q")
    assert code == 0, stderr
    pre = _only_run(results, "pretrain", "rope")
    r = json.loads((pre / "result.json").read_text())
    assert r["data"]["source"] == "stdlib" and len(r["data"]["hash"]) == 64
    assert r["data"]["tokenizer"]["kind"] == "byte" and r["data"]["source_info"]["python"]
    assert {"val_ppl", "val_loss", "unigram_ppl"} <= set(r["metrics"])

    code, _, stderr = _run(capsys, "run", "-t", "perplexity", "-p", "tiny", "--init", str(pre), "-o", out, "-q")
    assert code == 0, stderr
    ppl = json.loads((_only_run(results, "perplexity", "rope") / "result.json").read_text())
    assert ppl["config"]["train"]["steps"] == 0 and ppl["init"]["run"] == str(pre)
    assert ppl["metrics"]["ppl_1x"]["value"] == pytest.approx(r["metrics"]["val_ppl"]["value"], rel=1e-4)
    assert set(ppl["grids"]) == {"ppl_chunks", "ppl_sliding"}
    assert ppl["grids"]["ppl_chunks"]["axes"][0]["values"] == [64, 128, 256]
    details = ppl["evaluation"]["results"]
    assert [d["tokens_scored"] for d in details if d["protocol"] == "chunks"] == [64 * 63, 32 * 127, 16 * 255]
    assert all(d["tokens_scored"] == 4095 for d in details if d["protocol"] == "sliding")
    # no per-sample rows, no predictions file (an empty one was written before issue 24), in either run
    for run in (pre, _only_run(results, "perplexity", "rope")):
        record = json.loads((run / "result.json").read_text())
        assert record["predictions"] is None and not (run / "predictions.jsonl").exists()

    code, _, stderr = _run(capsys, "run", "-t", "passkey", "-p", "tiny", "--init", str(pre), "-o", out, "-q")
    assert code == 0, stderr
    pk = json.loads((_only_run(results, "passkey", "rope") / "result.json").read_text())
    assert pk["grids"]["accuracy"]["axes"] == [{"name": "length", "values": [288, 576]},
                                               {"name": "depth", "values": [0.0, 0.5, 1.0]}]
    assert pk["config"]["model"]["max_seq_len"] == 288 and pk["data"]["tokenizer"]["kind"] == "byte"

    code, _, stderr = _run(capsys, "run", "-t", "passkey", "-p", "tiny", "-e", "alibi", "-o", out, "-q",
                           "--set", "task.mode=longlora", "--set", "task.interval=300", "--set", "task.max_tokens=300")
    assert code == 0, stderr
    ll = json.loads((_only_run(results, "passkey", "alibi") / "result.json").read_text())
    assert ll["evaluation"]["mode"] == "longlora" and ll["evaluation"]["points"][0]["n_garbage"] == 1024

    code, _, stderr = _run(capsys, "run", "-t", "scrolls", "-p", "tiny", "--init", str(pre), "--data", str(FIXTURES),
                           "--datasets", "qasper,contract_nli", "-o", out, "-q")
    assert code == 0, stderr
    sc = json.loads((_only_run(results, "scrolls", "rope") / "result.json").read_text())
    assert list(sc["metrics"]) == ["qasper_f1", "contract_nli_em", "scrolls_score"]

    # the scrolls run's submission file scores with `posbench score`
    sub = _only_run(results, "scrolls", "rope") / "scrolls" / "qasper.json"
    code, stdout, stderr = _run(capsys, "score", str(sub), "-d", "qasper", "--data", str(FIXTURES), "-f", "json")
    assert code == 0, stderr
    assert json.loads(stdout)["f1"] == sc["metrics"]["qasper_f1"]["value"]

    figures = tmp_path / "figures"
    code, stdout, stderr = _run(capsys, "compare", out, "--format", "markdown", "--plots", str(figures))
    assert code == 0, stderr
    for task in ("pretrain", "perplexity", "passkey", "scrolls"):
        assert f"### {task}" in stdout
    scrolls_header = next(line for line in stdout.splitlines() if line.startswith("| encoding | qasper_f1"))
    assert scrolls_header.index("qasper_f1") < scrolls_header.index("contract_nli_em") < \
        scrolls_header.index("scrolls_score")
    names = sorted(p.name for p in figures.iterdir())
    assert {"perplexity_ppl_chunks.png", "perplexity_ppl_sliding.png", "passkey_accuracy.png"} <= set(names)


def test_one_line_errors(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    code, _, stderr = _run(capsys, "run", "-e", "rope", "-t", "pretrain", "-p", "tiny", "--data", "allenai/c4",
                           "-o", str(tmp_path), "-q")
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert "--data PATH" in stderr and "--data stdlib" in stderr
    code, _, stderr = _run(capsys, "run", "-e", "rope", "-t", "scrolls", "-p", "tiny", "--data", str(tmp_path),
                           "--datasets", "qasper", "-o", str(tmp_path), "-q")
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and "DIR/<dataset>" in stderr
    code, _, stderr = _run(capsys, "run", "-e", "rope", "-t", "pretrain", "-p", "tiny", "--data",
                           str(tmp_path / "missing.jsonl"), "-o", str(tmp_path), "-q")
    assert code == 2 and "no such file" in stderr
    code, _, stderr = _run(capsys, "run", "-e", "rope", "-t", "perplexity", "-p", "tiny", "--set",
                           "task.protocols=chunks,rolling", "-o", str(tmp_path), "-q")
    assert code == 2 and "rolling" in stderr
    preds = tmp_path / "p.json"
    for bad, message in [({"qa-v1": "x"}, "missing"), ({"qa-v1": "x", "qa-v2": "y", "qa-v3": "z", "zz": "w"}, "not in the references"),
                         ({"qa-v1": 1, "qa-v2": "y", "qa-v3": "z"}, "not strings")]:
        preds.write_text(json.dumps(bad))
        code, _, stderr = _run(capsys, "score", str(preds), "-d", "qasper", "--data", str(FIXTURES))
        assert code == 2 and message in stderr and len(stderr.strip().splitlines()) == 1


def test_a_presets_tokenizer_gives_way_to_the_init_runs(results, capsys, tmp_path):
    """The paper preset names a 32k BPE for runs from scratch; with --init the init run's tokenizer is used
    (the preset's is not a user's request), while an explicit --tokenizer with --init is still refused."""
    from posbench.runs.config import resolve_run_config
    from posbench.tasks.perplexity.task import Perplexity

    if not (results / "pretrain" / "rope").is_dir():          # the slow test above did not run first: its own
        assert main(["run", "-e", "rope", "-t", "pretrain", "-p", "tiny", "-o", str(tmp_path), "-q"]) == 0
        results = tmp_path
    pre = _only_run(results, "pretrain", "rope")               # written by the test above (module scope)
    assert preset_of(Perplexity, "paper")["task"]["tokenizer"] == "bpe:32000"
    cfg = resolve_run_config("perplexity", None, "paper", init=str(pre))
    assert cfg.task_options["tokenizer"] == "byte"               # the default: "take the init run's"
    code, _, err = _run(capsys, "run", "-t", "perplexity", "-p", "tiny", "--init", str(pre),
                        "--tokenizer", "bpe:300", "-o", str(results), "-q")
    assert code == 2 and "the tokenizer comes from the --init model" in err
