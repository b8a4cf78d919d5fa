"""Where posbench's models meet the tools researchers use: every extend run exports to a directory that plain
transformers loads with its method intact (TAPE through ``trust_remote_code``; yarn and ntk through
transformers' own rope parameters), and lm-evaluation-harness (``lm_eval --model hf``) evaluates a RoPE, a
TAPE and an extended export over a small local task, giving the numbers posbench's own models give.

The models are tiny real runs through the CLI: a tiny local Llama (``posbench.hf.tiny``, 64 positions)
extended to 128 tokens with every method (2 steps at lr 0.05, so that TAPE's updates and LoRA's B are far
from their zero start), and two tiny ``pretrain`` runs (rope, tape; byte tokens). Tolerances: where the
export runs the code posbench runs on the same tensors (tape, ntk) the logits are bitwise equal (one thread
in both processes); where LoRA was folded into the weights (lora, longlora, theta, yarn)
|a - b| <= 1e-5 |b| + 1e-5 max(1, max|b|);
lm-eval's bits per byte against posbench's log-likelihood: relative 1e-4 (float32 sums over ~100 tokens).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from encoding_helpers import assert_close, one_thread  # noqa: F401 (a fixture)
from posbench.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")
EXTENDED = ["tape", "lora", "longlora", "theta", "yarn", "ntk"]
FOLDED = ("lora", "longlora", "theta", "yarn")          # an adapter folded into the weights on export
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def _only(root: Path, task: str, label: str) -> Path:
    (run,) = sorted((root / task / label).iterdir())
    return run


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The runs and their exports: {"llama": base dir, "extend:<m>": run, "export:llama+<m>": its export, "rope",
    "tape": the pretrain runs, "export:rope", "export:tape": theirs}."""
    from posbench.hf.tiny import save_tiny_llama

    root = tmp_path_factory.mktemp("clients")
    out = root / "results"
    llama = save_tiny_llama(root / "tiny-llama", max_positions=64, layers=2)
    made = {"llama": llama}
    for method in EXTENDED:
        assert main(["extend", "--model", str(llama), "--method", method, "--length", "128", "--data", "stdlib",
                     "--preset", "tiny", "-q", "-o", str(out), "--set", "train.lr=0.05",
                     "--set", "task.eval_tokens=512"]) == 0
        made[f"extend:{method}"] = _only(out, "extend", f"llama+{method}")
    assert main(["run", "-e", "rope,tape", "-t", "pretrain", "-p", "tiny", "-q", "-o", str(out),
                 "--set", "steps=2"]) == 0
    for encoding in ("rope", "tape"):
        made[encoding] = _only(out, "pretrain", encoding)
    for name in [*(f"llama+{m}" for m in EXTENDED), "rope", "tape"]:
        run = made[f"extend:{name.removeprefix('llama+')}"] if name.startswith("llama+") else made[name]
        assert main(["export", str(run), str(root / "exports" / name)]) == 0
        made[f"export:{name}"] = root / "exports" / name
    return made


def tokens(n: int = 100, high: int = 300, seed: int = 3) -> torch.Tensor:
    return torch.randint(3, high, (1, n), generator=torch.Generator().manual_seed(seed))


def posbench_logits(directory: Path, x: torch.Tensor) -> torch.Tensor:
    """What posbench computes: the extended model as ``posbench.hf.saving`` rebuilds it."""
    from posbench.hf.saving import load_extended

    model, _, _ = load_extended(directory)
    with torch.no_grad():
        return model(input_ids=x).logits


LOAD_SCRIPT = textwrap.dedent('''
    import json, sys, torch
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, LlamaForCausalLM
    jobs, x, out = json.loads(sys.argv[1]), torch.tensor(json.loads(sys.argv[2])), {}
    for name, directory, how in jobs:                  # (posbench is imported by a remote-code file only)
        try:
            if how == "llama-class":
                model = LlamaForCausalLM.from_pretrained(directory)
            else:
                model = AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=how == "remote-code")
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
            continue
        with torch.no_grad():
            out[name] = [type(model).__name__, model(input_ids=x).logits]
    torch.save(out, sys.argv[3])
''')


def load_elsewhere(jobs: list[tuple[str, str, str]], x: torch.Tensor, tmp_path: Path) -> dict:
    """Load each (name, directory, how) in a fresh Python that never imports posbench itself (only a remote-code
    file may), and return the class and logits (or the error) of each."""
    result = tmp_path / "loaded.pt"
    done = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, json.dumps([list(j) for j in jobs]),
                           json.dumps(x.tolist()), str(result)], capture_output=True, text=True,
                          env={**os.environ, **OFFLINE}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(result)


# ---- item 3: every extend run exports with its method intact ---------------------------------------------------

