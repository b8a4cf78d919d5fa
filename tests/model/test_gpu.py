"""On a CUDA device (skipped elsewhere; run with ``pytest -m gpu``): every backend's bf16 outputs and gradients
against a float64 reference, FlexAttention training every biased encoding in bf16, memory without a
sequence x sequence tensor, compiled models and cached decoding.

Tolerances. bf16 keeps 8 bits of mantissa, so a bf16 result is compared with the float64 eager reference on
the same weights and inputs, never with another bf16 result (two roundings add up). The tolerance is set from
eager attention's own bf16 error on the same inputs: a backend passes when its relative error (Frobenius norm
of the difference over the reference's) is at most ``ERROR_FACTOR`` times eager bf16's, plus 1e-3 absolute
slack for cases where eager happens to be almost exact. Models use head size 32 (FlexAttention needs 16).

Every test starts from a fresh compiler, and a hit recompile limit fails it (never a silent eager run).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import posbench.model.attention as attention
from posbench.bench import speed
from posbench.model import ModelConfig, Transformer

from encoding_helpers import BUILTIN, CONTEXTUAL, has_bias, perturb_cope, perturb_tape, score_bias_of, task_context

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
ERROR_FACTOR = 3.0
BACKENDS = ["eager", "sdpa", "sdpa_split", "flex", "flash_attn"]


@pytest.fixture(autouse=True)
def strict_fresh_compiler():
    with speed.strict_compilation():
        speed.fresh_compiler()
        yield


def gpu_model(encoding: str, backend: str, *, layers: int = 2, d_model: int = 128, heads: int = 4,
              max_seq_len: int = 128, dtype=torch.float32) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, d_model=d_model, n_layers=layers, n_heads=heads,
                                    max_seq_len=max_seq_len, encoding=encoding, attention=backend, init_std=0.1,
                                    encoding_options=task_context(encoding)))
    if encoding == "tape":
        perturb_tape(model, std=0.1)
    if encoding == "cope":
        perturb_cope(model, std=0.1)
    if encoding in ("fire", "t5", "kerple"):             # make the learnable biases non-trivial
        with torch.no_grad():
            for p in model.encoding.parameters():
                p.add_(torch.randn_like(p) * 0.1)
    return model.to(CUDA, dtype).eval()


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def forward_backward(model: Transformer, x: torch.Tensor, bf16: bool):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        logits = model(x)
    logits.double().logsumexp(-1).mean().backward()
    grads = torch.cat([p.grad.double().flatten() for p in model.parameters() if p.grad is not None])
    return logits.detach(), grads


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("encoding", BUILTIN)
def test_bf16_backend_against_a_float64_reference(encoding, backend):
    if backend == "flash_attn" and not attention.flash_attn_available():
        pytest.skip("flash-attn is not installed")
    x = torch.randint(0, 64, (2, 96), generator=torch.Generator().manual_seed(1)).to(CUDA)
    reference = gpu_model(encoding, "eager", dtype=torch.float64)
    ref_logits, ref_grads = forward_backward(reference, x, bf16=False)
    eager_logits, eager_grads = forward_backward(gpu_model(encoding, "eager"), x, bf16=True)
    model = gpu_model(encoding, backend)
    if (backend == "flash_attn" and has_bias(encoding)) or \
            (backend in ("flex", "flash_attn") and encoding in CONTEXTUAL):
        with pytest.raises(attention.BackendError):
            model(x)
        return
    logits, grads = forward_backward(model, x, bf16=True)
    eager_out, eager_grad = relative_error(eager_logits, ref_logits), relative_error(eager_grads, ref_grads)
    out, grad = relative_error(logits, ref_logits), relative_error(grads, ref_grads)
    assert out <= ERROR_FACTOR * eager_out + 1e-3, f"logits: {out:.2e} vs eager bf16 {eager_out:.2e}"
    assert grad <= ERROR_FACTOR * eager_grad + 1e-3, f"gradients: {grad:.2e} vs eager bf16 {eager_grad:.2e}"


@pytest.mark.parametrize("encoding", ["alibi", "t5", "fire", "kerple", "sandwich"])
def test_flex_trains_a_biased_encoding_in_bf16_at_the_paper_head_size(encoding):
    """Head size 64, 1024 tokens, three AdamW steps with compiled FlexAttention (the backward kernel must fit
    the GPU's shared memory): the loss is finite and every bias parameter gets a non-zero gradient."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=512, d_model=256, n_layers=2, n_heads=4, max_seq_len=1024,
                                    encoding=encoding, attention="flex")).to(CUDA).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 512, (2, 1025), device=CUDA)
    for _ in range(3):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        assert torch.isfinite(loss)
        for name, p in model.encoding.named_parameters():
            assert p.grad is not None and p.grad.abs().max() > 0, name
        optimizer.step()


