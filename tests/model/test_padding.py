"""Padded batches (issue 24, item 2): every encoding takes a batch of rows of different lengths, padded on the
left (``attention_mask``, positions from the mask), and gives each row what it gets alone: its logits, its greedy
tokens through posbench's ``generate`` (growing cache, no cache, the static-cache decoder, compiled), through
transformers' ``generate`` on a posbench model and on exports (TAPE, Abacus, and RoPE as a plain Llama), and
through posbench's wrapper of a Hugging Face Llama (plain and TAPE-extended).

Tolerance for logits: |padded - alone| <= 1e-5 max|alone| (float32). A padded batch runs its matrix products and
softmaxes over other shapes than a row alone (more keys, more rows, per-row positions where a lone row shares
one), so the sums are taken in other orders and bitwise equality is not expected; what padding must not do is
change what a real token sees, which would move the logits by orders of magnitude more (measured: at most
2.5e-6 of the largest logit, every encoding and backend). Generated token ids must be identical. What a pad holds
must not matter at all: two fillers give bitwise equal real logits. An all-ones mask is the unpadded path,
bitwise.

RandPE evaluates at ordinary positions (``eval_random=false``, its default), so it is deterministic and tested
like the others; with ``eval_random=true`` (the reference's stochastic evaluation) every pass draws new positions
for the whole batch, and no batch, padded or not, equals a row alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from encoding_helpers import fresh_dynamo, one_thread  # noqa: F401 (fixtures)
from encoding_helpers import BUILTIN, CONTEXTUAL, TASK_CONTEXT, digit_rich, tiny
from posbench.model.generate import Decoder

pytestmark = pytest.mark.usefixtures("one_thread")

LENGTHS = (12, 9, 5)                 # the rows' real lengths; the batch is as long as the first
NEW = 8                              # generated tokens


def padded_batch(x: torch.Tensor, lengths=LENGTHS, side: str = "left", filler: int | None = None):
    """``x [B, N]`` cut to each row's length (its last tokens, or its first for right padding) and padded back to N,
    with the mask: 1 for a real token. ``filler``: the pads' token (default: the tokens that stood there)."""
    n = x.shape[1]
    mask = torch.zeros_like(x)
    for row, length in enumerate(lengths):
        if side == "left":
            mask[row, n - length:] = 1
        else:
            mask[row, :length] = 1
    padded = x if filler is None else x.masked_fill(mask == 0, filler)
    return padded, mask


def real_rows(x: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    return [x[row][mask[row].bool()][None] for row in range(x.shape[0])]


def assert_rows_alone(padded_out: torch.Tensor, mask: torch.Tensor, alone: list[torch.Tensor]) -> None:
    for row, own in enumerate(alone):
        got = padded_out[row][mask[row].bool()]
        scale = own.abs().max()
        assert ((got - own[0]).abs() <= 1e-5 * scale).all(), (row, ((got - own[0]).abs().max() / scale).item())


def backends(encoding: str) -> list[str]:
    return ["eager", "sdpa"] + ([] if encoding in CONTEXTUAL else ["flex"])   # flex: inference on a CPU


# ---- logits ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", BUILTIN)
def test_padded_rows_get_the_logits_they_get_alone(encoding):
    """Left and right padding, on every backend the encoding runs on."""
    x = digit_rich(3, LENGTHS[0], seed=2)
    for backend in backends(encoding):
        model = tiny(encoding, attention=backend).eval()
        for side in ("left", "right"):
            padded, mask = padded_batch(x, side=side)
            with torch.no_grad():
                out = model(padded, attention_mask=mask)
                alone = [model(row) for row in real_rows(padded, mask)]
            assert_rows_alone(out, mask, alone)


@pytest.mark.parametrize("encoding", BUILTIN)
def test_what_a_pad_holds_never_matters_and_an_all_ones_mask_is_the_unpadded_path(encoding):
    model = tiny(encoding).eval()
    x = digit_rich(3, LENGTHS[0], seed=3)
    _, mask = padded_batch(x)
    digit = TASK_CONTEXT["digit_ids"][0]
    with torch.no_grad():
        first, second = (model(x.masked_fill(mask == 0, filler), attention_mask=mask) for filler in (digit, 0))
        assert torch.equal(first[mask.bool()], second[mask.bool()])
        assert torch.equal(model(x, attention_mask=torch.ones_like(x)), model(x))


@pytest.mark.parametrize("encoding", ["alibi", "tape", "fire"])
def test_long_padded_rows_through_the_query_blocks(encoding):
    """From 256 queries up a CPU runs a bias (alibi, fire) or TAPE's wider values in blocks of queries
    (``posbench.model.query_blocks``): each block masks the pads too; gradients through the blocks equal eager's."""
    x = digit_rich(2, 300, seed=4)
    mask = torch.ones_like(x)
    mask[1, :45] = 0
    model = tiny(encoding, attention="sdpa", max_seq_len=512).eval()
    with torch.no_grad():
        out = model(x, attention_mask=mask)
        alone = [model(row) for row in real_rows(x, mask)]
    assert_rows_alone(out, mask, alone)
    eager = tiny(encoding, attention="eager", max_seq_len=512).eval()
    eager.load_state_dict(model.state_dict())
    grads = []
    for m in (model, eager):
        m(x, attention_mask=mask)[mask.bool()].logsumexp(-1).mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None]))
    assert ((grads[0] - grads[1]).abs() <= 1e-4 * grads[1].abs().max()).all()


