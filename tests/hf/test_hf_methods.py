"""The extension methods (posbench.hf.methods) on tiny random LlamaConfig models: what conversion does to
the logits, what trains (counts against formulas, and what one step changes), S²-Attn against a dense
reference, save/load, and cached generation; YaRN's and dynamic NTK's frequencies against a derivation written
here from the papers' formulas.

Tolerances: float32; "equal" is |a - b| <= 1e-5 |b| + 1e-5 max(1, max|b|) (``encoding_helpers.assert_close``)
unless a test says bitwise. Frequencies: the model's float32 table against a float64 derivation, relative
2e-6 (float32 rounding of b^(-2d/D) and of the blend).
"""

from __future__ import annotations

import copy
import math
import re

import numpy as np
import pytest
import torch

from encoding_helpers import assert_close, one_thread  # noqa: F401 (a fixture)
from posbench.data.batch import Batch
from posbench.hf.adapter import HFCausalLM, HFModelConfig
from posbench.hf.methods import METHODS, apply_method, embedding_and_norm_count, make_method
from posbench.train import TrainConfig, train
from posbench.hf.rope import llama_of
from posbench.hf.s2attn import s2_attention
from posbench.hf.tiny import tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 61
ALL = ["tape", "lora", "longlora", "theta"]


def trainable_count(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def llama(kv_heads=None, layers=2, seed=0, attention="sdpa"):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config(VOCAB, layers=layers, heads=4, kv_heads=kv_heads, max_positions=32,
                                        attention=attention, initializer_range=0.2)).eval()


def llama_with_rope(original, rope_parameters):
    """The same weights in a Llama whose config has ``rope_parameters`` (built independently of posbench.hf)."""
    from transformers import LlamaForCausalLM

    cfg = copy.deepcopy(original.config)
    cfg.rope_parameters = dict(rope_parameters)
    model = LlamaForCausalLM(cfg).eval()
    model.load_state_dict(original.state_dict())
    return model


def tokens(batch=2, n=16, seed=3):
    return torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))


def logits(model, x):
    with torch.no_grad():
        return model(input_ids=x).logits


def extended(name, original=None, scale=2.0, length=64, **options):
    original = original if original is not None else llama()
    return apply_method(copy.deepcopy(original), make_method(name, options), scale, length).eval()


# ---- converted, untrained ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_unscaled_conversion_keeps_the_logits(name):
    """scale 1 (and, for theta, theta left at the model's own): LoRA's B and TAPE's updates start at zero."""
    original = llama()
    options = {"theta": 10000.0} if name == "theta" else {}
    assert_close(logits(extended(name, original, scale=1.0, length=32, **options), tokens()),
                 logits(original, tokens()))


@pytest.mark.parametrize("name", ALL)
def test_interpolation_and_theta_change_the_logits_as_their_rope_config_says(name):
    """scale 2 gives the logits of the same Llama with rope {linear, factor 2}; theta adds rope_theta 1e6."""
    original = llama()
    x = tokens(n=24)
    rope = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6 if name == "theta" else 10000.0}
    model = extended(name, original)
    assert llama_of(model).config.rope_parameters == rope
    assert_close(logits(model, x), logits(llama_with_rope(original, rope), x))
    assert (logits(model, x) - logits(original, x)).abs().max() > 1e-2           # interpolation acts
    if name == "theta":
        lora = extended("lora", original)
        assert (logits(model, x) - logits(lora, x)).abs().max() > 1e-2           # and theta too


def test_longlora_trains_with_s2_attention_and_evaluates_with_full_attention():
    from posbench.hf.s2attn import S2_ATTENTION

    original = llama()
    model = extended("longlora", original)
    model.set_attn_implementation(S2_ATTENTION)
    x = tokens(n=16)
    full = logits(extended("lora", original), x)
    assert_close(logits(model.eval(), x), full)
    model.train()
    sparse = logits(model, x)
    # the first group (4 tokens) of the unshifted heads is the same; beyond it S²-Attn differs
    assert (sparse[:, 8:] - full[:, 8:]).abs().max() > 1e-3


