"""What the TAPE paper's arithmetic release computes, established on its own code (issue 47; docs/paper.md,
"What the arithmetic release ran").

The release is github:zhuconv/arithmetic, public commits 84c16ad ("update", the one with shells/addition_ff.sh)
and 55f877d ("version 0.1", HEAD). Each test reads the release's files from its git mirror when it runs
(tests/release_source.py; skipped when the mirror is absent) and runs them on CPU at toy sizes: sequence 8,
batch 2, width 32, 4 heads of 8.

Tolerances: "unchanged" is bitwise (``torch.equal``: the same float32 operations on the same inputs on CPU);
"changes" is a largest absolute difference above 1e-3 (the outputs are O(0.1-1)).
"""

from __future__ import annotations

import ast
import re
import shlex
import types

import pytest
import torch

from release_source import cramming_stubs, require

OWNER, NAME = "zhuconv", "arithmetic"
HEAD, UPDATE = "55f877d", "84c16ad"
ARCH = "cramming/architectures"
S, B, HIDDEN, HEADS = 8, 2, 32, 4
HD = HIDDEN // HEADS
CHANGED = 1e-3


class _Unused(torch.nn.Module):
    """Stands in for a base class the tests never instantiate (BertSelfAttention)."""


# Imports these files make that the tests do not exercise: stand-ins, present only while a file executes.
STUBS = cramming_stubs(_Unused, types.SimpleNamespace())

# The attention's forward throws away the rotated q and k (84c16ad:attention.py:302, 55f877d:attention.py:319).
DISCARDED = "self.apply_rotary_emb(query_layer, key_layer, position_states)"


@pytest.fixture(scope="module")
def release():
    return require(OWNER, NAME, HEAD, UPDATE)


def load(release, commit, name, **kwargs):
    return release.load(commit, f"{ARCH}/{name}.py", stubs=STUBS, **kwargs)


def cfg_attention(kind):
    """The launch's attention settings (84c16ad:shells/addition_ff.sh:229-232 over
    cramming/config/arch/crammed-adadepthrecurrent.yaml:42-53), at toy width."""
    return types.SimpleNamespace(type="self-attention", num_attention_heads=HEADS, rotary_embedding=kind,
                                 qkv_bias=False, bias_in_proj=False, skip_output_projection=False,
                                 sequence_op="torch-softmax", seq_op_in_fp32=False, max_length=64,
                                 sub_normalization=False)


def attention(module, kind, seed=0):
    torch.manual_seed(seed)
    m = module.get_attention_mechanism(0, HIDDEN, cfg_attention(kind), torch.nn.Identity)
    with torch.no_grad():
        m.in_proj_weight.mul_(HIDDEN ** -0.5)    # its randn init at unit scale saturates the softmax at any width
    return m.eval()


def causal_mask(release, commit):
    return load(release, commit, "components").get_causal_attention_mask(torch.zeros(B, S, dtype=torch.long))


def hidden(seed=1):
    return torch.randn(S, B, HIDDEN, generator=torch.Generator().manual_seed(seed))    # [S B H]: seq first


def release_position_state(release, commit, kind, x):
    """The position state the release's model builds before its first layer: AdaRotary for 'adape' and
    YaRNRotary for 'adayarn' at 55f877d (crammed_adadepthrecurrent.py:239-242); at 84c16ad YaRNRotary whatever
    the flag (crammed_adadepthrecurrent.py:234). Evaluation mode: no random offset. Two [S B heads head_dim]."""
    emb = load(release, commit, "embeddings")
    if commit == HEAD and kind == "adape":
        rotary = emb.AdaRotary(HD, HEADS, max_position_embeddings=64, scaling_factor=1)
    else:
        rotary = emb.YaRNRotary(HD, HEADS, max_position_embeddings=64, original_max_position_embeddings=64)
    return rotary.eval()(x, seq_len=S)


def random_state(seed, shape=(S, B, HEADS, HD), positive=False):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) if positive else torch.randn(shape, generator=g)


def gap(a, b):
    return (a - b).abs().max().item()


# (a) the scores never read the position state -------------------------------------------------------------------

ADA_CASES = [(HEAD, "adape"), (HEAD, "adayarn"), (UPDATE, "adape")]


