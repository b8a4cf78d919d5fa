"""Causal attention with a logit bias in query blocks (``posbench.model.query_blocks``, the CPU's path from 256
queries up) against the definition; the Toeplitz layout of a relative bias against a loop; the relative
declarations of ALiBi, T5 and FIRE against their functions; glibc keeping freed memory.

Tolerances: float64 throughout where the blocks are compared with the definition (1e-10: the same sums in
another order) and where whole models are compared with eager attention (1e-9: deeper sums); bf16 autocast
within 2e-2 of a float64 reference (bf16 keeps 8 bits).
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

import posbench.model.attention as attention
from posbench.model.attention import attend
from posbench.model.bias import ScoreBias, ToeplitzLayout
from posbench.encodings import ENCODINGS
from posbench.model.query_blocks import CAUSAL_BLOCK, biased_query_blocks

from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from encoding_helpers import BUILTIN, assert_close, has_bias, score_bias_of, tiny, tokens

pytestmark = pytest.mark.usefixtures("one_thread")

F64 = torch.float64
BIASED = [name for name in BUILTIN if has_bias(name)]


def definition(q, k, v, bias):
    """Bottom-right aligned causal attention with ``bias`` [B or 1, H, Nq, Nk], one query row at a time."""
    nq, nk = q.shape[-2], k.shape[-2]
    rows = []
    for i in range(nq):
        visible = nk - nq + i + 1
        scores = q[..., i:i + 1, :] @ k[..., :visible, :].transpose(-2, -1) / math.sqrt(q.shape[-1])
        scores = scores + bias[..., i:i + 1, :visible]
        rows.append(scores.softmax(-1) @ v[..., :visible, :])
    return torch.cat(rows, dim=-2)


def quadratic(head, q_pos, k_pos, tilt):
    """A made-up absolute bias (reads i and j, not only i - j), with a gradient to ``tilt`` [H, 2] (one read)."""
    return tilt[head, 0] * (0.01 * q_pos.to(tilt.dtype) - 0.003 * k_pos.to(tilt.dtype)) ** 2


def log_distance(head, q_pos, k_pos, r):
    """A relative bias (KERPLE's logarithmic form) with a gradient to ``r`` [H]."""
    return -r[head] * torch.log1p((q_pos - k_pos).abs().to(r.dtype))


def leaves(seed, *shapes):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=F64).requires_grad_() for shape in shapes]


@pytest.mark.parametrize("kind", ["relative", "absolute", "tensor"])
@pytest.mark.parametrize("nq, nk, batch, per_row", [(300, 300, 1, False), (260, 400, 2, False),
                                                     (300, 300, 2, True)],
                         ids=["square", "after-a-cache", "per-row-positions"])
@pytest.mark.parametrize("blocks", [1, 2, 3])
def test_blocks_equal_the_definition_with_every_gradient(kind, nq, nk, batch, per_row, blocks):
    """Outputs and the gradients of q, k, v and of every tensor the bias reads, float64 to 1e-10; uneven
    blocks (300 / 3 rows, 260 / 2 over 400 keys)."""
    q, k, v = leaves(1, (batch, 3, nq, 8), (batch, 3, nk, 8), (batch, 3, nk, 16))
    start = torch.arange(batch)[:, None] * 7 if per_row else torch.zeros(1, 1, dtype=torch.long)
    k_pos = start + torch.arange(nk)
    q_pos = k_pos[:, nk - nq:]
    (param,) = leaves(2, (3, 2) if kind == "absolute" else (3,) if kind == "relative" else (batch, 3, nq, nk))
    param.data.abs_()
    fn = {"relative": log_distance, "absolute": quadratic}.get(kind)
    weight = torch.randn(batch, 3, nq, 16, generator=torch.Generator().manual_seed(3), dtype=F64)

    def grads(out):
        params = (q, k, v, param)
        return [out.detach()] + list(torch.autograd.grad((out * weight).sum(), params))

    score_bias = ScoreBias(fn, (param,), relative=kind == "relative") if fn else None
    dense = score_bias.materialise(3, q_pos, k_pos) if fn else param
    expected = grads(definition(q, k, v, dense))
    got = grads(biased_query_blocks(q, k, v, score_bias or param, q_pos, k_pos, blocks))
    for name, a, b in zip(("output", "dq", "dk", "dv", "dbias"), got, expected):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)


def test_blocks_without_gradients_equal_the_blocks_with():
    q, k, v = leaves(4, (1, 2, 300, 8), (1, 2, 300, 8), (1, 2, 300, 8))
    (r,) = leaves(5, (2,))
    pos = torch.arange(300)[None]
    with_grad = biased_query_blocks(q, k, v, ScoreBias(log_distance, (r,), relative=True), pos, pos, 3)
    with torch.no_grad():
        without = biased_query_blocks(q, k, v, ScoreBias(log_distance, (r,), relative=True), pos, pos, 3)
    assert not without.requires_grad
    torch.testing.assert_close(without, with_grad.detach(), rtol=0, atol=0)


