"""Biases stated element-wise (``ScoreBias``): the function evaluated one score at a time, as a FlexAttention
kernel does, equals the materialised tensor, and both equal each encoding's definition, values and gradients.

Tolerances: float32 1e-6 relative for per-element evaluation against the materialised tensor (the same
operations); float64 1e-12 for FIRE's pieces against its MLP (a different but exact evaluation).
"""

from __future__ import annotations

import pytest
import torch

from posbench.encodings import ENCODINGS
from posbench.encodings.t5 import causal_bucket

from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from encoding_helpers import bias_tensor, has_bias, score_bias_of

pytestmark = pytest.mark.usefixtures("one_thread")

HEADS, HEAD_DIM = 4, 8
BIASED = [name for name in sorted(ENCODINGS) if has_bias(name) and not ENCODINGS[name].bias_from_qk]


def build(name: str, dtype=torch.float32, **options):
    torch.manual_seed(0)
    pe = ENCODINGS[name](2, HEADS, HEAD_DIM, HEADS * HEAD_DIM, 16, **options).to(dtype)
    with torch.no_grad():                       # non-trivial values everywhere, zero-initialised biases too
        for p in pe.parameters():
            p.copy_(torch.randn(p.shape, dtype=dtype) * 0.5 + (0.3 if p.dim() == 0 else 0.0))
    return pe


def test_the_biased_encodings_are_alibi_fire_kerple_sandwich_t5():
    assert BIASED == ["alibi", "fire", "kerple", "sandwich", "t5"]
    assert not any(has_bias(n) for n in ("rope", "randpe", "xpos", "nope", "tape", "abacus"))