@pytest.mark.parametrize("commit,kind", ADA_CASES, ids=[f"{c}-{k}" for c, k in ADA_CASES])
def test_ada_attention_output_ignores_the_position_state(release, commit, kind):
    """'adape'/'adayarn': the attention's output is bitwise the same under the release's own position state and
    under a random one (the scores come from the un-rotated q and k); the state it hands on does change.
    (84c16ad routes only 'adape' to this class: attention.py:14; 'adayarn' there is plain RoPE attention.)"""
    mod = load(release, commit, "attention")
    m = attention(mod, kind)
    assert type(m).__name__ == "SeqFirstSelfAdaAttention"
    assert release.line_of(commit, f"{ARCH}/attention.py", DISCARDED) == {UPDATE: 302, HEAD: 319}[commit]
    x, mask = hidden(), causal_mask(release, commit)
    own = release_position_state(release, commit, kind, x)
    other = (random_state(2), random_state(3))
    with torch.no_grad():
        out_own, state_own = m(x, own, mask)
        out_other, state_other = m(x, other, mask)
    assert torch.equal(out_own, out_other)
    assert gap(state_own[0], state_other[0]) > CHANGED and gap(state_own[1], state_other[1]) > CHANGED


def test_adalibi_attention_output_reads_the_position_state(release):
    """The control: 'adalibi' (55f877d only) adds log(p_i . p_j) to the scores (attention.py:233-236), so two
    random (positive) position states give outputs more than 1e-3 apart."""
    m = attention(load(release, HEAD, "attention"), "adalibi")
    x, mask = hidden(), causal_mask(release, HEAD)
    with torch.no_grad():
        out_a, _ = m(x, random_state(2, positive=True), mask)
        out_b, _ = m(x, random_state(3, positive=True), mask)
    assert gap(out_a, out_b) > CHANGED


@pytest.mark.parametrize("commit", [HEAD, UPDATE])
def test_the_check_would_see_rotated_q_and_k_used(release, commit):
    """The guard: the release's attention.py with the one line changed to keep what apply_rotary_emb returns
    (``query_layer, key_layer = self.apply_rotary_emb(...)``), loaded as its own module: its output now differs
    by more than 1e-3 between the two position states, so the bitwise check above fails on a release whose
    scores read the rotated q and k."""
    text = release.show(commit, f"{ARCH}/attention.py")
    assert text.count(DISCARDED) == 1
    patched = text.replace(DISCARDED, "query_layer, key_layer = " + DISCARDED)
    m = attention(load(release, commit, "attention", source=patched, tag="rotated"), "adape")
    x, mask = hidden(), causal_mask(release, commit)
    with torch.no_grad():
        out_own, _ = m(x, release_position_state(release, commit, "adape", x), mask)
        out_other, _ = m(x, (random_state(2), random_state(3)), mask)
    assert gap(out_own, out_other) > CHANGED


@pytest.mark.parametrize("commit", [HEAD, UPDATE])
def test_a_whole_tape_layer_hands_on_hidden_states_that_ignore_the_position_state(release, commit):
    """One AdaTransformerLayer (crammed_adadepthrecurrent.py: attention, then the FFN and AdaPE, post-norm, as the
    launch builds it): its hidden output is bitwise the same under the release's position state and a random
    one, so nothing of the state reaches the logits through any layer; its position output differs."""
    rec = load(release, commit, "crammed_adadepthrecurrent")
    cfg = types.SimpleNamespace(hidden_size=HIDDEN, intermed_size=2 * HIDDEN, norm="LayerNorm", norm_eps=1e-12,
                                norm_scheme="post", nonlin="GELUglu", sub_normalization=False, use_bias=False,
                                attention=cfg_attention("adape"))
    torch.manual_seed(0)
    layer = rec.AdaTransformerLayer(0, cfg).eval()
    with torch.no_grad():
        layer.attn.in_proj_weight.mul_(HIDDEN ** -0.5)
    x, mask = hidden(), causal_mask(release, commit)
    with torch.no_grad():
        h_own, p_own = layer(x, release_position_state(release, commit, "adape", x), mask)
        h_other, p_other = layer(x, (random_state(2), random_state(3)), mask)
    assert torch.equal(h_own, h_other)
    assert gap(p_own[0], p_other[0]) > CHANGED


# (b) the attention-side state update runs backwards -------------------------------------------------------------