# ---- S²-Attn against a dense reference ------------------------------------------------------------------
def dense_s2_reference(q, k, v, ratio):
    """Softmax attention in float64 with an explicit mask: j <= i and i, j in the same group, where the groups
    are [0, G), [G, 2G), ... for the first half of the heads and [0, G/2), [G/2, 3G/2), ... for the rest."""
    b, h, n, d = q.shape
    g = int(n * ratio)
    i = torch.arange(n)
    out = torch.empty(b, h, n, v.shape[-1], dtype=torch.float64)
    for head in range(h):
        group = i // g if head < h // 2 else (i + g // 2) // g
        allowed = (i[None, :] <= i[:, None]) & (group[None, :] == group[:, None])
        scores = q[:, head].double() @ k[:, head].double().transpose(-1, -2) / math.sqrt(d)
        out[:, head] = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v[:, head].double()
    return out


@pytest.mark.parametrize("n,ratio", [(16, 0.25), (24, 0.25), (16, 0.5)])
def test_s2_attention_equals_the_dense_masked_reference(n, ratio):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, n, 8, generator=gen) for _ in range(3))
    assert_close(s2_attention(q, k, v, ratio).double(), dense_s2_reference(q, k, v, ratio))


def test_s2_attention_is_causal():
    """LongLoRA's roll lets the first G/2 tokens of the shifted heads see the last G/2; here nothing sees a
    later token: changing the last token's key and value changes no earlier output."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 4, 16, 8, generator=gen) for _ in range(3))
    k2, v2 = k.clone(), v.clone()
    k2[:, :, -1] += 5.0
    v2[:, :, -1] += 5.0
    torch.testing.assert_close(s2_attention(q, k2, v2)[:, :, :-1], s2_attention(q, k, v)[:, :, :-1],
                               rtol=0, atol=0)


# ---- what trains ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_trainable_counts_match_their_formulas(name, kv_heads):
    original = llama(kv_heads=kv_heads, layers=3)
    method = make_method(name)
    model = apply_method(copy.deepcopy(original), method, 2.0, 64)
    c = original.config
    d, h, kvh, layers, v = c.hidden_size, 4, kv_heads, 3, VOCAB
    dh = d // h
    embeddings_norms = v * d + (2 * layers + 1) * d
    assert embedding_and_norm_count(c) == embeddings_norms
    if name == "tape":
        i = 4 * h                                                   # position_size default: 4 x heads
        per_layer = d * i + 2 * h * i + h * h                       # x_proj, up/down_proj, the H x H gate
        assert method.added_formula(c) == layers * per_layer
        expected_trainable = (layers - 1) * per_layer + embeddings_norms     # the last layer's is frozen
    else:
        r = 8
        per_layer = r * (d + h * dh) + 2 * r * (d + kvh * dh) + r * (h * dh + d)   # q, k, v, o: r x (in + out)
        assert method.added_formula(c) == layers * per_layer
        expected_trainable = layers * per_layer + embeddings_norms
    added = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in original.parameters())
    assert added == method.added_formula(c)
    assert trainable_count(model) == expected_trainable == method.trainable_formula(c)
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert not any(n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                               "gate_proj.weight", "up_proj.weight", "down_proj.weight", "lm_head.weight"))
                   and ".tape." not in n for n in names)


class RandomTokens:
    """A resumable stream of random token windows for the engine."""

    def __init__(self, n=16):
        self.n, self.index = n, 0

    def next_batch(self, batch_size):
        rng = np.random.default_rng(self.index)
        self.index += 1
        x = torch.as_tensor(rng.integers(0, VOCAB, size=(batch_size, self.n + 1)))
        return Batch(x[:, :-1], x[:, 1:])

    def state_dict(self):
        return {"index": self.index}

    def load_state_dict(self, state):
        self.index = state["index"]


def train_steps(model, method, steps=2):
    from posbench.hf.s2attn import S2_ATTENTION

    if method.training_attention():
        model.set_attn_implementation(S2_ATTENTION) if not hasattr(model, "get_base_model") else \
            model.get_base_model().set_attn_implementation(S2_ATTENTION)
    adapter = HFCausalLM(model, HFModelConfig(label=f"llama+{method.name}", method=method.name), method)
    train(adapter, RandomTokens(), TrainConfig(steps=steps, batch_size=2, lr=1e-2, warmup_steps=0,
                                                             weight_decay=0.0, log_every=1))
    if method.training_attention():
        (model.get_base_model() if hasattr(model, "get_base_model") else model).set_attn_implementation("sdpa")
    return adapter.eval()


@pytest.mark.parametrize("name", ALL)
def test_training_changes_only_what_should_train(name):
    method = make_method(name)
    model = extended(name)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    train_steps(model, method, steps=2)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed <= trainable, sorted(changed - trainable)
    frozen_tape = {n for n in trainable if ".layers.1.tape." in n}
    assert not frozen_tape                               # the last layer's TAPE parameters do not train
    # everything trainable moved: the method's tensors, embeddings (rows of tokens seen), every norm
    assert trainable - changed == set(), sorted(trainable - changed)


# ---- save / load, cached generation --------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_save_and_load_give_identical_logits_and_cached_generation_is_exact(name, tmp_path):
    from posbench.hf.saving import load_extended, save_extended
    from posbench.hf.tiny import tiny_tokenizer

    method = make_method(name)
    adapter = train_steps(extended(name), method, steps=2)     # non-zero LoRA B / TAPE updates
    x = tokens(n=20)
    expected = logits(adapter.hf, x)
    tokenizer = type("Tok", (), {"hf": tiny_tokenizer()})()
    save_extended(adapter.hf, method, tmp_path / "model", {"label": f"llama+{name}", "scale": 2.0, "length": 64},
                  tokenizer)
    with pytest.raises(Exception, match="never overwritten"):
        save_extended(adapter.hf, method, tmp_path / "model", {}, tokenizer)
    model, loaded_method, meta = load_extended(tmp_path / "model")
    assert loaded_method.name == name and meta["length"] == 64 and meta["llama"]["max_position_embeddings"] == 64
    assert not any(m.training for m in model.modules())      # loaded for evaluation, as from_pretrained does
    assert torch.equal(logits(model, x), expected)            # bitwise: same tensors, same operations
    reloaded = HFCausalLM(model, HFModelConfig(label=meta["label"], method=name), loaded_method).eval()
    prompt = tokens(2, 6, seed=9)
    assert torch.equal(reloaded.generate(prompt, 8, use_cache=True), reloaded.generate(prompt, 8, use_cache=False))


def test_engine_checkpoints_hold_only_what_trains():
    """The adapter's state dict (what engine checkpoints save) is the trainable tensors plus TAPE's frozen last
    layer; loading it into a fresh conversion restores the trained model's logits."""
    method = make_method("tape")
    trained = train_steps(extended("tape"), method)
    state = trained.state_dict()
    assert set(state) == {n for n, p in trained.hf.named_parameters() if p.requires_grad} | \
        {n for n in trained.hf.state_dict() if ".tape." in n}
    assert not any(n.endswith("q_proj.weight") for n in state)
    fresh = HFCausalLM(extended("tape", seed_model := llama()), trained.config, method)
    del seed_model
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    assert not missing and not unexpected
    x = tokens()
    assert_close(logits(fresh.hf, x), logits(trained.hf, x))