def test_pads_never_start_or_join_a_number_for_abacus():
    """Pads whose token is a digit, before a row that starts with a digit: the pads are not digits
    (``init_state`` sees ``PAD_TOKEN``), so the row's first number counts from its own first digit."""
    from posbench.model.padding import PAD_TOKEN

    model = tiny("abacus").eval()
    digits = TASK_CONTEXT["digit_ids"]
    x = digit_rich(3, LENGTHS[0], seed=5)
    x[:, :4] = digits[3]                               # every row starts with a number (the pads are digits too)
    x[1, 3:5] = digits[7]
    _, mask = padded_batch(x)
    seen = recording(model)
    with torch.no_grad():
        out = model(x, attention_mask=mask)
        alone = [model(row) for row in real_rows(x, mask)]
    assert torch.equal(seen[0][1], x.masked_fill(mask == 0, PAD_TOKEN))
    assert_rows_alone(out, mask, alone)


def recording(model) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The (positions, tokens) the encoding's ``init_state`` is given, call after call."""
    seen = []
    original = model.encoding.init_state

    def init_state(positions, tokens, memory):
        seen.append((positions.clone(), tokens.clone()))
        return original(positions, tokens, memory)
    model.encoding.init_state = init_state
    return seen


# ---- greedy decoding -------------------------------------------------------------------------------------------

