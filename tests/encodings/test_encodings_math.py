"""Each encoding's formula against an independent derivation (Python's math, complex numbers, numpy)."""

from __future__ import annotations

import cmath
import math

import numpy as np
import pytest
import torch

from posbench.encodings import ENCODINGS
from posbench.encodings.alibi import alibi_slopes
from posbench.encodings.t5 import causal_bucket

from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from encoding_helpers import bias_tensor

pytestmark = pytest.mark.usefixtures("one_thread")

HEADS, HEAD_DIM, D_MODEL, MAX_LEN = 4, 8, 32, 16


def build(name: str, n_layers: int = 1, n_heads: int = HEADS, head_dim: int = HEAD_DIM, **options):
    torch.manual_seed(0)
    return ENCODINGS[name](n_layers, n_heads, head_dim, n_heads * head_dim, MAX_LEN, **options)


# ---- ALiBi ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("heads, exponents", [
    (1, [8]),
    (2, [4, 8]),
    (4, [2, 4, 6, 8]),
    (8, [1, 2, 3, 4, 5, 6, 7, 8]),
    (6, [2, 4, 6, 8, 1, 3]),                                   # P = 4, then every other slope of 2P = 8
    (12, [1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5]),        # Press et al.'s worked example
    (16, [0.5 * h for h in range(1, 17)]),
])
def test_alibi_slopes(heads, exponents):
    expected = [2.0 ** -e for e in exponents]
    assert alibi_slopes(heads) == pytest.approx(expected, rel=1e-12)  # exact powers of two in float64


def test_alibi_bias_is_minus_slope_times_distance():
    alibi = build("alibi", n_heads=12)
    q_pos = torch.tensor([[3, 7, 100]])
    k_pos = torch.tensor([[0, 3, 5, 7]])
    bias = bias_tensor(alibi, 0, q_pos, k_pos)
    assert bias.shape == (1, 12, 3, 4)
    slopes = alibi_slopes(12)
    for h in range(12):
        for a, i in enumerate(q_pos[0].tolist()):
            for b, j in enumerate(k_pos[0].tolist()):
                assert bias[0, h, a, b].item() == pytest.approx(-slopes[h] * (i - j), rel=1e-6, abs=1e-6)


# ---- T5 buckets -------------------------------------------------------------------------------------
def t5_bucket_by_hand(d: int, num_buckets: int = 64, max_distance: int = 128) -> int:
    exact = num_buckets // 2
    if d < exact:
        return d
    log_position = math.log(d / exact) / math.log(max_distance / exact)   # 0 at d = exact, 1 at max_distance
    return min(num_buckets - 1, exact + int(log_position * (num_buckets - exact)))


@pytest.mark.parametrize("distance, bucket", [
    (0, 0), (5, 5), (31, 31),        # exact buckets below 32
    (32, 32),                        # first log bucket: 32 + floor(log(1)/log(4) * 32)
    (45, 39),                        # 32 + floor(32 * log(45/32) / log 4) = 32 + floor(7.87)
    (64, 48),                        # 32 + 32 * log(2)/log(4) = 48
    (127, 63),                       # 32 + floor(31.82)
    (128, 63),                       # would be 64: clamped to num_buckets - 1
    (500, 63),
])
def test_t5_bucket_hand_worked(distance, bucket):
    assert t5_bucket_by_hand(distance) == bucket
    assert causal_bucket(torch.tensor([distance]), 64, 128).item() == bucket


def test_t5_bucket_every_distance_and_future_keys():
    d = torch.arange(0, 600)
    got = causal_bucket(d, 64, 128).tolist()
    assert got == [t5_bucket_by_hand(x) for x in range(600)]
    assert causal_bucket(torch.tensor([-1, -50]), 64, 128).tolist() == [0, 0]  # causal: future is bucket 0
    assert causal_bucket(torch.arange(0, 200), 32, 128).tolist() == \
        [t5_bucket_by_hand(x, 32, 128) for x in range(200)]


