"""End to end through the CLI: a tiny local Llama (posbench.hf.tiny, no download) is extended from 64 to 128
tokens with each method, then evaluated by `perplexity` and `passkey` with the extend run as --init (and the
plain Llama as the baseline), then `compare` reads the tree. Plus resume after a kill, and one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from posbench.cli import main

METHODS = ["tape", "lora", "longlora", "theta"]
ROPE_METHODS = ["yarn", "ntk"]         # YaRN and dynamic NTK instead of the linear interpolation
EVERY = METHODS + ROPE_METHODS


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _only(root: Path, task: str, label: str) -> Path:
    runs = sorted((root / task / label).iterdir())
    assert len(runs) == 1, runs
    return runs[0]


def _result(run: Path) -> dict:
    return json.loads((run / "result.json").read_text())


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from posbench.hf.tiny import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("hf") / "tiny-llama", max_positions=64, layers=2)


EXTEND = ("--length", 128, "--data", "stdlib", "--preset", "tiny", "-q")


@pytest.mark.slow  # an extend run per method, then the tasks
def test_extend_each_method_then_perplexity_passkey_and_compare(llama_dir, tmp_path, capsys):
    out = tmp_path / "results"
    for method in METHODS:
        extra = ("--set", "train.checkpointing=true") if method == "tape" else ()
        code, stdout, stderr = _run(capsys, "extend", "--model", llama_dir, "--method", method, *EXTEND, "-o", out,
                                    *extra)
        assert code == 0, stderr
        assert f"llama+{method}" in stdout
        run = _only(out, "extend", f"llama+{method}")
        r = _result(run)
        assert r["task"] == "extend" and r["encoding"] == r["config"]["label"] == f"llama+{method}"
        assert r["config"]["encoding"] == method and r["config"]["init"] == str(llama_dir)
        assert r["model"]["scale"] == 2.0 and r["config"]["model"]["n_layers"] == 2
        assert all(isinstance(r["config"][k], dict) for k in ("model", "encoding_options", "train", "task_options"))
        assert r["model"]["trainable_parameters"] == r["model"]["trainable_formula"]
        assert r["model"]["added_parameters"] == r["model"]["added_formula"] > 0
        assert r["training"]["steps"] == 2 and r["metrics"]["val_ppl"]["value"] > 1
        assert r["model"]["gradient_checkpointing"] == (method == "tape")
        assert r["data"]["tokenizer"]["kind"] == "hf" and (run / "checkpoint" / "model" / "config.json").is_file()
        saved = json.loads((run / "checkpoint" / "model" / "config.json").read_text())
        assert saved["max_position_embeddings"] == 128 and saved["rope_parameters"]["factor"] == 2.0
        assert saved["rope_parameters"]["rope_theta"] == (1e6 if method == "theta" else 10000.0)

    # yarn (trained as lora) and ntk (training-free: 0 steps without being told) through transformers' rope types
    for method in ROPE_METHODS:
        code, stdout, stderr = _run(capsys, "extend", "--model", llama_dir, "--method", method, *EXTEND, "-o", out)
        assert code == 0, stderr
        run = _only(out, "extend", f"llama+{method}")
        r = _result(run)
        assert r["encoding"] == r["config"]["label"] == f"llama+{method}" and r["metrics"]["val_ppl"]["value"] > 1
        assert r["model"]["trainable_parameters"] == r["model"]["trainable_formula"]
        assert r["model"]["added_parameters"] == r["model"]["added_formula"]
        saved = json.loads((run / "checkpoint" / "model" / "config.json").read_text())
        if method == "yarn":
            assert r["training"]["steps"] == 2 and r["model"]["added_parameters"] > 0
            assert saved["max_position_embeddings"] == 128
            assert saved["rope_parameters"] == {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
                                                "original_max_position_embeddings": 64, "beta_fast": 32.0,
                                                "beta_slow": 1.0}
        else:
            assert r["training"]["steps"] == 0 and r["model"]["trainable_parameters"] == 0
            assert r["model"]["added_parameters"] == 0 and "train_loss" not in r["metrics"]
            assert saved["max_position_embeddings"] == 64       # dynamic: scaled from the original context on
            assert saved["rope_parameters"] == {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}

    evaluated = [_only(out, "extend", f"llama+{m}") for m in EVERY] + [llama_dir]
    for init in evaluated:
        code, _, stderr = _run(capsys, "run", "-t", "perplexity", "-p", "tiny", "--init", init, "-o", out, "-q",
                               "--set", "model.max_seq_len=32", "--set", "task.protocols=chunks",
                               "--set", "task.eval_tokens=2048")
        assert code == 0, stderr
        code, _, stderr = _run(capsys, "run", "-t", "passkey", "-p", "tiny", "--init", init, "-o", out, "-q",
                               "--steps", 0, "--set", "task.train_length=160", "--set", "task.length_factors=1",
                               "--set", "task.trials=1")
        assert code == 0, stderr
    for label, init in zip([f"llama+{m}" for m in EVERY] + ["llama"], evaluated):
        ppl, pk = _result(_only(out, "perplexity", label)), _result(_only(out, "passkey", label))
        for r in (ppl, pk):
            kind = "hf" if label == "llama" else "extended"        # a model directory, or an extend run's model
            assert r["init"]["run"] == str(init) and r["init"]["label"] == label and r["init"]["kind"] == kind
            assert r["config"]["model_config"]["label"] == label and len(r["init"]["checkpoint_sha256"]) == 64
            assert r["data"]["tokenizer"]["kind"] == "hf"
        assert ppl["grids"]["ppl_chunks"]["axes"][0]["values"] == [32, 64, 128]
        assert ppl["config"]["train"]["steps"] == 0 and pk["config"]["train"]["steps"] == 0
        assert pk["grids"]["accuracy"]["axes"][0]["values"] == [160]
    # each extended model, reloaded by `run`, scores the held-out text exactly as its extend run did (the same
    # 2048 tokens in chunks of 128): the trained weights, not a fresh conversion, were loaded
    for method in EVERY:
        reloaded = _result(_only(out, "perplexity", f"llama+{method}"))["metrics"]["ppl_4x"]["value"]
        trained = _result(_only(out, "extend", f"llama+{method}"))["metrics"]["val_ppl"]["value"]
        assert reloaded == pytest.approx(trained, rel=1e-5), method

    code, stdout, stderr = _run(capsys, "compare", out, "--format", "markdown")
    assert code == 0, stderr
    assert "skipped" not in stderr                     # the saved models inside runs are not runs
    for task in ("extend", "perplexity", "passkey"):
        assert f"### {task}" in stdout
    table = stdout.split("### perplexity")[1].split("###")[0]
    for label in [f"llama+{m}" for m in EVERY] + ["llama"]:       # one row per model (maybe with its init named)
        assert re.search(rf"^\| {re.escape(label)}( \[[^\]]*\])? \|", table, re.MULTILINE), (label, table)

    # the paper's Table 2 and passkey figure as one table: a row per extended model, perplexity per length and
    # passkey accuracy as columns
    code, stdout, stderr = _run(capsys, "compare", out, "--by-model", "--format", "markdown")
    assert code == 0, stderr
    header = next(line for line in stdout.splitlines() if line.startswith("| "))
    for column in ("perplexity:ppl_1x", "perplexity:ppl_4x", "passkey:accuracy"):
        assert column in header, header
    for label in [f"llama+{m}" for m in EVERY] + ["llama"]:
        assert re.search(rf"^\| {re.escape(label)} \|", stdout, re.MULTILINE), (label, stdout)


def test_resume_after_a_kill_gives_the_uninterrupted_model(llama_dir, tmp_path):
    from posbench.runs import runner
    from posbench.runs.config import resolve_run_config
    from posbench.train import StopTraining

    cfg = resolve_run_config("extend", "tape", "tiny", init=str(llama_dir),
                             sets=["task.data=stdlib", "task.length=128", "train.steps=3", "train.checkpoint_every=1"])
    whole = runner.execute(cfg, tmp_path / "a").run_dir

    def kill(step, model, loss):
        if step == 2:
            raise StopTraining

    with pytest.raises(StopTraining):
        runner.execute(cfg, tmp_path / "b", callbacks=(kill,))
    killed = _only(tmp_path / "b", "extend", "llama+tape")
    assert not (killed / "result.json").exists()
    outcome = runner.resume(killed)
    resumed, training = outcome.run_dir, outcome.record.training
    assert training["resumed_from"] == [2] and training["steps"] == 3
    from safetensors.torch import load_file

    a, b = (load_file(str(r / "checkpoint" / "model" / "model.safetensors")) for r in (whole, resumed))
    assert any(".tape." in k for k in a)                   # TAPE's tensors are saved with the Llama's
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_grouped_query_models_extend_with_tape(tmp_path, capsys):
    """Grouped-query attention is supported: keys and values are repeated per query head (TAPE's state is
    per head)."""
    from posbench.hf.tiny import save_tiny_llama

    gqa = save_tiny_llama(tmp_path / "gqa", kv_heads=2, max_positions=64)
    code, _, stderr = _run(capsys, "extend", "--model", gqa, "--method", "tape", *EXTEND, "-o", tmp_path / "r")
    assert code == 0, stderr
    r = _result(_only(tmp_path / "r", "extend", "llama+tape"))
    assert r["model"]["base_model"]["num_key_value_heads"] == 2


def _one_line_error(capsys, *argv, match: str):
    code, _, stderr = _run(capsys, *argv)
    assert code == 2, stderr
    assert len(stderr.strip().splitlines()) == 1 and stderr.startswith("error:"), stderr
    assert match in stderr, stderr


def test_bad_input_is_one_line_and_exit_code_2(llama_dir, tmp_path, capsys):
    out = ("-o", tmp_path / "results")
    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    _one_line_error(capsys, "extend", "--model", not_a_model, "--method", "tape", *EXTEND, *out,
                    match="not a Hugging Face model directory")
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    _one_line_error(capsys, "extend", "--model", gpt2, "--method", "lora", *EXTEND, *out, match="not a Llama")
    _one_line_error(capsys, "extend", "--model", llama_dir, "--method", "tape", "--length", 32, "--data", "stdlib",
                    *out, match="below the model's own context (64 tokens")
    _one_line_error(capsys, "extend", "--model", llama_dir, "--method", "yarnn", *EXTEND, *out,
                    match="unknown method 'yarnn'. Did you mean 'yarn'")
    _one_line_error(capsys, "extend", "--model", llama_dir, "--method", "yarn", *EXTEND, *out, "--set",
                    "method.beta_slow=64", match="must exceed method.beta_slow")
    _one_line_error(capsys, "extend", "--model", "meta-llama/Llama-2-7b-hf", "--method", "tape", *EXTEND, *out,
                    match="offline")
    _one_line_error(capsys, "extend", "--model", llama_dir, "--method", "tape", *out, match="needs --length, --data")
    _one_line_error(capsys, "extend", "--model", llama_dir, "--method", "lora", *EXTEND, *out, "--set",
                    "method.r=x", match="method.r")
    _one_line_error(capsys, "extend", "--model", llama_dir, "--method", "tape", *EXTEND, *out, "--scale", 0.5,
                    match="--scale must be >= 1")
    _one_line_error(capsys, "extend", "--model", llama_dir, "--method", "longlora", "--length", 130, "--data",
                    "stdlib", *out, match="S²-Attn needs the sequence length (130)")
    assert not (tmp_path / "results").exists()        # nothing was written for bad input
    half = tmp_path / "half" / "extend" / "llama+tape" / "run"
    half.mkdir(parents=True)
    (half / "config.json").write_text(json.dumps({"config": {"task": "extend"}}))
    _one_line_error(capsys, "run", "-t", "perplexity", "-p", "tiny", "--init", half, *out,
                    match="has not finished")