def test_without_gradients_each_block_makes_its_bias_when_it_is_used(monkeypatch):
    """A long evaluation holds one block's bias at a time: bias and scores alternate, block by block."""
    import posbench.model.query_blocks as query_blocks

    events = []
    real_scores = query_blocks.block_scores
    monkeypatch.setattr(query_blocks, "block_scores", lambda *a: events.append("scores") or real_scores(*a))

    def counted(head, q_pos, k_pos, r):
        events.append("bias")
        return log_distance(head, q_pos, k_pos, r)

    q, k, v = (torch.randn(1, 2, 300, 8) for _ in range(3))
    pos = torch.arange(300)[None]
    with torch.no_grad():
        biased_query_blocks(q, k, v, ScoreBias(counted, (torch.rand(2),), relative=True), pos, pos, 3)
    assert events == ["bias", "scores"] * 3


def test_blocks_under_bf16_autocast_stay_within_bf16_of_the_float64_definition():
    q, k, v = (t.detach().float().requires_grad_() for t in leaves(6, (1, 2, 256, 16), (1, 2, 256, 16),
                                                                     (1, 2, 256, 16)))
    (r,) = leaves(7, (2,))
    r32 = r.detach().float().abs().requires_grad_()
    pos = torch.arange(256)[None]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attend(q, k, v, ScoreBias(log_distance, (r32,), relative=True), "sdpa", q_pos=pos, k_pos=pos)
    out.float().sum().backward()
    qd, kd, vd, rd = (t.detach().double().requires_grad_() for t in (q, k, v, r32))
    reference = definition(qd, kd, vd, ScoreBias(log_distance, (rd,)).materialise(2, pos, pos))
    reference.sum().backward()
    for got, want in ((out, reference), (q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad), (r32.grad, rd.grad)):
        error = ((got.double() - want.detach()).norm() / want.detach().norm()).item()
        assert error < 2e-2, error


@pytest.mark.parametrize("nq, takes_blocks", [(2 * CAUSAL_BLOCK, True), (2 * CAUSAL_BLOCK - 1, False)])
@pytest.mark.parametrize("kind", ["score", "tensor"])
def test_sdpa_on_a_cpu_takes_the_blocks_from_two_blocks_of_queries(nq, takes_blocks, kind, monkeypatch):
    seen = []
    real = attention.biased_query_blocks
    monkeypatch.setattr(attention, "biased_query_blocks", lambda *a: seen.append(a[6]) or real(*a))
    q, k, v = (torch.randn(1, 2, nq, 8) for _ in range(3))
    pos = torch.arange(nq)[None]
    score_bias = ScoreBias(log_distance, (torch.rand(2),), relative=True)
    bias = score_bias if kind == "score" else score_bias.materialise(2, pos, pos)
    out = attend(q, k, v, bias, "sdpa", q_pos=pos, k_pos=pos)
    assert seen == ([nq // CAUSAL_BLOCK] if takes_blocks else [])
    assert_close(out, attend(q, k, v, bias, "eager", q_pos=pos, k_pos=pos))


@pytest.mark.parametrize("encoding", BIASED)
def test_every_biased_encoding_through_the_blocks_equals_eager(encoding):
    """A whole float64 model at 300 tokens (two blocks of the CPU path, the second uneven), logits and every
    parameter's gradient against eager attention, to 1e-9."""
    x = tokens(2, 300)
    results = {}
    for backend in ("eager", "sdpa"):
        model = tiny(encoding, attention=backend, max_seq_len=128).double().train()
        torch.manual_seed(9)                        # the same random draws (none of these draws any)
        logits = model(x)
        weight = torch.randn(logits.shape, generator=torch.Generator().manual_seed(8), dtype=F64)
        (logits * weight).sum().backward()
        results[backend] = (logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    (ref_logits, ref_grads), (logits, grads) = results["eager"], results["sdpa"]
    torch.testing.assert_close(logits, ref_logits, rtol=1e-9, atol=1e-9)
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-9, atol=1e-9, msg=name)


# ---- the Toeplitz layout of a relative bias ------------------------------------------------------------------
@pytest.mark.parametrize("nq, nk", [(1, 5), (4, 4), (3, 7), (6, 2), (2, 2)])
def test_toeplitz_layout_and_its_gradient_against_loops(nq, nk):
    """Entry (i, j) is value j - i + nq - 1; the gradient of value t is the sum of the entries that show it."""
    (values,) = leaves(10, (1, 2, nq + nk - 1))
    out = ToeplitzLayout.apply(values, nq, nk)
    assert out.shape == (1, 2, nq, nk)
    for i in range(nq):
        for j in range(nk):
            assert torch.equal(out[0, :, i, j], values[0, :, j - i + nq - 1])
    (grad,) = leaves(11, (1, 2, nq, nk))
    (got,) = torch.autograd.grad(out, values, grad.detach())
    expected = torch.zeros_like(values)
    for i in range(nq):
        for j in range(nk):
            expected[0, :, j - i + nq - 1] += grad[0, :, i, j].detach()
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_a_relative_bias_is_laid_out_from_one_value_per_distance(monkeypatch):
    """``relative=True``: fn is called once, on Nq + Nk - 1 distances, and the layout equals the element-wise
    evaluation at every index, gradients included."""
    calls = []

    def counted(head, q_pos, k_pos, r):
        calls.append(q_pos.numel() * k_pos.numel())
        return log_distance(head, q_pos, k_pos, r)

    (r,) = leaves(12, (3,))
    r.data.abs_()
    q_pos, k_pos = torch.arange(6, 11)[None], torch.arange(11)[None]
    laid_out = ScoreBias(counted, (r,), relative=True).materialise(3, q_pos, k_pos)
    assert calls == [5 + 11 - 1]
    elementwise = ScoreBias(log_distance, (r,)).materialise(3, q_pos, k_pos)
    torch.testing.assert_close(laid_out, elementwise, rtol=0, atol=0)
    weight = torch.randn(laid_out.shape, dtype=F64)
    (a,) = torch.autograd.grad((laid_out * weight).sum(), r)
    (b,) = torch.autograd.grad((elementwise * weight).sum(), r)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("encoding", ["alibi", "t5", "kerple", "sandwich"])
def test_a_bias_declared_relative_depends_on_the_distance_only(encoding):
    """fn(i, j) == fn(i - j, 0) at every (i, j) of a 40 x 40 grid, positions up to 1000 (what the Toeplitz
    layout assumes), bit for bit."""
    enc = ENCODINGS[encoding](2, 4, 16, 64, 64)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(torch.rand(p.shape, generator=torch.Generator().manual_seed(13)) * 0.1)
    score_bias = score_bias_of(enc, 0)
    assert score_bias.relative
    i = torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(14)).view(1, 1, 40, 1)
    j = torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(15)).view(1, 1, 1, 40)
    head = torch.arange(4).view(1, 4, 1, 1)
    with torch.no_grad():
        direct = score_bias.fn(head, i, j, *score_bias.tensors)
        shifted = score_bias.fn(head, i - j, torch.zeros_like(j), *score_bias.tensors)
    assert torch.equal(direct.expand(shifted.shape), shifted)


