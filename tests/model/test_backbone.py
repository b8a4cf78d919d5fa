"""The depth-recurrent backbone (docs/encodings.md, "Backbones"), derived independently of the release: the settings
``norm=layer``, ``norm_position=post``, ``mlp=geglu``, ``embedding_norm``, ``head_mlp``, ``recurrences`` /
``eval_recurrences``, ``input_injection``, ``state_std`` and ``init_scheme=deepnorm`` (ModelConfig), each against a
computation written here from its definition, and the default model unchanged. (tests/model/test_release_backbone.py
compares the whole model with the release's own code.)

(a) one post-norm LayerNorm GEGLU block, computed by hand from its weights (attention, the LayerNorm formula, exact
    GELU through erf); (b) the recurrence: the blocks run ``recurrences`` times, the normalised embeddings added at
    the entry of every pass, ``eval_recurrences`` in evaluation only; (c) the initial state: N(0, state_std) drawn
    at every training forward pass, zero at evaluation; (d) the DeepNorm init by its distribution (the sample std
    of each matrix within 5 standard errors, s / sqrt(2 (n - 1)) for a normal, of the formula; the mean within
    5 s / sqrt(n)); (e) every built-in encoding on the backbone with 2 recurrences: cached decoding equals
    recomputation and ``generate`` runs; (f) ``posbench run`` trains and evaluates an arithmetic run on the
    backbone (two encodings here, every one under ``-m slow``); (g) the default ModelConfig builds what it built
    before the backbone existed.

Tolerances: float64 by-hand comparisons within 1e-12 of the largest entry; float32 cache comparisons 1e-5
relative to the largest logit (``assert_close``); "differs" means a largest absolute difference above 1e-3.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from posbench.cli import main
from posbench.encodings import ENCODINGS
from posbench.model import ModelConfig, Transformer
from posbench.model.transformer import GatedMLP, RMSNorm

from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from encoding_helpers import BUILTIN, VOCAB, assert_close, digit_rich, task_context, tiny, tokens

pytestmark = pytest.mark.usefixtures("one_thread")

#: the release's depth-recurrent class in posbench's settings (ModelConfig's comment), at 2 recurrences
RECURRENT = dict(norm="layer", norm_eps=1e-12, norm_position="post", mlp="geglu", embedding_norm=True,
                 head_mlp=True, recurrences=2, input_injection=True, state_std=0.02, init_scheme="deepnorm")
EXACT, DIFFERS = 1e-12, 1e-3


def recurrent(encoding: str = "nope", *, dtype=torch.float32, perturb_norms: bool = True, **settings) -> Transformer:
    """A tiny model (encoding_helpers.tiny: width 32, 2 layers, 4 heads) on the recurrent backbone; its LayerNorms
    perturbed away from 1 and 0 so that a norm's weight or bias in the wrong place shows."""
    model = tiny(encoding, **{**RECURRENT, **settings}).to(dtype)
    if perturb_norms:
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, torch.nn.LayerNorm):
                    module.weight.copy_(1 + 0.2 * torch.randn(module.weight.shape, generator=g))
                    module.bias.copy_(0.2 * torch.randn(module.bias.shape, generator=g))
    return model


def close(actual: torch.Tensor, expected: torch.Tensor, tol: float = EXACT) -> None:
    scale = max(1.0, expected.abs().max().item())
    gap = (actual - expected).abs().max().item()
    assert gap <= tol * scale, gap


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# (a) one block by hand ------------------------------------------------------------------------------------------