def test_unknown_method_and_option_are_one_line_errors():
    from posbench.errors import UserError

    with pytest.raises(UserError, match="unknown method 'tapes'. Did you mean 'tape'"):
        make_method("tapes")
    with pytest.raises(UserError, match="has no option rank"):
        make_method("lora", {"rank": 4})
    assert sorted(METHODS) == ["longlora", "lora", "ntk", "tape", "theta", "yarn"]


@pytest.mark.parametrize("name", ["tape", "longlora"])
def test_bf16_weights_with_fp32_trainables_train_under_autocast(name):
    """The GPU recipe, on the CPU: frozen weights in bfloat16, the trainable ones promoted to float32 (so small
    AdamW updates are not rounded away), bf16 autocast for the step; and a model loaded all in bfloat16 for
    evaluation runs without autocast."""
    from posbench.hf.s2attn import register

    original = llama().to(torch.bfloat16)
    method = make_method(name)
    model = apply_method(original, method, 2.0, 64)
    llama_of(model).set_attn_implementation(method.training_attention() or "sdpa")
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert all(dtypes[n] == torch.float32 for n, p in model.named_parameters() if p.requires_grad)
    assert all(dtypes[n] == torch.bfloat16 for n, p in model.named_parameters() if not p.requires_grad
               and ".tape." not in n)
    model.train()
    x = tokens(2, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=x, labels=x).loss
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)
    register()
    evaluated = extended(name, llama().to(torch.bfloat16), scale=2.0).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.isfinite(evaluated(input_ids=x).logits.float()).all()


