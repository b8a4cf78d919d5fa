"""``posbench export`` (posbench.hf.export): runs as Hugging Face model directories, and back.

Real tiny runs (pretrain with the byte, BPE and a Hugging Face tokenizer, arithmetic with the character
tokenizer) test the pipeline and the tokenizers; models built here with large weights (init std 0.2, TAPE's
updates perturbed) test the numbers, so that a wrong layout or a wrong position cannot hide in float32 noise.

Tolerances: a posbench-typed export runs posbench's own code, so its logits must be bitwise equal; a RoPE export
runs Llama's code, whose rotary angles are float32 (posbench's are float64), so
|a - b| <= 1e-5 |b| + 1e-5 max(1, max|b|) (``assert_close``; measured: 1.5e-5 at logits up to 6.3, 128 positions). Generated tokens must be identical (after the first EOS, HF pads and posbench repeats EOS:
both are compared as EOS).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from encoding_helpers import assert_close, one_thread, perturb_tape  # noqa: F401 (a fixture)
from posbench.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["hello world", "héllo wörld: naïve café, 日本語, Ελληνικά 🎉", "a<eos>b <|eos|> [EOS] <pad>",
         "  tabs\tand\nnew lines  ", "", "12+34=46", " 1 2 x 3=", "def f(x):\n    return x ** 2\n"]


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one(root: Path, task: str, encoding: str) -> Path:
    (run,) = sorted((root / task / encoding).iterdir())
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny runs through the CLI: pretrain rope and tape (byte tokens), pretrain alibi (BPE), pretrain xpos (a
    Hugging Face tokenizer), arithmetic fire (characters)."""
    from posbench.hf.tiny import save_tiny_llama

    root = tmp_path_factory.mktemp("runs")
    hf_tokenizer = save_tiny_llama(root / "tiny-llama")
    common = ("-p", "tiny", "-q", "--out", root, "--set", "steps=2")
    for args in (("-e", "rope,tape", "-t", "pretrain"),
                 ("-e", "alibi", "-t", "pretrain", "--set", "task.tokenizer=bpe:300"),
                 ("-e", "xpos", "-t", "pretrain", "--set", f"task.tokenizer={hf_tokenizer}"),
                 ("-e", "fire", "-t", "arithmetic", "--set", "task.eval_samples=1")):
        assert main([str(a) for a in ("run", *args, *common)]) == 0
    return {"rope": _one(root, "pretrain", "rope"), "tape": _one(root, "pretrain", "tape"),
            "alibi-bpe": _one(root, "pretrain", "alibi"), "xpos-hf": _one(root, "pretrain", "xpos"),
            "fire-char": _one(root, "arithmetic", "fire")}


def run_model(run: Path):
    """The run's own posbench model, from its checkpoint."""
    from posbench.files import read_json
    from posbench.model import ModelConfig, Transformer
    from posbench.train.checkpoint import load_weights

    model = Transformer(ModelConfig(**read_json(run / "checkpoint" / "model_config.json")))
    load_weights(model, run / "checkpoint")
    return model.eval()


def fake_run(root: Path, encoding: str, *, vocab: int = 259, d_model: int = 64, heads: int = 4, layers: int = 2,
             max_seq_len: int = 64, **options) -> Path:
    """A run directory (config.json, checkpoint, result.json with a byte tokenizer) holding a model with large
    weights: what ``posbench run`` writes, minus the metrics."""
    from posbench.data.tokenizer import ByteTokenizer
    from posbench.files import atomic_write_json
    from posbench.model import ModelConfig, Transformer
    from posbench.train.checkpoint import save_checkpoint

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=vocab, d_model=d_model, n_layers=layers, n_heads=heads,
                                    max_seq_len=max_seq_len, encoding=encoding, encoding_options=options,
                                    init_std=0.2))
    if encoding == "tape":
        perturb_tape(model)
    run = root / "pretrain" / encoding / "run"
    run.mkdir(parents=True)
    atomic_write_json(run / "config.json", {"config": {"task": "pretrain", "encoding": encoding}})
    save_checkpoint(run / "checkpoint", model, {"step": 0})
    atomic_write_json(run / "result.json", {"task": "pretrain", "encoding": encoding, "metrics": {},
                                            "data": {"tokenizer": ByteTokenizer().spec()}})
    return run