def prompts(seed: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    x = digit_rich(3, LENGTHS[0], seed=seed)
    return padded_batch(x, filler=TASK_CONTEXT["digit_ids"][0])


@pytest.mark.parametrize("encoding", BUILTIN)
def test_batched_greedy_decoding_of_a_left_padded_batch_equals_each_row_alone(encoding):
    """posbench's ``generate`` with a growing cache, without a cache, and with the static-cache decoder."""
    model = tiny(encoding, max_seq_len=32).eval()
    x, mask = prompts()
    alone_rows = real_rows(x, mask)
    for how in ("cache", "no cache", "static"):
        def generate(prompt, attention_mask=None):
            if how == "static":
                return Decoder(model).generate(prompt, NEW, attention_mask=attention_mask)
            return model.generate(prompt, NEW, use_cache=how == "cache", attention_mask=attention_mask)
        batched = generate(x, mask)
        for row, alone in enumerate(alone_rows):
            assert torch.equal(batched[row], generate(alone)[0]), (how, row)


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("encoding", ["alibi", "tape", "cope"])
def test_compiled_decoding_takes_a_padded_batch_with_one_more_graph(encoding):
    """The compiled static-cache decoder: an unpadded call, then two padded ones of other paddings: one graph for
    the unpadded step, one for the padded step (its key mask and per-row positions), reused."""
    model = tiny(encoding, max_seq_len=32).eval()
    counter = CompileCounter()
    compile = {"backend": counter}
    x, mask = prompts()
    other = mask.clone()
    other[0, :2] = 0
    plain = model.generate(x, NEW, compile=compile)
    assert torch.equal(plain, model.generate(x, NEW))
    for attention_mask in (mask, other):
        batched = model.generate(x, NEW, compile=compile, attention_mask=attention_mask)
        for row, alone in enumerate(real_rows(x, attention_mask)):
            assert torch.equal(batched[row], model.generate(alone, NEW)[0]), row
    assert counter.frame_count == 2


def hf_model(encoding: str):
    from posbench.hf.modeling import PosbenchConfig, PosbenchForCausalLM

    model = tiny(encoding, max_seq_len=32).eval()
    hf = PosbenchForCausalLM(PosbenchConfig.from_model_config(model.config, pad_token_id=0))
    hf.model.load_state_dict(model.state_dict())
    return hf.eval(), model


@pytest.mark.parametrize("encoding", BUILTIN)
def test_transformers_generate_on_a_padded_batch_equals_each_row_alone(encoding):
    """``GenerationMixin.generate`` on a posbench model (the class of every non-RoPE export), cached and not:
    transformers passes the mask of every token and position ids from it."""
    hf, model = hf_model(encoding)
    x, mask = prompts()
    for use_cache in (True, False):
        batched = hf.generate(input_ids=x, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                              use_cache=use_cache)[:, x.shape[1]:]
        for row, alone in enumerate(real_rows(x, mask)):
            own = hf.generate(input_ids=alone, max_new_tokens=NEW, do_sample=False, use_cache=use_cache)
            assert torch.equal(batched[row], own[0, alone.shape[1]:]), (use_cache, row)
            assert torch.equal(batched[row], model.generate(alone, NEW)[0])


CODE = ["def f(x):", "print(", "import os\nimport sys", "a = [1, 2"]
EXPORTS = {  # name: (encoding, options, prompts); byte tokens (a digit's id is its byte)
    "tape": ("tape", {}, CODE),
    "abacus": ("abacus", {"digit_ids": [ord(str(d)) for d in range(10)]}, ["12+34=", "7+8=", "907+1234=", "5"]),
    "rope": ("rope", {}, CODE),
}


@pytest.mark.parametrize("name", EXPORTS)
def test_an_export_generates_a_left_padded_batch_as_each_row_alone(name, tmp_path, capsys):
    """``posbench export`` of a run (large weights: ``test_hf_export.fake_run``), then in transformers: the export's
    tokenizer pads on the left, ``generate`` greedy on the batch and on each prompt alone; the new tokens agree (cut
    at the first EOS, after which the batch pads) and are posbench's own greedy tokens. The RoPE export is a plain
    Llama: kept working padded."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posbench.hf.export import load_export
    from test_hf_export import export, fake_run

    encoding, options, texts = EXPORTS[name]
    out = export(capsys, fake_run(tmp_path, encoding, **options), tmp_path / "export")
    tokenizer = AutoTokenizer.from_pretrained(str(out), trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True).eval()
    own, _ = load_export(out)
    eos = tokenizer.eos_token_id

    def cut(ids: list[int]) -> list[int]:
        return ids[:ids.index(eos) + 1] if eos in ids else ids

    batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
    assert not batch["attention_mask"].all()
    with torch.no_grad():
        batched = model.generate(**batch, max_new_tokens=NEW, do_sample=False)[:, batch["input_ids"].shape[1]:]
        for row, text in enumerate(texts):
            alone = tokenizer([text], return_tensors="pt")
            single = model.generate(**alone, max_new_tokens=NEW, do_sample=False)[0, alone["input_ids"].shape[1]:]
            assert cut(batched[row].tolist()) == cut(single.tolist()), (name, text)
            assert cut(single.tolist()) == cut(own.generate(alone["input_ids"], NEW, eos_id=eos)[0].tolist())


@pytest.mark.parametrize("tape", [False, True], ids=["llama", "llama+tape"])
def test_a_hugging_face_llama_behind_posbench_takes_a_padded_batch(tape):
    """posbench's wrapper of a transformers model (``posbench.hf.adapter.HFCausalLM``: what ``extend`` trains and
    the tasks evaluate): logits and greedy decoding, cached and not, of a left-padded batch equal each row's
    alone; the mask is kept on the cache between calls. And transformers' own ``generate`` on the model (a
    TAPE-extended export's class is this converted Llama)."""
    from posbench.hf.adapter import HFCausalLM, HFModelConfig
    from posbench.hf.tape_llama import convert_to_tape
    from test_hf_tape import llama as tiny_llama, perturb_tape

    llama = tiny_llama(layers=2, attention="sdpa")
    if tape:
        convert_to_tape(llama)
        perturb_tape(llama)
    model = HFCausalLM(llama.eval(), HFModelConfig(label="llama", method=None)).eval()
    x, mask = prompts()
    with torch.no_grad():
        out = model(x, attention_mask=mask)
        alone_rows = real_rows(x, mask)
        assert_rows_alone(out, mask, [model(row) for row in alone_rows])
    for use_cache in (True, False):
        batched = model.generate(x, NEW, use_cache=use_cache, attention_mask=mask)
        for row, alone in enumerate(alone_rows):
            assert torch.equal(batched[row], model.generate(alone, NEW, use_cache=use_cache)[0]), (use_cache, row)
    with torch.no_grad():
        theirs = llama.generate(input_ids=x, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                                eos_token_id=None)[:, x.shape[1]:]
    assert torch.equal(theirs, batched)