def test_memory_arithmetic_counts_what_the_models_hold():
    """posbench.hf.memory's static arithmetic (the README's 7B estimate) counts what a converted model holds,
    and gives Llama-2-7B's published size (6,738,415,616 parameters)."""
    from posbench.hf.memory import LLAMA2_7B, parameter_counts

    original = llama(kv_heads=2, layers=3)
    shape = {"hidden": 32, "layers": 3, "heads": 4, "kv_heads": 2, "intermediate": 64, "vocab": VOCAB}
    for name in ("lora", "tape"):
        model = extended(name, original)
        counts = parameter_counts(shape, name)
        assert counts["base"] == sum(p.numel() for p in original.parameters())
        assert counts["total"] == sum(p.numel() for p in model.parameters())
        assert counts["trainable"] == trainable_count(model)
    assert parameter_counts(LLAMA2_7B, "lora")["base"] == 6_738_415_616
    assert parameter_counts(LLAMA2_7B, "lora")["trainable"] == 139_726_848
    assert parameter_counts(LLAMA2_7B, "tape")["trainable"] == 147_876_864


# ---- yarn and ntk -------------------------------------------------------------------------------------------------
def wide_llama(max_positions=512, seed=0):
    """One layer, head size 64 (hidden 128, 2 heads), context 512: enough rotary pairs that YaRN's three regions
    (kept, ramped, interpolated) are all populated."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config(VOCAB, hidden_size=128, layers=1, heads=2, intermediate_size=64,
                                        max_positions=max_positions, initializer_range=0.2)).eval()


def saved_and_loaded(model, method, tmp_path, length):
    from posbench.hf.saving import load_extended, save_extended

    save_extended(model, method, tmp_path / "model", {"label": f"llama+{method.name}", "length": length})
    loaded, loaded_method, _ = load_extended(tmp_path / "model")
    assert loaded_method.name == method.name
    return llama_of(loaded)


def yarn_inv_freq(head: int, base: float, context: int, scale: float, beta_fast: float, beta_slow: float):
    """YaRN (Peng et al. 2023, section 3.3 and its reference code), in float64. Pair d has frequency
    theta_d = base^(-2d/D) and makes r_d = context theta_d / (2 pi) turns over the original context; the pair
    index where r = beta is d(beta) = D ln(context / (2 pi beta)) / (2 ln base). Pairs up to floor(d(beta_fast))
    keep theta_d, pairs from ceil(d(beta_slow)) on get theta_d / scale, and the pairs in between a linear ramp
    over the index (gamma: 0 -> 1)."""
    d = torch.arange(head // 2, dtype=torch.float64)
    theta = base ** (-2 * d / head)
    at = lambda beta: head * math.log(context / (2 * math.pi * beta)) / (2 * math.log(base))   # noqa: E731
    low, high = max(math.floor(at(beta_fast)), 0), min(math.ceil(at(beta_slow)), head - 1)
    gamma = ((d - low) / max(high - low, 1e-3)).clamp(0, 1)
    return (1 - gamma) * theta + gamma * theta / scale, theta, context * theta / (2 * math.pi)


@pytest.mark.parametrize("options,scale", [({}, 4.0), ({"beta_fast": 16.0, "beta_slow": 2.0,
                                                         "attention_factor": 1.25}, 2.0)])
def test_yarn_uses_the_frequencies_and_temperature_of_the_paper(tmp_path, options, scale):
    original = wide_llama()
    length = int(512 * scale)
    method = make_method("yarn", options)
    model = apply_method(copy.deepcopy(original), method, scale, length).eval()
    loaded = saved_and_loaded(model, method, tmp_path, length)
    config = loaded.config
    beta_fast, beta_slow = options.get("beta_fast", 32.0), options.get("beta_slow", 1.0)
    assert config.rope_parameters == {"rope_type": "yarn", "rope_theta": 10000.0, "factor": scale,
                                      "original_max_position_embeddings": 512, "beta_fast": beta_fast,
                                      "beta_slow": beta_slow, **({"attention_factor": 1.25} if options else {})}
    assert config.max_position_embeddings == length
    expected, theta, turns = yarn_inv_freq(64, 10000.0, 512, scale, beta_fast, beta_slow)
    rotary = loaded.model.rotary_emb
    torch.testing.assert_close(rotary.inv_freq.double(), expected, rtol=2e-6, atol=0)
    # the paper's regions: many turns over the context -> unchanged; under one (beta_slow) -> interpolated
    kept, interpolated = turns > beta_fast, turns < beta_slow
    assert kept.sum() >= 2 and interpolated.sum() >= 2 and (~kept & ~interpolated).sum() >= 2
    torch.testing.assert_close(rotary.inv_freq.double()[kept], theta[kept], rtol=2e-6, atol=0)
    torch.testing.assert_close(rotary.inv_freq.double()[interpolated], theta[interpolated] / scale, rtol=2e-6, atol=0)
    temperature = options.get("attention_factor") or 0.1 * math.log(scale) + 1      # sqrt(1/t)
    assert rotary.attention_scaling == pytest.approx(temperature, rel=1e-12)
    # the table the attention reads: temperature x cos / sin of t x theta'_d; transformers' angles are float32 (under
    # 64 rad here, whose spacing is 7.6e-6), hence 1e-5 x temperature
    positions = torch.arange(64)[None]
    cos, sin = rotary(torch.zeros(1, 1, 128), positions)
    angles = positions[0, :, None].double() * expected
    angles = torch.cat((angles, angles), -1)
    torch.testing.assert_close(cos[0].double(), temperature * angles.cos(), rtol=0, atol=1e-5 * temperature)
    torch.testing.assert_close(sin[0].double(), temperature * angles.sin(), rtol=0, atol=1e-5 * temperature)


def ntk_inv_freq(head: int, base: float, context: int, scale: float, length: int):
    """Dynamic NTK-aware scaling (bloc97 / emozilla; the YaRN paper's "Dynamic NTK" when scale = 1), float64:
    at a sequence of ``length`` > context, base' = base (scale length / context - (scale - 1))^(D / (D - 2));
    at or under the context, RoPE's own base."""
    if length > context:
        base = base * (scale * length / context - (scale - 1)) ** (head / (head - 2))
    return base ** (-2 * torch.arange(head // 2, dtype=torch.float64) / head)


@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_ntk_uses_the_dynamic_ntk_base_at_every_length(tmp_path, scale):
    original = wide_llama()
    method = make_method("ntk")
    model = apply_method(copy.deepcopy(original), method, scale, 2048).eval()
    loaded = saved_and_loaded(model, method, tmp_path, 2048)
    assert loaded.config.rope_parameters == {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": scale}
    assert loaded.config.max_position_embeddings == 512          # transformers scales from the original context
    rotary = loaded.model.rotary_emb
    for length in (128, 512, 513, 768, 1024, 2048):              # growing, as transformers' cache of the table expects
        rotary(torch.zeros(1, 1, 128), torch.arange(length)[None])
        torch.testing.assert_close(rotary.inv_freq.double(), ntk_inv_freq(64, 10000.0, 512, scale, length),
                                   rtol=2e-6, atol=0, msg=f"length {length}")
        assert rotary.attention_scaling == 1.0
    if scale == 1.0:                                             # the YaRN paper's definition: s = length / context
        torch.testing.assert_close(ntk_inv_freq(64, 1e4, 512, 1.0, 1024),
                                   (1e4 * 2 ** (64 / 62)) ** (-2 * torch.arange(32, dtype=torch.float64) / 64))


@pytest.mark.parametrize("name", ["yarn", "ntk"])
def test_yarn_and_ntk_at_scale_1_keep_the_logits(name):
    original = llama()
    assert_close(logits(extended(name, original, scale=1.0, length=32), tokens()), logits(original, tokens()))


def test_ntk_changes_nothing_within_the_original_context_and_scales_beyond_it():
    original = llama()                       # context 32
    model = extended("ntk", original)
    short, long = tokens(n=32), tokens(n=48)
    assert_close(logits(model, short), logits(original, short))
    assert (logits(model, long) - logits(original, long)).abs().max() > 1e-3


def test_yarn_trains_like_lora_and_reloads_exactly(tmp_path):
    from posbench.hf.saving import load_extended, save_extended

    original = llama(kv_heads=2)
    method = make_method("yarn")
    model = extended("yarn", original)
    lora = make_method("lora")
    assert trainable_count(model) == method.trainable_formula(original.config) == \
        lora.trainable_formula(original.config)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    adapter = train_steps(model, method, steps=2)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed == trainable
    x = tokens(n=40)                         # beyond the original 32
    expected = logits(adapter.hf, x)
    save_extended(adapter.hf, method, tmp_path / "m", {"label": "llama+yarn", "length": 64})
    loaded, _, _ = load_extended(tmp_path / "m")
    assert torch.equal(logits(loaded, x), expected)                           # bitwise
    reloaded = HFCausalLM(loaded, HFModelConfig(label="llama+yarn", method="yarn"), method).eval()
    prompt = tokens(2, 6, seed=9)
    assert torch.equal(reloaded.generate(prompt, 8, use_cache=True), reloaded.generate(prompt, 8, use_cache=False))


def test_ntk_trains_nothing_refuses_steps_and_reloads_exactly(tmp_path):
    from posbench.errors import UserError
    from posbench.hf.saving import load_extended, save_extended

    original = llama()
    method = make_method("ntk")
    model = extended("ntk", original)
    assert trainable_count(model) == 0 == method.trainable_formula(original.config) == method.added_formula(
        original.config)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in original.parameters())
    with pytest.raises(UserError, match="method 'ntk' trains nothing .*leave --steps out"):
        method.check_steps(2)
    method.check_steps(0)
    make_method("yarn").check_steps(5)
    x = tokens(n=48)
    expected = logits(model, x)
    save_extended(model, method, tmp_path / "m", {"label": "llama+ntk", "length": 64})
    assert not (tmp_path / "m" / "adapter").exists() and not (tmp_path / "m" / "tape.safetensors").exists()
    loaded, _, meta = load_extended(tmp_path / "m")
    assert meta["files"] == [] and torch.equal(logits(loaded, x), expected)          # bitwise


@pytest.mark.parametrize("name,options,match", [
    ("yarn", {"beta_fast": 0}, "method 'yarn' option beta_fast=0.0 is out of range: it must be > 0"),
    ("yarn", {"beta_fast": 2, "beta_slow": 4}, "must exceed method.beta_slow"),
    ("yarn", {"attention_factor": -1}, "method 'yarn' option attention_factor=-1.0 is out of range: it must be >= 0"),
    ("yarn", {"r": 0}, "method 'yarn' option r=0 is out of range: it must be >= 1"),
    ("lora", {"dropout": 1}, "method 'lora' option dropout=1.0 is out of range: it must be >= 0 and < 1"),
    ("theta", {"theta": 0.5}, "method 'theta' option theta=0.5 is out of range: it must be > 1"),
    ("tape", {"gate": "max"}, "method 'tape' option gate='max' is out of range: it must be one of rowsum, scalar"),
    ("ntk", {"factor": 2}, "method 'ntk' has no option factor"),
])
def test_method_options_are_range_checked_in_one_line(name, options, match):
    from posbench.errors import UserError

    with pytest.raises(UserError, match=re.escape(match)):
        make_method(name, options)


@pytest.mark.parametrize("name", ["yarn", "ntk"])
def test_yarn_and_ntk_refuse_a_model_that_already_scales_rope(name):
    from posbench.errors import UserError

    scaled = llama_with_rope(llama(), {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.raises(UserError, match=f"{name} scales plain RoPE; this model uses rope_type 'linear'"):
        make_method(name).rope_parameters(scaled.config, 2.0)
    with pytest.raises(UserError, match="--scale must be >= 1"):
        make_method(name).rope_parameters(llama().config, 0.5)