@pytest.mark.parametrize("encoding", ["alibi", "t5", "fire", "kerple", "sandwich"])
@pytest.mark.parametrize("length", [77, 130, 1000])
def test_flex_at_lengths_off_its_block_size_matches_the_reference(encoding, length):
    """Compiled FlexAttention with a block mask and a score_mod at lengths that are not multiples of 128
    (pytorch/pytorch#153799: NaN gradients there; #159247: wrong values): posbench pads them, so outputs and
    gradients stay within the bf16 tolerance of the float64 eager reference, and every gradient is finite."""
    x = torch.randint(0, 64, (2, length), generator=torch.Generator().manual_seed(4)).to(CUDA)
    ref_logits, ref_grads = forward_backward(gpu_model(encoding, "eager", dtype=torch.float64), x, bf16=False)
    eager_logits, eager_grads = forward_backward(gpu_model(encoding, "eager"), x, bf16=True)
    logits, grads = forward_backward(gpu_model(encoding, "flex"), x, bf16=True)
    assert torch.isfinite(grads).all()
    assert relative_error(logits, ref_logits) <= ERROR_FACTOR * relative_error(eager_logits, ref_logits) + 1e-3
    assert relative_error(grads, ref_grads) <= ERROR_FACTOR * relative_error(eager_grads, ref_grads) + 1e-3


@pytest.mark.parametrize("encoding", ["alibi", "t5", "fire", "kerple", "sandwich"])
def test_a_biased_encoding_needs_no_sequence_by_sequence_tensor(encoding):
    """Training at 8192 tokens: peak memory within 1.2x RoPE's. A materialised [H, N, N] float bias alone
    would be 4 x 8192^2 x 4 bytes = 1 GiB per layer."""
    peaks = {}
    for name in ("rope", encoding):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch.manual_seed(0)
        model = Transformer(ModelConfig(vocab_size=512, d_model=256, n_layers=2, n_heads=4, max_seq_len=8192,
                                        encoding=name)).to(CUDA).train()
        x = torch.randint(0, 512, (1, 8193), device=CUDA)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x[:, :-1])
        F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten()).backward()
        torch.cuda.synchronize()
        peaks[name] = torch.cuda.max_memory_allocated()
        del model, logits
    assert peaks[encoding] <= 1.2 * peaks["rope"], {k: v / 2**20 for k, v in peaks.items()}


@pytest.mark.parametrize("encoding", BUILTIN)
def test_compiled_model_on_cuda_matches_eager(encoding):
    """Inductor-compiled training step (one graph for all layers) against the same model eager, both bf16:
    each compared with the float64 reference, as above."""
    torch._dynamo.reset()
    x = torch.randint(0, 64, (2, 96), generator=torch.Generator().manual_seed(1)).to(CUDA)
    ref_logits, _ = forward_backward(gpu_model(encoding, "eager", dtype=torch.float64), x, bf16=False)
    eager_logits, _ = forward_backward(gpu_model(encoding, "auto"), x, bf16=True)
    model = gpu_model(encoding, "auto")
    compiled = torch.compile(model, fullgraph=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = compiled(x)
    logits.float().logsumexp(-1).mean().backward()
    assert relative_error(logits, ref_logits) <= ERROR_FACTOR * relative_error(eager_logits, ref_logits) + 1e-3


@pytest.mark.parametrize("encoding", BUILTIN)
def test_cached_decoding_on_cuda_equals_recomputation(encoding):
    model = gpu_model(encoding, "auto")
    prompt = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(2)).to(CUDA)
    cached = model.generate(prompt, max_new_tokens=12)
    full = model.generate(prompt, max_new_tokens=12, use_cache=False)
    assert torch.equal(cached, full)


