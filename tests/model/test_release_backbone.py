"""posbench's depth-recurrent backbone computes what the arithmetic release's model computes, established on the
release's own code (docs/encodings.md, "Backbones").

The release is github:zhuconv/arithmetic at 55f877d ("version 0.1", HEAD): class ``ScriptableRecurrentLMBPTT``
(the launches' ``arch.objective_layout=TBPTT``) around ``ScriptableRecurrentLM`` in
cramming/architectures/crammed_depthrecurrent.py, with the settings of cramming/config/arch/
crammed-depthrecurrent.yaml (post-norm LayerNorm blocks, GELU-GLU, normalised embeddings injected at every
recurrence, an FFN head before the final norm, deepnorm-straight init). The test reads the file from the git
mirror when it runs (tests/release_source.py; skipped when the mirror is absent), builds the release's model on CPU
at a toy size (width 32, 4 heads of 8, 2 layers in the block, GLU width 48, vocabulary 20) with 1 and 2
recurrences, copies a posbench model's weights into it by the explicit map ``copy_into_release`` (every release
parameter written exactly once), and compares the logits of every position.

The attentions, as the release's launches (84c16ad:shells/addition_ff.sh) build them:
- NoPE: ``attention.type=pytorch`` (``nn.MultiheadAttention``), ``embedding.pos_embedding=None``;
- RoPE: ``attention.type=self-attention``, ``rotary_embedding=true`` (the NeoX-style attention with ``Rotary``,
  rotate-half, base 10000), whose fused in_proj is laid out per head ([q_h; k_h; v_h] for head h in turn, where
  nn.MultiheadAttention and posbench have [q; k; v], heads inside each): mapped by ``per_head``;
- Abacus: ``attention.type=pytorch`` with ``embedding.pos_embedding=abacus`` (evaluation: offset k = 0);
- FIRE and Abacus + FIRE: ``attention.type=self-attention``, ``rotary_embedding=fire`` (float32 only: the release's
  FIRE computes its distances in float32 whatever the model's dtype, and its MLP then refuses them in float64).

The deliberate differences, neutralised here: the release's ``TransposedAdapter`` (a bias-free d x d linear map
between the final norm and the decoder, which posbench does not have) is set to the identity; its initial state is
random at evaluation too (``state_init: embed``), posbench's zero, so the release runs with ``state_init=zero``;
its TBPTT objective with ``maximal_recurrence=1`` draws n = 0 passes without gradients and k = 1 with them, one
ordinary forward pass (checked below in training mode). Its self-attention's score scale is a float32 buffer even
in a float64 model: set to the float64 value (``built``).

Tolerances. float64: every logit within 1e-10 of the release's (they are O(1); measured at most 1.1e-15), RoPE
included, the release reading posbench's cos/sin table (posbench builds it in float32; the release's own table,
computed from a float32 inverse frequency, differs from it by ~1e-7, and with it the logits are compared at 1e-6,
measured 1.7e-8). float32 (FIRE; training mode): 1e-5 (measured at most 8e-7). The guards: a posbench model built
pre-norm, all else equal, differs from the release by more than 0.1 (measured 1.4), one without input injection
likewise (0.56), and RoPE's weights copied without the per-head map likewise.
"""

from __future__ import annotations

import math
import types

import pytest
import torch

from posbench.encodings.base import rope_cos_sin
from posbench.model import ModelConfig, Transformer

from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from encoding_helpers import TASK_CONTEXT
from release_source import cramming_stubs, require

pytestmark = pytest.mark.usefixtures("one_thread")

OWNER, NAME, HEAD = "zhuconv", "arithmetic", "55f877d"
FILE = "cramming/architectures/crammed_depthrecurrent.py"
D, HEADS, LAYERS, D_FF, VOCAB, S, B = 32, 4, 2, 48, 20, 12, 3
HD = D // HEADS
EXACT, OWN_TABLE, FLOAT32, DIFFERENT = 1e-10, 1e-6, 1e-5, 0.1
ENCODINGS = ("nope", "rope", "abacus")
#: with FIRE: the release's FIRE runs in float32 only (its distances are float32 whatever the model's dtype)
FIRE_CASES = ("fire", "abacus+fire")
#: FIRE's threshold L on both sides (the release's own is 512.0, far above these 12 positions, where every
#: normalised distance is near 0 and FIRE moves the logits by ~3e-3 only): half the positions lie beyond it
FIRE_INIT_L = 6.0


