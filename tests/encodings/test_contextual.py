"""CoPE and DAPE: logit biases computed from the queries and keys (``bias_from_qk``).

Each is checked against an independent derivation: a plain loop over (head, query, key) that follows the
papers' equations (CoPE: gates, the sum from the key to the query, the interpolated embedding *vector* dotted
with q; DAPE: the MLP applied to one (i, j) pair's 2H inputs, the base bias from its own formula), in float64 to
1e-10. Then the properties they claim, the routing to the backends that take a tensor (flex and flash_attn are a
one-line error, exit code 2 on the command line, nothing written), and a tiny training run of every task.
Model-level tolerances: 1e-5 relative to the largest logit (float32); "exactly" means bit for bit.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from posbench.model.attention import BackendError, CONTEXTUAL_WHY, attend, resolve_backend
from posbench.cli import main
from posbench.encodings import ENCODINGS
from posbench.encodings.alibi import alibi_slopes
from posbench.encodings.cope import reversed_positions
from posbench.encodings.dape import BASES

from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from encoding_helpers import assert_close, has_bias, tiny, tokens

pytestmark = pytest.mark.usefixtures("one_thread")

H, D = 3, 8
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def build(name, n_layers=2, max_seq_len=16, **options):
    torch.manual_seed(0)
    pe = ENCODINGS[name](n_layers, H, D, H * D, max_seq_len, **options).double()
    with torch.no_grad():                      # non-trivial values everywhere (CoPE's table starts at zero)
        for p in pe.parameters():
            p.copy_(torch.randn(p.shape, dtype=p.dtype) * 0.5)
    return pe


def qk(nq, nk, batch=2, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, H, nq, D, generator=g, dtype=torch.float64) * scale,
            torch.randn(batch, H, nk, D, generator=g, dtype=torch.float64) * scale)


CASES = [(9, 9), (4, 9), (1, 9)]         # square; a KV cache's new queries (Nq < Nk); one decoding step


# ---- CoPE -------------------------------------------------------------------------------------------------
def cope_by_the_paper(q, k, table, npos_max):
    """Eq. 3-6, one (b, h, i, j) at a time: g = sigmoid(q.k / sqrt(D)), p = sum over t from j to i of g_it,
    clamped to npos_max - 1, e[p] = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p], bias q.e[p] / sqrt(D).
    Query i is key nk - nq + i. Returns the bias and the positions (NaN right of the diagonal)."""
    b, h, nq, d = q.shape
    nk = k.shape[-2]
    bias = torch.full((b, h, nq, nk), float("nan"), dtype=torch.float64)
    positions = bias.clone()
    for bb in range(b):
        for hh in range(h):
            for i in range(nq):
                me = nk - nq + i
                for j in range(me + 1):
                    p = sum(1 / (1 + math.exp(-(q[bb, hh, i] @ k[bb, hh, t]).item() / math.sqrt(d)))
                            for t in range(j, me + 1))
                    p = min(p, npos_max - 1)
                    lo, hi = math.floor(p), math.ceil(p)
                    e = (p - lo) * table[:, hi] + (1 - p + lo) * table[:, lo]
                    bias[bb, hh, i, j] = (q[bb, hh, i] @ e).item() / math.sqrt(d)
                    positions[bb, hh, i, j] = p
    return bias, positions


def visible(nq, nk):
    return torch.ones(nq, nk, dtype=torch.bool).tril(diagonal=nk - nq)


@pytest.mark.parametrize("nq, nk", CASES)
@pytest.mark.parametrize("npos_max", [0, 4], ids=["default", "clamped"])
def test_cope_bias_equals_the_papers_equations_one_pair_at_a_time(nq, nk, npos_max):
    pe = build("cope", npos_max=npos_max)
    assert pe.npos_max == (npos_max or 17)                      # default: max_seq_len + 1
    q, k = qk(nq, nk, scale=1.5)
    mask = visible(nq, nk)
    for layer in range(2):
        got = pe.bias(layer, None, q, k, None, None)
        expected, positions = cope_by_the_paper(q, k, pe.pos_emb[layer].detach(), pe.npos_max)
        assert got.shape == (2, H, nq, nk)
        torch.testing.assert_close(got[..., mask], expected[..., mask], rtol=1e-10, atol=1e-10)
    if npos_max == 4:
        assert (positions[..., mask] == 3).any()                # the clamp was exercised


def cope_positions(gate_logits, npos_max):
    """Positions ``p_ij = sum_{t=j..i} sigmoid(l_it)`` from the scaled logits ``l [B, H, Nq, Nk]`` in their own
    order: the encoding's reversed form (queries and keys both reversed), flipped back."""
    return reversed_positions(gate_logits.flip(-2, -1), npos_max).flip(-2, -1)


