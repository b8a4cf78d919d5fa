"""TAPE inside a Hugging Face Llama (posbench.hf.tape_llama), on tiny random LlamaConfig models (no download).

* converted but untrained, the logits are the original's (TAPE's updates start at zero);
* against posbench's own Transformer with the same weights: equal with RoPE, and equal after both become
  TAPE with the same perturbed (non-zero) TAPE weights, with and without position interpolation;
* the KV cache (the per-layer state of past tokens in the widened values) decodes as full recomputation;
* gradient checkpointing differentiates through the state exactly, and both updates get gradients.

Tolerances: float32 throughout. "Exact" means |a - b| <= 1e-5 x max(1, max|b|) (``encoding_helpers.assert_close``):
the converted model runs the same operations on the same numbers except that the attention call has wider
values (observed differences ~1e-7). posbench's Transformer computes its RoPE angles in float64 and transformers
in float32, which differ by < 1e-6 rad at these positions.
"""

from __future__ import annotations

import copy

import pytest
import torch

from encoding_helpers import assert_close, one_thread  # noqa: F401 (a fixture)
from posbench.hf.adapter import enable_checkpointing
from posbench.hf.methods import TapeMethod, apply_method
from posbench.hf.tape_llama import TapeAttention, convert_to_tape
from posbench.hf.tiny import tiny_config
from posbench.model import ModelConfig, Transformer

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 61


