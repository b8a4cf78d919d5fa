"""Issue 59, items 11 to 14: what an export and the command line say, tried as a new user would.

11. An exported model of any encoding but RoPE (model_type 'posbench') returns its attention weights for
    ``output_attentions=True``, as a Llama does: one ``[batch, heads, queries, keys]`` tensor per block, the
    softmax of posbench's own scores and bias (checked against the scores the ``observer`` hook sees), zero on the
    keys a query does not see (later ones, pads); the logits are the same with and without them.
12. An unknown flag's suggestion comes from the options of the command line being read, its settings flags too:
    ``--step`` is ``--steps`` and ``--learning-rate`` is ``--lr`` (not ``--task``, ``--log``).
13. A name read from a run's record (``export``, ``analyze``, ``run --resume``) that no registry holds says, as
    ``check`` does, that it may be a plugin's and how to name one (``posbench.registry.plugin_hint``).
14. ``posbench --version`` prints the version and the commit posbench runs from, exit 0.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from cli_helpers import cli
from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from posbench.cli import main
from tests.hf.test_hf_export import fake_run     # a run directory of a tiny model with large weights

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]


def one_error(capsys, *argv) -> str:
    code, _, err = cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    return lines[0]


# ---- 11: output_attentions of a posbench export -----------------------------------------------------------------

def observed(model) -> list[tuple]:
    """What each attention call of the posbench ``Transformer`` ``model`` scores, through its ``observer`` hook."""
    seen: list[tuple] = []
    for block in model.blocks:
        block.attn.observer = lambda *args: seen.append(args)
    return seen


def softmax_of(q, k, bias, q_pos, k_pos) -> torch.Tensor:
    """The attention weights written out, in float64: scores over sqrt(D), plus the bias, causal, softmax."""
    from posbench.model.bias import ScoreBias

    scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])
    if isinstance(bias, ScoreBias):
        bias = bias.materialise(q.shape[1], q_pos, k_pos)
    if bias is not None:
        scores = scores + bias.double()
    nq, nk = q.shape[-2], k.shape[-2]
    visible = torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq)
    return scores.masked_fill(~visible, float("-inf")).softmax(-1)


def test_an_exported_alibi_model_returns_its_attention_weights(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    run = fake_run(tmp_path, "alibi", d_model=32)
    code, _, err = cli(capsys, "export", run, tmp_path / "out")
    assert code == 0, err
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), trust_remote_code=True)
    x = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = hf(input_ids=x)
        seen = observed(hf.model)
        out = hf(input_ids=x, output_attentions=True)
    assert plain.attentions is None                                   # not asked for: none, as a Llama
    assert torch.equal(out.logits, plain.logits)                      # asking changes nothing else
    assert isinstance(out.attentions, tuple) and len(out.attentions) == 2 == len(seen)
    for weights, args in zip(out.attentions, seen):
        assert weights.shape == (2, 4, 9, 9) and weights.dtype == torch.float32
        assert torch.allclose(weights.double(), softmax_of(*args), atol=1e-6, rtol=0)
        assert torch.all(weights.triu(1) == 0)                       # no later key
    hf.config.output_attentions = True                                # the config's switch, as transformers reads it
    with torch.no_grad():
        assert len(hf(input_ids=x).attentions) == 2
        steps = hf.generate(x, max_new_tokens=3, min_new_tokens=3, do_sample=False, output_attentions=True,
                            return_dict_in_generate=True).attentions
    assert [tuple(step[0].shape) for step in steps] == [(2, 4, 9, 9), (2, 4, 1, 10), (2, 4, 1, 11)]


@pytest.mark.parametrize("encoding, options", [("t5", {}), ("cope", {}), ("tape", {}), ("nope", {}),
                                               ("alibi", {"recurrences": 2})])
def test_every_encoding_returns_the_weights_of_its_own_scores(encoding, options):
    """A relative table (T5), a bias computed from q and k (CoPE), TAPE's rotated q and k, no bias at all, and a
    looped model (one tensor per block and pass), padded on the left as lm-eval pads."""
    from posbench.hf.modeling import PosbenchConfig, PosbenchForCausalLM

    torch.manual_seed(0)
    hf = PosbenchForCausalLM(PosbenchConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, max_seq_len=64,
                                            encoding=encoding, init_std=0.2, **options)).eval()
    x = torch.randint(1, 64, (2, 8), generator=torch.Generator().manual_seed(2))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8])
    calls = 2 * options.get("recurrences", 1)
    with torch.no_grad():
        seen = observed(hf.model)
        out = hf(input_ids=x, output_attentions=True, use_cache=False)
        assert torch.equal(out.logits, hf(input_ids=x, use_cache=False).logits)
        padded = hf(input_ids=x, attention_mask=mask, output_attentions=True, use_cache=False).attentions
        alone = hf(input_ids=x[:1, 2:], output_attentions=True, use_cache=False).attentions
    assert len(out.attentions) == calls and len(seen) == 4 * calls             # four forward passes
    for weights, args in zip(out.attentions, seen[:calls]):
        assert torch.allclose(weights.double(), softmax_of(*args), atol=1e-6, rtol=0)
    for weights, own in zip(padded, alone):         # a padded row's real tokens: as alone, nothing on the pads
        assert torch.all(weights[0, :, 2:, :2] == 0)
        assert torch.allclose(weights[0, :, 2:, 2:], own[0], atol=1e-6, rtol=0)


def test_the_forward_is_unchanged_unless_weights_are_asked_for():
    """Nothing is computed, and no list kept, unless asked for; the observer hook is still called."""
    from posbench.hf.modeling import PosbenchConfig, PosbenchForCausalLM

    torch.manual_seed(0)
    hf = PosbenchForCausalLM(PosbenchConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, encoding="alibi"))
    x = torch.randint(0, 64, (1, 6))
    with torch.no_grad():
        seen = observed(hf.model)
        hf(input_ids=x, output_attentions=True)
        assert all(block.attn.weights is None for block in hf.model.blocks)
        assert len(seen) == 2
        assert torch.equal(hf(input_ids=x).logits, hf.model(x))


# ---- 12: an unknown flag's suggestion --------------------------------------------------------------------------

RUN = ("run", "-e", "rope", "-t", "arithmetic")


@pytest.mark.parametrize("argv, meant", [
    ((*RUN, "--step", "100"), ["--steps"]),
    ((*RUN, "--learning-rate", "1e-3"), ["--lr"]),
    ((*RUN, "--learning_rate", "1e-3"), ["--lr"]),
    ((*RUN, "--num-steps", "3"), ["--steps"]),
    ((*RUN, "--bs", "3"), ["--batch-size"]),
    ((*RUN, "--seq-len", "3"), ["--max-seq-len"]),
    ((*RUN, "--rope-thet", "3"), ["--rope-theta"]),                   # the chosen encoding's flag
    ((*RUN, "--results", "x"), ["--out"]),                            # issue 48: what the help says it is
    (("bench", "--timed-step", "3"), ["--timed-steps"]),
    (("export", "--forc", "a", "b"), ["--force"]),                    # a command without settings flags
    (("--plugin", "x.py", "ls"), ["--plugins"]),
])
def test_an_unknown_flag_names_the_flags_of_its_command_line_it_may_mean(capsys, argv, meant):
    line = one_error(capsys, *argv)
    assert "(Possible options: " in line, line
    assert line.split("(Possible options: ")[1].split(")")[0].split(", ") == meant


def test_the_suggestion_depends_on_the_encodings_chosen(capsys):
    assert "(Possible options: --theta)" in one_error(capsys, *RUN, "--thet", "5")
    assert "--theta" not in one_error(capsys, "run", "-e", "alibi", "-t", "arithmetic", "--thet", "5")


# ---- 13: a plugin's name read from a record --------------------------------------------------------------------

@pytest.fixture(scope="module")
def plugin_run(tmp_path_factory) -> Path:
    """A finished tiny run whose record names 'learned' (docs/extending.md's plugin encoding), read here without
    the plugin: an ALiBi run with its encoding renamed in config.json, result.json and the checkpoint."""
    root = tmp_path_factory.mktemp("plugin")
    assert main(["run", "-e", "alibi", "-t", "arithmetic", "-p", "tiny", "--steps", "2", "-q", "-o", str(root),
                 "--set", "task.eval_samples=2", "--set", "train.threads=1"]) == 0
    (run,) = (root / "arithmetic" / "alibi").iterdir()
    for name in ("config.json", "result.json", "checkpoint/model_config.json"):
        path = run / name
        path.write_text(json.dumps(json.loads(path.read_text())).replace('"alibi"', '"learned"'))
    return run


def says_plugins(line: str) -> None:
    from posbench.registry import plugin_hint

    assert "unknown encoding 'learned'" in line and plugin_hint() in line, line


def test_export_of_a_plugins_run_without_it_names_plugins(plugin_run, tmp_path, capsys):
    says_plugins(one_error(capsys, "export", plugin_run, tmp_path / "out"))
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_every_command_that_reads_the_name_from_a_record_names_plugins(plugin_run, tmp_path, capsys):
    says_plugins(one_error(capsys, "analyze", plugin_run, "--factors", "1", "--tokens", "8"))
    unfinished = tmp_path / "unfinished"
    shutil.copytree(plugin_run, unfinished)
    (unfinished / "result.json").unlink()
    says_plugins(one_error(capsys, "run", "--resume", unfinished))
    says_plugins(one_error(capsys, "run", "-e", "learned", "-t", "arithmetic", "--dry-run"))     # typed: the same


def test_check_and_the_registry_give_the_same_hint(capsys):
    from posbench.registry import plugin_hint

    assert plugin_hint("check learned") in one_error(capsys, "check", "learned")


# ---- 14: --version -----------------------------------------------------------------------------------------------

def test_version_prints_the_version_and_the_commit(capsys):
    from importlib.metadata import version

    import posbench

    code, out, err = cli(capsys, "--version")
    assert code == 0 and err == "", err
    (line,) = out.strip().splitlines()
    assert line.startswith(f"posbench {posbench.__version__} from {Path(posbench.__file__).resolve().parent} (")
    assert posbench.__version__ == version("posbench")                 # what pip installed, what pyproject says
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:                                           # a checkout: its commit
        assert f"(commit {head.stdout.strip()}" in line
    else:
        assert "no commit known" in line
    assert "--version" in cli(capsys, "--help")[1]