@pytest.mark.slow  # `made`: an extend run per method
def test_every_extend_run_exports_to_plain_transformers_with_its_method(made, tmp_path):
    x = tokens(120)
    # first without posbench's code (its remote-code file, once run, registers the TAPE model type)
    jobs = [("tape-without-code", str(made["export:llama+tape"]), "plain"),
            ("tape-checkpoint-without-code", str(made["extend:tape"] / "checkpoint" / "model"), "plain"),
            ("tape-as-llama", str(made["export:llama+tape"]), "llama-class"),
            ("base", str(made["llama"]), "plain")]
    jobs += [(m, str(made[f"export:llama+{m}"]), "remote-code" if m == "tape" else "plain") for m in EXTENDED]
    loaded = load_elsewhere(jobs, x, tmp_path)
    for method in EXTENDED:
        assert not isinstance(loaded[method], str), loaded[method]
        cls, got = loaded[method]
        expected = posbench_logits(made[f"extend:{method}"] / "checkpoint" / "model", x)
        assert cls == ("TapeLlamaForCausalLM" if method == "tape" else "LlamaForCausalLM")
        if method in FOLDED:                       # LoRA folded into the weights: float32 rounding
            assert_close(got, expected, rel=1e-5)
        else:                                      # the same tensors through the same code
            assert torch.equal(got, expected), (method, (got - expected).abs().max())
        # the method is there: not the plain Llama (whose logits, ~0.2 here, are rounded at ~1e-8; ntk's base
        # change moves them by ~4e-4 on this small-weight model, the trained weights of the others by more)
        assert (got - loaded["base"][1]).abs().max() > 1e-4, method
    # a TAPE-extended model without posbench's code is refused, never a Llama without its TAPE
    for name in ("tape-without-code", "tape-checkpoint-without-code"):
        assert loaded[name].startswith("ValueError") and "trust_remote_code" in loaded[name], loaded[name]
    # (forcing Llama's class on it drops TAPE: its logits are not the model's)
    assert (loaded["tape-as-llama"][1] - loaded["tape"][1]).abs().max() > 1e-4


