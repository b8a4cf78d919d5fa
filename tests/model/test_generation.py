"""KV-cache decoding equals full recomputation for every encoding (TAPE with perturbed updates).

Logit tolerance: 1e-5 relative to the largest logit (float32). Generated tokens must be identical.
"""

from __future__ import annotations

import pytest
import torch

from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from encoding_helpers import BUILTIN, VOCAB, assert_close, tiny, tokens

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("encoding", BUILTIN)
def test_cached_generation_equals_full_recomputation(encoding):
    model = tiny(encoding, max_seq_len=32)
    prompt = tokens(3, 6)
    cached = model.generate(prompt, max_new_tokens=10)
    full = model.generate(prompt, max_new_tokens=10, use_cache=False)
    assert cached.shape == (3, 10) and cached.dtype == torch.long
    assert torch.equal(cached, full)
    assert model.training  # generate restores the mode it found


def test_generation_is_greedy():
    model = tiny("tape")
    prompt = tokens(2, 5)
    out = model.generate(prompt, max_new_tokens=4, use_cache=False)
    model.eval()
    seq = prompt
    with torch.no_grad():
        for step in range(4):
            nxt = model(seq)[:, -1].argmax(-1)
            assert torch.equal(out[:, step], nxt)
            seq = torch.cat((seq, nxt[:, None]), 1)


@pytest.mark.parametrize("encoding", BUILTIN)
@pytest.mark.parametrize("backend", ["auto", "eager"])
def test_prefix_then_suffix_logits_equal_full_logits(encoding, backend):
    model = tiny(encoding, max_seq_len=32, attention=backend).eval()
    x = tokens(2, 14)
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache()
        parts = [model(x[:, :6], cache=cache),          # prefix
                 model(x[:, 6:10], cache=cache),        # several tokens at once (Nq < Nk)
                 model(x[:, 10:11], cache=cache),       # one token
                 model(x[:, 11:], cache=cache)]
    assert cache.length == 14
    assert_close(torch.cat(parts, dim=1), full)


@pytest.mark.parametrize("encoding", ["rope", "alibi", "tape"])
def test_cache_with_explicit_positions(encoding):
    model = tiny(encoding, max_seq_len=32).eval()
    x = tokens(1, 10)
    positions = torch.arange(100, 110)
    with torch.no_grad():
        full = model(x, positions=positions)
        cache = model.new_cache()
        first = model(x[:, :7], positions=positions[:7], cache=cache)
        rest = model(x[:, 7:], positions=positions[7:], cache=cache)
    assert_close(torch.cat((first, rest), 1), full)


def test_eos_stops_and_pads():
    model = tiny("rope")
    prompt = tokens(2, 4)
    free = model.generate(prompt, max_new_tokens=6)
    eos = int(free[0, 1])                       # row 0 emits it by step 1 at the latest
    out = model.generate(prompt, max_new_tokens=6, eos_id=eos)
    assert out.shape == (2, 6)
    for row in range(2):
        hits = (free[row] == eos).nonzero()
        stop = int(hits[0]) + 1 if len(hits) else 6   # tokens up to and including the first EOS
        assert torch.equal(out[row, :stop], free[row, :stop])
        assert (out[row, stop:] == eos).all()
    assert (out[0, 2:] == eos).all()


def test_generation_past_the_training_length():
    for encoding in BUILTIN:
        model = tiny(encoding, max_seq_len=8, layers=1)
        out = model.generate(tokens(1, 6), max_new_tokens=30)
        assert out.shape == (1, 30) and int(out.max()) < VOCAB


@pytest.mark.parametrize("first, then", [("per-row", "shared"), ("shared", "per-row")])
def test_cache_with_per_row_then_shared_positions(first, then):
    """A cache filled with per-row positions can continue with positions every row shares, and back; both
    through a growth of the buffers (capacity 4 < 10 tokens)."""
    model = tiny("alibi", max_seq_len=32).eval()
    x = tokens(2, 10)
    shared, per_row = torch.arange(10), torch.arange(10).repeat(2, 1)
    chosen = {"shared": None, "per-row": per_row}
    with torch.no_grad():
        full = model(x, positions=shared)
        cache = model.new_cache(4)
        a = model(x[:, :3], positions=None if first == "shared" else per_row[:, :3], cache=cache)
        b = model(x[:, 3:], positions=None if then == "shared" else chosen[then][:, 3:], cache=cache)
    assert_close(torch.cat((a, b), 1), full)