def llama(layers=3, heads=4, kv_heads=None, attention="eager", seed=0, hidden=32, max_positions=32):
    """A tiny random Llama with every weight (norms included) of order 0.2, so that positions matter."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(VOCAB, hidden_size=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
                                         max_positions=max_positions, attention=attention, initializer_range=0.2))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model.eval()


def perturb_tape(model, std=0.3, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.model.layers:
            for p in layer.tape.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * std)


def tokens(batch=2, n=12, seed=3):
    return torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))


def logits(model, x):
    with torch.no_grad():
        return model(input_ids=x).logits


# ---- converted, untrained: the original logits ---------------------------------------------------------------
@pytest.mark.parametrize("kv_heads,attention", [(4, "eager"), (4, "sdpa"), (2, "sdpa"), (1, "eager")])
def test_converted_tape_equals_the_original(kv_heads, attention):
    original = llama(kv_heads=kv_heads, attention=attention)
    tape = copy.deepcopy(original)
    convert_to_tape(tape)
    assert not any(m.training for m in tape.modules())       # the new modules take the model's (eval) mode
    x = tokens()
    assert_close(logits(tape, x), logits(original, x))
    perturb_tape(tape)                     # the test can fail: non-zero updates change the logits
    assert (logits(tape, x) - logits(original, x)).abs().max() > 1e-2


def test_interpolated_tape_equals_a_llama_with_linear_rope():
    """scale 2: TAPE's initial state is the model's own rotary table with positions t / 2, so the converted
    model equals the same Llama built with rope_parameters {linear, factor 2}, and not the original."""
    from transformers import LlamaForCausalLM

    original = llama()
    tape = apply_method(copy.deepcopy(original), TapeMethod(), 2.0, 64).eval()
    cfg = copy.deepcopy(original.config)
    cfg.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    pi = LlamaForCausalLM(cfg).eval()
    pi.load_state_dict(original.state_dict())
    x = tokens(n=20)
    assert_close(logits(tape, x), logits(pi, x))
    assert (logits(tape, x) - logits(original, x)).abs().max() > 1e-2
    assert tape.config.max_position_embeddings == 64


def test_values_in_one_pass_equal_head_dim_chunks(monkeypatch):
    """Backends without wide values get the values in head_dim chunks, one attention call each."""
    model = llama()
    convert_to_tape(model)
    perturb_tape(model)
    x = tokens()
    one_pass = logits(model, x)
    monkeypatch.setattr(TapeAttention, "ONE_PASS", ())
    assert_close(logits(model, x), one_pass)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_output_attentions_are_the_weights_that_mixed_the_values(kv_heads):
    """``output_attentions=True`` returns, per layer, the causal softmax weights each head applied to its values:
    rows summing to 1, nothing above the diagonal, and o_proj's input equal to those weights times v_proj's
    values (each key/value head repeated for its query heads), derived here from the hooked projections. Before,
    TAPE's attention returned no weights and transformers handed back an empty tuple; the logits do not change."""
    model = llama(kv_heads=kv_heads)
    convert_to_tape(model)
    perturb_tape(model)                    # a non-zero state: the weights are TAPE's, not the original's
    x = tokens()
    seen = {"v": [], "o_in": []}
    hooks = [h for layer in model.model.layers for h in (
        layer.self_attn.v_proj.register_forward_hook(lambda m, args, out: seen["v"].append(out)),
        layer.self_attn.o_proj.register_forward_pre_hook(lambda m, args: seen["o_in"].append(args[0])))]
    with torch.no_grad():
        out = model(input_ids=x, output_attentions=True)
    for h in hooks:
        h.remove()
    heads, d = model.config.num_attention_heads, model.config.head_dim
    b, n = x.shape
    assert len(out.attentions) == len(model.model.layers)
    for weights, v, o_in in zip(out.attentions, seen["v"], seen["o_in"]):
        assert weights.shape == (b, heads, n, n)
        assert torch.all(weights.triu(diagonal=1) == 0)
        assert_close(weights.sum(-1), torch.ones(b, heads, n))
        values = v.view(b, n, kv_heads, d).transpose(1, 2).repeat_interleave(heads // kv_heads, dim=1)
        assert_close(o_in, (weights @ values).transpose(1, 2).reshape(b, n, heads * d))
    assert_close(out.logits, logits(model, x), rel=0)


# ---- against posbench's own TAPE -----------------------------------------------------------------------------
def posbench_twin(model, encoding: str, scale: float = 1.0) -> Transformer:
    """A posbench Transformer holding the Llama's weights (q/k/v -> the fused qkv, o -> out, ...)."""
    c = model.config
    options = {"theta": c.rope_parameters["rope_theta"], "scale": scale}
    if encoding == "tape":
        options.update(position_size=model.model.layers[0].tape.x_proj.out_features, gate="rowsum")
    twin = Transformer(ModelConfig(vocab_size=c.vocab_size, d_model=c.hidden_size, n_layers=c.num_hidden_layers,
                                   n_heads=c.num_attention_heads, d_ff=c.intermediate_size, max_seq_len=32,
                                   encoding=encoding, encoding_options=options, attention="eager",
                                   norm_eps=c.rms_norm_eps))
    w = {k: v for k, v in model.state_dict().items()}
    state = {"embed.weight": w["model.embed_tokens.weight"], "norm.weight": w["model.norm.weight"],
             "lm_head.weight": w["lm_head.weight"]}
    for i in range(c.num_hidden_layers):
        p, q = f"model.layers.{i}.", f"blocks.{i}."
        state[q + "attn_norm.weight"] = w[p + "input_layernorm.weight"]
        state[q + "mlp_norm.weight"] = w[p + "post_attention_layernorm.weight"]
        state[q + "attn.qkv.weight"] = torch.cat([w[p + f"self_attn.{m}_proj.weight"] for m in "qkv"])
        state[q + "attn.out.weight"] = w[p + "self_attn.o_proj.weight"]
        for m in ("gate", "up", "down"):
            state[q + f"mlp.{m}.weight"] = w[p + f"mlp.{m}_proj.weight"]
        if encoding == "tape":
            for name in ("gate", "x_proj.weight", "up_proj.weight", "down_proj.weight"):
                state[f"encoding.layers.{i}.{name}"] = w[p + f"tape.{name}"]
    twin.load_state_dict(state, strict=True)
    return twin.eval()


@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_llama_and_posbench_agree_with_rope_then_with_tape(scale):
    from posbench.hf.rope import scaled_rope_parameters, set_rope

    original = llama()
    set_rope(original, scaled_rope_parameters(original.config, scale), 64)
    x = tokens(n=16)
    assert_close(logits(original, x), posbench_twin(original, "rope", scale)(x))

    tape = copy.deepcopy(original)
    convert_to_tape(tape)
    perturb_tape(tape)                      # non-zero gate, x_proj, up_proj, down_proj in every layer
    ours, theirs = logits(tape, x), posbench_twin(tape, "tape", scale)(x)
    assert_close(ours, theirs)
    assert (ours - logits(original, x)).abs().max() > 1e-2


# ---- KV cache ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_cached_generation_equals_recomputation(kv_heads):
    from posbench.hf.adapter import HFCausalLM, HFModelConfig

    model = llama(kv_heads=kv_heads, attention="sdpa")
    convert_to_tape(model)
    perturb_tape(model)
    adapter = HFCausalLM(model, HFModelConfig(label="llama+tape", method="tape")).eval()
    prompt = tokens(2, 7)
    cached = adapter.generate(prompt, max_new_tokens=10, use_cache=True)
    full = adapter.generate(prompt, max_new_tokens=10, use_cache=False)
    assert torch.equal(cached, full)
    # the same through transformers' own generate (DynamicCache holding the widened values)
    model.generation_config.eos_token_id = None          # posbench's greedy decoding does not stop at EOS
    with torch.no_grad():
        hf = model.generate(prompt, max_new_tokens=10, do_sample=False, use_cache=True,
                            attention_mask=torch.ones_like(prompt), pad_token_id=2)
    assert torch.equal(hf[:, prompt.shape[1]:], full)
    # logits of a cached step equal the last row of a full pass
    cache = adapter.new_cache()
    with torch.no_grad():
        adapter(prompt, cache=cache)
        step = adapter(full[:, :1], cache=cache)[:, -1]
        whole = adapter(torch.cat((prompt, full[:, :1]), dim=1))[:, -1]
    assert_close(step, whole)


# ---- gradients -----------------------------------------------------------------------------------------------
def test_checkpointing_gives_the_same_gradients_and_both_updates_train():
    model = llama(attention="sdpa")
    convert_to_tape(model)
    perturb_tape(model)
    TapeMethod().mark_trainable(model)
    twin = copy.deepcopy(model)
    enable_checkpointing(twin)
    x = tokens(2, 12)
    grads = []
    for m in (model, twin):
        m.train()
        loss = m(input_ids=x, labels=x).loss
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    assert twin.model.layers[0].gradient_checkpointing
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        assert_close(grads[1][name], grad, msg=name)
    # both TAPE updates of every layer but the last receive gradient (the reference froze the gate)
    for i in range(len(model.model.layers) - 1):
        for part in ("gate", "x_proj.weight", "up_proj.weight", "down_proj.weight"):
            assert grads[0][f"model.layers.{i}.tape.{part}"].abs().sum() > 0, (i, part)
    assert not any(".layers.2.tape." in n for n in grads[0])    # the last layer's state is discarded


def test_a_checkpointed_backward_leaves_no_recomputed_state_behind():
    """PyTorch's recomputation stops right after the last saved tensor (inside the MLP-side update) and its
    graph holds its tensors strongly: a recomputed state left in the shared object would keep a layer's
    activations alive through the rest of the backward pass (measured: 4x the memory per layer)."""
    model = llama(layers=4, attention="sdpa")
    state = convert_to_tape(model)
    perturb_tape(model)
    TapeMethod().mark_trainable(model)
    enable_checkpointing(model)
    model.train()
    x = tokens(1, 12)
    loss = model(input_ids=x, labels=x).loss
    after_forward = list(state.inputs)
    assert all(t is not None for t in after_forward) and state.mids == [None] * 4
    loss.backward()
    assert all(a is b for a, b in zip(state.inputs, after_forward))     # the forward's tensors, not recomputed ones
    assert state.mids == [None] * 4


def test_fresh_conversion_trains_the_gate_and_up_projection_first():
    """At conversion the gate and up_proj are zero; their gradients are not (W_x and W_down only get gradient
    once up_proj has moved, since the update is down diag(g) up)."""
    model = llama()
    convert_to_tape(model)
    TapeMethod().mark_trainable(model)
    x = tokens(2, 12)
    model.train()
    model(input_ids=x, labels=x).loss.backward()
    tape0 = model.model.layers[0].tape
    assert tape0.gate.grad.abs().sum() > 0 and tape0.up_proj.weight.grad.abs().sum() > 0
    assert tape0.x_proj.weight.grad.abs().sum() == 0 and tape0.down_proj.weight.grad.abs().sum() == 0


def test_random_training_offset_shifts_every_position_by_one_draw():
    """method.random_offset (default, as the reference's TAPE): in training, one k ~ U{0..2 x length}
    (posbench's ``training_offset``) shifts all positions of the pass; evaluation uses the positions as they
    are. A common shift rotates every 2x2 block of the state by the same angle per frequency, and TAPE is
    rotation-equivariant, so the logits do not change (up to float32 rounding of the larger angles)."""
    import random

    from posbench.encodings.rope import training_offset

    def seeded(fn):
        random.seed(11)
        torch.manual_seed(11)
        return fn()

    model = apply_method(llama(), TapeMethod(), 2.0, 64)
    perturb_tape(model)
    rotary = model.model.rotary_emb
    x = tokens(1, 10)
    positions = torch.arange(10)[None]
    embedded = model.model.embed_tokens(x)
    with torch.no_grad():
        shifted = seeded(lambda: training_offset(rotary.train(), positions, True, 64))
        cos_train, _ = seeded(lambda: rotary.train()(embedded, positions))
        cos_shifted, _ = rotary.inner(embedded, shifted)
        cos_eval, _ = seeded(lambda: rotary.eval()(embedded, positions))
        cos_plain, _ = rotary.inner(embedded, positions)
    k = (shifted - positions).unique()
    assert k.numel() == 1 and 0 < int(k) <= 128                   # one draw for the whole pass, within range
    assert torch.equal(cos_train, cos_shifted) and torch.equal(cos_eval, cos_plain)
    assert (cos_train - cos_eval).abs().max() > 0.1
    with torch.no_grad():
        trained = seeded(lambda: model.train()(input_ids=x).logits)     # dropout is 0: only the offset differs
        plain = model.eval()(input_ids=x).logits
    assert_close(trained, plain)


# ---- the tied state -------------------------------------------------------------------------------------------
def test_the_state_is_carried_tied_and_untied_when_the_table_is_not():
    """Llama's table repeats its angles in both halves, so the state is [c | s] of width D (posbench's layout);
    a table whose halves differ is carried untied, [C | S] of width 2D, and still rotates by the definition."""
    from posbench.encodings.tape import rotate_by_state, untie
    from posbench.hf.tape_llama import TapeState

    model = llama()
    state = convert_to_tape(model)
    perturb_tape(model)
    x = tokens()
    with torch.no_grad():
        model(input_ids=x)
    assert state.tied is True and state.n_heads == 4
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    assert state.inputs[0] is None or state.inputs[0].shape[-1] == head_dim

    odd = TapeState(1, 2)
    cos, sin = torch.rand(1, 3, 8), torch.rand(1, 3, 8)          # halves differ
    odd.start(cos, sin)
    assert odd.tied is False and odd.input(0).shape == (1, 2, 3, 16)
    q = torch.randn(1, 2, 3, 8)
    rotate_half = torch.cat((-q[..., 4:], q[..., :4]), dim=-1)
    torch.testing.assert_close(rotate_by_state(q, odd.input(0)), q * cos[:, None] + rotate_half * sin[:, None])
    tied = TapeState(1, 2)
    tied.start(torch.cat((cos[..., :4], cos[..., :4]), -1), torch.cat((sin[..., :4], sin[..., :4]), -1))
    assert tied.tied is True and tied.input(0).shape == (1, 2, 3, 8)
    torch.testing.assert_close(untie(tied.input(0)), torch.cat((cos[..., :4],) * 2 + (sin[..., :4],) * 2, -1)
                               [:, None].expand(1, 2, 3, 16))