@pytest.mark.parametrize("encoding", BUILTIN)
def test_compiled_static_decoding_on_cuda_equals_recomputation(encoding):
    """The static cache's one-token step compiled with CUDA graphs (gpt-fast's reduce-overhead), float32."""
    model = gpu_model(encoding, "auto")
    prompt = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(2)).to(CUDA)
    compiled = model.generate(prompt, max_new_tokens=12, compile={"mode": "reduce-overhead"})
    again = model.generate(prompt, max_new_tokens=12, compile={"mode": "reduce-overhead"})
    full = model.generate(prompt, max_new_tokens=12, use_cache=False)
    assert torch.equal(compiled, full) and torch.equal(again, full)


@pytest.mark.parametrize("encoding", BUILTIN)
def test_a_padded_batch_on_cuda_gives_each_row_its_own_logits_and_tokens(encoding):
    """``auto`` on CUDA (FlexAttention's mask_mod for a bias, SDPA's mask otherwise), float32: a left-padded
    batch's real logits equal each row's alone (1e-4 of the largest logit: other shapes, other kernels' sums), and
    its greedy tokens, cached and through the compiled static decoder (CUDA graphs), equal each row's alone."""
    model = gpu_model(encoding, "auto")
    x = torch.randint(0, 64, (3, 40), generator=torch.Generator().manual_seed(3)).to(CUDA)
    mask = torch.ones_like(x)
    mask[1, :9], mask[2, :23] = 0, 0
    rows = [x[row][mask[row].bool()][None] for row in range(3)]
    with torch.no_grad():
        out = model(x, attention_mask=mask)
        for row, alone in enumerate(rows):
            own = model(alone)[0]
            assert (out[row][mask[row].bool()] - own).abs().max() <= 1e-4 * own.abs().max(), row
    for compile in (False, {"mode": "reduce-overhead"}):
        batched = model.generate(x, max_new_tokens=12, attention_mask=mask, compile=compile)
        for row, alone in enumerate(rows):
            assert torch.equal(batched[row], model.generate(alone, max_new_tokens=12)[0]), (compile, row)


@pytest.mark.parametrize("encoding", ["alibi", "t5", "kerple", "sandwich", "fire"])
def test_flex_in_bf16_adds_the_bias_in_float32_at_8192_tokens(encoding):
    """The last 128 queries of 8,192 over every key, bf16 autocast: FlexAttention (a per-distance table, FIRE
    element-wise) within bf16's rounding of the float64 eager reference, as eager bf16 is."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, d_model=128, n_layers=1, n_heads=4, max_seq_len=1024,
                                    encoding=encoding)).to(CUDA).eval()
    pe = model.encoding
    generator = torch.Generator(device=CUDA).manual_seed(0)
    q, k, v = (torch.randn(1, 4, n, 32, device=CUDA, generator=generator) for n in (128, 8192, 8192))
    q_pos, k_pos = torch.arange(8192 - 128, 8192, device=CUDA)[None], torch.arange(8192, device=CUDA)[None]
    with torch.no_grad():
        bias = score_bias_of(pe, 0)
        ref = attention.attend(q.double(), k.double(), v.double(), bias, "eager", q_pos=q_pos, k_pos=k_pos)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
            eager = attention.attend(qb, kb, vb, bias, "eager", q_pos=q_pos, k_pos=k_pos)
            flex = attention.attend(qb, kb, vb, bias, "flex", q_pos=q_pos, k_pos=k_pos, aligned=True)
    assert relative_error(flex, ref) <= ERROR_FACTOR * relative_error(eager, ref) + 1e-3