@pytest.mark.parametrize("table_init, scale", [("t5", lambda d: 1.0), ("x-transformers", math.sqrt)])
def test_t5_bias_reads_the_layer_table(table_init, scale):
    """The bias is the table entry of the distance's bucket times the release's scale: 1 for T5's own (the
    default), sqrt(head dim) for x-transformers'."""
    t5 = build("t5", n_layers=2, table_init=table_init)
    q_pos, k_pos = torch.tensor([[40, 200]]), torch.tensor([[0, 5, 40]])
    for layer in range(2):
        bias = bias_tensor(t5, layer, q_pos, k_pos)
        table = t5.tables[layer].weight
        for a, i in enumerate([40, 200]):
            for b, j in enumerate([0, 5, 40]):
                expected = table[t5_bucket_by_hand(max(i - j, 0))] * scale(HEAD_DIM)
                torch.testing.assert_close(bias[0, :, a, b], expected, rtol=1e-6, atol=1e-6)


# ---- RoPE -------------------------------------------------------------------------------------------
def rope_by_complex(x: list[float], t: float, theta: float = 10000.0, scale: float = 1.0) -> list[float]:
    """Pair f = (x_f, x_{f+D/2}) as the complex number x_f + i x_{f+D/2}, multiplied by e^{i t w_f}."""
    half = len(x) // 2
    out = [0.0] * len(x)
    for f in range(half):
        w = theta ** (-2 * f / len(x))
        z = complex(x[f], x[f + half]) * cmath.exp(1j * (t / scale) * w)
        out[f], out[f + half] = z.real, z.imag
    return out


@pytest.mark.parametrize("options", [{}, {"theta": 500.0}, {"scale": 4.0}])
def test_rope_matches_complex_multiplication(options):
    rope = build("rope", **options).eval()
    positions = torch.tensor([[0, 1, 7, 1000, 100_000]])
    q = torch.randn(1, HEADS, 5, HEAD_DIM)
    k = torch.randn(1, HEADS, 5, HEAD_DIM)
    q_rot, k_rot = rope.rotate(0, q, k, rope.init_state(positions, None, None))
    for h in range(HEADS):
        for n, t in enumerate(positions[0].tolist()):
            expected = rope_by_complex(q[0, h, n].tolist(), t, **options)
            # the table is computed in float64 and rounded to float32: 1e-6 on entries of order 1, even at
            # t = 100000 (a float32 angle would be off by up to 4e-3 rad there)
            torch.testing.assert_close(q_rot[0, h, n], torch.tensor(expected), rtol=0, atol=1e-6)
            expected = rope_by_complex(k[0, h, n].tolist(), t, **options)
            torch.testing.assert_close(k_rot[0, h, n], torch.tensor(expected), rtol=0, atol=1e-6)


def test_rope_logit_is_a_function_of_distance():
    rope = build("rope")
    q = torch.randn(1, 1, 1, HEAD_DIM).expand(1, 1, 6, HEAD_DIM)
    k = torch.randn(1, 1, 1, HEAD_DIM).expand(1, 1, 6, HEAD_DIM)
    positions = torch.tensor([[3, 10, 50, 57, 60, 100]])
    qr, kr = rope.rotate(0, q, k, rope.init_state(positions, None, None))
    dot = qr[0, 0] @ kr[0, 0].T
    torch.testing.assert_close(dot[1, 0], dot[3, 2], rtol=1e-5, atol=1e-5)    # distance 7 both
    torch.testing.assert_close(dot[4, 1], dot[5, 2], rtol=1e-5, atol=1e-5)    # distance 50 both
    assert not torch.allclose(dot[4, 2], dot[3, 2], atol=1e-3)                # distance 10 vs 7