def test_cope_positions_grow_away_from_the_query_and_stay_in_range():
    """p_ij is non-decreasing as key j moves away from query i, in [0, i - j + 1] (strictly inside: every gate
    is in (0, 1)), and zero right of the diagonal."""
    logits = torch.randn(2, H, 12, 12, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 4
    p = cope_positions(logits, npos_max=100)
    i = torch.arange(12)[:, None]
    j = torch.arange(12)[None, :]
    mask = j <= i
    assert (p[..., ~mask] == 0).all()
    assert ((p > 0) & (p < (i - j + 1))).where(mask, True).all()
    steps = p[..., :, :-1] - p[..., :, 1:]                      # p_i(j) - p_i(j + 1): adding gate g_ij >= 0
    assert (steps.where(mask[:, :-1], 0) >= 0).all()
    assert (cope_positions(logits, npos_max=5) <= 4).all()


def test_cope_gradients_reach_the_gates_the_queries_keys_and_the_table():
    pe = build("cope")
    q, k = (t.requires_grad_() for t in qk(6, 6))
    bias = pe.bias(0, None, q, k, None, None)
    (bias[..., visible(6, 6)] * torch.randn(2, H, 21, dtype=torch.float64)).sum().backward()
    assert q.grad.abs().max() > 0 and pe.pos_emb.grad[0].abs().max() > 0
    assert k.grad.abs().max() > 0                               # only through the gates (p - floor p)
    assert pe.pos_emb.grad[1].abs().max() == 0                  # the other layer's table


def test_cope_reads_no_position_and_is_nope_at_init():
    """The logits depend on q and k only (any positions give the same logits), and the table starts at zero,
    as in the paper's code, so a fresh CoPE model is NoPE."""
    cope, nope = tiny("cope", perturb=False).eval(), tiny("nope").eval()
    nope.load_state_dict(cope.state_dict(), strict=False)
    x = tokens(2, 10)
    with torch.no_grad():
        torch.testing.assert_close(cope(x), nope(x), rtol=0, atol=0)
        trained = tiny("cope").eval()
        scrambled = torch.randperm(10, generator=torch.Generator().manual_seed(1)) * 7
        torch.testing.assert_close(trained(x, positions=scrambled), trained(x), rtol=0, atol=0)


# ---- DAPE -------------------------------------------------------------------------------------------------
def base_by_hand(pe, base, layer, i, j):
    """The base bias of every head at query position i, key position j, from its own formula."""
    if base == "alibi":
        return torch.tensor([-m * (i - j) for m in alibi_slopes(H)], dtype=torch.float64)
    if base == "kerple":      # the log kernel -r1 log(1 + r2 d), d = i - j (0 for the masked future keys),
        # r1 and r2 read as at least eps (0.01); the layer's own pair (the released code's one per layer)
        kernel, eps = pe.base.kernels[layer], pe.base.options["eps"]
        return torch.tensor([-max(float(r1), eps) * math.log(1 + max(float(r2), eps) * max(i - j, 0))
                             for r1, r2 in zip(kernel.r1.detach(), kernel.r2.detach())], dtype=torch.float64)
    return pe.base.layers[layer].mlp_bias(torch.tensor([[i]]), torch.tensor([[j]]))[0, :, 0, 0].detach()


def dape_by_the_paper(pe, base, layer, q, k, q_pos, k_pos):
    """B_ij + f([L_ij, B_ij]) one (b, i, j) at a time, f = W2 LeakyReLU(W1 u + b1) + b2 on the 2H inputs."""
    mlp = pe.layers[layer]
    w1, b1, w2, b2 = (t.detach() for t in (mlp.up.weight, mlp.up.bias, mlp.down.weight, mlp.down.bias))
    b, h, nq, d = q.shape
    nk = k.shape[-2]
    out = torch.zeros(b, h, nq, nk, dtype=torch.float64)
    for bb in range(b):
        for i in range(nq):
            for j in range(nk):
                logits = torch.stack([q[bb, hh, i] @ k[bb, hh, j] for hh in range(h)]) / math.sqrt(d)
                bias = base_by_hand(pe, base, layer, int(q_pos[0, i]), int(k_pos[0, j]))
                hidden = w1 @ torch.cat((logits, bias)) + b1
                hidden = torch.where(hidden > 0, hidden, 0.01 * hidden)
                out[bb, :, i, j] = bias + w2 @ hidden + b2
    return out


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("nq, nk", CASES)
def test_dape_bias_equals_the_mlp_applied_one_pair_at_a_time(base, nq, nk):
    pe = build("dape", base=base, hidden=5)
    if base == "fire":
        with torch.no_grad():
            pe.base.layers[1].l_mult.fill_(0.1)                 # L = 6.4: queries on both sides of it
    q, k = qk(nq, nk, seed=1)
    k_pos = torch.arange(nk)[None] + 3
    q_pos = k_pos[:, nk - nq:]
    for layer in range(2):
        got = pe.bias(layer, None, q, k, q_pos, k_pos)
        expected = dape_by_the_paper(pe, base, layer, q, k, q_pos, k_pos)
        assert got.shape == (2, H, nq, nk)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)   # every entry: f acts pair by pair


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_dape_with_its_mlp_output_zeroed_is_its_base_exactly(base, backend):
    """f's last layer at zero: the logits of a DAPE model are its base encoding's, bit for bit, with the same
    weights; with f's weights as they are, they differ."""
    dape = tiny("dape", attention=backend, encoding_options={"base": base}).eval()
    plain = tiny(base, attention=backend, encoding_options=dape.encoding.base.options).eval()
    weights = {n.replace("encoding.base.", "encoding."): t for n, t in dape.state_dict().items()}
    plain.load_state_dict({n: weights[n] for n in plain.state_dict()})
    x = tokens(2, 12)
    with torch.no_grad():
        assert (dape(x) - plain(x)).abs().max() > 1e-3
        for layer in dape.encoding.layers:
            layer.down.weight.zero_()
            layer.down.bias.zero_()
        torch.testing.assert_close(dape(x), plain(x), rtol=0, atol=0)


