"""Decoding with a static cache (issue 23, item 4): one compiled step serves every token, and it computes what
recomputing the whole sequence computes, for every encoding.

Compilation is counted with dynamo's ``CompileCounter`` backend (graphs traced, run as traced, no code
generated: posbench never compiles for a CPU in use, see test_compile.py). Tolerance: logits 1e-5 relative to
the largest logit (float32); generated tokens identical.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from posbench.model.generate import Decoder, StaticCache

from encoding_helpers import fresh_dynamo, one_thread  # noqa: F401 (fixtures)
from encoding_helpers import BUILTIN, assert_close, tiny, tokens

pytestmark = pytest.mark.usefixtures("one_thread", "fresh_dynamo")

#: one encoding of each way an encoding enters attention, the four the GPU call's CPU rehearsal benches: rotated
#: queries and keys (RoPE), an element-wise bias (ALiBi), a bias from q and k (CoPE), TAPE's tensor state. The fast
#: tier compiles these; the slow one every other built-in encoding too.
FAMILY = ("rope", "alibi", "cope", "tape")


def by_family(encodings) -> list:
    return [pytest.param(e, marks=() if e in FAMILY else pytest.mark.slow) for e in encodings]

NEW = 32


@pytest.mark.parametrize("encoding", by_family(BUILTIN))
def test_compiled_decoding_of_32_tokens_compiles_once_and_equals_recomputation(encoding):
    model = tiny(encoding, max_seq_len=32).eval()
    prompt = tokens(2, 6)
    counter = CompileCounter()
    step = torch.compile(model, backend=counter, fullgraph=True)
    with torch.no_grad():
        cache = model.new_static_cache(64)
        logits = [model(prompt, cache=cache)[:, -1:]]              # the prompt: one eager call
        sequence = torch.cat((prompt, logits[0].argmax(-1)), dim=1)
        for _ in range(NEW - 1):
            logits.append(step(sequence[:, -1:].clone(), cache=cache))     # a fresh token, as Decoder passes
            sequence = torch.cat((sequence, logits[-1].argmax(-1)), dim=1)
        full = model(sequence[:, :-1])
    assert counter.frame_count == 1, "one graph for every decoding step"
    assert cache.length == 6 + NEW - 1
    assert_close(torch.cat(logits, dim=1), full[:, 5:])
    recomputed = model.generate(prompt, max_new_tokens=NEW, use_cache=False)
    assert torch.equal(sequence[:, 6:], recomputed)
    generated = model.generate(prompt, max_new_tokens=NEW, compile={"backend": CompileCounter()})
    assert torch.equal(generated, recomputed)


def test_a_decoder_reuses_its_cache_and_its_compiled_step():
    """Calls of one batch size whose lengths round to one capacity run the same graph: no recompilation."""
    model = tiny("alibi", max_seq_len=32).eval()
    counter = CompileCounter()
    decoder = Decoder(model, {"backend": counter})
    first = decoder.generate(tokens(2, 6), 10)
    second = decoder.generate(tokens(2, 9, seed=4), 12)
    assert counter.frame_count == 1 and len(decoder.caches) == 1
    assert torch.equal(first, model.generate(tokens(2, 6), 10))
    assert torch.equal(second, model.generate(tokens(2, 9, seed=4), 12))


@pytest.mark.parametrize("encoding", ["alibi", "fire", "cope", "tape", "abacus"])
def test_a_static_cache_with_explicit_positions_equals_the_full_pass(encoding):
    """Positions given by the caller (no per-distance table: the bias is evaluated from the positions), the prompt
    in two calls, then one-token steps."""
    model = tiny(encoding, max_seq_len=32).eval()
    x, positions = tokens(2, 12), torch.arange(100, 112)
    with torch.no_grad():
        full = model(x, positions=positions)
        cache = StaticCache(model.config.n_layers, 16, "cpu")
        parts = [model(x[:, :5], positions=positions[:5], cache=cache), model(x[:, 5:8], positions=positions[5:8],
                                                                             cache=cache)]
        parts += [model(x[:, i:i + 1], positions=positions[i:i + 1], cache=cache) for i in range(8, 12)]
    assert_close(torch.cat(parts, dim=1), full)


def test_a_static_cache_refuses_more_tokens_than_its_capacity():
    model = tiny("rope").eval()
    cache = model.new_static_cache(4)
    with torch.no_grad(), pytest.raises(ValueError, match="capacity 4"):
        model(tokens(1, 6), cache=cache)


def test_what_a_step_leaves_in_the_cache_memory_outlives_the_next_step():
    """Under CUDA graphs (``reduce-overhead``) every output of the captured step, what it writes into the cache's
    memory for the encoding included, is overwritten when the graph replays. Emulated on a CPU: a step whose
    outputs of the previous call are scribbled over when the next call begins. Abacus keeps each row's digit run
    in the memory; the decoder must copy it out, and then decodes exactly what recomputation decodes (issue 35)."""
    from posbench.model.generate import next_token

    model = tiny("abacus").eval()
    digits = torch.tensor(model.encoding.options["digit_ids"])
    prompt = digits[torch.randint(0, 10, (2, 6), generator=torch.Generator().manual_seed(3))]
    expected = model.generate(prompt, 12, use_cache=False)
    decoder = Decoder(model)
    produced: list[torch.Tensor] = []

    def replaying_step(m, token, cache):
        for t in produced:                  # what the graph's previous replay returned is reused memory now
            t.fill_(-7)
        produced.clear()
        out = next_token(m, token, cache)
        produced.extend([out, *(v for v in cache.memory.values() if isinstance(v, torch.Tensor))])
        return out

    decoder.step = replaying_step
    assert torch.equal(decoder.generate(prompt, 12), expected)