def test_fire_is_laid_out_by_distance_only_below_its_threshold(monkeypatch):
    """FIRE's normaliser psi(max(i, L)) is constant while i < L: there it takes the Toeplitz layout and equals
    the element-wise bias bit for bit; from L on, the element-wise one."""
    fire = ENCODINGS["fire"](1, 4, 16, 64, 64, init_l=100.0)
    laid_out = []
    real = ScoreBias.toeplitz
    monkeypatch.setattr(ScoreBias, "toeplitz", lambda self, *a: laid_out.append(a[1].shape[0]) or real(self, *a))
    score_bias = score_bias_of(fire, 0)
    assert score_bias.relative_below.item() == pytest.approx(100.0)
    head = torch.arange(4).view(1, 4, 1, 1)
    for q_pos, takes in ((torch.arange(60, 100)[None], True), (torch.arange(61, 101)[None], False)):
        laid_out.clear()
        k_pos = torch.arange(0, int(q_pos[0, -1]) + 1)[None]
        with torch.no_grad():
            got = score_bias.materialise(4, q_pos, k_pos)
            expected = score_bias.fn(head, q_pos[:, None, :, None], k_pos[:, None, None, :], *score_bias.tensors)
        assert bool(laid_out) == takes
        assert torch.equal(got, expected.expand(got.shape))


# ---- glibc keeps freed memory for the next step -------------------------------------------------------------
def test_freed_memory_is_reused_without_new_page_faults():
    """A step-like round (eight tensors, 104 MB written) ten times after one warm-up: 266,000 pages written. After
    ``keep_freed_memory()`` the rounds reuse what the warm-up freed: measured 2,000 to 6,000 minor page faults,
    where glibc's defaults gave 30,000 to 266,000 (how many depends on its dynamic mmap threshold, so the bound
    is on the pages written, not on the defaults). In a child process: the setting is process-wide."""
    code = """
import resource, sys, torch
from posbench.train.device import keep_freed_memory
if not keep_freed_memory():
    print("skip"); sys.exit(0)
def step():
    tensors = [torch.ones(n) for n in (2 << 20, 6 << 20, 4 << 20, 1 << 20)]
    tensors += [t * 2 for t in tensors]
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    if out == ["skip"]:
        pytest.skip("not glibc: malloc's settings are left alone")
    pages_written = 10 * 2 * (2 + 6 + 4 + 1) * (1 << 20) * 4 // 4096
    assert int(out[0]) < 0.1 * pages_written, (int(out[0]), pages_written)