def test_dape_gradients_reach_its_mlp_and_a_learned_base():
    model = tiny("dape", encoding_options={"base": "fire"})
    model(tokens(2, 10)).logsumexp(-1).mean().backward()
    for name, p in model.encoding.named_parameters():
        assert p.grad is not None and p.grad.abs().max() > 0, name


def test_dape_kerple_has_one_kernel_pair_per_layer_as_released():
    """The released code builds one ``ParallelKerpleLog_C`` inside each attention layer: layer l's base bias is
    -r1_l log(1 + r2_l (i - j)) from its own (r1, r2), derived here from the stored parameters (1e-12); with
    ``base_per_layer=false`` every layer reads the one shared pair (the behaviour before this option)."""
    pe = build("dape", n_layers=3, base="kerple")
    assert len(pe.base.kernels) == 3 and pe.base.options["per_layer"] is True
    i, j = torch.tensor([[9]]), torch.tensor([[0, 4, 9]])
    biases = []
    for layer in range(3):
        r1, r2 = (t.detach().clamp(min=0.01) for t in (pe.base.kernels[layer].r1, pe.base.kernels[layer].r2))
        by_hand = torch.stack([-r1 * torch.log1p(r2 * d) for d in (9.0, 5.0, 0.0)], dim=-1)     # [H, 3]
        got = pe.base_bias(layer, None, i, j)[0, :, 0, :].detach()
        torch.testing.assert_close(got, by_hand, rtol=1e-12, atol=1e-12)
        biases.append(got)
    assert (biases[0] - biases[1]).abs().max() > 1e-3                 # the layers' pairs differ
    shared = build("dape", n_layers=3, base="kerple", base_per_layer=False)
    assert len(shared.base.kernels) == 1
    torch.testing.assert_close(shared.base_bias(0, None, i, j), shared.base_bias(2, None, i, j), rtol=0, atol=0)