def export(capsys, run: Path, out: Path) -> Path:
    code, stdout, stderr = _run(capsys, "export", run, out)
    assert code == 0, stderr
    assert str(out) in stdout
    return out


def logits(model, x):
    with torch.no_grad():
        out = model(input_ids=x) if not hasattr(model, "encoding") else model(x)
    return out.logits if hasattr(out, "logits") else out


def prompts(batch=2, n=6, seed=5, high=256):
    """Random prompts without the PAD id (transformers' generate masks PAD tokens in a prompt out)."""
    return torch.randint(0, high, (batch, n), generator=torch.Generator().manual_seed(seed))


def through_eos(tokens: torch.Tensor, eos: int) -> torch.Tensor:
    """Every token after a row's first EOS replaced by EOS."""
    seen = (tokens == eos).cumsum(1) > 0
    shifted = torch.cat((torch.zeros_like(seen[:, :1]), seen[:, :-1]), 1)
    return tokens.masked_fill(shifted, eos)


# ---- RoPE: a plain Llama ---------------------------------------------------------------------------------------

def test_a_rope_run_exports_as_a_plain_llama_with_posbench_logits(runs, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    out = export(capsys, runs["rope"], tmp_path / "rope")
    config = json.loads((out / "config.json").read_text())
    model_config = json.loads((runs["rope"] / "checkpoint" / "model_config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert "auto_map" not in config and not list(out.glob("*.py"))
    d, h = model_config["d_model"], model_config["n_heads"]
    assert (config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"],
            config["intermediate_size"], config["num_hidden_layers"], config["vocab_size"]) == \
        (d, h, h, d // h, model_config["d_ff"], model_config["n_layers"], model_config["vocab_size"])
    assert config["rms_norm_eps"] == model_config["norm_eps"] and config["hidden_act"] == "silu"
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}
    assert config["max_position_embeddings"] == model_config["max_seq_len"]
    assert not config["tie_word_embeddings"] and not config["attention_bias"] and not config["mlp_bias"]
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (256, 257, 258)
    hf = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert type(hf) is LlamaForCausalLM
    x = prompts(2, model_config["max_seq_len"])
    assert_close(logits(hf, x), logits(run_model(runs["rope"]), x))


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_llama_export_keeps_theta_scale_and_the_qkv_layout(tmp_path, capsys, attention):
    """Large weights, 4 heads, RoPE theta 5e5 with positions divided by 2 (Llama's linear rope type), every
    position up to 128: the same logits, and the same greedy tokens."""
    from transformers import AutoModelForCausalLM

    run = fake_run(tmp_path, "rope", max_seq_len=128, theta=5e5, scale=2.0)
    out = export(capsys, run, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["rope_parameters"] == {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}
    hf = AutoModelForCausalLM.from_pretrained(str(out), attn_implementation=attention).eval()
    ours = run_model(run)
    x = prompts(2, 128)
    assert_close(logits(hf, x), logits(ours, x))
    q, k, v = ours.blocks[1].attn.qkv.weight.chunk(3)
    attn = hf.model.layers[1].self_attn
    assert torch.equal(attn.q_proj.weight, q) and torch.equal(attn.k_proj.weight, k) and \
        torch.equal(attn.v_proj.weight, v)
    p = prompts(2, 5, seed=7)
    generated = hf.generate(p, max_new_tokens=12, do_sample=False)[:, 5:]
    assert torch.equal(through_eos(generated, 257), through_eos(ours.generate(p, 12, eos_id=257), 257))


# ---- every other encoding: posbench's own model type -------------------------------------------------------------

@pytest.mark.parametrize("encoding", ["tape", "alibi", "fire", "cope", "dape"])
def test_other_encodings_export_as_posbench_models_with_posbench_logits_and_generation(tmp_path, capsys, encoding):
    from transformers import AutoModelForCausalLM

    from posbench.hf.modeling import PosbenchForCausalLM

    run = fake_run(tmp_path, encoding)
    out = export(capsys, run, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "posbench" and config["encoding"] == encoding
    assert config["auto_map"] == {"AutoConfig": "configuration_posbench.PosbenchConfig",
                                  "AutoModelForCausalLM": "modeling_posbench.PosbenchForCausalLM"}
    assert {p.name for p in out.glob("*.py")} == {"configuration_posbench.py", "modeling_posbench.py"}
    hf = AutoModelForCausalLM.from_pretrained(str(out))
    assert type(hf) is PosbenchForCausalLM and not hf.training
    ours = run_model(run)
    assert hf.config.encoding_options == ours.config.encoding_options
    x = prompts(2, 40)
    assert torch.equal(logits(hf, x), logits(ours, x))                       # bitwise: posbench's own code
    p = prompts(3, 6, seed=11)
    expected = through_eos(ours.generate(p, 16, eos_id=257), 257)
    cached = hf.generate(p, max_new_tokens=16, do_sample=False)
    full = hf.generate(p, max_new_tokens=16, do_sample=False, use_cache=False)
    assert torch.equal(cached, full)                                          # the cache changes nothing
    assert torch.equal(cached[:, :6], p)
    assert torch.equal(through_eos(cached[:, 6:], 257), expected[:, :cached.shape[1] - 6])
    assert torch.equal(expected, through_eos(ours.generate(p, 16, eos_id=257, use_cache=False), 257))


def test_hf_cache_prefix_then_suffix_equals_one_pass(tmp_path, capsys):
    """A forward pass in three pieces through transformers' DynamicCache gives the one-pass logits (ALiBi: the
    bias reads the cached keys' positions)."""
    from transformers import AutoModelForCausalLM, DynamicCache

    out = export(capsys, fake_run(tmp_path, "alibi"), tmp_path / "out")
    hf = AutoModelForCausalLM.from_pretrained(str(out))
    x = prompts(2, 20)
    cache = DynamicCache(config=hf.config)
    with torch.no_grad():
        parts = [hf(input_ids=x[:, :7], past_key_values=cache).logits,
                 hf(input_ids=x[:, 7:8], past_key_values=cache).logits,
                 hf(input_ids=x[:, 8:], past_key_values=cache).logits]
    assert cache.get_seq_length() == 20
    assert_close(torch.cat(parts, 1), logits(hf, x))


def test_output_hidden_states_are_each_blocks_input_then_the_output_layers(tmp_path, capsys):
    """As a Llama's: the input of every block, then the final norm's output (what the output layer reads), derived
    here by walking the model's modules by hand; asking changes no logit; none unless asked (the call's argument,
    else the config's switch)."""
    from transformers import AutoModelForCausalLM

    out = export(capsys, fake_run(tmp_path, "tape"), tmp_path / "out")           # TAPE: a block also passes state
    hf = AutoModelForCausalLM.from_pretrained(str(out))
    x = prompts(2, 12)
    with torch.no_grad():
        plain = hf(input_ids=x, use_cache=False)
        asked = hf(input_ids=x, use_cache=False, output_hidden_states=True)
        model = hf.model
        positions = torch.arange(12).expand(2, 12)
        state = model.encoding.init_state(positions, x, None)
        walked = [model.encoding.embed(model.embed(x), state)]
        for block in model.blocks:
            h, state = block(walked[-1], state, positions, model.encoding, None, True, None)
            walked.append(h)
        walked[-1] = model.norm(walked[-1])
    assert plain.hidden_states is None
    assert torch.equal(asked.logits, plain.logits)
    assert len(asked.hidden_states) == len(walked) == 3
    for ours, derived in zip(asked.hidden_states, walked):
        assert ours.shape == (2, 12, 64) and torch.equal(ours, derived)          # the same ops: bitwise
    assert torch.equal(hf.get_output_embeddings()(asked.hidden_states[-1]), asked.logits)
    hf.config.output_hidden_states = True
    with torch.no_grad():
        assert len(hf(input_ids=x).hidden_states) == 3
        assert hf(input_ids=x, output_hidden_states=False).hidden_states is None


def test_a_looped_models_hidden_states_are_one_per_block_and_pass():
    from posbench.hf.modeling import PosbenchConfig, PosbenchForCausalLM
    from posbench.model import ModelConfig

    torch.manual_seed(0)
    config = ModelConfig(vocab_size=259, d_model=32, n_layers=2, n_heads=4, max_seq_len=32, encoding="rope",
                         recurrences=3, input_injection=True)
    hf = PosbenchForCausalLM(PosbenchConfig.from_model_config(config)).eval()
    with torch.no_grad():
        out = hf(input_ids=prompts(1, 8), output_hidden_states=True, use_cache=False)
    assert len(out.hidden_states) == 2 * 3 + 1
    assert torch.equal(hf.get_output_embeddings()(out.hidden_states[-1]), out.logits)


@pytest.mark.slow  # a fresh process
def test_trust_remote_code_loads_an_export_without_importing_posbench_first(tmp_path, capsys):
    """In a fresh process that has not imported posbench, the export loads only with trust_remote_code=True (its
    two small files import posbench), to posbench's logits."""
    run = fake_run(tmp_path, "tape")
    out = export(capsys, run, tmp_path / "out")
    x = prompts(2, 12)
    torch.save({"x": x, "logits": logits(run_model(run), x)}, tmp_path / "expected.pt")
    script = f"""
import sys, torch
from transformers import AutoModelForCausalLM
assert not any(m == "posbench" or m.startswith("posbench.") for m in sys.modules)
try:
    AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=False)
    raise SystemExit("loaded without trust_remote_code")
except ValueError as exc:
    assert "trust_remote_code" in str(exc)
model = AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)
expected = torch.load({str(tmp_path / 'expected.pt')!r})
with torch.no_grad():
    got = model(input_ids=expected["x"]).logits
assert torch.equal(got, expected["logits"]), (got - expected["logits"]).abs().max()
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained({str(out)!r}, trust_remote_code=True)
assert tokenizer("héllo <eos>")["input_ids"] == list("héllo <eos>".encode()), tokenizer("héllo <eos>")
print("ok", type(model).__name__)
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_MODULES_CACHE": str(tmp_path / "modules"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and "ok PosbenchForCausalLM" in done.stdout, done.stderr[-2000:]


# ---- tokenizers --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,kind", [("rope", "byte"), ("alibi-bpe", "bpe"), ("fire-char", "char"),
                                       ("xpos-hf", "hf")])
def test_auto_tokenizer_gives_posbench_ids_and_special_ids(runs, tmp_path, capsys, name, kind):
    from transformers import AutoTokenizer

    from posbench.hf.export import read_run

    out = export(capsys, runs[name], tmp_path / "out")
    ours = read_run(runs[name]).tokenizer
    theirs = AutoTokenizer.from_pretrained(str(out))
    meta = json.loads((out / "posbench_export.json").read_text())
    assert meta["tokenizer"]["kind"] == kind
    assert (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id) == (ours.bos_id, ours.eos_id, ours.pad_id)
    assert len(theirs) == ours.vocab_size
    for text in TEXTS:
        ids = ours.encode(text)
        assert theirs(text, add_special_tokens=False)["input_ids"] == ids, text
        assert theirs(text)["input_ids"] == ids and theirs.encode(text) == ids, text   # nothing added
        if kind != "char":
            assert theirs.decode(ids) == text
    if kind == "byte":
        assert ours.encode("é日🎉") == [195, 169, 230, 151, 165, 240, 159, 142, 137]
    if kind == "char":
        assert ours.encode(" 1[PAD]") == [0, 5, 1, 1, 1, 1, 1]       # space -> PAD, unknown -> UNK


# ---- back to posbench (--init) -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["rope", "tape", "fire-char", "xpos-hf"])
def test_read_export_and_load_export_give_back_the_run(runs, tmp_path, capsys, name):
    from safetensors.torch import load_file

    from posbench.hf.export import is_export, load_export, read_export, read_export_meta, read_run

    out = export(capsys, runs[name], tmp_path / "out")
    assert is_export(out) and not is_export(runs[name])
    recorded = json.loads((runs[name] / "checkpoint" / "model_config.json").read_text())
    exported = read_export(out)
    assert exported.model_config == recorded == read_export_meta(out)["model_config"]
    weights = load_file(str(runs[name] / "checkpoint" / "model.safetensors"))
    assert exported.state_dict.keys() == weights.keys()
    assert all(torch.equal(exported.state_dict[k], weights[k]) for k in weights)
    model, tokenizer = load_export(out)
    assert not model.training
    x = prompts(2, 9, high=int(recorded["vocab_size"]))
    assert torch.equal(logits(model, x), logits(run_model(runs[name]), x))
    original = read_run(runs[name]).tokenizer
    assert type(tokenizer) is type(original)
    assert all(tokenizer.encode(t) == original.encode(t) for t in TEXTS)


def test_the_frame_holds_the_settings_the_model_used_as_its_export_does(runs, tmp_path, capsys):
    """``posbench.results.frame`` of a tiny TAPE run: the model's and the encoding's settings as the built model
    used them (the configuration said d_ff 0 and position_size 0, "derived"), equal to what its export says;
    numbers as numbers, the finish time as a UTC datetime."""
    import pandas as pd

    from posbench.results import frame

    out = export(capsys, runs["tape"], tmp_path / "tape")
    config = json.loads((out / "config.json").read_text())
    df = frame(runs["tape"])
    assert len(df) == len(json.loads((runs["tape"] / "result.json").read_text())["metrics"])
    assert (df["model.d_ff"] == config["d_ff"]).all() and config["d_ff"] == 4 * config["d_model"]
    assert (df["encoding.position_size"] == config["encoding_options"]["position_size"]).all()
    assert config["encoding_options"]["position_size"] == 4 * config["n_heads"]
    for column in ("value", "stderr", "train_s", "seed", "n", "model.d_ff", "train.lr", "encoding.theta"):
        assert pd.api.types.is_numeric_dtype(df[column]), (column, df[column].dtype)
    assert pd.api.types.is_datetime64_any_dtype(df["finished"]) and str(df["finished"].dt.tz) == "UTC"
    assert df["finished"].notna().all() and df["stderr"].dtype == "float64"


# ---- an exported RoPE model is a Llama for `posbench extend` ----------------------------------------------------

def test_an_exported_rope_model_extends_with_lora_and_is_an_init(runs, tmp_path, capsys):
    out = export(capsys, runs["rope"], tmp_path / "rope-llama")
    length = 2 * json.loads((out / "config.json").read_text())["max_position_embeddings"]
    code, stdout, stderr = _run(capsys, "extend", "--model", out, "--method", "lora", "--length", length, "--data",
                                "stdlib", "--preset", "tiny", "-q", "-o", tmp_path / "results")
    assert code == 0, stderr
    run = _one(tmp_path / "results", "extend", "rope+lora")         # posbench's RoPE model, extended (issue 36)
    result = json.loads((run / "result.json").read_text())
    assert result["training"]["steps"] == 2 and result["metrics"]["val_ppl"]["value"] > 1
    assert result["data"]["tokenizer"]["eos_id"] == 257 and result["model"]["base_model"]["name"] == str(out)
    # and as the --init of an evaluation: built back as posbench's own RoPE model, with the run's own tokenizer
    code, _, stderr = _run(capsys, "run", "-t", "perplexity", "-p", "tiny", "--init", out, "-q", "-o",
                           tmp_path / "results", "--set", "task.protocols=chunks")
    assert code == 0, stderr
    ppl = json.loads(next((tmp_path / "results" / "perplexity").glob("*/*/result.json")).read_text())
    assert ppl["init"]["run"] == str(out) and ppl["data"]["tokenizer"]["eos_id"] == 257
    assert ppl["init"]["kind"] == "export" and ppl["encoding"] == "rope"


# ---- errors --------------------------------------------------------------------------------------------------------

def _one_line_error(capsys, *argv, match: str):
    code, stdout, stderr = _run(capsys, *argv)
    assert code == 2, (stdout, stderr)
    assert len(stderr.strip().splitlines()) == 1 and stderr.startswith("error:"), stderr
    assert match in stderr, stderr
    assert "Traceback" not in stdout + stderr


def test_bad_input_is_one_line_exit_2_and_nothing_is_overwritten(runs, tmp_path, capsys):
    target = tmp_path / "out"
    _one_line_error(capsys, "export", tmp_path / "nowhere", target, match="not a posbench run directory")
    plain = tmp_path / "plain"
    plain.mkdir()
    _one_line_error(capsys, "export", plain, target, match="not a posbench run directory")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((runs["rope"] / "config.json").read_text())
    _one_line_error(capsys, "export", bare, target, match="has no checkpoint")
    extend_run = tmp_path / "extend-run"
    extend_run.mkdir()
    (extend_run / "config.json").write_text(json.dumps({"config": {"task": "extend"}}))
    _one_line_error(capsys, "export", extend_run, target, match="extend run that has not finished")
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    _one_line_error(capsys, "export", runs["rope"], target, match="already exists")
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]     # no half-written export
    _one_line_error(capsys, "export", runs["rope"], match="Missing argument")


def test_export_takes_an_empty_directory_and_replaces_a_full_one_only_with_force(runs, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    export(capsys, runs["rope"], empty)
    assert (empty / "config.json").is_file()
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    _one_line_error(capsys, "export", runs["rope"], full, match="--force")
    assert [p.name for p in full.iterdir()] == ["keep.txt"]
    code, _, stderr = _run(capsys, "export", runs["rope"], full, "--force")
    assert code == 0, stderr
    assert not (full / "keep.txt").exists() and (full / "config.json").is_file()      # replaced whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "full"]             # no temporary left
    afile = tmp_path / "afile"
    afile.write_text("mine")
    _one_line_error(capsys, "export", runs["rope"], afile, "--force", match="not a directory")
    assert afile.read_text() == "mine"


def test_the_tiny_llama_tool_refuses_a_directory_that_holds_files(tmp_path):
    target = tmp_path / "tiny"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    done = subprocess.run([sys.executable, "-m", "posbench.hf.tiny", str(target)], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("error:") and "--force" in done.stderr
    assert [p.name for p in target.iterdir()] == ["keep.txt"]


def test_export_help_has_examples(capsys):
    code, stdout, _ = _run(capsys, "export", "--help")
    assert code == 0 and "Examples" in stdout and "posbench export" in stdout


def test_an_exported_tape_model_is_an_init_that_scores_as_its_run(runs, tmp_path, capsys):
    """A posbench-typed export as ``--init``: built back as posbench's own TAPE model with the run's tokenizer,
    it scores the held-out text exactly as the run it was exported from (bitwise: the same weights and code)."""
    out = export(capsys, runs["tape"], tmp_path / "tape-export")
    scores = {}
    for name, init in (("run", runs["tape"]), ("export", out)):
        code, _, stderr = _run(capsys, "run", "-t", "perplexity", "-p", "tiny", "--init", init, "-q", "-o",
                               tmp_path / name, "--set", "task.protocols=chunks")
        assert code == 0, stderr
        result = json.loads(next((tmp_path / name / "perplexity").glob("*/*/result.json")).read_text())
        assert result["encoding"] == "tape" and result["init"]["kind"] == name
        scores[name] = {k: m["value"] for k, m in result["metrics"].items()}
    assert scores["export"] == scores["run"]


@pytest.mark.slow  # a fresh process
def test_export_prints_one_line_and_no_library_bars(tmp_path):
    """``posbench export`` says what it wrote in one line; transformers' shard bar is not printed (issue 36,
    item 7)."""
    import subprocess
    import sys

    from posbench.cli import main

    assert main(["run", "-e", "alibi", "-t", "pretrain", "-p", "tiny", "--quiet", "--out", str(tmp_path)]) == 0
    (run,) = [p.parent for p in tmp_path.rglob("result.json")]
    proc = subprocess.run([sys.executable, "-m", "posbench", "export", str(run), str(tmp_path / "export")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (proc.stdout + proc.stderr).strip().count("\n") == 0 and "shards" not in proc.stderr, proc.stderr


@pytest.mark.slow  # pretrain, export, extend
def test_an_extension_of_a_posbench_rope_export_is_labelled_by_its_encoding(tmp_path):
    """An extend run from a posbench RoPE export (a plain Llama directory) is ``rope+tape``, not ``llama+tape``,
    the label of an extension of a real Llama (issue 36, item 7)."""
    from posbench.cli import main
    from posbench.runs.config import resolve_run_config

    assert main(["run", "-e", "rope", "-t", "pretrain", "-p", "tiny", "--quiet", "--out", str(tmp_path)]) == 0
    (run,) = [p.parent for p in tmp_path.rglob("result.json")]
    assert main(["export", str(run), str(tmp_path / "export")]) == 0
    config = resolve_run_config("extend", "tape", "tiny", init=str(tmp_path / "export"), init_flag="--model",
                                sets=["task.length=128"])
    assert config.label == "rope+tape"
