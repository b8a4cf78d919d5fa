"""KERPLE and Sandwich against independent derivations, their relative-position property, KERPLE's positivity
after an optimizer step, Sandwich's absence of parameters, the Toeplitz evaluation of a relative bias against
the element-wise one, and both encodings trained end to end on every task's tiny preset.

Derivations are plain Python (``math``) on hand-picked heads, parameters and positions. Tolerances: float64
encodings against ``math`` 1e-12 relative (the same formula, another library); float32 tables against float64
``math`` 2e-6 absolute on values of order d_bar / 2 = 32 (float32 rounding of the stored table, 2^-24 x 32 =
2e-6); float32 Toeplitz against element-wise evaluation: equal values (the same function on the same
distances) and gradients to 1e-5 relative (sums in another order). Shift invariance of whole models: 1e-5
relative to the largest logit (float32, several layers).
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

from posbench.model.bias import ScoreBias
from posbench.cli import main
from posbench.encodings import ENCODINGS
from posbench.options import OptionError
from posbench.encodings.sandwich import distance_table

from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from encoding_helpers import assert_close, bias_tensor, score_bias_of, tiny, tokens

pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURES = Path(__file__).parents[1] / "fixtures" / "scrolls"


def build(name: str, n_heads: int = 4, head_dim: int = 8, n_layers: int = 2, dtype=torch.float64, **options):
    torch.manual_seed(0)
    return ENCODINGS[name](n_layers, n_heads, head_dim, n_heads * head_dim, 16, **options).to(dtype)


def set_kernel(pe, r1: list[float], r2: list[float], layer: int = 0) -> None:
    with torch.no_grad():
        pe.kernels[layer].r1.copy_(torch.tensor(r1, dtype=torch.float64))
        pe.kernels[layer].r2.copy_(torch.tensor(r2, dtype=torch.float64))


# ---- KERPLE: the paper's two kernels, by hand --------------------------------------------------------------
R1, R2 = [0.5, 1.3, 0.02, 1.9], [0.9, 0.05, 1.7, 0.4]
Q_POS, K_POS = [0, 3, 7, 250], [0, 1, 3, 6, 7, 249, 250]


def kerple_by_hand(variant: str, r1: float, r2: float, i: int, j: int) -> float:
    d = abs(i - j)
    return -r1 * math.log(1 + r2 * d) if variant == "log" else -r1 * d ** r2


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_bias_is_the_papers_kernel(variant):
    """KERPLE (Chi et al. 2022), logarithmic kernel -r1 log(1 + r2 |i - j|) and power kernel -r1 |i - j|^r2,
    per head, at causal pairs (future keys are masked; their bias is not looked at)."""
    pe = build("kerple", variant=variant)
    set_kernel(pe, R1, R2)
    bias = bias_tensor(pe, 0, torch.tensor([Q_POS]), torch.tensor([K_POS]))
    assert bias.shape == (1, 4, len(Q_POS), len(K_POS)) and bias.dtype == torch.float64
    checked = 0
    for h in range(4):
        for a, i in enumerate(Q_POS):
            for b, j in enumerate(K_POS):
                if j <= i:
                    expected = kerple_by_hand(variant, R1[h], R2[h], i, j)
                    assert bias[0, h, a, b].item() == pytest.approx(expected, rel=1e-12, abs=1e-12), (h, i, j)
                    checked += 1
    assert checked == 4 * 16


def test_kerple_hand_worked_numbers():
    """Two numbers worked out on paper: r1 = 2, r2 = 0.5, distance 6: -2 log(4) = -2.7725887...; power kernel
    r1 = 0.5, r2 = 1.5, distance 4: -0.5 * 8 = -4."""
    log = build("kerple")
    set_kernel(log, [2.0] * 4, [0.5] * 4)
    assert bias_tensor(log, 0, torch.tensor([[6]]), torch.tensor([[0]]))[0, 0, 0, 0].item() == \
        pytest.approx(-2.772588722239781, rel=1e-12)
    power = build("kerple", variant="power")
    set_kernel(power, [0.5] * 4, [1.5] * 4)
    assert bias_tensor(power, 0, torch.tensor([[9]]), torch.tensor([[5]]))[0, 0, 0, 0].item() == pytest.approx(-4.0)


def test_kerple_gradients_are_the_derivatives_by_hand():
    """d/dr1 and d/dr2 of sum over causal pairs of the log kernel: -log(1 + r2 d) and -r1 d / (1 + r2 d)."""
    pe = build("kerple")
    set_kernel(pe, R1, R2)
    q, k = torch.tensor([Q_POS]), torch.tensor([K_POS])
    visible = (q[0][:, None] >= k[0][None, :]).double()
    (bias_tensor(pe, 0, q, k) * visible).sum().backward()
    for h in range(4):
        pairs = [(i - j) for i in Q_POS for j in K_POS if j <= i]
        g1 = sum(-math.log(1 + R2[h] * d) for d in pairs)
        g2 = sum(-R1[h] * d / (1 + R2[h] * d) for d in pairs)
        assert pe.kernels[0].r1.grad[h].item() == pytest.approx(g1, rel=1e-12)
        assert pe.kernels[0].r2.grad[h].item() == pytest.approx(g2, rel=1e-12)


def test_kerple_power_kernel_has_a_finite_gradient_at_distance_zero():
    pe = build("kerple", variant="power")
    set_kernel(pe, R1, R2)
    bias_tensor(pe, 0, torch.tensor([[0, 1, 2]]), torch.tensor([[0, 1, 2]])).sum().backward()
    for p in pe.parameters():
        assert torch.isfinite(p.grad).all()


def test_kerple_initialisation_and_sharing_follow_the_released_code():
    """Released code (chijames/KERPLE): r1 ~ U(0, 2), r2 ~ U(0, 1) for the log kernel, r1 ~ U(0, 1) and the
    exponent r2 ~ U(0, 2) for the power kernel, clamped to >= 0.01; one module for all layers."""
    pe = build("kerple", n_heads=512, n_layers=3)
    assert len(pe.kernels) == 1 and sum(p.numel() for p in pe.parameters()) == 2 * 512
    r1, r2 = pe.kernels[0].r1, pe.kernels[0].r2
    low = 0.01 - 1e-8                                      # clamped in float32, read in float64
    assert low <= r1.min() and r1.max() <= 2 and r1.max() > 1.5 and low <= r2.min() and r2.max() <= 1
    power = build("kerple", variant="power", n_heads=512)
    assert power.kernels[0].r1.max() <= 1 and 1.5 < power.kernels[0].r2.max() <= 2
    per_layer = build("kerple", n_layers=3, per_layer=True)
    assert len(per_layer.kernels) == 3
    set_kernel(per_layer, R1, R2, layer=2)
    q, k = torch.tensor([[5]]), torch.tensor([[0]])
    assert not torch.equal(bias_tensor(per_layer, 0, q, k), bias_tensor(per_layer, 2, q, k))


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_parameters_stay_in_range_after_a_step_that_pushes_them_out(variant):
    """An optimizer step pushes r1 and r2 below zero (and the power exponent above 2); the bias reads them
    through the range at once, and the next forward pass projects the stored values back (the released
    code's clamp of .data before every forward)."""
    model = tiny("kerple", encoding_options={"variant": variant})
    kernel = model.encoding.kernels[0]
    optimizer = torch.optim.SGD([kernel.r1, kernel.r2], lr=100.0)
    kernel.r1.grad = torch.full_like(kernel.r1, 1.0)                          # step: r -= 100
    kernel.r2.grad = torch.tensor([1.0, 1.0, -1.0, -1.0])                    # heads 2, 3: r2 += 100
    optimizer.step()
    assert (kernel.r1 < 0).all() and (kernel.r2[:2] < 0).all() and (kernel.r2[2:] > 50).all()
    r1, r2 = model.encoding.parameters_of(0)                                 # what the bias reads
    high = 2.0 if variant == "power" else None
    assert (r1 == 0.01).all() and (r2[:2] == 0.01).all()
    assert (r2[2:] == 2.0).all() if high else (r2[2:] > 50).all()
    logits = model(tokens(2, 10))                                            # the next forward pass
    assert torch.isfinite(logits).all()
    assert (kernel.r1 == 0.01).all() and (kernel.r2[:2] == 0.01).all()
    assert (kernel.r2[2:] == 2.0).all() if high else (kernel.r2[2:] > 50).all()
    logits.logsumexp(-1).mean().backward()                                   # and training goes on from there
    assert kernel.r1.grad.abs().sum() > 0 and torch.isfinite(kernel.r2.grad).all()


@pytest.mark.parametrize("options, message", [
    ({"variant": "cubic"}, "option variant='cubic' is out of range: it must be one of log, power"),
    ({"eps": 0}, "option eps=0.0 is out of range: it must be > 0"),
    ({"variant": "power", "eps": 3.0}, "so eps must be <= 2"),
])
def test_kerple_options_are_range_checked(options, message):
    with pytest.raises(OptionError, match=message):
        build("kerple", **options)


# ---- Sandwich: the inner product of sinusoidal embeddings, compressed per head -----------------------------
def sandwich_by_hand(d: int, h: int, heads: int, d_bar: int, base: float = 10000.0) -> float:
    """(p_m . p_n - d_bar / 2) / (8 h / H), h = 1..H, with p_m = [sin(m w_i), cos(m w_i)], i = 1..d_bar/2: the
    embeddings themselves and their dot product, not the cosine identity."""
    m, n = d + 11, 11
    ws = [base ** (-2 * i / d_bar) for i in range(1, d_bar // 2 + 1)]
    p_m = [math.sin(m * w) for w in ws] + [math.cos(m * w) for w in ws]
    p_n = [math.sin(n * w) for w in ws] + [math.cos(n * w) for w in ws]
    dot = sum(a * b for a, b in zip(p_m, p_n))
    return (dot - d_bar / 2) / (8 * h / heads)


def test_sandwich_bias_is_the_inner_product_of_sinusoids():
    pe = build("sandwich", n_heads=12, head_dim=64)                       # d_bar = 0: the head size, 64
    assert pe.d_bar == 64
    q, k = torch.tensor([[0, 5, 40, 1000]]), torch.tensor([[0, 1, 5, 39, 40]])
    bias = bias_tensor(pe, 0, q, k)
    assert bias.shape == (1, 12, 4, 5) and bias.dtype == torch.float64   # the table is float32, cast with .to
    for h in range(12):
        for a, i in enumerate(q[0].tolist()):
            for b, j in enumerate(k[0].tolist()):
                if j <= i:
                    expected = sandwich_by_hand(i - j, h + 1, 12, 64)
                    assert bias[0, h, a, b].item() == pytest.approx(expected, abs=2e-6), (h, i, j)
    assert (bias[0, :, 0, 0] == 0).all()                                 # 0 at distance 0, by the subtraction
    assert bias[0, 0, 3, 0].item() < bias[0, 0, 2, 3].item() < 0       # decays with the distance


@pytest.mark.parametrize("d_bar, base", [(2, 10000.0), (16, 10000.0), (128, 500.0)])
def test_sandwich_distance_table_in_float64(d_bar, base):
    """The table's blockwise construction (cos(a + r) expanded) against the sum of cosines, at distances across
    several blocks, up to 10^6."""
    table = distance_table(d_bar, base, 2 ** 20)
    assert table.dtype == torch.float64 and table.shape == (2 ** 20 + 2,) and math.isnan(table[-1])
    ws = [base ** (-2 * i / d_bar) for i in range(1, d_bar // 2 + 1)]
    for d in [0, 1, 2, 7, 1023, 1024, 1025, 5000, 123_457, 999_999, 2 ** 20]:
        expected = sum(math.cos(d * w) for w in ws) - d_bar / 2
        assert table[d].item() == pytest.approx(expected, abs=1e-9 * d_bar), d


def test_sandwich_compression_ratios_are_8h_over_h():
    """ratio_h = 8 h / H: for H = 8, 1..8, so head h's bias is (p.p - d_bar/2) / h."""
    pe = build("sandwich", n_heads=8, head_dim=16)
    bias = bias_tensor(pe, 0, torch.tensor([[30]]), torch.tensor([[0]]))[0, :, 0, 0]
    first = bias[0].item()
    for h in range(8):
        assert bias[h].item() == pytest.approx(first / (h + 1), rel=1e-6)


def test_sandwich_has_no_parameters_and_saves_nothing():
    pe = build("sandwich")
    assert list(pe.parameters()) == [] and pe.state_dict() == {}
    sandwich, nope = tiny("sandwich"), tiny("nope")
    assert sum(p.numel() for p in sandwich.parameters()) == sum(p.numel() for p in nope.parameters())
    assert sandwich.state_dict().keys() == nope.state_dict().keys()


def test_sandwich_past_its_table_is_not_finite():
    pe = build("sandwich", max_distance=100)
    bias = bias_tensor(pe, 0, torch.tensor([[100, 101]]), torch.tensor([[0]]))
    assert torch.isfinite(bias[0, :, 0, 0]).all() and torch.isnan(bias[0, :, 1, 0]).all()


@pytest.mark.parametrize("options, message", [
    ({"d_bar": 7}, "d_bar=7 is out of range: it must be even"),
    ({"d_bar": -2}, "d_bar=-2 is out of range: it must be >= 0"),
    ({"base": 1.0}, "base=1.0 is out of range: it must be > 1"),
])
def test_sandwich_options_are_range_checked(options, message):
    with pytest.raises(OptionError, match=message):
        build("sandwich", **options)


# ---- the relative-position property, on random cases ------------------------------------------------------
@pytest.mark.parametrize("name, options", [("kerple", {}), ("kerple", {"variant": "power"}), ("sandwich", {})])
def test_bias_depends_on_the_distance_only(name, options):
    """Property, 50 random cases: shifting every query and key position by the same s leaves the bias unchanged
    (any heads, any positions in [0, 5000), any shift in [-positions' minimum, 10^5]), per-row positions
    included."""
    rng = random.Random(7)
    for case in range(50):
        heads = rng.choice([1, 3, 4, 8])
        pe = build(name, n_heads=heads, **options)
        if name == "kerple":
            set_kernel(pe, [rng.uniform(0.01, 2) for _ in range(heads)],
                       [rng.uniform(0.01, 2 if options else 3) for _ in range(heads)])
        rows = rng.choice([1, 2])
        nq, nk = rng.randint(1, 9), rng.randint(1, 9)
        q = torch.tensor([[rng.randrange(5000) for _ in range(nq)] for _ in range(rows)])
        k = torch.tensor([[rng.randrange(5000) for _ in range(nk)] for _ in range(rows)])
        shift = rng.randint(-int(min(q.min(), k.min())), 100_000)
        torch.testing.assert_close(bias_tensor(pe, 0, q + shift, k + shift), bias_tensor(pe, 0, q, k), rtol=0, atol=0,
                                   msg=f"case {case}")


@pytest.mark.parametrize("encoding", ["kerple", "sandwich"])
def test_a_model_ignores_a_random_shift_of_all_positions(encoding):
    """Property on whole models (KV cache included): 10 random shifts up to 10^5."""
    rng = random.Random(3)
    model = tiny(encoding).eval()
    x = tokens(2, 12)
    with torch.no_grad():
        base = model(x, positions=torch.arange(12))
        for _ in range(10):
            shift = rng.randint(1, 100_000)
            assert_close(model(x, positions=torch.arange(shift, shift + 12)), base)
            cache = model.new_cache()
            first = model(x[:, :7], positions=torch.arange(shift, shift + 7), cache=cache)
            rest = model(x[:, 7:], positions=torch.arange(shift + 7, shift + 12), cache=cache)
            assert_close(torch.cat((first, rest), 1), base)


# ---- the Toeplitz evaluation of a relative bias ------------------------------------------------------------
def elementwise(score_bias: ScoreBias, heads: int, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    head = torch.arange(heads).view(1, heads, 1, 1)
    return score_bias.fn(head, q[:, None, :, None], k[:, None, None, :], *score_bias.tensors)


@pytest.mark.parametrize("name, options", [("kerple", {}), ("kerple", {"variant": "power"}), ("sandwich", {})])
@pytest.mark.parametrize("q_range, k_range", [((0, 40), (0, 40)), ((30, 33), (0, 33)), ((105, 106), (100, 106)),
                                              ((500, 520), (0, 700))], ids=["square", "cache", "decode", "wide"])
def test_toeplitz_equals_the_element_wise_bias(name, options, q_range, k_range):
    """Consecutive shared positions take the Toeplitz path: the same values as the element-wise evaluation of the
    same function, and the same gradients."""
    pe = build(name, dtype=torch.float32, **options)
    if name == "kerple":
        set_kernel(pe, R1, R2)
    q, k = torch.arange(*q_range)[None], torch.arange(*k_range)[None]
    score_bias = score_bias_of(pe, 0)
    assert score_bias.relative
    upstream = torch.randn(1, 4, q.shape[1], k.shape[1], generator=torch.Generator().manual_seed(1))
    results = []
    for how in ("toeplitz", "elementwise"):
        pe.zero_grad(set_to_none=True)
        score_bias = score_bias_of(pe, 0)
        bias = score_bias.materialise(4, q, k) if how == "toeplitz" else elementwise(score_bias, 4, q, k)
        if name == "kerple":
            (bias * upstream).sum().backward()
        results.append((bias.detach(), [p.grad for p in pe.parameters()]))
    (fast, fast_grads), (slow, slow_grads) = results
    assert fast.shape == (1, 4, q.shape[1], k.shape[1])
    torch.testing.assert_close(fast, slow.expand_as(fast), rtol=0, atol=0)
    for got, expected in zip(fast_grads, slow_grads):
        assert_close(got, expected)


def test_toeplitz_is_used_only_where_it_is_exact(monkeypatch):
    seen = []
    real = ScoreBias.toeplitz
    monkeypatch.setattr(ScoreBias, "toeplitz", lambda self, *a: seen.append(1) or real(self, *a))
    pe = build("kerple", dtype=torch.float32)
    bias_tensor(pe, 0, torch.arange(5, 9)[None], torch.arange(9)[None])
    assert len(seen) == 1
    bias_tensor(pe, 0, torch.tensor([[0, 2, 4]]), torch.tensor([[0, 2, 4]]))                 # gaps
    bias_tensor(pe, 0, torch.arange(4).repeat(2, 1), torch.arange(4).repeat(2, 1))         # per-row positions
    ScoreBias(lambda h, q, k: (q - k).float() * h, relative=False).materialise(2, torch.arange(3)[None],
                                                                                torch.arange(3)[None])
    assert len(seen) == 1


# ---- every task, tiny preset ---------------------------------------------------------------------------------
def _record(root: Path, task: str, encoding: str) -> dict:
    runs = sorted((root / task / encoding).glob("*/result.json"))
    assert len(runs) == 1, runs
    return json.loads(runs[0].read_text())


def test_both_train_on_arithmetic(tmp_path, capsys):
    code = main(["run", "-e", "kerple,sandwich", "-t", "arithmetic", "-p", "tiny", "-q", "-o", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    for encoding in ("kerple", "sandwich"):
        record = _record(tmp_path, "arithmetic", encoding)
        assert record["config"]["encoding"] == encoding and record["metrics"]


@pytest.mark.parametrize("encoding", ["kerple", "sandwich"])
@pytest.mark.slow  # a run per long task
def test_pretrain_then_every_long_task(encoding, tmp_path, capsys):
    """pretrain from scratch, then perplexity, passkey and scrolls from its checkpoint (ruler's tiny preset
    runs every encoding in tests/tasks/test_ruler_task.py)."""
    out = str(tmp_path)
    assert main(["run", "-e", encoding, "-t", "pretrain", "-p", "tiny", "-q", "-o", out]) == 0, \
        capsys.readouterr().err
    pre = next((tmp_path / "pretrain" / encoding).iterdir())
    assert math.isfinite(_record(tmp_path, "pretrain", encoding)["metrics"]["val_ppl"]["value"])
    for task, extra in (("perplexity", []), ("passkey", []),
                        ("scrolls", ["--data", str(FIXTURES), "--datasets", "qasper"])):
        code = main(["run", "-t", task, "-p", "tiny", "--init", str(pre), "-q", "-o", out, *extra])
        assert code == 0, capsys.readouterr().err
        record = _record(tmp_path, task, encoding)
        assert record["config"]["encoding"] == encoding


def test_ls_and_bench_pick_both_up(capsys):
    assert main(["ls", "encodings"]) == 0
    listing = capsys.readouterr().out
    assert "kerple" in listing and "sandwich" in listing
    assert main(["bench", "--dry-run"]) == 0                       # the default: every registered encoding
    (config,) = json.loads(capsys.readouterr().out)
    encodings = config["task_options"]["encodings"]
    assert encodings[0] == "rope" and {"kerple", "sandwich"} <= set(encodings) and set(encodings) == set(ENCODINGS)