def test_dape_fire_starts_its_threshold_at_64_as_released():
    """FIRE_C gets init_L = noise_seq_length = 128 and stores init_L // 2 = 64: the normaliser is
    psi(max(i, 64)), psi(x) = log(|c x| + 1). By hand at queries below (10) and above (100) the threshold, with
    the layer's own MLP (ReLU, posbench's FIRE), to 1e-12; ``fire_init_l=512`` gives FIRE's own default."""
    pe = build("dape", n_layers=2, max_seq_len=128, base="fire")
    assert pe.options["fire_init_l"] == 64.0 and pe.base.options["init_l"] == 64.0
    for layer in range(2):
        fire = pe.base.layers[layer]
        with torch.no_grad():
            fire.l_mult.fill_(1.0)                            # its initial value: L = 64 itself
        c = fire.c.item()
        w1, b1 = fire.mlp[0].weight[:, 0].detach(), fire.mlp[0].bias.detach()
        w2, b2 = fire.mlp[2].weight.detach(), fire.mlp[2].bias.detach()
        for i in (10, 100):
            for j in (0, i // 2, i):
                u = math.log(abs(c * (i - j)) + 1) / (math.log(abs(c * max(i, 64.0)) + 1) + 1e-6)
                by_hand = w2 @ torch.relu(w1 * u + b1) + b2
                got = pe.base_bias(layer, None, torch.tensor([[i]]), torch.tensor([[j]]))[0, :, 0, 0].detach()
                torch.testing.assert_close(got, by_hand, rtol=1e-12, atol=1e-12)
    assert build("dape", base="fire", fire_init_l=512.0).base.options["init_l"] == 512.0


def test_dape_bases_are_the_element_wise_biases_that_exist():
    assert set(BASES) <= {name for name in ENCODINGS if has_bias(name) and not ENCODINGS[name].bias_from_qk}
    assert ENCODINGS["dape"].OPTIONS["base"].limit.choices == BASES


# ---- backends ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["cope", "dape"])
def test_the_contextual_bias_is_the_same_through_every_backend_that_takes_it(name):
    """The layer's bias (with gradients to q and k) through eager, sdpa and sdpa_split: outputs 1e-5, gradients
    of q, k, v and the encoding's parameters 1e-4 (float32), a KV cache's offset included."""
    results = {}
    for backend in ("eager", "sdpa", "sdpa_split"):
        pe = build(name).float()
        g = torch.Generator().manual_seed(5)
        q, k, v = (torch.randn(2, H, n, D, generator=g).requires_grad_() for n in (5, 9, 9))
        k_pos = torch.arange(9)[None]
        bias = pe.bias(0, None, q, k, k_pos[:, 4:], k_pos)
        out = attend(q, k, v, bias, backend, q_pos=k_pos[:, 4:], k_pos=k_pos, contextual=True)
        (out * torch.randn(out.shape, generator=g)).sum().backward()
        results[backend] = [out.detach(), q.grad, k.grad, v.grad] + [p.grad for p in pe.parameters()
                                                                     if p.grad is not None]
    for backend in ("sdpa", "sdpa_split"):
        assert len(results[backend]) == len(results["eager"]) > 4
        assert_close(results[backend][0], results["eager"][0])
        for got, expected in zip(results[backend][1:], results["eager"][1:]):
            assert_close(got, expected, rel=1e-4)


@pytest.mark.parametrize("needs_grad", [False, True])
def test_auto_routes_a_contextual_bias_to_a_tensor_backend_and_refuses_the_others(needs_grad):
    for device in (CPU, CUDA):
        assert resolve_backend("auto", True, device, needs_grad, contextual=True) == "sdpa"
        for name in ("eager", "sdpa", "sdpa_split"):
            assert resolve_backend(name, True, device, needs_grad, contextual=True) == name
        for name in ("flex", "flash_attn"):
            with pytest.raises(BackendError) as info:
                resolve_backend(name, True, device, needs_grad, contextual=True)
            assert str(info.value) == f"attention backend '{name}' cannot run here: {CONTEXTUAL_WHY}"


@pytest.mark.parametrize("command", [
    ["run", "-e", "cope", "-t", "arithmetic", "-p", "tiny", "--set", "model.attention=flex"],
    ["run", "-e", "dape", "-t", "arithmetic", "-p", "tiny", "--set", "model.attention=flash_attn"],
    ["bench", "-e", "dape", "--attention", "flex", "--lengths", "16", "--batch", "1"],
], ids=["run-cope-flex", "run-dape-flash_attn", "bench-dape-flex"])
def test_the_cli_refuses_flex_for_a_contextual_encoding_in_one_line(command, tmp_path, capsys):
    code = main([*command, "-q", "-o", str(tmp_path / "results")])
    err = capsys.readouterr().err
    assert code == 2
    backend = command[-1].split("=")[-1] if command[0] == "run" else "flex"
    encoding = command[2]
    assert err.strip() == f"error: attention backend '{backend}' cannot run encoding '{encoding}': {CONTEXTUAL_WHY}"
    assert not (tmp_path / "results").exists()


# ---- the command line: listed, trained on every task, benchmarked ----------------------------------------
def test_listed_with_their_options(capsys):
    assert main(["ls", "encodings"]) == 0
    out = capsys.readouterr().out
    assert "cope" in out and "dape" in out and "npos_max=0" in out and "base=alibi, hidden=32" in out


#: what a task needs beyond its tiny preset (data it cannot make)
TASK_ARGS = {"scrolls": ["--data", "tests/fixtures/scrolls", "--datasets", "qasper"]}


def encoding_tasks() -> list[str]:
    """The built-in tasks that train a posbench model of any encoding (not bench, which builds its own, nor
    extend, whose models are pretrained Llamas): found in the registry, so a new task needs no edit here."""
    from posbench.tasks import TASKS

    return sorted(n for n in TASKS if TASKS.origin(n) == "built-in" and TASKS[n].model_source.builds
                  and TASKS[n].model_source.encodings() is ENCODINGS)


@pytest.mark.slow  # a whole run per task (the fast tier runs CoPE's and DAPE's models, not their runs)
@pytest.mark.parametrize("task", [task for task in encoding_tasks() if task != "ruler"])   # ruler: test_ruler_task.py
@pytest.mark.parametrize("encoding", ["cope", "dape"])
def test_trains_on_every_task_with_the_tiny_preset(encoding, task, tmp_path, capsys, monkeypatch):
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    code = main(["run", "-e", encoding, "-t", task, "-p", "tiny", "-q", "-o", str(tmp_path),
                 *TASK_ARGS.get(task, [])])
    assert code == 0, capsys.readouterr().err
    record = json.loads(next((tmp_path / task / encoding).glob("*/result.json")).read_text())
    assert record["config"]["encoding"] == encoding
    assert all(math.isfinite(m["value"]) for m in record["metrics"].values() if m.get("value") is not None)


def test_benchmarked_next_to_rope(tmp_path):
    from posbench.runs import runner
    from posbench.runs.config import resolve_run_config

    config = resolve_run_config("bench", None, "small", sets=["task.lengths=16", "task.batch=2", "task.warmup=1",
                                                            "task.steps=1", "train.threads=1",
                                                            "task.encodings=cope,dape"])
    cells = runner.execute(config, tmp_path, command=["posbench", "bench"]).record.bench["cells"]
    assert [c["encoding"] for c in cells] == ["rope", "cope", "dape"]
    assert all(c["status"] == "ok" and c["ms"] > 0 for c in cells)
    default = resolve_run_config("bench", None, "small").task_options["encodings"]
    assert {"cope", "dape"} <= set(default)                     # every encoding by default

