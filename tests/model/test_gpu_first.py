"""What only a GPU can check, run first in a GPU call (``benchmarks/gpu/run.sh``; skipped without CUDA): CUDA-graph
capture of the compiled decoder, compiled Triton FlexAttention forward and backward with posbench's kernel options
(do they fit the device's shared memory), flash-attn itself, the CUDA-event timer, and TF32.

Tolerances: compiled or graph-captured decoding must give the eager tokens exactly (greedy argmax of the same
float32 logits up to rounding: the prompts are random and the models tiny, so no two logits tie within 1e-4);
FlexAttention and flash-attn in bf16 against the float64 reference within 3x eager bf16's own error (as in
tests/model/test_gpu.py); the timer within 25% of a synchronised wall clock over a 50 ms workload.
"""

from __future__ import annotations

import time

import pytest
import torch

import posbench.model.attention as attention
from posbench.model.bias import ScoreBias
from posbench.model import ModelConfig, Transformer
from posbench.bench import speed
from posbench.train.device import setup_device

from encoding_helpers import task_context

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")


def cuda_model(encoding: str, **shape) -> Transformer:
    torch.manual_seed(0)
    config = dict(vocab_size=64, d_model=128, n_layers=2, n_heads=2, max_seq_len=64, init_std=0.1)
    config.update(shape)
    return Transformer(ModelConfig(encoding=encoding, encoding_options=task_context(encoding), **config)).to(CUDA)


@pytest.mark.parametrize("encoding", ["rope", "abacus", "alibi", "tape"])
def test_cuda_graph_capture_of_the_compiled_decoder_gives_the_eager_tokens(encoding):
    model = cuda_model(encoding).eval()
    prompt = torch.randint(4, 14, (2, 12), device=CUDA, generator=torch.Generator(CUDA).manual_seed(1))
    expected = model.generate(prompt, 16)
    with speed.strict_compilation():
        speed.fresh_compiler()
        got = model.generate(prompt, 16, compile={"mode": "reduce-overhead"})
        again = model.generate(prompt, 16, compile={"mode": "reduce-overhead"})    # replayed graphs
    assert torch.equal(got, expected) and torch.equal(again, expected)


def reference_and_bf16(backend: str, head_dim: int, bias: bool):
    """Outputs and q/k/v gradients of one attention in float64 (eager) and in bf16 on ``backend``."""
    g = torch.Generator(CUDA).manual_seed(0)
    q, k, v = (torch.randn(2, 4, 300, head_dim, device=CUDA, generator=g) for _ in range(3))
    slopes = torch.linspace(0.05, 0.5, 4, device=CUDA)
    score = ScoreBias(lambda h, i, j, s: -s[h] * (i - j).clamp(min=0), (slopes,), relative=True) \
        if bias else None
    pos = torch.arange(300, device=CUDA)[None]

    def run(name, dtype):
        xs = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out = attention.attend(*xs, score, name, q_pos=pos, k_pos=pos, aligned=True)
        out.float().square().sum().backward()
        return out.double(), [x.grad.double() for x in xs]
    return run("eager", torch.float64), run(backend, torch.bfloat16), run("eager", torch.bfloat16)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("head_dim", [64, 128])
def test_compiled_flex_forward_and_backward_with_posbenchs_kernel_options(head_dim):
    """The compiled Triton kernels build with FLEX_KERNEL_OPTIONS (shared memory) at the paper's head sizes and
    match the float64 reference."""
    with speed.strict_compilation():
        speed.fresh_compiler()
        (ref, ref_g), (got, got_g), (eager, eager_g) = reference_and_bf16("flex", head_dim, bias=True)
    assert relative(got, ref) <= 3 * relative(eager, ref) + 1e-3
    for g, r, e in zip(got_g, ref_g, eager_g):
        assert relative(g, r) <= 3 * relative(e, r) + 1e-3


@pytest.mark.parametrize("head_dim", [64, 128])
def test_compiled_flex_forward_without_gradients_builds_at_the_paper_head_sizes(head_dim):
    """Evaluation and a decoder's prefill run flex under no_grad: the forward kernel must fit too (on an H100 with
    torch 2.11, Inductor's default bf16 forward tile at head size 64 did not, with a captured bias table)."""
    g = torch.Generator(CUDA).manual_seed(2)
    q, k, v = (torch.randn(2, 4, 300, head_dim, device=CUDA, generator=g, dtype=torch.bfloat16) for _ in range(3))
    slopes = torch.linspace(0.05, 0.5, 4, device=CUDA)
    score = ScoreBias(lambda h, i, j, s: -s[h] * (i - j).clamp(min=0), (slopes,), relative=True)
    pos = torch.arange(300, device=CUDA)[None]
    with torch.no_grad(), speed.strict_compilation():
        speed.fresh_compiler()
        got = attention.attend(q, k, v, score, "flex", q_pos=pos, k_pos=pos, aligned=True)
        ref = attention.attend(*(t.double() for t in (q, k, v)), score, "eager", q_pos=pos, k_pos=pos, aligned=True)
        eager = attention.attend(q, k, v, score, "eager", q_pos=pos, k_pos=pos, aligned=True)
    assert relative(got.double(), ref) <= 3 * relative(eager.double(), ref) + 1e-3


def test_flash_attn_itself_matches_the_reference():
    pytest.importorskip("flash_attn")
    (ref, ref_g), (got, got_g), (eager, eager_g) = reference_and_bf16("flash_attn", 64, bias=False)
    assert relative(got, ref) <= 3 * relative(eager, ref) + 1e-3
    for g, r, e in zip(got_g, ref_g, eager_g):
        assert relative(g, r) <= 3 * relative(e, r) + 1e-3


def test_the_cuda_event_timer_agrees_with_a_synchronised_wall_clock():
    a = torch.randn(4096, 4096, device=CUDA)
    work = lambda: [a @ a for _ in range(20)]                       # noqa: E731
    work()
    torch.cuda.synchronize()
    start = time.perf_counter()
    work()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) * 1000
    timed = speed.Timer(CUDA)(work)
    assert timed > 0 and abs(timed - wall) <= 0.25 * wall + 1.0, (timed, wall)


def test_setup_turns_tf32_on_and_float32_matmuls_use_it():
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        setup_device(CUDA, 0)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        a, b = (torch.randn(1024, 1024, device=CUDA, generator=torch.Generator(CUDA).manual_seed(i)) for i in (1, 2))
        exact = a.double() @ b.double()
        err = relative((a @ b).double(), exact)
        assert 1e-6 < err < 1e-2, err                             # TF32's 10-bit mantissa, not float32's 23
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