@pytest.mark.slow  # `made`: an extend run per method
def test_an_extended_export_says_its_context_and_tokens_and_is_an_init(made):
    from posbench.hf.tape_model import MODEL_TYPE
    from posbench.results import frame
    from posbench.runs.init import resolve_init

    for method in EXTENDED:
        directory = made[f"export:llama+{method}"]
        config = json.loads((directory / "config.json").read_text())
        tokenizer = json.loads((directory / "tokenizer_config.json").read_text())
        generation = json.loads((directory / "generation_config.json").read_text())
        meta = json.loads((directory / "posbench_extend.json").read_text())
        assert config["model_type"] == (MODEL_TYPE if method == "tape" else "llama")
        if method == "ntk":        # dynamic scaling starts from the original context; the extended one for lm-eval
            assert config["max_position_embeddings"] == 64 and config["n_positions"] == 128
            assert config["rope_parameters"] == {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
        else:
            assert config["max_position_embeddings"] == 128
        assert tokenizer["model_max_length"] == 128 and meta["length"] == 128 and meta["label"] == f"llama+{method}"
        assert {generation[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")} == {0, 1, 2}
        assert meta["method"] == (None if method in FOLDED else method)
        assert resolve_init(str(directory)).label == f"llama+{method}"
    assert json.loads((made["export:llama+yarn"] / "posbench_extend.json").read_text())["merged"]["method"] == "yarn"
    assert json.loads((made["export:llama+tape"] / "config.json").read_text())["tape_position_size"] == 16
    # the frame records TAPE's position size as the model used it (4 x 4 heads), as the export does
    df = frame(made["extend:tape"])
    assert (df["encoding.position_size"] == 16).all()


# ---- item 4: lm-evaluation-harness as a client ------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "docs" / "lm-eval"                  # the local task docs/pretrained.md runs
TEXTS = [json.loads(line)["text"] for line in (TASKS / "text.jsonl").read_text().splitlines()]
PROMPTS = [json.loads(line)["prompt"] for line in (TASKS / "prompts.jsonl").read_text().splitlines()]
MAX_GEN_TOKS = 8                                   # posbench_complete.yaml's max_gen_toks
#: generate_until's batch size per export: 4 (lm-eval pads the prompts on the left), the same generations as alone
GENERATE_BATCH = {"rope": 4, "tape": 4, "extended": 4}
EXPORTS = {"rope": "export:rope", "tape": "export:tape", "extended": "export:llama+tape"}


def write_tasks(directory: Path) -> Path:
    """docs/lm-eval's tasks (posbench_text: loglikelihood_rolling; posbench_complete: generate_until, greedy, up
    to the first newline), their data files named by absolute path."""
    directory.mkdir(parents=True, exist_ok=True)
    for yaml in TASKS.glob("*.yaml"):
        (directory / yaml.name).write_text(yaml.read_text().replace("docs/lm-eval/", f"{TASKS}/"))
    assert "max_gen_toks: 8" in (TASKS / "posbench_complete.yaml").read_text()
    return directory


def test_every_lm_eval_metric_declares_its_aggregation_and_direction():
    """Each metric of docs/lm-eval's tasks says how lm-eval aggregates it and which way is better (without them
    every lm-eval run printed six warnings; issue 36, item 7)."""
    import yaml

    for path in TASKS.glob("*.yaml"):
        for metric in yaml.safe_load(path.read_text())["metric_list"]:
            assert {"aggregation", "higher_is_better"} <= set(metric), (path.name, metric)


class PosbenchSide:
    """An export's model as posbench itself runs it, and the export's tokenizer: the log-likelihood of a text
    after the BOS token (lm-eval's rolling window for a text shorter than the context) and greedy text."""

    def __init__(self, name: str, made: dict, directory: Path | None = None):
        from transformers import AutoTokenizer

        directory = made[EXPORTS[name]] if directory is None else directory
        self.tokenizer = AutoTokenizer.from_pretrained(str(directory), trust_remote_code=True)
        if name == "extended":
            from posbench.hf.adapter import HFCausalLM, HFModelConfig
            from posbench.hf.saving import load_extended

            model, method, _ = load_extended(made["extend:tape"] / "checkpoint" / "model")
            self.model = HFCausalLM(model, HFModelConfig(label="llama+tape", method="tape"), method).eval()
        else:
            from posbench.hf.export import load_export

            self.model, _ = load_export(directory)

    def loglikelihood(self, text: str) -> float:
        ids = torch.tensor([[self.tokenizer.bos_token_id, *self.tokenizer.encode(text)]])
        with torch.no_grad():
            logp = torch.log_softmax(self.model(ids).double(), dim=-1)
        return float(logp[0, :-1].gather(-1, ids[0, 1:, None]).sum())

    def complete(self, prompt: str) -> str:
        ids = torch.tensor([self.tokenizer.encode(prompt)])
        eos = self.tokenizer.eos_token_id
        new = self.model.generate(ids, MAX_GEN_TOKS, eos_id=eos)[0].tolist()      # the new tokens
        new = new[:new.index(eos)] if eos in new else new
        return self.tokenizer.decode(new, skip_special_tokens=True).split("\n")[0]


def run_lm_eval(directory: Path, tasks: Path, out: Path, batch: int,
                names: str = "posbench_text,posbench_complete") -> subprocess.Popen:
    # `python -m lm_eval` of the interpreter running the tests (the one importorskip checked), not whichever
    # `lm_eval` is first on PATH: a venv used without activating it has its own off PATH
    command = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
               f"pretrained={directory},trust_remote_code=True,dtype=float32", "--include_path", str(tasks),
               "--tasks", names, "--device", "cpu", "--batch_size", str(batch),
               "--output_path", str(out), "--log_samples"]
    env = {**os.environ, **OFFLINE, "HF_HOME": str(out / "hf-home"), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=out.parent)


@pytest.mark.slow  # lm-eval in a fresh process
def test_lm_eval_evaluates_a_rope_a_tape_and_an_extended_export_as_posbench_does(made, tmp_path):
    """``lm_eval --model hf`` (the command line, offline, a local task) on each export: loglikelihood_rolling
    gives bits per byte equal to posbench's own log-likelihood of the texts, and generate_until gives the text
    posbench's greedy decoding gives (batch sizes: GENERATE_BATCH)."""
    pytest.importorskip("lm_eval", reason="lm-evaluation-harness (the dev extra) is not installed")
    tasks = write_tasks(tmp_path / "tasks")
    running = {}
    for name in EXPORTS:                         # the three evaluations at once (most of each is start-up)
        (tmp_path / name).mkdir()
        running[name] = run_lm_eval(made[EXPORTS[name]], tasks, tmp_path / name, GENERATE_BATCH[name])
    for name, process in running.items():
        output, _ = process.communicate(timeout=600)
        assert process.returncode == 0, output[-3000:]
        assert "posbench_text" in output and "bits_per_byte" in output          # its table was printed
        assert "aggregation is not" not in output and "higher_is_better is not" not in output   # no warnings
        (results,) = (tmp_path / name).rglob("results_*.json")
        scores = json.loads(results.read_text())["results"]
        side = PosbenchSide(name, made)
        nats = sum(side.loglikelihood(t) for t in TEXTS)
        n_bytes = sum(len(t.encode("utf-8")) for t in TEXTS)
        expected = -nats / n_bytes / math.log(2)
        assert scores["posbench_text"]["bits_per_byte,none"] == pytest.approx(expected, rel=1e-4), name
        assert generations(tmp_path / name) == {p: side.complete(p) for p in PROMPTS}, name


def generations(out: Path) -> dict[str, str]:
    """generate_until's text per prompt, from lm-eval's logged samples under ``out``."""
    (samples,) = out.rglob("samples_posbench_complete_*.jsonl")
    return {json.loads(line)["doc"]["prompt"]: json.loads(line)["filtered_resps"][0]
            for line in samples.read_text().splitlines()}


# ---- item 2: padded batches -------------------------------------------------------------------------------------

@pytest.mark.slow  # lm-eval in a fresh process
def test_lm_eval_generates_a_tape_export_at_batch_size_4_as_at_batch_size_1(tmp_path, capsys):
    """generate_until on a TAPE export at batch size 4 (lm-eval pads the four prompts, of 6 to 20 bytes, on the
    left) gives the generations of each prompt alone: posbench's own greedy decoding of one prompt at a time,
    which lm-eval at batch size 1 gives too (the test above holds lm-eval's generations equal to posbench's). The
    model has large weights (``test_hf_export.fake_run``: init std 0.2, TAPE's updates perturbed), so its greedy
    text differs from prompt to prompt and a pad that reached a real token would show (the tiny trained runs above
    complete every prompt alike)."""
    pytest.importorskip("lm_eval", reason="lm-evaluation-harness (the dev extra) is not installed")
    from test_hf_export import export, fake_run

    directory = export(capsys, fake_run(tmp_path, "tape"), tmp_path / "tape")
    tasks = write_tasks(tmp_path / "tasks")
    (tmp_path / "batch4").mkdir()
    process = run_lm_eval(directory, tasks, tmp_path / "batch4", 4, "posbench_complete")
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output[-3000:]
    side = PosbenchSide("tape", {}, directory)
    alone = {prompt: side.complete(prompt) for prompt in PROMPTS}
    assert generations(tmp_path / "batch4") == alone and len(alone) == len(PROMPTS)
    assert len(set(alone.values())) > 1, alone


# ---- item 6: no deprecation warning -----------------------------------------------------------------------------

WARNINGS_SCRIPT = textwrap.dedent('''
    import sys, warnings
    for category in (DeprecationWarning, FutureWarning):          # posbench's own calls: an error
        warnings.filterwarnings("error", category=category, module=r"posbench\\b")
    import torch
    from posbench.cli import main
    llama, extended, tape_export, out = sys.argv[1:5]
    for argv in (["extend", "--model", llama, "--method", "tape", "--length", "128", "--data", "stdlib", "-p",
                  "tiny", "-q", "-o", out, "--set", "task.eval_tokens=512", "--set", "train.steps=1"],
                 ["run", "-t", "perplexity", "-p", "tiny", "--init", extended, "-q", "-o", out,
                  "--set", "model.max_seq_len=32", "--set", "task.eval_tokens=256", "--set", "task.protocols=chunks"],
                 ["run", "-t", "perplexity", "-p", "tiny", "--init", llama, "-q", "-o", out,
                  "--set", "model.max_seq_len=32", "--set", "task.eval_tokens=256", "--set", "task.protocols=chunks"]):
        assert main(argv) == 0, argv
    from transformers import AutoModelForCausalLM, AutoTokenizer
    for directory in (tape_export, extended + "/checkpoint/model"):
        tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=True)
        model = AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True)
        prompt = tokenizer(["def f(x):"], return_tensors="pt")
        for use_cache in (True, False):
            model.generate(**prompt, max_new_tokens=4, do_sample=False, use_cache=use_cache)
''')


@pytest.mark.slow  # a fresh process
def test_extend_llama_evaluations_and_a_tape_export_generate_without_a_deprecation_warning(made, tmp_path):
    """In a fresh process with the warnings a user sees (and posbench's own deprecated calls made errors): an
    extend run, perplexity of an extended and of a plain Llama, and transformers' generate (cached and not) on a
    TAPE export and a TAPE-extended model print no deprecation warning and never ask for remote code."""
    done = subprocess.run([sys.executable, "-c", WARNINGS_SCRIPT, str(made["llama"]), str(made["extend:tape"]),
                           str(made["export:tape"]), str(tmp_path / "out")], capture_output=True, text=True,
                          env={**os.environ, **OFFLINE}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout + done.stderr
    assert "deprecat" not in printed.lower(), printed[-3000:]
    assert "custom code" not in printed, printed[-3000:]