@pytest.mark.parametrize("name", BIASED)
@pytest.mark.parametrize("rows", ["shared", "per-row"])
def test_score_mod_one_score_at_a_time_equals_the_materialised_bias(name, rows):
    """The kernel's view: score_mod called with 0-d index tensors, once per (b, h, i, j)."""
    pe = build(name, init_l=6.0) if name == "fire" else build(name)   # FIRE: queries on both sides of L
    layer = 1
    score_bias = score_bias_of(pe, layer)
    if rows == "shared":
        q_pos, k_pos = torch.tensor([[3, 5, 9, 130]]), torch.tensor([[0, 1, 3, 5, 9, 130]])
    else:
        q_pos = torch.tensor([[3, 5, 9, 130], [0, 2, 4, 6]])
        k_pos = torch.tensor([[0, 1, 3, 5, 9, 130], [0, 1, 2, 3, 4, 5]])
    dense = score_bias.materialise(HEADS, q_pos, k_pos)
    assert dense.shape == (q_pos.shape[0], HEADS, 4, 6)
    mod = score_bias.score_mod(q_pos, k_pos)
    with torch.no_grad():
        for b in range(q_pos.shape[0]):
            for h in range(HEADS):
                for i in range(4):
                    for j in range(6):
                        got = mod(torch.tensor(0.0), torch.tensor(b), torch.tensor(h), torch.tensor(i),
                                  torch.tensor(j))
                        assert got.item() == pytest.approx(dense[b, h, i, j].item(), rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("name", BIASED)
def test_an_element_wise_bias_hook_returns_a_score_bias(name):
    """The hook returns the function, not a tensor, whatever the state, queries and keys: every backend then
    evaluates it where it suits (the model reads it the same way at every step)."""
    from posbench.model.bias import ScoreBias

    pe = build(name)
    q = torch.randn(1, HEADS, 2, HEAD_DIM)
    assert isinstance(pe.bias(0, None, q, q, torch.tensor([[0, 1]]), torch.tensor([[0, 1]])), ScoreBias)
    assert isinstance(score_bias_of(pe, 1), ScoreBias)


# ---- T5: a per-distance table gathered from the bucket table ------------------------------------------------
def test_t5_distance_table_is_the_bucket_table_at_every_distance():
    t5 = build("t5", table_init="x-transformers")                               # a scale other than 1
    table = t5.tables[1].weight
    q_pos = torch.arange(0, 700, 7)[None]
    k_pos = torch.arange(0, 700)[None]
    dense = bias_tensor(t5, 1, q_pos, k_pos)[0]                                  # [H, Nq, Nk]
    distance = q_pos[0][:, None] - k_pos[0][None, :]
    scale = t5.head_dim ** 0.5                                                  # x-transformers' sqrt(D)
    expected = table[causal_bucket(distance, 64, 128)].permute(2, 0, 1) * t5.scale   # the bucket table, read directly
    assert t5.scale.item() == pytest.approx(scale, rel=1e-7)
    torch.testing.assert_close(dense, expected, rtol=0, atol=0)


def test_t5_gradient_reaches_the_bucket_table():
    """d loss / d table[bucket, h] = the scale times the sum of the upstream gradient over the pairs in that
    bucket."""
    t5 = build("t5", dtype=torch.float64)
    q_pos, k_pos = torch.arange(0, 300, 3)[None], torch.arange(0, 300)[None]
    upstream = torch.randn(1, HEADS, 100, 300, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (bias_tensor(t5, 0, q_pos, k_pos) * upstream).sum().backward()
    buckets = causal_bucket(q_pos[0][:, None] - k_pos[0][None, :], 64, 128)
    expected = torch.zeros(64, HEADS, dtype=torch.float64)
    expected.index_add_(0, buckets.flatten(), upstream[0].permute(1, 2, 0).reshape(-1, HEADS))
    torch.testing.assert_close(t5.tables[0].weight.grad, expected * t5.scale, rtol=1e-12, atol=1e-12)


# ---- FIRE: the MLP as exact linear pieces ---------------------------------------------------------------------
def fire_with_awkward_units():
    """Every kind of hidden unit: rising (w1 > 0), falling (w1 < 0), constant on (w1 = 0, b1 > 0) and off
    (w1 = 0, b1 < 0), breakpoints inside and outside [0, 1], and two equal breakpoints."""
    fire = build("fire", dtype=torch.float64, init_l=6.0)
    layer = fire.layers[1]
    with torch.no_grad():
        w1 = layer.mlp[0].weight[:, 0]
        b1 = layer.mlp[0].bias
        w1[0], b1[0] = 0.0, 0.7
        w1[1], b1[1] = 0.0, -0.4
        w1[2], b1[2] = 2.0, -1.0           # breakpoint 0.5
        w1[3], b1[3] = 4.0, -2.0           # breakpoint 0.5 as well
        w1[4], b1[4] = -3.0, 0.9           # falling, breakpoint 0.3
        layer.c.fill_(0.3)
        layer.l_mult.fill_(-1.0)           # L = |-1 x 6| = 6
    return fire, layer


def fire_positions():
    q_pos = torch.tensor([[0, 3, 5, 6, 7, 11, 40]])       # below, at and above L = 6
    k_pos = torch.tensor([[0, 1, 3, 5, 6, 10, 39]])
    return q_pos, k_pos


def test_fire_pieces_equal_the_mlp_values_and_gradients():
    fire, layer = fire_with_awkward_units()
    q_pos, k_pos = fire_positions()
    upstream = torch.randn(1, HEADS, 7, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    grads = {}
    for how in ("mlp", "pieces"):
        layer.zero_grad(set_to_none=True)
        bias = layer.mlp_bias(q_pos, k_pos) if how == "mlp" else bias_tensor(fire, 1, q_pos, k_pos)
        (bias * upstream).sum().backward()
        grads[how] = (bias.detach(), {n: p.grad.clone() for n, p in layer.named_parameters()})
    torch.testing.assert_close(grads["pieces"][0], grads["mlp"][0], rtol=1e-12, atol=1e-12)
    assert grads["mlp"][1].keys() == {"mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias", "c", "l_mult"}
    for name, grad in grads["mlp"][1].items():
        assert grad.abs().max() > 0 or name == "l_mult", name     # the test exercises every path
        torch.testing.assert_close(grads["pieces"][1][name], grad, rtol=1e-10, atol=1e-12, msg=name)


def test_fire_threshold_gets_a_gradient_below_it():
    """L_mult reaches the bias only for queries below L (there the normaliser is psi(L))."""
    fire, layer = fire_with_awkward_units()
    (bias_tensor(fire, 1, torch.tensor([[2, 3]]), torch.tensor([[0, 1]])).sum()).backward()
    assert layer.l_mult.grad.abs() > 0
    layer.zero_grad(set_to_none=True)
    (bias_tensor(fire, 1, torch.tensor([[20, 30]]), torch.tensor([[0, 1]])).sum()).backward()
    assert layer.l_mult.grad is None or layer.l_mult.grad.abs() == 0


def test_fire_pieces_are_sorted_and_cover_every_unit():
    fire, layer = fire_with_awkward_units()
    breaks, slope, icpt = layer.pieces()
    assert breaks.shape == (32,) and slope.shape == icpt.shape == (33, HEADS)
    finite = breaks[torch.isfinite(breaks)]
    assert (finite.diff() >= 0).all() and torch.isinf(breaks[-2:]).all()    # the two w1 = 0 units last
    # on each segment the pieces equal the MLP at the segment's midpoint (the definition, by hand)
    w1, b1 = layer.mlp[0].weight[:, 0].detach(), layer.mlp[0].bias.detach()
    w2, b2 = layer.mlp[2].weight.detach(), layer.mlp[2].bias.detach()
    edges = torch.cat((finite[:1] - 1, finite, finite[-1:] + 1))
    for s in range(len(edges) - 1):
        u = (edges[s] + edges[s + 1]) / 2
        expected = w2 @ torch.relu(w1 * u + b1) + b2
        torch.testing.assert_close(slope[s].detach() * u + icpt[s].detach(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["t5", "alibi", "kerple"])
@pytest.mark.parametrize("n", [40, 300])                # one materialised square; query blocks (>= 256 queries)
def test_the_models_own_positions_are_laid_out_by_distance_without_reading_them(name, n, monkeypatch):
    """On a GPU positions are never read on the host (``consecutive`` says no): the model's own positions
    (``aligned``) still take the Toeplitz layout, one evaluation per distance, with the same output and the same
    gradients (q, k, v and the encoding's tensors) as the element-wise evaluation, float64, 1e-12 relative.
    Element-wise, T5's table read took 615 ms a step on an H200 at 16 x 1024 (docs/speed.md)."""
    from posbench.model import attention, bias as bias_module

    monkeypatch.setattr(bias_module, "consecutive", lambda pos: pos.shape[0] < 2)     # as on a GPU
    laid_out = []
    toeplitz = bias_module.ScoreBias.toeplitz
    monkeypatch.setattr(bias_module.ScoreBias, "toeplitz", lambda self, *a: laid_out.append(1) or toeplitz(self, *a))
    pe = build(name, dtype=torch.float64)
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, HEADS, n, HEAD_DIM, dtype=torch.float64, requires_grad=True) for _ in range(3))
    pos = torch.arange(n).view(1, n)
    results = {}
    for aligned in (False, True):
        laid_out.clear()
        out = attention.attend(q, k, v, score_bias_of(pe, 1), "sdpa", q_pos=pos, k_pos=pos, aligned=aligned)
        grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)).sum(),
                                    [q, k, v, *[p for p in pe.parameters() if p.requires_grad]], allow_unused=True)
        results[aligned] = (out, [g for g in grads if g is not None], len(laid_out))   # layer 1's tables only
    assert results[False][2] == 0 and results[True][2] > 0
    assert len(results[True][1]) == len(results[False][1]) > 3 or name == "alibi"     # the encoding's gradients too
    for got, want in zip((results[True][0], *results[True][1]), (results[False][0], *results[False][1])):
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-12 * want.abs().max().item())