@pytest.mark.parametrize("commit", [HEAD, UPDATE])
def test_state_update_sends_later_positions_to_earlier_ones(release, commit):
    """``einsum('qbnh,bnqk->kbnh', state, probs)`` (84c16ad:attention.py:236-237, 55f877d:attention.py:252-253)
    gives key j the sum over queries i >= j of P[i, j] state[i]. With a state that is zero everywhere but at the
    last position, the first position's new state is nonzero in every batch row, head and channel (P[S-1, 0] >
    0); a causal update (query i gathering keys j <= i) would leave it exactly zero."""
    m = attention(load(release, commit, "attention"), "adape")
    x, mask = hidden(), causal_mask(release, commit)
    last_only = torch.zeros(S, B, HEADS, HD)
    last_only[-1] = 1.0
    with torch.no_grad():
        _, (new0, new1) = m(x, (last_only, torch.zeros_like(last_only)), mask)
    assert (new0[0] > 0).all()
    assert torch.equal(new1, torch.zeros_like(new1))
    assert torch.equal(new0[-1] > 0, torch.ones_like(new0[-1], dtype=torch.bool))   # and itself, P[S-1, S-1]


@pytest.mark.parametrize("commit", [HEAD, UPDATE])
def test_a_later_token_moves_an_earlier_positions_state_but_not_its_output(release, commit):
    """Changing only the last token's hidden state: the first position's attention output is bitwise unchanged
    (the value path is causal), its new position state moves by more than 1e-3 (the state path is not)."""
    m = attention(load(release, commit, "attention"), "adape")
    x, mask = hidden(), causal_mask(release, commit)
    later = x.clone()
    later[-1] += torch.randn(B, HIDDEN, generator=torch.Generator().manual_seed(9))
    state = (random_state(2), random_state(3))
    with torch.no_grad():
        out, (new0, _) = m(x, state, mask)
        out_later, (new0_later, _) = m(later, state, mask)
    assert torch.equal(out[:-1], out_later[:-1])
    assert gap(new0[0], new0_later[0]) > CHANGED


# (c) the launch record and the plot --------------------------------------------------------------------------------

def launches(text: str) -> dict[str, dict[str, str]]:
    """Each ``pretrain.py`` command of a shell script as its key=value overrides, by run name."""
    runs: dict[str, dict[str, str]] = {}
    for line in re.sub(r"\\[ \t]*\n", " ", text).splitlines():
        if line.lstrip().startswith("#") or "pretrain.py" not in line:
            continue
        words = shlex.split(line)
        settings = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
        assert settings["name"] not in runs
        runs[settings["name"]] = settings
    return runs


