"""TAPE: equal to RoPE when fresh, orthogonally equivariant, causal state, gradients, size, options.

All comparisons are float32 with tolerances stated at each assert; TAPE's zero-initialised gate and
up_proj are perturbed (std 0.3, ``encoding_helpers.perturb_tape``) wherever a zero update would hide a bug.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from posbench.encodings.base import rope_cos_sin
from posbench.encodings.tape import untie
from posbench.model import ModelConfig, Transformer

from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from encoding_helpers import VOCAB, assert_close, run_layers, seeded, tiny, tokens

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = dict(rtol=1e-5, atol=1e-5)


# ---- a fresh TAPE model is RoPE ------------------------------------------------------------------------
@pytest.mark.parametrize("gate", ["rowsum", "scalar"])
def test_fresh_tape_equals_rope_with_the_same_shared_weights(gate):
    rope = tiny("rope", layers=3, encoding_options={"random_offset": True})
    tape = tiny("tape", layers=3, perturb=False, encoding_options={"gate": gate})
    missing, unexpected = tape.load_state_dict(rope.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("encoding.layers.") for k in missing)
    x = tokens(2, 12)
    with torch.no_grad():
        torch.testing.assert_close(tape.eval()(x), rope.eval()(x), **TOL)
        # in training both draw the same random offset from Python's RNG
        torch.testing.assert_close(seeded(tape.train(), x, seed=5), seeded(rope.train(), x, seed=5), **TOL)
    perturbed = tiny("tape", layers=3)
    perturbed.load_state_dict({**perturbed.state_dict(), **rope.state_dict()})
    with torch.no_grad():
        assert (perturbed.eval()(x) - rope.eval()(x)).abs().max() > 1e-3  # the updates do act


# ---- the layer, written out from the specification ---------------------------------------------------------
def tape_by_the_spec(model, toks):
    """TAPE in float64 from its equations (Zhu et al., ICML 2025, arXiv:2501.00712, as its release VITA-Group/TAPE
    466d9e6 ``models/llama/adape.py`` computes them; posbench/encodings/tape.py's docstring writes them out),
    sharing nothing with posbench but the weights: q and k pairs multiplied by explicit 2x2 blocks E, an explicit
    attention matrix A, C, S <- C, S + s_h A (C, S), then dE[h] = sum_p W_down[h, p] g[p] sum_h' W_up[p, h'] E[h']
    with g = SiLU(W_x m) from the MLP output m. Returns logits and the state (C, S) after each layer."""
    cfg = model.config
    b, n = toks.shape
    heads, d = cfg.n_heads, cfg.head_dim
    half = d // 2
    w = {k: v.detach().double() for k, v in model.state_dict().items()}

    def rms(x, weight):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.norm_eps) * weight

    t = torch.arange(n, dtype=torch.float64)
    freq = torch.tensor([10000.0 ** (-2 * f / d) for f in range(half)], dtype=torch.float64)
    angle = torch.cat((t[:, None] * freq, t[:, None] * freq), -1)            # [N, D]
    c = angle.cos().expand(b, heads, n, d).clone()
    s = angle.sin().expand(b, heads, n, d).clone()

    def apply_e(u, c, s):
        """u [B, H, N, D]; pair f -> E @ (u_f, u_{f+F}) with E = [[C_f, -S_f], [S_{f+F}, C_{f+F}]]."""
        a, z = u[..., :half], u[..., half:]
        return torch.cat((c[..., :half] * a - s[..., :half] * z, s[..., half:] * a + c[..., half:] * z), -1)

    x = w["embed.weight"][toks]
    states = []
    for layer in range(cfg.n_layers):
        p = f"blocks.{layer}."
        h = rms(x, w[p + "attn_norm.weight"])
        wq, wk, wv = w[p + "attn.qkv.weight"].chunk(3, dim=0)
        q, k, v = ((h @ m.T).view(b, n, heads, d).transpose(1, 2) for m in (wq, wk, wv))
        scores = apply_e(q, c, s) @ apply_e(k, c, s).transpose(-1, -2) / math.sqrt(d)
        scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
        attn = scores.softmax(-1)                                              # A [B, H, N, N]
        x = x + (attn @ v).transpose(1, 2).reshape(b, n, -1) @ w[p + "attn.out.weight"].T
        gate = w[f"encoding.layers.{layer}.gate"]
        s_h = (gate.sum(-1) if gate.dim() == 2 else gate)[None, :, None, None]
        c, s = c + s_h * (attn @ c), s + s_h * (attn @ s)
        h2 = rms(x, w[p + "mlp_norm.weight"])
        m = (F.silu(h2 @ w[p + "mlp.gate.weight"].T) * (h2 @ w[p + "mlp.up.weight"].T)) @ w[p + "mlp.down.weight"].T
        g = F.silu(m @ w[f"encoding.layers.{layer}.x_proj.weight"].T)            # [B, N, I]
        w_up = w[f"encoding.layers.{layer}.up_proj.weight"]                      # [I, H]
        w_down = w[f"encoding.layers.{layer}.down_proj.weight"]                  # [H, I]
        new = []
        for e in (c, s):
            delta = torch.zeros_like(e)
            for head in range(heads):
                for i in range(w_up.shape[0]):
                    mixed = sum(w_up[i, j] * e[:, j] for j in range(heads))        # [B, N, D]
                    delta[:, head] += w_down[head, i] * g[:, :, i, None] * mixed
            new.append(e + delta)
        c, s = new
        x = x + m
        states.append(torch.cat((c, s), -1))
    return rms(x, w["norm.weight"]) @ w["lm_head.weight"].T, states


@pytest.mark.parametrize("gate", ["rowsum", "scalar"])
def test_tape_layers_match_the_specification(gate):
    model = tiny("tape", layers=3, encoding_options={"gate": gate}).eval()
    x = tokens(2, 9)
    expected_logits, expected_states = tape_by_the_spec(model, x)
    for dtype, rel in ((torch.float64, 1e-6), (torch.float32, 1e-4)):
        # float64: only the float32 RoPE table (rounded by 6e-8) differs from the spec, amplified by the
        # state's growth (|E| ~ 15) and three layers; float32 end to end: 1e-4 relative to the largest entry
        with torch.no_grad():
            logits, states = run_layers(model.to(dtype), x)
        assert_close(logits.double(), expected_logits, rel=rel)
        for layer in range(2):  # the last layer's state is discarded, so the model does not compute it
            assert_close(untie(states[layer]).double(), expected_states[layer], rel=rel, msg=f"layer {layer}")


# ---- orthogonal equivariance -----------------------------------------------------------------------------
def blocks(state: torch.Tensor) -> torch.Tensor:
    """[B, H, N, 2D] = [C | S] -> the 2x2 blocks E = [[C_f, -S_f], [S_{f+F}, C_{f+F}]], shape [B, H, N, F, 2, 2]."""
    c, s = state.chunk(2, dim=-1)
    f = c.shape[-1] // 2
    top = torch.stack((c[..., :f], -s[..., :f]), dim=-1)
    bottom = torch.stack((s[..., f:], c[..., f:]), dim=-1)
    return torch.stack((top, bottom), dim=-2)


def from_blocks(e: torch.Tensor) -> torch.Tensor:
    c = torch.cat((e[..., 0, 0], e[..., 1, 1]), dim=-1)
    s = torch.cat((-e[..., 0, 1], e[..., 1, 0]), dim=-1)
    return torch.cat((c, s), dim=-1)


def apply_g(g: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    return from_blocks(g @ blocks(state))


def rotation(angle: float) -> torch.Tensor:
    return torch.tensor([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])


def reflection(angle: float) -> torch.Tensor:
    return torch.tensor([[math.cos(angle), math.sin(angle)], [math.sin(angle), -math.cos(angle)]])


def test_block_view_round_trips():
    state = torch.randn(2, 3, 5, 8)
    torch.testing.assert_close(from_blocks(blocks(state)), state, rtol=0, atol=0)
    identity = torch.eye(2)
    torch.testing.assert_close(apply_g(identity, state), state, rtol=0, atol=0)


@pytest.mark.parametrize("g", [rotation(0.7), reflection(1.1), reflection(0.0)], ids=["rotation", "reflection",
                                                                                    "flip"])
@pytest.mark.parametrize("gate", ["rowsum", "scalar"])
def test_orthogonal_equivariance(g, gate, monkeypatch):
    assert torch.allclose(g @ g.T, torch.eye(2), atol=1e-6)
    model = tiny("tape", layers=3, encoding_options={"gate": gate}).eval()
    x = tokens(2, 10)
    with torch.no_grad():
        logits, states = run_layers(model, x)
        original_init = model.encoding.init_state
        monkeypatch.setattr(model.encoding, "init_state",
                            lambda *inputs: apply_g(g, untie(original_init(*inputs))))
        logits_g, states_g = run_layers(model, x)
        # the per-layer check is meaningful only if the layers actually change the state
        assert (states[0] - original_init(torch.arange(10).expand(2, 10), x, None)).abs().max() > 1e-2
        # logits see the state only through E_i^T E_j, which G leaves alone (float32, relative 1e-5)
        assert_close(logits_g, logits)
        assert_close(model(x), logits)  # the patched init_state is used by forward too
        for layer, (s, s_g) in enumerate(zip(states, states_g)):
            # both updates are linear in E with G-blind coefficients, so they commute with G; the state grows
            # to |E| ~ 15 over the layers, so the tolerance is relative to its largest entry
            assert_close(s_g, apply_g(g, untie(s)), msg=f"layer {layer}")


def test_equivariance_detects_a_non_equivariant_update(monkeypatch):
    """Guard on the test above: an update that treats C and S differently breaks the state check."""
    model = tiny("tape", layers=2).eval()
    g = rotation(0.7)
    plain_after_mlp = model.encoding.after_mlp

    def broken(layer, state, mlp_out):
        new = plain_after_mlp(layer, state, mlp_out)   # tied or untied: [c | s] or [C | S]
        c, s = new.chunk(2, dim=-1)
        return torch.cat((c * 1.1, s), dim=-1)

    monkeypatch.setattr(model.encoding, "after_mlp", broken)
    x = tokens(1, 8)
    with torch.no_grad():
        _, states = run_layers(model, x)
        original_init = model.encoding.init_state
        monkeypatch.setattr(model.encoding, "init_state",
                            lambda *inputs: apply_g(g, untie(original_init(*inputs))))
        _, states_g = run_layers(model, x)
    assert (states_g[0] - apply_g(g, untie(states[0]))).abs().max() > 1e-3


# ---- causal state --------------------------------------------------------------------------------------
def test_state_of_a_token_depends_only_on_earlier_tokens():
    model = tiny("tape", layers=3).eval()
    x = tokens(1, 12)
    with torch.no_grad():
        _, states = run_layers(model, x)
        for changed in (9, 4):
            y = x.clone()
            y[0, changed] = (y[0, changed] + 11) % VOCAB
            _, states_y = run_layers(model, y)
            for layer in range(2):  # the state after the last layer is discarded (and not computed)
                torch.testing.assert_close(states_y[layer][:, :, :changed], states[layer][:, :, :changed], **TOL)
                assert (states_y[layer][:, :, changed:] - states[layer][:, :, changed:]).abs().max() > 1e-4


# ---- gradients -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gate", ["rowsum", "scalar"])
def test_every_tape_parameter_that_reaches_the_loss_gets_a_gradient(gate):
    layers = 3
    model = tiny("tape", layers=layers, encoding_options={"gate": gate}).train()
    x = tokens(2, 12)
    loss = seeded(model, x[:, :-1]).flatten(0, 1).log_softmax(-1).gather(1, x[:, 1:].reshape(-1, 1)).mean()
    loss.backward()
    for name, p in model.encoding.named_parameters():
        layer = int(name.split(".")[1])
        if layer < layers - 1:
            assert p.grad is not None and p.grad.abs().max() > 1e-6, name
        else:
            # after the last layer the state is discarded (as in the reference): its update cannot reach the
            # loss, so it is skipped and its parameters get no gradient
            assert p.grad is None or p.grad.abs().max() == 0, name
            assert not p.requires_grad, name   # frozen, so DDP needs no search for unused parameters
    assert all(p.grad is not None for n, p in model.named_parameters() if not n.startswith("encoding."))


def test_gradients_flow_through_the_state_into_q_and_k():
    """The positional path's gradient w.r.t. the attention weights is kept (the reference's fused kernel
    drops it): autograd matches a central finite difference in float64 to 1e-4 relative."""
    model = tiny("tape", layers=2).double().eval()
    x = tokens(1, 8)

    def loss_fn():
        return model(x).logsumexp(-1).sum()

    gate = model.encoding.layers[0].gate
    loss_fn().backward()
    analytic = gate.grad[0, 0].item()
    eps = 1e-6
    with torch.no_grad():
        gate[0, 0] += eps
        up = loss_fn().item()
        gate[0, 0] -= 2 * eps
        down = loss_fn().item()
        gate[0, 0] += eps
    numeric = (up - down) / (2 * eps)
    assert analytic == pytest.approx(numeric, rel=1e-4, abs=1e-8)


# ---- size and options ------------------------------------------------------------------------------------
@pytest.mark.parametrize("d_model, heads, layers, size", [(32, 4, 2, 0), (48, 6, 3, 10), (64, 2, 1, 0)])
def test_added_parameter_count(d_model, heads, layers, size):
    options = {"position_size": size} if size else {}
    tape = Transformer(ModelConfig(vocab_size=20, d_model=d_model, n_layers=layers, n_heads=heads,
                                   encoding="tape", encoding_options=options))
    rope = Transformer(ModelConfig(vocab_size=20, d_model=d_model, n_layers=layers, n_heads=heads, encoding="rope"))
    i = size or 4 * heads
    assert tape.config.encoding_options["position_size"] == i
    expected = layers * (d_model * i + heads * i + i * heads + heads * heads)
    assert tape.num_parameters() - rope.num_parameters() == expected == tape.encoding.added_parameters()
    scalar = Transformer(ModelConfig(vocab_size=20, d_model=d_model, n_layers=layers, n_heads=heads,
                                     encoding="tape", encoding_options={**options, "gate": "scalar"}))
    assert scalar.num_parameters() - rope.num_parameters() == layers * (d_model * i + 2 * heads * i + heads)


def test_paper_size_matches_table_7():
    """768 / 12 heads / 12 layers, I = 48: 457,920 added parameters (0.44 Mi)."""
    tape = Transformer(ModelConfig(vocab_size=8, d_model=768, n_layers=12, n_heads=12, d_ff=8, encoding="tape",
                                   encoding_options={"position_size": 48}))
    assert tape.encoding.added_parameters() == 457_920


def test_zero_initialisation():
    model = tiny("tape", perturb=False)
    for layer in model.encoding.layers:
        assert torch.count_nonzero(layer.gate) == 0 and torch.count_nonzero(layer.up_proj.weight) == 0
        assert layer.x_proj.weight.std() > 0 and layer.down_proj.weight.std() > 0


def test_scalar_and_rowsum_gates_compute_the_same_update():
    rowsum = tiny("tape", layers=2, encoding_options={"gate": "rowsum"}).eval()
    scalar = tiny("tape", layers=2, encoding_options={"gate": "scalar"}).eval()
    state = {k: v for k, v in rowsum.state_dict().items() if not k.endswith(".gate")}
    for i, layer in enumerate(rowsum.encoding.layers):
        state[f"encoding.layers.{i}.gate"] = layer.gate.detach().sum(-1)  # s_h = sum_e W[h, e]
    scalar.load_state_dict(state)
    assert scalar.encoding.layers[0].gate.shape == (4,)
    x = tokens(2, 10)
    with torch.no_grad():
        torch.testing.assert_close(scalar(x), rowsum(x), **TOL)


def test_random_offset_in_training_only():
    model = tiny("tape", max_seq_len=16)
    tape = model.encoding
    positions = torch.arange(10).expand(2, 10)

    def offset_of(state):
        """Recover k from the state: the lowest frequency w turns less than pi over 0..2L, so k = atan2(S, C) / w
        at position 0; then the whole state must be the RoPE table at positions + k."""
        w = 10000.0 ** (-(tape.head_dim - 2) / tape.head_dim)
        f = tape.head_dim // 2 - 1
        half = tape.head_dim // 2
        k = round(math.atan2(state[0, 0, 0, half + f].item(), state[0, 0, 0, f].item()) / w)
        cos, sin = rope_cos_sin(positions + k, tape.head_dim, 10000.0)
        table = torch.cat((cos[..., :half], sin[..., :half]), -1)[:, None].expand_as(state)
        torch.testing.assert_close(state, table, rtol=0, atol=1e-6)
        return k

    tape.eval()
    assert offset_of(tape.init_state(positions, None, None)) == 0
    tape.train()
    torch.manual_seed(0)                 # the offset is drawn with torch's generator (no graph break)
    draws = [offset_of(tape.init_state(positions, None, None)) for _ in range(40)]
    assert len(set(draws)) > 10 and max(draws) <= 32 and min(draws) >= 0
    no_offset = tiny("tape", encoding_options={"random_offset": False}).encoding.train()
    assert offset_of(no_offset.init_state(positions, None, None)) == 0


def test_state_shape_and_initial_rope_table():
    model = tiny("tape").eval()
    state = model.encoding.init_state(torch.arange(6).expand(3, 6), None, None)
    assert state.shape == (3, 4, 6, 8)  # [B, H, N, D]: the tied state, half of C and half of S
    t = torch.arange(6, dtype=torch.float64)[:, None]
    freq = torch.tensor([10000.0 ** (-2 * f / 8) for f in range(4)], dtype=torch.float64)
    angles = t * freq
    table = torch.cat((angles.cos(), angles.sin()), -1).float()
    for h in range(4):  # every head starts from the same RoPE table, [cos | sin] of the D/2 frequencies
        for b in range(3):
            torch.testing.assert_close(state[b, h], table, rtol=0, atol=1e-7)


# ---- the tied state (the fast path) ------------------------------------------------------------------------
@pytest.mark.parametrize("gate", ["rowsum", "scalar"])
def test_tied_state_equals_the_full_state_outputs_and_gradients(gate, monkeypatch):
    """The fast path carries [c | s] (width D) instead of [C | S] (width 2D, halves duplicated, as the
    reference and posbench before it). In float64, in training mode (the same random offset), logits and every
    parameter's gradient agree to 1e-12 relative."""
    results = []
    for layout in ("tied", "full"):
        model = tiny("tape", layers=3, encoding_options={"gate": gate}).double().train()
        if layout == "full":
            tied_init = model.encoding.init_state
            monkeypatch.setattr(model.encoding, "init_state", lambda *inputs: untie(tied_init(*inputs)))
        x = tokens(2, 11)
        logits = seeded(model, x, seed=9)
        logits.logsumexp(-1).mean().backward()
        results.append((logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (tied, tied_grads), (full, full_grads) = results
    torch.testing.assert_close(tied, full, rtol=1e-12, atol=1e-12)
    assert tied_grads.keys() == full_grads.keys() and len(tied_grads) > 10
    for name, grad in full_grads.items():
        torch.testing.assert_close(tied_grads[name], grad, rtol=1e-10, atol=1e-12, msg=name)


def test_the_halves_of_the_full_state_stay_equal():
    """Why the tied state is exact: started from RoPE's table (halves equal), every update treats the channels
    alike, so the full state's halves are still equal after every layer."""
    model = tiny("tape", layers=3).double().eval()
    with torch.no_grad():
        original_init = model.encoding.init_state
        model.encoding.init_state = lambda *inputs: untie(original_init(*inputs))
        _, states = run_layers(model, tokens(2, 9))
    for state in states[:-1]:
        c, s = state.chunk(2, dim=-1)
        for full in (c, s):
            first, second = full.chunk(2, dim=-1)
            torch.testing.assert_close(first, second, rtol=0, atol=0)
        assert (state - untie(original_init(torch.arange(9).expand(2, 9), None, None))).abs().max() > 1e-2   # it moved