# ---- xPos -------------------------------------------------------------------------------------------
def test_xpos_zeta():
    xpos = build("xpos")
    d = HEAD_DIM
    expected = [(2 * f + 0.4 * d) / (1.4 * d) for f in range(d // 2)]
    zeta = xpos.zeta().tolist()
    assert zeta[: d // 2] == pytest.approx(expected, rel=1e-12)
    assert zeta[d // 2:] == pytest.approx(expected, rel=1e-12)


def test_xpos_matches_complex_derivation_and_decays_with_distance():
    xpos = build("xpos")
    d, half = HEAD_DIM, HEAD_DIM // 2
    positions = torch.tensor([[0, 5, 40, 300]])
    q = torch.randn(1, 1, 4, d)
    k = torch.randn(1, 1, 4, d)
    qr, kr = xpos.rotate(0, q, k, xpos.init_state(positions, None, None))
    centre = MAX_LEN // 2
    for n, t in enumerate(positions[0].tolist()):
        for f in range(half):
            w = 10000.0 ** (-2 * f / d)
            zeta = (2 * f + 0.4 * d) / (1.4 * d)
            rot = cmath.exp(1j * t * w)
            zq = complex(q[0, 0, n, f], q[0, 0, n, f + half]) * rot * zeta ** ((t - centre) / 2048)
            zk = complex(k[0, 0, n, f], k[0, 0, n, f + half]) * rot * zeta ** (-(t - centre) / 2048)
            assert qr[0, 0, n, f].item() == pytest.approx(zq.real, abs=1e-5)
            assert qr[0, 0, n, f + half].item() == pytest.approx(zq.imag, abs=1e-5)
            assert kr[0, 0, n, f].item() == pytest.approx(zk.real, abs=1e-5)
            assert kr[0, 0, n, f + half].item() == pytest.approx(zk.imag, abs=1e-5)
    # the q.k product of one frequency pair is RoPE's times zeta ** ((i - j) / 2048): decays for i > j
    rope = build("rope")
    qo, ko = rope.rotate(0, q, k, rope.init_state(positions, None, None))
    zeta = xpos.zeta().float()
    pair = lambda a, b, i, j: a[0, 0, i] * b[0, 0, j]  # noqa: E731
    for i, j in [(3, 0), (2, 1), (3, 2)]:
        dist = positions[0, i] - positions[0, j]
        torch.testing.assert_close(pair(qr, kr, i, j), pair(qo, ko, i, j) * zeta ** (dist / 2048.0),
                                   rtol=1e-4, atol=1e-5)
    assert (zeta < 1).all()


# ---- FIRE -------------------------------------------------------------------------------------------
def test_fire_bias_matches_numpy_formula():
    fire = build("fire", n_layers=2, init_l=8.0)
    layer = fire.layers[1]
    with torch.no_grad():  # non-trivial values for every parameter, including the zero-initialised biases
        for p in layer.mlp.parameters():
            p.copy_(torch.randn(p.shape))
        layer.c.fill_(0.3)
        layer.l_mult.fill_(-1.5)  # L = |L_mult * init_L| = 12
    w1 = layer.mlp[0].weight.detach().numpy()[:, 0]
    b1 = layer.mlp[0].bias.detach().numpy()
    w2 = layer.mlp[2].weight.detach().numpy()
    b2 = layer.mlp[2].bias.detach().numpy()
    q_pos = np.array([0, 3, 11, 12, 20, 40])
    k_pos = np.array([0, 1, 3, 11, 19])
    c, big_l, eps = 0.3, 12.0, 1e-6

    def psi(x):
        return np.log(np.abs(c * x) + 1.0)

    expected = np.zeros((HEADS, len(q_pos), len(k_pos)))
    for a, i in enumerate(q_pos):
        for b, j in enumerate(k_pos):
            x = psi(i - j) / (psi(max(i, big_l)) + eps)
            hidden = np.maximum(w1 * x + b1, 0.0)
            expected[:, a, b] = w2 @ hidden + b2
    got = bias_tensor(fire, 1, torch.tensor(q_pos)[None], torch.tensor(k_pos)[None])
    assert got.shape == (1, HEADS, len(q_pos), len(k_pos))
    np.testing.assert_allclose(got[0].detach().numpy(), expected, rtol=1e-5, atol=1e-5)


def test_fire_defaults_match_the_reference():
    fire = build("fire", n_layers=3)
    assert len(fire.layers) == 3                            # one MLP per layer
    layer = fire.layers[0]
    assert layer.mlp[0].in_features == 1 and layer.mlp[0].out_features == 32
    assert layer.mlp[2].out_features == HEADS
    assert layer.c.item() == pytest.approx(0.1) and layer.c.requires_grad
    assert layer.l_mult.item() == 1.0 and layer.l_mult.requires_grad
    assert layer.init_l.item() == fire.max_seq_len / 2 and not layer.init_l.requires_grad   # half the training length