def plotted(source: str) -> tuple[list[str], dict[str, str]]:
    """draw_all.py's ``names`` (the panels, in order) and ``name_mapping`` (their titles)."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("names", "name_mapping"):
                found[node.targets[0].id] = ast.literal_eval(node.value)
    return found["names"], found["name_mapping"]


# Every run in the "standard transformer" and "our method" sections (84c16ad:shells/addition_ff.sh:92-232).
COMMON = {
    "data": "arithmetic",
    "arch.objective_layout": "TBPTT", "arch.layers_in_recurrent_block": "16", "arch.maximal_recurrence": "1",
    "arch.hidden_size": "1024", "arch.intermed_size": "2048", "impl.microbatch_size": "256",
    "train.optim.lr": "0.0001", "arch.mask_before_equals": "True", "impl.compile_torch": "False",
    "data.sources.arithmetic.tokenizer_type": "pad",
    "data.sources.arithmetic.tokenized_dataset_path":
        "+_bucket_method_n_20_m_20_20000000_p_00_reverse_all/hf_tokenized_dataset",
    "arch.attention.type": "self-attention", "arch.attention.max_length": "64",
}
PLOTTED_RUNS = {
    "add_adayarn": {"arch": "crammed-adadepthrecurrent", "arch.embedding.pos_embedding": "abacus",
                    "arch.attention.rotary_embedding": "adape", "budget": "0.8", "arch.local_compilation": "False"},
    "add_ronope": {"arch": "crammed-depthrecurrent", "arch.embedding.pos_embedding": "None",
                   "arch.attention.rotary_embedding": "true", "budget": "0.2"},
    "add_fire_no": {"arch": "crammed-depthrecurrent", "arch.embedding.pos_embedding": "None",
                    "arch.attention.rotary_embedding": "fire", "budget": "0.5"},
}


def test_the_launch_record_of_the_plotted_runs(release):
    """84c16ad:shells/addition_ff.sh: TAPE's run (add_adayarn) adds Abacus embeddings and uses the depth-recurrent
    'ada' architecture; RoPE's (add_ronope) and FIRE's (add_fire_no) have no input position embedding; budgets
    (hours of wall clock) 0.8, 0.2, 0.5; no run sets the batch size, so train/cramming.yaml's 8192, ramped over
    60% of the budget, applies (cfg_pretrain.yaml: train: cramming)."""
    runs = launches(release.show(UPDATE, "shells/addition_ff.sh"))
    for name, own in PLOTTED_RUNS.items():
        assert runs[name] == {"name": name, "wandb": "none", "base_dir": "$cramming_base_dir",
                              "impl.fullgraph": "false", "impl.forbid_dataset_preprocessing": "False",
                              "impl.save_intermediate_checkpoints": "True", "impl.save_final_model": "True",
                              **COMMON, **own}
    assert not any(k == "train" or k.startswith("train.batch") for r in runs.values() for k in r)
    pretrain = release.show(UPDATE, "cramming/config/cfg_pretrain.yaml")
    cramming = release.show(UPDATE, "cramming/config/train/cramming.yaml")
    assert re.search(r"^  - train: cramming$", pretrain, flags=re.M)
    assert re.search(r"^batch_size: 8192$", cramming, flags=re.M)
    assert re.search(r"^batch_size_ramp: 0.60$", cramming, flags=re.M)
    assert "shells/addition_ff.sh" not in release.files(HEAD)          # HEAD has no launch script at all
    assert "script/train_add.sh" not in release.files(HEAD)            # though its README points to one


def test_the_plot_names_runs_the_launch_record_partly_lacks(release):
    """55f877d:assets/draw_all.py plots add_ronope, add_randomized, add_fire, add_adayarn as RoPE, RandPE, FIRE,
    TAPE. The 84c16ad launch record has add_ronope and add_adayarn, but no add_randomized and no add_fire (its
    FIRE run without Abacus is add_fire_no)."""
    names, mapping = plotted(release.show(HEAD, "assets/draw_all.py"))
    assert names == ["add_ronope", "add_randomized", "add_fire", "add_adayarn"]
    assert [mapping[n] for n in names] == ["RoPE", "RandPE", "FIRE", "TAPE"]
    runs = launches(release.show(UPDATE, "shells/addition_ff.sh"))
    assert {"add_ronope", "add_adayarn"} <= runs.keys()
    assert "add_randomized" not in runs and "add_fire" not in runs and "add_fire_no" in runs


# RandPE ---------------------------------------------------------------------------------------------------------

RANDPE_DRAW = "torch.randperm(self.seq_len_cached)"


def rope_pair(emb, cls, seq, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(seq, B, HEADS, HD, generator=g), torch.randn(seq, B, HEADS, HD, generator=g)
    torch.manual_seed(seed)                                            # the draw uses the global generator
    return getattr(emb, cls)(HD, seq_dim=0)(q, k)


@pytest.mark.parametrize("seq", [5, 17, 64])
def test_randpe_draws_the_identity_ordering_so_is_rope(release, seq):
    """55f877d's RandomRotary sets its length to the sequence's just before drawing
    (embeddings.py:297) and then draws sort(randperm(N)[:N]) = 0..N-1 (embeddings.py:305): its rotated q and k
    are bitwise RoPE's (Rotary). At 84c16ad there is no RandomRotary: 'randomized' falls through to Rotary."""
    emb = load(release, HEAD, "embeddings")
    for seed in range(3):
        for a, b in zip(rope_pair(emb, "RandomRotary", seq, seed), rope_pair(emb, "Rotary", seq, seed)):
            assert torch.equal(a, b)
    kinds = {c: type(attention(load(release, c, "attention"), "randomized").rotary_emb).__name__
             for c in (HEAD, UPDATE)}
    assert kinds == {HEAD: "RandomRotary", UPDATE: "Rotary"}


def test_the_check_would_see_a_real_randpe_draw(release):
    """The guard: the same class drawing from 4N positions instead of N (one expression changed, loaded as its own
    module) rotates q more than 1e-3 away from RoPE's."""
    text = release.show(HEAD, f"{ARCH}/embeddings.py")
    assert text.count(RANDPE_DRAW) == 1
    emb = load(release, HEAD, "embeddings", source=text.replace(RANDPE_DRAW, "torch.randperm(4 * self.seq_len_cached)"),
               tag="wider")
    rope = load(release, HEAD, "embeddings")
    assert gap(rope_pair(emb, "RandomRotary", 17, 0)[0], rope_pair(rope, "Rotary", 17, 0)[0]) > CHANGED
