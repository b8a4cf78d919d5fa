"""Relative biases as per-distance tables read by FlexAttention, and its causal block mask built from block
indices (issue 23, item 3).

A bias that depends on i - j only (ALiBi, T5, KERPLE, Sandwich) is evaluated once per distance with ordinary
autograd (``ScoreBias.distance_table``) and read once per score: the values and gradients must be today's
(the materialised bias, itself tested against each definition in test_score_bias.py). FlexAttention has no
backward on a CPU, so gradients are compared through the table laid out as a tensor (``table_rows``, what a
decoding step reads), values also through FlexAttention's eager forward. Tolerances: float32, 1e-5 of the
largest entry (the same operations in another order). The block mask must equal ``create_block_mask``'s lists
and must be built from tensors no larger than the block grid.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import posbench.model.attention as attention
from posbench.model.bias import table_rows
from posbench.encodings import ENCODINGS

from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from encoding_helpers import assert_close, bias_tensor, score_bias_of

pytestmark = pytest.mark.usefixtures("one_thread")

HEADS, HEAD_DIM = 4, 16
RELATIVE = ["alibi", "kerple", "sandwich", "t5"]


def build(name: str, **options):
    torch.manual_seed(0)
    pe = ENCODINGS[name](2, HEADS, HEAD_DIM, HEADS * HEAD_DIM, 64, **options)
    with torch.no_grad():
        for p in pe.parameters():
            p.add_(torch.randn(p.shape) * 0.1)
    return pe


@pytest.mark.parametrize("name, options", [(n, {}) for n in RELATIVE] + [("kerple", {"variant": "power"})])
@pytest.mark.parametrize("nq, nk", [(40, 40), (7, 300)])
def test_a_table_gives_the_materialised_bias_and_its_gradients(name, options, nq, nk):
    pe = build(name, **options)
    q_pos, k_pos = torch.arange(nk - nq, nk)[None], torch.arange(nk)[None]
    weights = torch.randn(1, HEADS, nq, nk, generator=torch.Generator().manual_seed(3)).tril(nk - nq)

    def gradients(bias):
        pe.zero_grad(set_to_none=True)
        (bias * weights).sum().backward()
        return [p.grad.clone() for p in pe.parameters() if p.grad is not None]

    materialised = bias_tensor(pe, 0, q_pos, k_pos)
    from_table = table_rows(score_bias_of(pe, 0).distance_table(HEADS, nk, "cpu"), torch.arange(nk - nq, nk), nk)
    visible = torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq)
    assert_close(from_table.expand(1, HEADS, nq, nk)[..., visible], materialised[..., visible])
    if list(pe.parameters()):
        expected, got = gradients(materialised), gradients(from_table)
        assert len(got) == len(expected) > 0
        for g, e in zip(got, expected):
            assert_close(g, e)


@pytest.mark.parametrize("name", RELATIVE)
@pytest.mark.parametrize("nq, nk", [(130, 130), (20, 150)])
def test_flex_reading_the_table_equals_eager_attention(name, nq, nk):
    """FlexAttention's eager forward (CPU, no gradients) with the table's score_mod, queries bottom-right aligned
    (a prefill after a cache when nq < nk), padded to its block size."""
    pe = build(name)
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, HEADS, n, HEAD_DIM, generator=generator) for n in (nq, nk, nk))
    q_pos, k_pos = torch.arange(nk - nq, nk)[None], torch.arange(nk)[None]
    with torch.no_grad():
        bias = score_bias_of(pe, 0)
        expected = attention.attend(q, k, v, bias, "eager", q_pos=q_pos, k_pos=k_pos)
        got = attention.attend(q, k, v, bias, "flex", q_pos=q_pos, k_pos=k_pos, aligned=True)
    assert_close(got, expected)


@pytest.mark.parametrize("nq, nk", [(3, 5), (128, 128), (130, 130), (200, 700), (1, 300), (129, 385), (256, 512)])
def test_the_block_mask_lists_are_create_block_masks(nq, nk):
    from torch.nn.attention.flex_attention import create_block_mask

    ours = attention.causal_block_mask(nq, nk, "cpu")
    theirs = create_block_mask(attention.causal_mask_mod(nq, nk), None, None, attention.padded(nq),
                               attention.padded(nk), device="cpu")
    for count, indices in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices"),
                           ("q_num_blocks", "q_indices"), ("full_q_num_blocks", "full_q_indices")):
        a, b = getattr(ours, count), getattr(theirs, count)
        assert torch.equal(a.flatten(), b.flatten()), count
        for row, n in enumerate(a.flatten().tolist()):
            assert torch.equal(getattr(ours, indices).flatten(0, -2)[row, :n],
                               getattr(theirs, indices).flatten(0, -2)[row, :n]), (indices, row)
    assert ours.shape[-2:] == theirs.shape[-2:]


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any operation returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_the_causal_block_mask_at_8192_tokens_makes_nothing_larger_than_its_block_grid():
    """The defect: ``create_block_mask`` evaluated the mask on all 8,192 x 8,192 pairs (+717 MiB on the CPU),
    inside the first biased cell's measured window. Built from block indices, the largest tensor is the 64 x 64
    grid of blocks."""
    build_mask = getattr(attention._cached_block_mask, "__wrapped__", attention._cached_block_mask)
    with LargestTensor() as recorder:
        build_mask(8192, 8192, "cpu")
    assert recorder.largest <= 2 * (8192 // 128) ** 2        # the grid, and its lists with one spare column
