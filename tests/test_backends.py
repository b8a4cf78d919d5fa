"""Attention backends agree with ``eager``; ``auto`` and explicit requests never pick an invalid backend.

Tolerances: 1e-5 (relative to the largest entry, float32) on outputs and gradients; FlexAttention's
unfused CPU path is checked on outputs only, since it has no CPU backward.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import posbench.attention as attention
from posbench.attention import BACKENDS, BackendError, attend, resolve_backend, valid_backends

from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from encoding_helpers import BUILTIN, assert_close, seeded, tiny, tokens

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


def run_backend(name, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex on CPU warns that it is unfused
        return attend(*args, name)


@pytest.mark.parametrize("name", ["eager", "sdpa", "flex"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("nq, nk, dv", [(7, 7, 8), (7, 7, 24), (3, 7, 24), (1, 9, 8), (1, 9, 24)],
                         ids=["square", "wide-v", "cache-wide-v", "one-query", "one-query-wide-v"])
def test_attention_function_against_the_definition(name, with_bias, nq, nk, dv):
    q, k, v = qkv(nq, nk, dv=dv)
    bias = torch.randn(1, 3, nq, nk) if with_bias else None
    with torch.no_grad():
        out = run_backend(name, q, k, v, bias)
    assert out.shape == (2, 3, nq, dv)
    assert_close(out, naive_attention(q, k, v, bias))


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("nq, nk, dv", [(7, 7, 24), (3, 7, 24), (1, 9, 8)])
def test_sdpa_gradients_match_eager(with_bias, nq, nk, dv):
    grads = {}
    for name in ("eager", "sdpa"):
        q, k, v = (t.requires_grad_() for t in qkv(nq, nk, dv=dv))
        bias = torch.randn(2, 3, nq, nk, generator=torch.Generator().manual_seed(4)).requires_grad_() \
            if with_bias else None
        weight = torch.randn(2, 3, nq, dv, generator=torch.Generator().manual_seed(5))
        (attend(q, k, v, bias, name) * weight).sum().backward()
        grads[name] = [t.grad for t in (q, k, v, bias) if t is not None]
    for eager, sdpa in zip(grads["eager"], grads["sdpa"]):
        assert_close(sdpa, eager)


# ---- whole models: every backend against eager, for every encoding --------------------------------------
def pair(encoding, backend):
    reference = tiny(encoding, attention="eager")
    other = tiny(encoding, attention=backend)
    other.load_state_dict(reference.state_dict())
    return reference.eval(), other.eval()


@pytest.mark.parametrize("encoding", BUILTIN)
def test_sdpa_model_matches_eager_outputs_and_gradients(encoding):
    reference, other = pair(encoding, "sdpa")
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
            assert_close(grads[name], grad, rel=1e-4, msg=name)  # gradients: sums over more terms


@pytest.mark.parametrize("encoding", BUILTIN)
def test_flex_model_matches_eager_outputs(encoding):
    reference, other = pair(encoding, "flex")
    x = tokens(2, 12)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_close(other(x), reference(x))
        # and with a KV cache: the prefix, then one token
        cache = other.new_cache()
        other(x[:, :8], cache=cache)
        assert_close(other(x[:, 8:9], cache=cache), reference(x[:, :9])[:, 8:9])


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
                                           r"flex, sdpa$"):
        attend(*qkv(), None, "flsh")


@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("needs_grad", [False, True])
@pytest.mark.parametrize("flash_installed", [False, True])
def test_auto_never_picks_an_invalid_backend(has_bias, needs_grad, flash_installed, monkeypatch):
    monkeypatch.setattr(attention, "flash_attn_available", lambda: flash_installed)
    cpu = resolve_backend("auto", has_bias, CPU, needs_grad)
    assert cpu in BACKENDS and cpu != "flash_attn"                     # never flash-attn without CUDA
    if needs_grad:
        assert cpu != "flex"                                           # no FlexAttention backward on CPU
        assert "flex" not in valid_backends(has_bias, CPU, needs_grad)
    cuda = resolve_backend("auto", has_bias, CUDA, needs_grad)
    assert cuda == ("flash_attn" if flash_installed and not has_bias else "sdpa")  # flash-attn: no bias
    for name in ("eager", "sdpa"):
        assert resolve_backend(name, has_bias, CPU, needs_grad) == name
    with pytest.raises(BackendError, match="flash_attn.*needs flash-attn, CUDA and no logit bias"):
        resolve_backend("flash_attn", has_bias, CPU, needs_grad)


@pytest.mark.parametrize("encoding", ["rope", "alibi", "tape"])
def test_auto_in_a_training_model_runs_and_matches_eager(encoding):
    reference, other = pair(encoding, "auto")
    x = tokens(2, 10)
    # the same random offset (TAPE) in both
    assert_close(seeded(other.train(), x, seed=3), seeded(reference.train(), x, seed=3))


# ---- CUDA ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("encoding", BUILTIN)
@pytest.mark.parametrize("backend", ["sdpa", "flex", "flash_attn"])
def test_cuda_backends_match_eager(encoding, backend):
    """bf16 on CUDA: 2e-2 relative to the largest logit (bf16 has 8 bits of mantissa)."""
    if backend == "flash_attn" and not attention.flash_attn_available():
        pytest.skip("flash-attn is not installed")
    reference = tiny(encoding, attention="eager").cuda().eval()
    other = tiny(encoding, attention=backend).cuda().eval()
    other.load_state_dict(reference.state_dict())
    x = tokens(2, 64).cuda()
    has_bias = type(reference.encoding).has_bias
    if backend == "flash_attn" and has_bias:
        with pytest.raises(BackendError):
            other(x)
        return
    with torch.autocast("cuda", dtype=torch.bfloat16):
        expected = reference(x).float()
        logits = other(x)
        logits.float().logsumexp(-1).mean().backward()  # every CUDA backend trains
    assert_close(logits.float(), expected, rel=2e-2)
