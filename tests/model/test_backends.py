"""Attention backends agree with the definition and with ``eager``; ``auto`` and explicit requests never pick an
invalid backend.

Tolerances: 1e-5 (relative to the largest entry, float32) on outputs, 1e-4 on gradients (sums over more
terms); FlexAttention's unfused CPU path is checked on outputs only, since it has no CPU backward. The CUDA
checks are in test_gpu.py.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import posbench.model.attention as attention
from posbench.model.attention import BACKENDS, BackendError, attend, resolve_backend, valid_backends
from posbench.model.bias import ScoreBias
from posbench.model.config import BACKEND_NAMES

from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from encoding_helpers import BUILTIN, CONTEXTUAL, assert_close, score_bias_of, seeded, tiny, tokens

pytestmark = pytest.mark.usefixtures("one_thread")

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def naive_attention(q, k, v, bias=None):
    """One query at a time, by the definition: softmax over the keys it may see (bottom-right aligned)."""
    b, h, nq, d = q.shape
    nk = k.shape[-2]
    out = torch.zeros(b, h, nq, v.shape[-1], dtype=torch.float64)
    for i in range(nq):
        visible = nk - nq + i + 1
        scores = (q[:, :, i:i + 1].double() @ k[:, :, :visible].double().transpose(-2, -1)) / math.sqrt(d)
        if bias is not None:
            scores = scores + bias[:, :, i:i + 1, :visible].double()
        out[:, :, i] = (scores.softmax(-1) @ v[:, :, :visible].double())[:, :, 0]
    return out.float()


def qkv(nq=7, nk=7, d=8, dv=8, batch=2, heads=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, heads, nq, d, generator=g), torch.randn(batch, heads, nk, d, generator=g),
            torch.randn(batch, heads, nk, dv, generator=g))


def tilt_bias(head, q_pos, k_pos, tilt):
    """A made-up element-wise bias: a per-head quadratic in the distance (tilt [H, 2])."""
    d = (q_pos - k_pos).to(tilt.dtype)
    return tilt[head, 0] * d + tilt[head, 1] * d * d / 10  # two reads of one tensor: fine without gradients


def run_backend(name, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex on CPU warns that it is unfused
        return attend(*args, name, **kwargs)


ALL_CPU = ["eager", "sdpa", "sdpa_split", "flex"]


@pytest.mark.parametrize("name", ALL_CPU)
@pytest.mark.parametrize("bias_kind", ["none", "tensor", "score"])
@pytest.mark.parametrize("nq, nk, dv", [(7, 7, 8), (7, 7, 24), (3, 7, 24), (1, 9, 8), (1, 9, 24)],
                         ids=["square", "wide-v", "cache-wide-v", "one-query", "one-query-wide-v"])
def test_attention_function_against_the_definition(name, bias_kind, nq, nk, dv):
    q, k, v = qkv(nq, nk, dv=dv)
    q_pos = torch.arange(nk - nq, nk)[None] + 5          # cached keys come first; positions start at 5
    k_pos = torch.arange(nk)[None] + 5
    tilt = torch.randn(3, 2, generator=torch.Generator().manual_seed(3))
    score_bias = ScoreBias(tilt_bias, (tilt,))
    dense = score_bias.materialise(3, q_pos, k_pos)
    bias = {"none": None, "tensor": dense, "score": score_bias}[bias_kind]
    with torch.no_grad():
        out = run_backend(name, q, k, v, bias, q_pos=q_pos, k_pos=k_pos)
    assert out.shape == (2, 3, nq, dv)
    assert_close(out, naive_attention(q, k, v, None if bias_kind == "none" else dense))


def test_materialised_score_bias_is_the_function_at_every_index():
    tilt = torch.randn(3, 2, generator=torch.Generator().manual_seed(7))
    q_pos, k_pos = torch.tensor([[4, 9]]), torch.tensor([[0, 4, 9]])
    dense = ScoreBias(tilt_bias, (tilt,)).materialise(3, q_pos, k_pos)
    assert dense.shape == (1, 3, 2, 3)
    for h in range(3):
        for a, i in enumerate((4, 9)):
            for b, j in enumerate((0, 4, 9)):
                expected = tilt[h, 0] * (i - j) + tilt[h, 1] * (i - j) ** 2 / 10
                assert dense[0, h, a, b].item() == pytest.approx(expected.item(), rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("name", ["sdpa", "sdpa_split"])
@pytest.mark.parametrize("bias_kind", ["none", "tensor", "score"])
@pytest.mark.parametrize("nq, nk, dv", [(7, 7, 24), (3, 7, 24), (1, 9, 8)])
def test_gradients_match_eager(name, bias_kind, nq, nk, dv):
    grads = {}
    for backend_name in ("eager", name):
        q, k, v = (t.requires_grad_() for t in qkv(nq, nk, dv=dv))
        q_pos, k_pos = torch.arange(nk - nq, nk)[None], torch.arange(nk)[None]
        leaf = torch.randn(2, 3, nq, nk, generator=torch.Generator().manual_seed(4)) if bias_kind == "tensor" \
            else torch.randn(3, 2, generator=torch.Generator().manual_seed(4))
        leaf.requires_grad_()
        bias = {"none": None, "tensor": leaf, "score": ScoreBias(tilt_bias, (leaf,))}[bias_kind]
        weight = torch.randn(2, 3, nq, dv, generator=torch.Generator().manual_seed(5))
        (attend(q, k, v, bias, backend_name, q_pos=q_pos, k_pos=k_pos) * weight).sum().backward()
        grads[backend_name] = [t.grad for t in (q, k, v)] + ([leaf.grad] if bias_kind != "none" else [])
    for reference, other in zip(grads["eager"], grads[name]):
        assert_close(other, reference, rel=1e-4)


# ---- whole models: every backend against eager, for every encoding --------------------------------------
def pair(encoding, backend):
    reference = tiny(encoding, attention="eager")
    other = tiny(encoding, attention=backend)
    other.load_state_dict(reference.state_dict())
    return reference.eval(), other.eval()


@pytest.mark.parametrize("backend", ["sdpa", "sdpa_split"])
@pytest.mark.parametrize("encoding", BUILTIN)
def test_model_matches_eager_outputs_and_gradients(encoding, backend):
    reference, other = pair(encoding, backend)
    x = tokens(2, 12)
    outs = []
    for model in (reference, other):
        logits = model(x)
        logits.logsumexp(-1).mean().backward()
        outs.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (ref_logits, ref_grads), (logits, grads) = outs
    assert_close(logits, ref_logits)
    assert ref_grads.keys() == grads.keys()
    for name, grad in ref_grads.items():
        if grad is None:
            assert grads[name] is None, name
        else:
            assert_close(grads[name], grad, rel=1e-4, msg=name)


@pytest.mark.parametrize("encoding", BUILTIN)
def test_flex_model_matches_eager_outputs(encoding):
    reference, other = pair(encoding, "flex")
    x = tokens(2, 12)
    if encoding in CONTEXTUAL:                  # a bias computed from q and k: no kernel takes it, one line
        with torch.no_grad(), pytest.raises(BackendError) as info:
            other(x)
        assert str(info.value) == "attention backend 'flex' cannot run here: " + attention.CONTEXTUAL_WHY
        assert "\n" not in str(info.value)
        return
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_close(other(x), reference(x))
        # and with a KV cache: the prefix, then one token
        cache = other.new_cache()
        other(x[:, :8], cache=cache)
        assert_close(other(x[:, 8:9], cache=cache), reference(x[:, :9])[:, 8:9])


@pytest.mark.parametrize("encoding", ["alibi", "t5", "fire", "kerple", "sandwich", "tape", "rope"])
@pytest.mark.parametrize("nq, nk, per_row", [(40, 40, False), (129, 129, True), (3, 131, False), (77, 200, True)],
                         ids=["odd", "just-over-a-block", "cache-prefix", "cache-per-row"])
def test_flex_pads_every_length_to_its_block_and_equals_eager(encoding, nq, nk, per_row, monkeypatch):
    """FlexAttention is only ever handed multiples of its block size (its kernels fail at other lengths:
    pytorch/pytorch#159247, #153799); the padding is masked and sliced off, so at any length, with a KV cache's
    offset and with per-row positions, the backend equals eager attention on the encoding's own bias. The eager
    FlexAttention reference runs here (the same padding and block mask the CUDA kernels get)."""
    seen = []
    real = attention.flex_function

    def recording(cuda):
        fn = real(cuda)

        def call(q, k, v, **kwargs):
            seen.append((q.shape[-2], k.shape[-2], v.shape[-2]))
            return fn(q, k, v, **kwargs)
        return call
    monkeypatch.setattr(attention, "flex_function", recording)
    options = {"init_l": 60.0} if encoding == "fire" else {}       # FIRE: queries on both sides of L
    pe = tiny(encoding, layers=2, d_model=64, heads=4, max_seq_len=64, encoding_options=options).encoding
    with torch.no_grad():
        for p in pe.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)) * 0.3)
    q, k, v = qkv(nq, nk, d=16, dv=32 if encoding == "tape" else 16, heads=4)
    rows = 2 if per_row else 1
    k_pos = torch.arange(nk)[None].repeat(rows, 1) + torch.arange(rows)[:, None] * 7 + 3
    q_pos = k_pos[:, nk - nq:]
    score_bias = score_bias_of(pe, 0)
    with torch.no_grad():
        expected = attend(q, k, v, score_bias, "eager", q_pos=q_pos, k_pos=k_pos)
        got = run_backend("flex", q, k, v, score_bias, q_pos=q_pos, k_pos=k_pos)
    assert_close(got, expected)
    assert seen and all(n % attention.FLEX_BLOCK == 0 for shape in seen for n in shape), seen


def test_flex_block_mask_hides_the_padded_keys():
    from torch.nn.attention.flex_attention import create_mask

    mask = attention.causal_block_mask(3, 5, "cpu")
    assert mask.shape[-2:] == (128, 128)
    dense = create_mask(mask.mask_mod, 1, 1, 128, 128, device="cpu")[0, 0]
    assert dense[:3, :5].tolist() == causal_rows(3, 5)           # the real block: bottom-right causal
    assert not dense[:, 5:].any()                                # padded keys: never seen
    assert dense[3:, :5].all()                                   # padded query rows see every real key (sliced off)


def causal_rows(nq, nk):
    return [[j <= nk - nq + i for j in range(nk)] for i in range(nq)]


def test_flex_in_training_on_cpu_is_a_one_line_error():
    model = tiny("alibi", attention="flex").train()
    with pytest.raises(BackendError) as info:
        model(tokens(1, 8))
    assert str(info.value) == "attention backend 'flex' cannot run here: FlexAttention has no backward on this device"
    with torch.no_grad():
        assert torch.isfinite(run_backend("auto", *qkv(), None)).all()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model(tokens(1, 8))  # inference with flex is fine


def test_unknown_backend_is_a_one_line_error():
    with pytest.raises(BackendError, match=r"unknown attention backend 'flsh'; valid: auto, eager, flash_attn, "
                                           r"flex, sdpa, sdpa_split$"):
        attend(*qkv(), None, "flsh")


@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("needs_grad", [False, True])
@pytest.mark.parametrize("flash_installed", [False, True])
def test_auto_never_picks_an_invalid_backend(has_bias, needs_grad, flash_installed, monkeypatch):
    monkeypatch.setattr(attention, "flash_attn_available", lambda: flash_installed)
    cpu = resolve_backend("auto", has_bias, CPU, needs_grad)
    assert cpu == "sdpa"                                                # never flash-attn or flex-backward on CPU
    if needs_grad:
        assert "flex" not in valid_backends(has_bias, CPU, needs_grad)  # no FlexAttention backward on CPU
    cuda = resolve_backend("auto", has_bias, CUDA, needs_grad)
    if has_bias:
        assert cuda == "flex"                                           # the bias evaluated inside the kernel
        # ... above SDPA_BIAS_MAX_SCORES per layer; below it SDPA takes the materialised bias, flex second
        at_1k = 12 * 1024 * 1024                                        # 12 heads x 1,024 x 1,024: SDPA
        at_8k = 12 * 8192 * 8192                                        # 12 heads x 8,192 x 8,192: flex
        assert attention.SDPA_BIAS_MAX_SCORES == 2 ** 26 and at_1k < 2 ** 26 < at_8k
        assert valid_backends(has_bias, CUDA, needs_grad, scores=at_1k)[:2] == ["sdpa", "sdpa_split"]
        assert "flex" in valid_backends(has_bias, CUDA, needs_grad, scores=at_1k)
        assert resolve_backend("auto", has_bias, CUDA, needs_grad, scores=at_8k) == "flex"
        assert resolve_backend("auto", has_bias, CUDA, needs_grad, scores=2 ** 26) == "sdpa"
        assert resolve_backend("auto", has_bias, CUDA, needs_grad, scores=2 ** 26 + 1) == "flex"
    else:
        assert cuda == ("flash_attn" if flash_installed else "sdpa")
    # decoding (few queries) and tiny heads keep a bias out of FlexAttention on CUDA
    assert resolve_backend("auto", has_bias, CUDA, needs_grad, n_queries=1) != "flex"
    assert resolve_backend("auto", has_bias, CUDA, needs_grad, head_dim=8) != "flex"
    for name in ("eager", "sdpa", "sdpa_split"):
        assert resolve_backend(name, has_bias, CPU, needs_grad) == name
    with pytest.raises(BackendError, match="flash_attn.*needs flash-attn, CUDA, float16 or bfloat16, no logit bias "
                                           "and no padded batch"):
        resolve_backend("flash_attn", has_bias, CPU, needs_grad)
    # flash_attn_func takes half precision only: float32 on CUDA never goes to it (issue 35)
    assert resolve_backend("auto", has_bias, CUDA, needs_grad, dtype=torch.float32) != "flash_attn"
    if flash_installed and not has_bias:
        assert resolve_backend("auto", has_bias, CUDA, needs_grad, dtype=torch.bfloat16) == "flash_attn"
        with pytest.raises(BackendError, match="float16 or bfloat16"):
            resolve_backend("flash_attn", has_bias, CUDA, needs_grad, dtype=torch.float32)
    with pytest.raises(BackendError, match="head size of at least 16"):
        resolve_backend("flex", has_bias, CUDA, needs_grad, head_dim=8)


@pytest.mark.parametrize("encoding", ["rope", "alibi", "tape"])
def test_auto_in_a_training_model_runs_and_matches_eager(encoding):
    reference, other = pair(encoding, "auto")
    x = tokens(2, 10)
    # the same random offset (TAPE) in both
    assert_close(seeded(other.train(), x, seed=3), seeded(reference.train(), x, seed=3))


def test_flex_kernel_options_from_the_environment(monkeypatch):
    assert attention.flex_kernel_options(torch.bfloat16, 64) == attention.FLEX_KERNEL_OPTIONS
    assert attention.flex_kernel_options(torch.float16, 128) == attention.FLEX_KERNEL_OPTIONS
    backward_only = {k: v for k, v in attention.FLEX_KERNEL_OPTIONS.items() if k.startswith("bwd_")}
    assert attention.flex_kernel_options(torch.float32, 64) == backward_only      # Inductor's forward tile stands
    assert attention.flex_kernel_options(torch.bfloat16, 256) == backward_only    # (the measured tile is for <= 128)
    monkeypatch.setenv("POSBENCH_FLEX_OPTIONS", '{"bwd_BLOCK_M1": 16, "num_stages": 1}')
    assert attention.flex_kernel_options() == {"bwd_BLOCK_M1": 16, "num_stages": 1}
    monkeypatch.setenv("POSBENCH_FLEX_OPTIONS", "not json")
    with pytest.raises(BackendError, match="POSBENCH_FLEX_OPTIONS is not JSON"):
        attention.flex_kernel_options()


def test_every_backend_is_registered():
    assert set(BACKENDS) == {"eager", "sdpa", "sdpa_split", "flex", "flash_attn"}


@pytest.mark.parametrize("blocks", [1, 2, 3, 8])
def test_causal_query_blocks_equal_eager_outputs_and_gradients(blocks):
    """TAPE's widened values on a CPU go through causal attention in query blocks (each block sees only the keys
    it may): exact, 301 tokens so the blocks are uneven."""
    grads = {}
    for name in ("eager", "blocks"):
        q, k, v = (t.requires_grad_() for t in qkv(301, 301, d=8, dv=16, batch=1, heads=2))
        out = attention.causal_query_blocks(q, k, v, blocks) if name == "blocks" else attend(q, k, v, None, "eager")
        weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(6))
        (out * weight).sum().backward()
        grads[name] = [out.detach()] + [t.grad for t in (q, k, v)]
    for reference, other in zip(grads["eager"], grads["blocks"]):
        assert_close(other, reference, rel=1e-4)


def test_sdpa_takes_query_blocks_for_wide_values_on_cpu(monkeypatch):
    seen = []
    real = attention.causal_query_blocks
    monkeypatch.setattr(attention, "causal_query_blocks", lambda *a: seen.append(a[3]) or real(*a))
    q, k, v = qkv(256, 256, d=8, dv=16, batch=1, heads=2)
    assert_close(attend(q, k, v, None, "sdpa"), attend(q, k, v, None, "eager"))
    attend(q, k, v[..., :8], None, "sdpa")            # equal widths: the flash kernel, no blocks
    attend(*qkv(100, 100, d=8, dv=16, batch=1, heads=2), None, "sdpa")   # short: one block is faster
    assert seen == [2]


def test_attend_tells_auto_the_size_of_a_materialised_bias_per_layer(monkeypatch):
    """heads x queries x keys, whatever the batch: a relative bias is shared by the batch's rows."""
    seen = []
    real = attention.resolve_backend

    def spy(*args, **kwargs):
        seen.append(args[-1] if len(args) >= 10 else kwargs.get("scores"))
        return real(*args, **kwargs)
    monkeypatch.setattr(attention, "resolve_backend", spy)
    q, k, v = qkv(nq=5, nk=9, batch=4, heads=3)
    attend(q, k, v, torch.zeros(1, 3, 5, 9), "auto")
    attend(q, k, v, torch.zeros(4, 3, 5, 9), "auto")                  # a bias of its own per row
    slopes = torch.tensor([0.1, 0.2, 0.3])
    score = ScoreBias(lambda h, i, j, s: -s[h] * (i - j).abs(), (slopes,), relative=True)
    shared, per_row = torch.arange(9)[None], torch.arange(9).repeat(4, 1)
    attend(q, k, v, score, "auto", q_pos=shared[:, 4:], k_pos=shared)   # the model's own positions: one row
    attend(q, k, v, score, "auto", q_pos=per_row[:, 4:], k_pos=per_row)  # positions per row: materialised per row
    assert seen == [3 * 5 * 9, 4 * 3 * 5 * 9, 3 * 5 * 9, 4 * 3 * 5 * 9]


def test_the_model_configs_backend_names_are_the_registered_backends():
    """``ModelConfig.attention``'s choices are declared without importing the attention (``BACKEND_NAMES``, so a
    record is read without torch); each names a registered backend function and each function a choice."""
    assert sorted(BACKENDS) == sorted(BACKEND_NAMES)