def layer_norm(x: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias, the variance the biased one (over the last dimension)."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def gelu(x: torch.Tensor) -> torch.Tensor:
    """The exact GELU, x Phi(x) (not the tanh approximation)."""
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def geglu(mlp: GatedMLP, x: torch.Tensor) -> torch.Tensor:
    return (gelu(x @ mlp.gate.weight.T) * (x @ mlp.up.weight.T)) @ mlp.down.weight.T


def rope_by_hand(t: torch.Tensor, n: int) -> torch.Tensor:
    """Rotate-half RoPE, base 10000: pair (f, f + D/2) of position p turned by p 10000^(-2f/D). cos and sin are
    rounded to float32 as posbench's table is (encodings/base.py rope_cos_sin)."""
    d = t.shape[-1]
    angle = torch.arange(n, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64)
                                                                       / d)
    cos = angle.cos().float().to(t.dtype).repeat(1, 2)
    sin = angle.sin().float().to(t.dtype).repeat(1, 2)
    half = torch.cat((-t[..., d // 2:], t[..., :d // 2]), dim=-1)
    return t * cos + half * sin


def attention_by_hand(attn, x: torch.Tensor, rope: bool) -> torch.Tensor:
    """Causal softmax attention from the fused [q; k; v] projection (heads inside each) and the output map."""
    b, n, d = x.shape
    h, hd = attn.n_heads, attn.head_dim
    q, k, v = (x @ attn.qkv.weight.T).view(b, n, 3, h, hd).permute(2, 0, 3, 1, 4)     # each [b, h, n, hd]
    if rope:
        q, k = rope_by_hand(q, n), rope_by_hand(k, n)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v
    return y.transpose(1, 2).reshape(b, n, d) @ attn.out.weight.T


@pytest.mark.parametrize("encoding", ["nope", "rope"])
def test_a_post_norm_layernorm_geglu_block_by_hand(encoding):
    """x1 = LN_1(x + Attn(x)), out = LN_2(x1 + down(GELU(gate x1) * up x1)), in float64, within 1e-12."""
    model = recurrent(encoding, dtype=torch.float64).eval()
    block = model.blocks[0]
    assert isinstance(block.attn_norm, torch.nn.LayerNorm) and block.attn_norm.eps == 1e-12
    assert block.mlp.act is F.gelu
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    toks = tokens(2, 9)
    positions = torch.arange(9).expand(2, 9)
    with torch.no_grad():
        state = model.encoding.init_state(positions, toks, None)
        got, _ = block(x, state, positions, model.encoding)
        x1 = layer_norm(x + attention_by_hand(block.attn, x, encoding == "rope"), block.attn_norm)
        expected = layer_norm(x1 + geglu(block.mlp, x1), block.mlp_norm)
        close(got, expected)
        # the guards: pre-norm order, or the tanh GELU, would not pass
        pre = x + attention_by_hand(block.attn, layer_norm(x, block.attn_norm), encoding == "rope")
        pre = pre + geglu(block.mlp, layer_norm(pre, block.mlp_norm))
        assert gap(got, pre) > DIFFERS
        x1 = layer_norm(x + attention_by_hand(block.attn, x, encoding == "rope"), block.attn_norm)
        tanh_gelu = (F.gelu(x1 @ block.mlp.gate.weight.T, approximate="tanh") * (x1 @ block.mlp.up.weight.T))
        assert gap(expected, layer_norm(x1 + tanh_gelu @ block.mlp.down.weight.T, block.mlp_norm)) > 1e-9


def test_geglu_is_the_releases_glu_over_one_projection():
    """The release's GLU: one d -> 2 d_ff projection, ``x, gate = chunk(2)``, GELU(gate) * x: posbench's
    down(GELU(gate(x)) * up(x)) with that projection's rows [up; gate]."""
    mlp = GatedMLP(ModelConfig(d_model=16, d_ff=24, mlp="geglu")).double()
    x = torch.randn(3, 16, dtype=torch.float64)
    fused = x @ torch.cat((mlp.up.weight, mlp.gate.weight)).T
    first, second = fused.chunk(2, dim=-1)
    with torch.no_grad():
        close(mlp(x), (torch.nn.GELU()(second) * first) @ mlp.down.weight.T)


# (b) the recurrence by hand -------------------------------------------------------------------------------------

def forward_by_hand(model: Transformer, toks: torch.Tensor, passes: int, start: torch.Tensor | None = None,
                    inject: bool = True) -> torch.Tensor:
    """embed -> the encoding's embed -> LayerNorm = e; x = start (zero by default); ``passes`` times: x = x + e, then
    every block in turn (the encoding's state carried through); logits = lm_head(norm(head(x)))."""
    b, n = toks.shape
    pe = model.encoding
    positions = torch.arange(n).expand(b, n)
    state = pe.init_state(positions, toks, None)
    e = model.embed_norm(pe.embed(model.embed(toks), state))
    x = torch.zeros_like(e) if start is None else start
    if not inject:
        x = e
    for _ in range(passes):
        if inject:
            x = x + e
        for block in model.blocks:
            x, state = block(x, state, positions, pe)
    return model.lm_head(model.norm(model.head(x)))


@pytest.mark.parametrize("encoding", ["nope", "rope", "fire"])
def test_two_recurrences_are_the_blocks_twice_with_the_injection_at_each_entry(encoding):
    """Evaluation, float64: the model's logits equal the blocks run twice by hand, the normalised embeddings
    added at the entry of each pass; not one pass, nor two passes without re-injection."""
    model = recurrent(encoding, dtype=torch.float64).eval()
    toks = tokens(2, 10)
    with torch.no_grad():
        got = model(toks)
        close(got, forward_by_hand(model, toks, 2))
        assert gap(got, forward_by_hand(model, toks, 1)) > DIFFERS
        assert gap(got, forward_by_hand(model, toks, 2, inject=False)) > DIFFERS
    assert len(model.new_cache().layers) == 2 * 2


def test_eval_recurrences_are_used_in_evaluation_only():
    """recurrences=2, eval_recurrences=3: evaluation runs three passes, training two (state_std=0: a zero start);
    a KV cache holds 2 x 3 layers; ``generate`` decodes with three."""
    model = recurrent("rope", dtype=torch.float64, recurrences=2, eval_recurrences=3, state_std=0.0)
    toks = tokens(2, 10)
    with torch.no_grad():
        model.eval()
        close(model(toks), forward_by_hand(model, toks, 3))
        assert gap(model(toks), forward_by_hand(model, toks, 2)) > DIFFERS
        model.train()
        close(model(toks), forward_by_hand(model, toks, 2))
    assert model.config.depth == 3 and len(model.new_cache().layers) == 6
    prompt = toks[:, :5]
    new = model.generate(prompt, max_new_tokens=4)
    assert model.training                                       # generate restores the mode it found
    with torch.no_grad():
        model.eval()
        first = forward_by_hand(model, prompt, 3)[:, -1].argmax(-1)
    assert torch.equal(new[:, 0], first)


def test_fewer_eval_recurrences_than_training_ones():
    model = recurrent("nope", dtype=torch.float64, recurrences=3, eval_recurrences=1).eval()
    toks = tokens(2, 8)
    with torch.no_grad():
        close(model(toks), forward_by_hand(model, toks, 1))
    assert len(model.new_cache().layers) == 2 * 3                 # n_layers x max(recurrences, eval_recurrences)


def test_one_recurrence_from_a_zero_state_is_the_plain_forward_pass():
    """Injection onto a zero state with one pass adds the embeddings to zero: bitwise the model without it."""
    injected = recurrent("rope", recurrences=1, state_std=0.0).eval()
    plain = recurrent("rope", recurrences=1, input_injection=False, state_std=0.0).eval()
    plain.load_state_dict(injected.state_dict())
    toks = tokens(2, 10)
    with torch.no_grad():
        assert torch.equal(injected(toks), plain(toks))


# (c) the initial state ------------------------------------------------------------------------------------------

def test_training_draws_the_initial_state_from_n0_state_std_at_every_forward_pass():
    """state_std=0.02, training: the model's logits equal the by-hand pass started from randn * 0.02 drawn from the
    same generator state, and two forward passes differ; evaluation starts at zero, so it is deterministic."""
    model = recurrent("nope", dtype=torch.float64).train()
    toks = tokens(2, 10)
    with torch.no_grad():
        torch.manual_seed(11)
        got = model(toks)
        torch.manual_seed(11)
        e = model.embed_norm(model.embed(toks))
        start = torch.randn_like(e) * 0.02
        close(got, forward_by_hand(model, toks, 2, start=start))
        assert gap(got, model(toks)) > DIFFERS                  # a second draw (measured 0.037)
        model.eval()
        a, b = model(toks), model(toks)
        assert torch.equal(a, b)
        close(a, forward_by_hand(model, toks, 2))


def test_state_std_zero_or_no_injection_is_deterministic_in_training():
    toks = tokens(2, 10)
    for settings in ({"state_std": 0.0}, {"input_injection": False, "state_std": 0.0}):
        model = recurrent("nope", **settings).train()
        with torch.no_grad():
            assert torch.equal(model(toks), model(toks)), settings


# (d) the DeepNorm init --------------------------------------------------------------------------------------------

def assert_normal(w: torch.Tensor, std: float, what: str) -> None:
    x = w.detach().double().flatten()
    n = x.numel()
    assert abs(x.mean().item()) <= 5 * std / math.sqrt(n), (what, x.mean().item(), std, n)
    assert abs(x.std().item() - std) <= 5 * std / math.sqrt(2 * (n - 1)), (what, x.std().item(), std, n)


def xavier(fan_out: int, fan_in: int, gain: float) -> float:
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


@pytest.mark.parametrize("encoding", ["rope", "abacus"])
def test_deepnorm_init_by_its_distribution(encoding):
    """Width 128, 4 layers, recurrences 2 (eval_recurrences 6 does not count): L = 8, g = (8 L)^-1/4 = 1/sqrt(8).
    Queries and keys: Xavier normal at gain 1 on d x d; values and the output map at g; gate and up at g on the
    release's one d -> 2 d_ff matrix (fan_out 2 d_ff); down at g; the head MLP likewise; the LM head at g; token
    embeddings N(0, d^-1/2), and Abacus's table drawn like them; every LayerNorm at weight 1, bias 0."""
    d, layers, d_ff, vocab = 128, 4, 256, 64
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=vocab, d_model=d, n_layers=layers, n_heads=4, d_ff=d_ff,
                                    max_seq_len=64, encoding=encoding, encoding_options=task_context(encoding),
                                    **{**RECURRENT, "eval_recurrences": 6}))
    g = (8 * layers * 2) ** -0.25
    for i, block in enumerate(model.blocks):
        q, k, v = block.attn.qkv.weight.view(3, d, d)
        assert_normal(q, xavier(d, d, 1.0), f"{i}.q")
        assert_normal(k, xavier(d, d, 1.0), f"{i}.k")
        assert_normal(v, xavier(d, d, g), f"{i}.v")
        assert_normal(block.attn.out.weight, xavier(d, d, g), f"{i}.out")
    for name, mlp in [(f"blocks.{i}.mlp", b.mlp) for i, b in enumerate(model.blocks)] + [("head", model.head)]:
        assert_normal(mlp.gate.weight, xavier(2 * d_ff, d, g), f"{name}.gate")
        assert_normal(mlp.up.weight, xavier(2 * d_ff, d, g), f"{name}.up")
        assert_normal(mlp.down.weight, xavier(d, d_ff, g), f"{name}.down")
    assert_normal(model.lm_head.weight, xavier(vocab, d, g), "lm_head")
    assert_normal(model.embed.weight, d ** -0.5, "embed")
    if encoding == "abacus":
        assert_normal(model.encoding.table.weight, d ** -0.5, "abacus table")
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == 2 * layers + 2                            # two per block, the embeddings', the final
    for norm in norms:
        assert torch.equal(norm.weight, torch.ones(d)) and torch.equal(norm.bias, torch.zeros(d))


def test_deepnorm_leaves_an_encodings_own_parameters_alone():
    """FIRE's MLP keeps its own (PyTorch default) init under init_scheme=deepnorm: the same values as under init_scheme=normal."""
    a = tiny("fire", **{**RECURRENT, "init_scheme": "deepnorm"}, seed=3)
    b = tiny("fire", **{**RECURRENT, "init_scheme": "normal"}, seed=3)
    for (name, p), (_, q) in zip(a.encoding.named_parameters(), b.encoding.named_parameters()):
        assert torch.equal(p, q), name


# (e) every encoding: cached decoding on the recurrent backbone ----------------------------------------------------

@pytest.mark.parametrize("encoding", BUILTIN)
def test_cached_decoding_equals_recomputation_on_the_recurrent_backbone(encoding):
    """2 recurrences (a cache of 2 x 2 layers), evaluation: a prefix, several tokens, one token and the rest through
    one ``new_cache()`` give the logits of the whole sequence at once (1e-5 of the largest logit, float32);
    ``generate`` with the cache gives the tokens it gives without."""
    passes = 1 if ENCODINGS[encoding].one_pass else 2                  # TAPE runs on one pass only
    model = recurrent(encoding, max_seq_len=32, recurrences=passes).eval()
    x = digit_rich(2, 14) if encoding == "abacus" else tokens(2, 14)
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache()
        parts = [model(x[:, :6], cache=cache), model(x[:, 6:10], cache=cache), model(x[:, 10:11], cache=cache),
                 model(x[:, 11:], cache=cache)]
    assert len(cache.layers) == 2 * passes and cache.length == 14
    assert_close(torch.cat(parts, dim=1), full)
    prompt = x[:, :6]
    cached = model.generate(prompt, max_new_tokens=6)
    assert cached.shape == (2, 6)
    assert torch.equal(cached, model.generate(prompt, max_new_tokens=6, use_cache=False))


@pytest.mark.parametrize("encoding", ["rope", "fire", "abacus"])
def test_cached_decoding_with_more_eval_recurrences(encoding):
    model = recurrent(encoding, max_seq_len=32, eval_recurrences=3).eval()
    x = digit_rich(2, 12) if encoding == "abacus" else tokens(2, 12)
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache()
        parts = [model(x[:, :7], cache=cache), model(x[:, 7:8], cache=cache), model(x[:, 8:], cache=cache)]
    assert len(cache.layers) == 6
    assert_close(torch.cat(parts, dim=1), full)


# (f) an arithmetic run on the backbone ---------------------------------------------------------------------------

BACKBONE_SETS = ["model.norm=layer", "model.norm_position=post", "model.mlp=geglu", "model.embedding_norm=true",
                 "model.head_mlp=true", "model.input_injection=true", "model.state_std=0.02",
                 "model.init_scheme=deepnorm", "model.norm_eps=1e-12"]


def evaluation(passes: int) -> int:
    """The recurrences at evaluation: one more than training's, or (one-pass encodings) as training."""
    return passes + 1 if passes > 1 else 0


def run_backbone(capsys, tmp_path, encodings: list[str], passes: int = 2) -> list[dict]:
    """``posbench run -e ENCODINGS -t arithmetic -p tiny`` on the backbone (``passes`` recurrences in training, one
    more at evaluation), 4 steps, 2 samples per cell; the results, in the order of ``encodings``."""
    args = ["run", "-e", ",".join(encodings), "-t", "arithmetic", "-p", "tiny", "-q", "--out", str(tmp_path)]
    for setting in BACKBONE_SETS + [f"model.recurrences={passes}", f"model.eval_recurrences={evaluation(passes)}",
                                    "steps=4", "task.eval_samples=2"]:
        args += ["--set", setting]
    code = main(args)
    err = capsys.readouterr().err
    assert code == 0, err
    results = []
    for encoding in encodings:
        (path,) = tmp_path.glob(f"arithmetic/{encoding}/*/result.json")
        results.append((path.parent, json.loads(path.read_text())))
    return results


def check_run(run_dir, result: dict, passes: int = 2) -> None:
    from safetensors.torch import load_file

    assert result["status"] == "complete"
    recorded = result["config"]["model_config"]
    for key, value in {"norm": "layer", "norm_position": "post", "mlp": "geglu", "embedding_norm": True,
                       "head_mlp": True, "recurrences": passes, "eval_recurrences": evaluation(passes),
                       "input_injection": True,
                       "state_std": 0.02, "init_scheme": "deepnorm", "norm_eps": 1e-12}.items():
        assert recorded[key] == value, key
    assert result["training"]["steps"] == 4 and math.isfinite(result["training"]["final_loss"])
    accuracy = result["metrics"]["accuracy"]
    assert accuracy["n"] == result["n_predictions"] > 0 and 0 <= accuracy["value"] <= 100     # percent
    # the checkpoint holds the backbone's modules and loads into the model the record describes
    model = Transformer(ModelConfig(**recorded))
    weights = load_file(str(run_dir / "checkpoint" / "model.safetensors"))
    assert {"embed_norm.weight", "embed_norm.bias", "head.gate.weight", "norm.bias"} <= set(weights)
    model.load_state_dict(weights, strict=True)


def test_an_arithmetic_run_on_the_backbone(capsys, tmp_path):
    """Abacus (digit ids from the task) on two recurrences, and TAPE (a position state through the layers) on one:
    the recurrence TAPE runs on."""
    for run_dir, result in run_backbone(capsys, tmp_path / "two", ["abacus"]):
        check_run(run_dir, result)
    for run_dir, result in run_backbone(capsys, tmp_path / "one", ["tape"], passes=1):
        check_run(run_dir, result, passes=1)


def test_an_encoding_of_one_pass_refuses_more_recurrences_in_one_line(capsys, tmp_path):
    """TAPE discards its state after the last layer (so that layer's update is frozen and skipped): a second pass
    would need it, so a model of more recurrences is refused, with exit code 2 and nothing written."""
    code = main(["run", "-e", "tape", "-t", "arithmetic", "-p", "tiny", "-q", "--out", str(tmp_path),
                 "--set", "model.recurrences=2"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "runs on one pass of the blocks" in err and not list(tmp_path.glob("arithmetic/tape/*"))


@pytest.mark.slow
def test_an_arithmetic_run_on_the_backbone_for_every_encoding(capsys, tmp_path):
    looped = [name for name in BUILTIN if not ENCODINGS[name].one_pass]
    for run_dir, result in run_backbone(capsys, tmp_path / "two", looped):
        check_run(run_dir, result)
    for run_dir, result in run_backbone(capsys, tmp_path / "one", [n for n in BUILTIN if n not in looped], passes=1):
        check_run(run_dir, result, passes=1)


# (g) the default model is what it was -----------------------------------------------------------------------------

DEFAULT_PARAMETERS = [
    ("embed.weight", (256, 128)),
    *[(f"blocks.{i}.{name}", shape) for i in range(2) for name, shape in [
        ("attn_norm.weight", (128,)), ("attn.qkv.weight", (384, 128)), ("attn.out.weight", (128, 128)),
        ("mlp_norm.weight", (128,)), ("mlp.gate.weight", (512, 128)), ("mlp.up.weight", (512, 128)),
        ("mlp.down.weight", (128, 512))]],
    ("norm.weight", (128,)),
    ("lm_head.weight", (256, 128)),
]


def test_the_default_model_builds_what_it_built_before():
    """ModelConfig() with rope: the same parameters (names, shapes, order) as before the backbone settings, RMSNorm
    without a bias, SwiGLU, no ``embed_norm`` or ``head``, one pass and a cache of n_layers layers; its forward
    pass is the pre-norm decoder, computed here by hand (float64, within 1e-12)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig())
    assert [(n, tuple(p.shape)) for n, p in model.named_parameters()] == DEFAULT_PARAMETERS
    assert not hasattr(model, "embed_norm") and not hasattr(model, "head")
    assert all(isinstance(m, RMSNorm) for m in (model.norm, *[b.attn_norm for b in model.blocks],
                                                *[b.mlp_norm for b in model.blocks]))
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
    assert all(b.mlp.act is F.silu and not b.post_norm for b in model.blocks)
    assert len(model.new_cache().layers) == 2 and model.config.depth == 1
    assert_normal(model.blocks[0].attn.qkv.weight, 0.02, "qkv")                  # N(0, init_std), as before
    assert_normal(model.embed.weight, 0.02, "embed")

    small = Transformer(ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, encoding="rope",
                                    init_std=0.2, attention="eager")).double().eval()

    def rms(x, norm):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight

    toks = tokens(2, 9)
    with torch.no_grad():
        x = small.embed(toks)
        for block in small.blocks:
            x = x + attention_by_hand(block.attn, rms(x, block.attn_norm), rope=True)
            h = rms(x, block.mlp_norm)
            x = x + (F.silu(h @ block.mlp.gate.weight.T) * (h @ block.mlp.up.weight.T)) @ block.mlp.down.weight.T
        close(small(toks), small.lm_head(rms(x, small.norm)))


def test_a_looped_model_through_transformers_forward_and_generate():
    """The Hugging Face wrapper of a model of 2 recurrences (3 at evaluation): a cache made from the config (by the
    forward pass or by transformers' generate) has n_layers layers, the model needs n_layers x 3; both give the
    model's own logits (exactly) and greedy tokens."""
    from posbench.hf.modeling import PosbenchConfig, PosbenchForCausalLM

    cfg = ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, max_seq_len=16, encoding="rope",
                      **{**RECURRENT, "eval_recurrences": 3})
    torch.manual_seed(0)
    hf = PosbenchForCausalLM(PosbenchConfig.from_model_config(cfg, bos_token_id=1, eos_token_id=2,
                                                              pad_token_id=0)).eval()
    x = tokens(2, 9)
    with torch.no_grad():
        assert torch.equal(hf(x).logits, hf.model(x))
        out = hf.generate(x, max_new_tokens=5, do_sample=False)
        assert torch.equal(out[:, 9:], hf.model.generate(x, 5))


def test_settings_that_would_do_nothing_are_refused():
    """A setting accepted but ignored would be recorded and split compare's rows for nothing: state_std without
    input_injection, and Abacus's fire_init_l without its FIRE bias, are each one OptionError."""
    from posbench.options import OptionError

    with pytest.raises(OptionError, match="input_injection"):
        ModelConfig(state_std=0.02)
    with pytest.raises(OptionError, match="attention_bias=fire"):
        tiny("abacus", encoding_options={"fire_init_l": 512.0})