class Settings(dict):
    """What ``OmegaConf.create`` gives the release: a dict read by attribute (and ``.get``), nested likewise."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    @classmethod
    def of(cls, d: dict) -> "Settings":
        return cls({k: cls.of(v) if isinstance(v, dict) else v for k, v in d.items()})


# Imports the file makes that the tests do not exercise (or exercise only as OmegaConf.create): stand-ins, present
# only while a file executes.
STUBS = cramming_stubs(torch.nn.Module, types.SimpleNamespace(create=Settings.of))


@pytest.fixture(scope="module")
def recurrent():
    """The release's crammed_depthrecurrent.py as a module. Executing it sets ``torch._dynamo.config.
    suppress_errors = True`` (its line 5), a process-wide setting: restored at once, so no other test sees it."""
    release = require(OWNER, NAME, HEAD)
    before = torch._dynamo.config.suppress_errors
    try:
        module = release.load(HEAD, FILE, stubs=STUBS, tag="backbone")
    finally:
        torch._dynamo.config.suppress_errors = before
    return module


def release_arch(encoding: str, recurrences: int) -> dict:
    """cramming/config/arch/crammed-depthrecurrent.yaml at toy size, as the launches override it: the encoding's
    attention and embedding, ``state_init=zero`` (posbench's evaluation state), no local compilation."""
    attention = {"nope": ("pytorch", False), "abacus": ("pytorch", False), "rope": ("self-attention", True),
                 "fire": ("self-attention", "fire"), "abacus+fire": ("self-attention", "fire")}
    kind, rotary = attention[encoding]
    return dict(
        layers_in_recurrent_block=LAYERS, maximal_recurrence=recurrences, max_backprop=None,
        maximal_recurrence_in_eval=recurrences, hidden_size=D, intermed_size=2 * D_FF, input_injection_type="add",
        initial_hidden_randomized=True, state_init="zero", norm="LayerNorm", norm_eps=1e-12, norm_scheme="post",
        nonlin="GELUglu", sub_normalization=False, tie_weights=False, decoder_bias=False, use_bias=False,
        final_norm=True, head="ffn", objective_layout="TBPTT",
        embedding=dict(vocab_size=VOCAB, pos_embedding="abacus" if encoding.startswith("abacus") else None,
                       max_seq_length=128, embedding_dim=D, normalization=True, stable_low_precision=False,
                       max_abacus_len=100),
        attention=dict(type=kind, num_attention_heads=HEADS, skip_output_projection=False, qkv_bias=False,
                       bias_in_proj=False, max_length=0, rotary_embedding=rotary, seq_op_in_fp32=False,
                       sequence_op="torch-softmax", sub_normalization=False),
        init=dict(type="deepnorm-straight", std=0.02), throttle=False, alpha=1.0, mask_before_equals=False,
        local_compilation=False, loss_reduction="mean", forward_only_model_with_skip=False)


def release_model(recurrent, encoding: str, recurrences: int, seed: int = 5):
    torch.manual_seed(seed)
    config = recurrent.crammedDepthRecurrentConfig(release_arch(encoding, recurrences))
    return recurrent.ScriptableRecurrentLMBPTT(config, equals_token=17)


def posbench_model(encoding: str, recurrences: int, seed: int = 0, **settings) -> Transformer:
    """The release's class in posbench's settings (ModelConfig's comment), its norms perturbed away from 1 and 0
    so that a norm mapped to the wrong place shows."""
    torch.manual_seed(seed)
    options = {"digit_ids": TASK_CONTEXT["digit_ids"]} if encoding.startswith("abacus") else {}
    if encoding == "fire":
        options["init_l"] = FIRE_INIT_L
    if encoding == "abacus+fire":
        options.update(attention_bias="fire", fire_init_l=FIRE_INIT_L)
        encoding = "abacus"
    backbone = dict(norm="layer", norm_eps=1e-12, norm_position="post", mlp="geglu", embedding_norm=True,
                    head_mlp=True, recurrences=recurrences, input_injection=True, state_std=0.02, init_scheme="deepnorm")
    backbone.update(settings)
    model = Transformer(ModelConfig(vocab_size=VOCAB, d_model=D, n_layers=LAYERS, n_heads=HEADS, d_ff=D_FF,
                                    max_seq_len=16, encoding=encoding, encoding_options=options, attention="eager",
                                    **backbone))
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.copy_(1 + 0.2 * torch.randn(module.weight.shape, generator=g))
                module.bias.copy_(0.2 * torch.randn(module.bias.shape, generator=g))
            elif type(module).__name__ == "RMSNorm":
                module.weight.copy_(1 + 0.2 * torch.randn(module.weight.shape, generator=g))
    return model


def per_head(qkv: torch.Tensor) -> torch.Tensor:
    """posbench's fused [q; k; v] (heads inside each) as the release's self-attention reads its in_proj: its
    ``view(S, B, heads, 3 * head_dim)`` then ``split(head_dim)`` takes rows [q_h; k_h; v_h] for head h in turn."""
    return qkv.view(3, HEADS, HD, D).transpose(0, 1).reshape(3 * D, D)


def glu(mlp) -> torch.Tensor:
    """posbench's gate and up as the release's one d -> 2 d_ff projection: GLU's ``x, gate = chunk(2)``, so the
    first half of the rows is up (the multiplied half) and the second the gate (the GELU's input)."""
    return torch.cat((mlp.up.weight, mlp.gate.weight), dim=0)


def copy_into_release(model: Transformer, release) -> dict[str, str]:
    """posbench's weights into the release's model; returns the map (release parameter -> what was written).
    Every release parameter is written once; the TransposedAdapter gets the identity."""
    block = getattr(release.encoder.recurrent_block, "_orig_mod", release.encoder.recurrent_block)
    writes: dict[str, tuple[torch.nn.Parameter, torch.Tensor, str]] = {}

    def put(target: torch.nn.Parameter, value: torch.Tensor, what: str) -> None:
        writes[id(target)] = (target, value, what)

    def norm(target: torch.nn.LayerNorm, source: torch.nn.LayerNorm, what: str) -> None:
        put(target.weight, source.weight, f"{what}.weight")
        put(target.bias, source.bias, f"{what}.bias")

    emb = release.encoder.embedding
    put(emb.word_embedding.weight, model.embed.weight, "embed.weight")
    norm(emb.norm, model.embed_norm, "embed_norm")
    if emb.pos_embedding is not None:                          # Abacus: posbench's rows, then rows nothing reads
        table = model.encoding.table.weight
        rest = emb.pos_embedding.embedding.weight[table.shape[0]:]
        put(emb.pos_embedding.embedding.weight, torch.cat((table, rest.to(table.dtype))), "encoding.table.weight")
    for i, (layer, ours) in enumerate(zip(block.layers, model.blocks)):
        attention = layer.attn.attn if hasattr(layer.attn, "attn") else layer.attn
        if hasattr(layer.attn, "attn"):                        # nn.MultiheadAttention: [q; k; v] as posbench
            put(attention.in_proj_weight, ours.attn.qkv.weight, f"blocks.{i}.attn.qkv.weight")
        else:                                                  # the NeoX-style attention: per head
            put(attention.in_proj_weight, per_head(ours.attn.qkv.weight), f"per_head(blocks.{i}.attn.qkv.weight)")
        put(attention.out_proj.weight, ours.attn.out.weight, f"blocks.{i}.attn.out.weight")
        if getattr(attention, "use_fire", False):             # FIRE: one module per layer on both sides
            fire = getattr(model.encoding, "fire", model.encoding)
            ours_fire, theirs = fire.layers[i], attention.rotary_emb
            name = f"{'encoding.fire' if fire is not model.encoding else 'encoding'}.layers.{i}"
            for j in (0, 2):
                put(theirs.mlp[j].weight, ours_fire.mlp[j].weight, f"{name}.mlp.{j}.weight")
                put(theirs.mlp[j].bias, ours_fire.mlp[j].bias, f"{name}.mlp.{j}.bias")
            put(theirs.c, ours_fire.c, f"{name}.c")
            put(theirs.L_multiplier, ours_fire.l_mult, f"{name}.l_mult")
            put(theirs.init_L, ours_fire.init_l, f"{name}.init_l")
        norm(layer.residual1.norm, ours.attn_norm, f"blocks.{i}.attn_norm")
        norm(layer.residual2.norm, ours.mlp_norm, f"blocks.{i}.mlp_norm")
        put(layer.ffn.dense_in.weight, glu(ours.mlp), f"cat(blocks.{i}.mlp.up, blocks.{i}.mlp.gate)")
        put(layer.ffn.dense_out.weight, ours.mlp.down.weight, f"blocks.{i}.mlp.down.weight")
    head = release.encoder.head
    put(head.dense_in.weight, glu(model.head), "cat(head.up, head.gate)")
    put(head.dense_out.weight, model.head.down.weight, "head.down.weight")
    norm(release.encoder.final_norm, model.norm, "norm")
    put(release.adapter.weight, torch.eye(D), "identity")
    put(release.decoder.weight, model.lm_head.weight, "lm_head.weight")

    names = {id(p): n for n, p in release.named_parameters()}
    assert set(writes) == set(names), sorted(set(names.values()) - {names.get(k) for k in writes})
    with torch.no_grad():
        for target, value, _ in writes.values():
            assert target.shape == value.shape, (names[id(target)], target.shape, value.shape)
            target.copy_(value)
    return {names[key]: what for key, (_, _, what) in writes.items()}


def release_logits(release, tokens: torch.Tensor, recurrences: int) -> torch.Tensor:
    """The release's evaluation path (``forward`` out of training: ``model_call(n=maximal_recurrence_in_eval,
    k=0)``), every position's logits ``[B, S, V]``; its ``forward`` returns the last position's."""
    _, logits = release.model_call(tokens, n=recurrences, k=0)
    assert torch.equal(release(tokens)["logits"], logits[:, -1])
    return logits


def tokens(encoding: str, seed: int = 1) -> torch.Tensor:
    """Random tokens; for Abacus two thirds of them the release's digits 4-13 (numbers of several digits)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (B, S), generator=g)
    if not encoding.startswith("abacus"):
        return x
    digits = torch.randint(4, 14, (B, S), generator=g)
    return torch.where(torch.rand(B, S, generator=g) < 2 / 3, digits, x)


def use_posbench_rope_table(release, model: Transformer, n: int) -> None:
    """The release's Rotary reads posbench's cos/sin (float32, cast to the model's dtype) for n positions."""
    cos, sin = rope_cos_sin(torch.arange(n)[None], HD, model.encoding.options["theta"])
    block = getattr(release.encoder.recurrent_block, "_orig_mod", release.encoder.recurrent_block)
    for layer in block.layers:
        rotary = layer.attn.rotary_emb
        rotary.seq_len_cached = n
        dtype = rotary.inv_freq.dtype
        rotary.cos_cached = cos[0, :, None, None, :].to(dtype)
        rotary.sin_cached = sin[0, :, None, None, :].to(dtype)


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def built(recurrent, encoding: str, recurrences: int, dtype=torch.float64, **settings):
    """posbench's model and the release's with posbench's weights, in ``dtype``. The release's self-attention
    keeps its score scale 1/sqrt(head_dim) in a buffer computed in float32 (``torch.tensor(8).rsqrt()``), which
    ``.double()`` casts but does not recompute: set to the float64 value, else the float64 logits differ by ~7e-9
    (a float32 rounding, none in float32)."""
    model = posbench_model(encoding, recurrences, **settings).to(dtype).eval()
    release = release_model(recurrent, encoding, recurrences).to(dtype).eval()
    mapping = copy_into_release(model, release)
    for module in release.modules():
        if hasattr(module, "norm_factor"):
            module.norm_factor.fill_(module.hidden_per_head ** -0.5)
    return model, release, mapping


@pytest.mark.parametrize("recurrences", [1, 2])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_posbench_backbone_equals_the_release_in_float64(recurrent, encoding, recurrences):
    model, release, _ = built(recurrent, encoding, recurrences)
    x = tokens(encoding)
    if encoding == "rope":
        use_posbench_rope_table(release, model, S)
    with torch.no_grad():
        ours, theirs = model(x), release_logits(release, x, recurrences)
    assert ours.dtype == theirs.dtype == torch.float64
    assert theirs.abs().max().item() > 0.1                      # logits of order one, not a degenerate zero
    assert gap(ours, theirs) <= EXACT, gap(ours, theirs)


@pytest.mark.parametrize("recurrences", [1, 2])
@pytest.mark.parametrize("encoding", FIRE_CASES)
def test_posbench_fire_backbone_equals_the_release_in_float32(recurrent, encoding, recurrences):
    """FIRE (``attention.type=self-attention``, ``rotary_embedding=fire``) and Abacus + FIRE (with
    ``pos_embedding=abacus``), as the launches build them, L = 6 on both sides (so that the normaliser max(i, L)
    is L for some queries and i for others): every logit within 1e-5 (float32; posbench evaluates FIRE's MLP as its
    linear pieces, the release through the MLP; measured at most 6e-7). The guard: the release with its FIRE
    MLP's output zeroed differs by more than 1e-3 (a 12-token causal softmax over deepnorm-initialised keys moves
    little with the bias; measured 0.017 to 0.042), a hundred times the tolerance."""
    model, release, _ = built(recurrent, encoding, recurrences, dtype=torch.float32)
    x = tokens(encoding)
    with torch.no_grad():
        ours, theirs = model(x), release_logits(release, x, recurrences)
    assert theirs.abs().max().item() > 0.1
    assert gap(ours, theirs) <= FLOAT32, gap(ours, theirs)
    block = release.encoder.recurrent_block
    with torch.no_grad():                                       # the guard: the release without its FIRE bias
        for layer in block.layers:
            layer.attn.rotary_emb.mlp[2].weight.zero_()
            layer.attn.rotary_emb.mlp[2].bias.zero_()
        assert gap(ours, release_logits(release, x, recurrences)) > 1e-3      # measured 0.017-0.042


def test_the_releases_own_rotary_table_is_posbench_rope(recurrent):
    """The release's Rotary (its own cos/sin: inverse frequencies 10000^(-2f/D) computed in float32, the angle
    duplicated over the two halves, rotate-half) against posbench's RoPE: the tables agree to float32 rounding
    and the model's logits to 1e-6 (float64 arithmetic on both sides; measured 1.7e-8)."""
    model, release, _ = built(recurrent, "rope", 2)
    block = release.encoder.recurrent_block
    rotary = block.layers[0].attn.rotary_emb
    assert type(rotary).__name__ == "Rotary"
    cos, sin = rotary.get_cos_sin_cache(torch.zeros(S, 1, 1, HD))        # [S, 1, 1, D]: sequence first
    ref_cos, ref_sin = rope_cos_sin(torch.arange(S)[None], HD, 10000.0)
    assert gap(cos[:, 0, 0], ref_cos[0].double()) < 1e-6 and gap(sin[:, 0, 0], ref_sin[0].double()) < 1e-6
    x = tokens("rope")
    with torch.no_grad():
        assert gap(model(x), release_logits(release, x, 2)) <= OWN_TABLE


def test_the_per_head_layout_matters(recurrent):
    """The guard for the RoPE mapping: posbench's [q; k; v] copied into the release's self-attention as it is
    (without ``per_head``) gives other logits."""
    model, release, _ = built(recurrent, "rope", 1)
    use_posbench_rope_table(release, model, S)
    for layer, ours in zip(release.encoder.recurrent_block.layers, model.blocks):
        with torch.no_grad():
            layer.attn.in_proj_weight.copy_(ours.attn.qkv.weight)
    x = tokens("rope")
    with torch.no_grad():
        assert gap(model(x), release_logits(release, x, 1)) > DIFFERENT


@pytest.mark.parametrize("encoding", ["nope", "rope"])
def test_the_check_would_see_a_pre_norm_posbench(recurrent, encoding):
    """The guard: the same weights in a posbench model built with ``norm_position=pre`` (all else equal) give
    logits more than 0.1 away from the release's, so the float64 check above fails on a pre-norm backbone."""
    model, release, _ = built(recurrent, encoding, 2)
    pre = posbench_model(encoding, 2, norm_position="pre").double().eval()
    pre.load_state_dict(model.state_dict())
    if encoding == "rope":
        use_posbench_rope_table(release, model, S)
    x = tokens(encoding)
    with torch.no_grad():
        theirs = release_logits(release, x, 2)
        assert gap(model(x), theirs) <= EXACT
        assert gap(pre(x), theirs) > DIFFERENT


def test_the_check_would_see_a_missing_injection(recurrent):
    """The guard for the recurrence: with ``input_injection`` off (the blocks then run twice on the embeddings,
    no re-injection), the logits differ from the release's by more than 0.1."""
    model, release, _ = built(recurrent, "nope", 2)
    plain = posbench_model("nope", 2, input_injection=False, state_std=0.0).double().eval()
    plain.load_state_dict(model.state_dict())
    x = tokens("nope")
    with torch.no_grad():
        assert gap(plain(x), release_logits(release, x, 2)) > DIFFERENT


@pytest.mark.parametrize("encoding", ["nope", "rope"])
def test_training_with_one_recurrence_is_one_pass_as_the_releases_tbptt(recurrent, encoding):
    """Training mode, float32, ``maximal_recurrence=1`` (the launches'): the release's TBPTT step
    (``forward_progressive``, alpha 1) calls ``model_call(n, k)`` with n ~ U{0..max_recurrences - 1} = 0 passes
    without gradients and k ~ U{1..min(max_recurrences - n, max_backprop)} = 1 with them, max_backprop being
    max(1 // 2, 1) = 1: one ordinary pass. (Called here as ``model_call(n=0, k=1)``: ``forward_progressive``
    itself runs on a GPU only, its ``torch.zeros(1).to(input_ids.get_device())`` being ``.to(-1)`` on a CPU.)
    posbench's training forward with ``state_std=0`` (the release's zero state) gives the same logits within 1e-5,
    and gradients reach the embeddings on both sides."""
    model, release, _ = built(recurrent, encoding, 1, dtype=torch.float32, state_std=0.0)
    model.train()
    release.train()
    assert release.max_recurrences_for_training == 1 and release.max_backprop == 1 and release.alpha == 1
    x = tokens(encoding)
    if encoding == "rope":
        use_posbench_rope_table(release, model, S)
    loss, theirs = release.model_call(x, n=0, k=1)
    ours = model(x)
    assert gap(ours.detach(), theirs) <= FLOAT32
    loss.backward()
    ours.sum().backward()
    assert release.encoder.embedding.word_embedding.weight.grad.abs().sum() > 0
    assert model.embed.weight.grad.abs().sum() > 0


def test_the_map_writes_every_release_parameter_once(recurrent):
    """The explicit map, as ``copy_into_release`` applies it, for the record (and so that a changed release or
    posbench shows here first)."""
    _, _, mapping = built(recurrent, "rope", 2)
    block = "encoder.recurrent_block.layers.0"
    assert mapping[f"{block}.attn.in_proj_weight"] == "per_head(blocks.0.attn.qkv.weight)"
    assert mapping[f"{block}.ffn.dense_in.weight"] == "cat(blocks.0.mlp.up, blocks.0.mlp.gate)"
    assert mapping[f"{block}.residual1.norm.weight"] == "blocks.0.attn_norm.weight"
    assert mapping[f"{block}.residual2.norm.bias"] == "blocks.0.mlp_norm.bias"
    assert mapping["encoder.embedding.norm.weight"] == "embed_norm.weight"
    assert mapping["encoder.head.dense_in.weight"] == "cat(head.up, head.gate)"
    assert mapping["encoder.final_norm.bias"] == "norm.bias"
    assert mapping["adapter.weight"] == "identity"
    assert mapping["decoder.weight"] == "lm_head.weight"
    _, _, nope = built(recurrent, "nope", 1)
    assert nope["encoder.recurrent_block.layers.1.attn.attn.in_proj_weight"] == "blocks.1.attn.qkv.weight"
    assert len(nope) == 25                   # 3 embedding + 2 x 8 per layer + 4 head and final norm + 2


# The init ------------------------------------------------------------------------------------------------------

def xavier_std(fan_out: int, fan_in: int, gain: float) -> float:
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


def within(x: torch.Tensor, std: float) -> bool:
    """The sample std of the draws ``x`` within 5 standard errors of ``std`` (a normal's: std / sqrt(2 (n-1)))."""
    n = x.numel()
    return abs(x.double().std().item() - std) <= 5 * std / math.sqrt(2 * (n - 1))


def test_the_release_and_posbench_draw_the_same_init_through_multihead_attention(recurrent):
    """deepnorm-straight through nn.MultiheadAttention (NoPE, Abacus): every matrix of the release's fresh model
    has the std posbench's init gives the matrix it maps to (Xavier normal at gain (8 L)^-1/4, queries and keys
    at 1; embeddings N(0, d^-1/2)). Width 128, 4 layers x 2 recurrences so each matrix pools 16k+ draws."""
    d, layers, r = 128, 4, 2
    arch = release_arch("abacus", r)
    arch.update(hidden_size=d, layers_in_recurrent_block=layers, intermed_size=2 * d)
    arch["embedding"].update(embedding_dim=d, vocab_size=64)
    torch.manual_seed(0)
    release = recurrent.ScriptableRecurrentLMBPTT(recurrent.crammedDepthRecurrentConfig(arch), equals_token=17)
    g = (8 * layers * r) ** -0.25
    for layer in release.encoder.recurrent_block.layers:
        q, k, v = layer.attn.attn.in_proj_weight.detach().view(3, d, d)
        assert within(q, xavier_std(d, d, 1.0)) and within(k, xavier_std(d, d, 1.0)) and within(v, xavier_std(d, d, g))
        assert within(layer.attn.attn.out_proj.weight.detach(), xavier_std(d, d, g))
        assert within(layer.ffn.dense_in.weight.detach(), xavier_std(2 * d, d, g))
        assert within(layer.ffn.dense_out.weight.detach(), xavier_std(d, d, g))
    assert within(release.decoder.weight.detach(), xavier_std(64, d, g))
    assert within(release.encoder.embedding.word_embedding.weight.detach(), d ** -0.5)
    assert within(release.encoder.embedding.pos_embedding.embedding.weight.detach(), d ** -0.5)


def test_the_releases_self_attention_init_goes_by_row_block_not_by_role(recurrent):
    """A difference of init, not of the forward pass (posbench follows the nn.MultiheadAttention path): the
    release's NeoX-style attention (its RoPE and FIRE runs) subclasses nn.MultiheadAttention, so ``_init_module``
    draws its in_proj as [Q; K; V] blocks of d rows (gains 1, 1, g), but this attention reads its rows per head
    ([q_h; k_h; v_h]). With 4 heads the first d rows are head 0's q, k, v and head 1's q: head 0's values are
    drawn at gain 1 and head 3's queries at gain g. posbench draws every head's values at g and queries at 1."""
    d, layers, r = 256, 2, 1
    arch = release_arch("rope", r)
    arch.update(hidden_size=d, intermed_size=2 * d)
    arch["embedding"].update(embedding_dim=d)
    torch.manual_seed(0)
    release = recurrent.ScriptableRecurrentLMBPTT(recurrent.crammedDepthRecurrentConfig(arch), equals_token=17)
    g = (8 * layers * r) ** -0.25                                        # 0.5
    hd = d // HEADS
    rows = release.encoder.recurrent_block.layers[0].attn.in_proj_weight.detach().view(HEADS, 3, hd, d)
    one, small = xavier_std(d, d, 1.0), xavier_std(d, d, g)
    assert within(rows[0, 2], one) and not within(rows[0, 2], small)     # head 0's values: gain 1
    assert within(rows[3, 0], small) and not within(rows[3, 0], one)     # head 3's queries: gain g
    torch.manual_seed(0)
    ours = Transformer(ModelConfig(vocab_size=VOCAB, d_model=d, n_layers=layers, n_heads=HEADS, d_ff=d,
                                   encoding="rope", init_scheme="deepnorm", recurrences=r, norm="layer",
                                   norm_position="post", mlp="geglu", embedding_norm=True, head_mlp=True,
                                   input_injection=True))
    q, k, v = ours.blocks[0].attn.qkv.weight.detach().view(3, HEADS, hd, d)
    assert within(v[0], small) and within(q[3], one)


def test_the_releases_deepnorm_init_redraws_fires_mlp(recurrent):
    """A difference of init (FIRE and Abacus + FIRE runs): ``_init_module`` visits every module of the release's
    model, FIRE's two nn.Linear included, so under ``deepnorm-straight`` FIRE's MLP is Xavier normal at gain g with
    zero biases (every breakpoint -b1/w1 at u = 0: at init the bias is linear in the normalised distance u >= 0).
    posbench's FIRE keeps its own init under ``init_scheme=deepnorm`` (PyTorch's default: the first layer's weights and
    biases U(-1, 1), std 0.58; tests/model/test_backbone.py), as DAPE's FIRE class releases it."""
    release = release_model(recurrent, "fire", 1)
    g = (8 * LAYERS * 1) ** -0.25
    mlps = [layer.attn.rotary_emb.mlp for layer in release.encoder.recurrent_block.layers]
    for mlp in mlps:
        assert not mlp[0].bias.any() and not mlp[2].bias.any()
    assert within(torch.cat([m[0].weight.detach().flatten() for m in mlps]), xavier_std(32, 1, g))
    assert within(torch.cat([m[2].weight.detach().flatten() for m in mlps]), xavier_std(HEADS, 32, g))
    ours = posbench_model("fire", 1)
    assert all(layer.mlp[0].bias.abs().max() > 0.5 for layer in ours.encoding.layers)