# ---- what padding refuses ----------------------------------------------------------------------------------------

def test_a_mask_that_is_not_padding_is_refused_in_one_line():
    from posbench.model.attention import BACKENDS, BackendError, valid_backends
    from posbench.model.padding import PaddingError

    model = tiny("rope").eval()
    x = digit_rich(2, 6)
    hole = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 1, 1, 1]])
    right = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    left = right.flip(1)
    with torch.no_grad():
        for mask, message in ((hole, "a pad between two real tokens"), (torch.ones(2, 5), "expected one 0 / 1 per")):
            with pytest.raises(PaddingError, match=message) as caught:
                model(x, attention_mask=mask)
            assert "\n" not in str(caught.value)
        cache = model.new_cache()
        model(x, cache=cache, attention_mask=right)          # right padding: fine, until a token follows it
        with pytest.raises(PaddingError, match="ended with a pad"):
            model(x[:, :1], cache=cache)
        cache = model.new_cache()
        model(x, cache=cache)
        with pytest.raises(PaddingError, match="between two real tokens"):     # a later left-padded call
            model(x, cache=cache, attention_mask=left)
        static = model.new_static_cache(16)
        with pytest.raises(PaddingError, match="pad on the left to generate"):
            model(x, cache=static, attention_mask=right)
        static = model.new_static_cache(16)
        model(x, cache=static)
        with pytest.raises(PaddingError, match="between two real tokens"):
            model(x[:, :2], cache=static, attention_mask=torch.tensor([[1, 1], [0, 1]]))
    q = k = v = torch.zeros(1, 1, 2, 4)
    with pytest.raises(BackendError, match="no padded batch"):
        BACKENDS["flash_attn"](q, k, v, None, key_mask=torch.ones(1, 2, dtype=torch.bool))
    assert "flash_attn" not in valid_backends(False, torch.device("cuda"), False, padded_batch=True)


def test_positions_count_each_rows_real_tokens_across_cache_calls():
    """What an encoding sees: a left-padded prompt's real tokens at 0, 1, 2, ..., the next call's continuing each
    row's count (a pad's position is 0)."""
    model = tiny("rope").eval()
    records = recording(model)
    x = digit_rich(2, 5)
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 0, 1, 1]])
    with torch.no_grad():
        cache = model.new_cache()
        model(x, cache=cache, attention_mask=mask)
        model(x[:, :2], cache=cache)
        model(x, attention_mask=mask)
    seen = [positions for positions, _ in records]
    assert seen[0].tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 0, 1]]
    assert seen[1].tolist() == [[5, 6], [2, 3]]
    assert seen[2].tolist() == seen[0].tolist()


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "fire"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_padded_batch_of_one_row_gets_what_the_row_gets_alone(name, attention, monkeypatch):
    """A single left-padded row shares its positions with no other row, so its bias may be laid out by distance;
    its pads sit at position 0, so the distances cannot be read off the first position. Checked with the host's
    consecutiveness check off (as on a GPU, where positions are never read), without a cache (300 queries: the
    query blocks on a CPU) and through a cache (the next token after a padded prompt). Tolerance as above."""
    from posbench.model import bias as bias_module

    monkeypatch.setattr(bias_module, "consecutive", lambda pos: pos.shape[0] < 2)
    x = digit_rich(1, 300, seed=4)
    mask = torch.ones_like(x)
    mask[0, :45] = 0
    model = tiny(name, attention=attention, max_seq_len=512).eval()
    with torch.no_grad():
        padded, alone = model(x, attention_mask=mask)[0][45:], model(x[:, 45:])[0]
        assert (padded - alone).abs().max() <= 1e-5 * alone.abs().max()
        prompt = digit_rich(1, 12, seed=6)
        cache = model.new_cache()
        model(prompt[:, :11], cache=cache, attention_mask=(torch.arange(11) >= 4).long().view(1, 11))
        following, alone = model(prompt[:, 11:], cache=cache)[0, -1], model(prompt[:, 4:])[0, -1]
        assert (following - alone).abs().max() <= 1e-5 * alone.abs().max()