def test_a_table_read_by_index_add_has_indexings_gradient():
    """``TableRead`` (the CUDA path of ``read_table``): the value of ``table[row, col]`` and, by float64 gradcheck,
    its gradient, with many duplicate indices (every read of a few rows) and broadcast index tensors. On a CPU
    ``read_table`` is plain indexing (its gradient node is indexing's)."""
    from posbench.model.bias import TableRead, read_table

    torch.manual_seed(0)
    table = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    row = torch.randint(0, 5, (1, 1, 7, 9))
    col = torch.arange(3).view(1, 3, 1, 1)
    assert torch.equal(TableRead.apply(table, row, col), table[row, col])
    assert torch.autograd.gradcheck(lambda t: TableRead.apply(t, row, col), (table,))
    assert "Index" in type(read_table(table, row, col).grad_fn).__name__


@pytest.mark.parametrize("name", ["fire", "t5"])
def test_fire_and_t5_read_their_tables_through_the_cuda_path_with_the_same_gradients(name, monkeypatch):
    """FIRE's pieces and T5's per-distance table read per score through ``TableRead`` (forced here; it runs on
    CUDA only): the same bias and the same gradients to every parameter as plain indexing, float64, 1e-12."""
    from posbench.encodings import fire, t5
    from posbench.model.bias import TableRead

    pe = build(name, dtype=torch.float64, **({"init_l": 6.0} if name == "fire" else {}))  # FIRE: both sides of L
    q_pos, k_pos = torch.tensor([[3, 5, 9, 130]]), torch.tensor([[0, 1, 3, 5, 9, 130]])
    weights = torch.linspace(-1, 1, HEADS * 4 * 6, dtype=torch.float64).view(1, HEADS, 4, 6)
    params = [p for p in pe.parameters() if p.requires_grad]
    results, reads = [], []
    for forced in (False, True):
        if forced:
            monkeypatch.setattr(fire if name == "fire" else t5, "read_table",
                                lambda *args: reads.append(1) or TableRead.apply(*args))
        bias = score_bias_of(pe, 1).materialise(HEADS, q_pos, k_pos)     # element-wise: positions not consecutive
        grads = torch.autograd.grad((bias * weights).sum(), params, allow_unused=True)
        results.append((bias, [g for g in grads if g is not None]))
    (plain, plain_grads), (forced, forced_grads) = results
    assert reads                                                   # the forced pass went through TableRead
    assert torch.allclose(forced, plain, rtol=1e-12, atol=1e-12) and len(forced_grads) == len(plain_grads) > 0
    for got, want in zip(forced_grads, plain_grads):
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-12 * want.abs().max().item())
