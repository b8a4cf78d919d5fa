"""No position, distance or bias in bfloat16 (issue 23, item 1): under bf16 autocast every encoding's logit bias
is its float32 evaluation, and attention adds it in float32 whichever path runs (prefill or a decoding step),
so decoding equals prefill.

bf16 keeps 8 bits of mantissa: positions above 256 are rounded, and a bias of size 16..32 (ALiBi at distance
8,000 with its smallest slope, 2^-8) lands on a grid 0.125 wide. The references are float64 evaluations of the
same encoding (a copy of its weights), without autocast. Tolerances: 1e-5 relative to the largest entry for the
biases (float32 against float64); for attention outputs in bf16, 4e-3 absolute on outputs in [0, 1]: bf16's own
rounding of the output (spacing 2^-8 in [0.5, 1)) and of the attention weights; a bias rounded to bf16 moves
them by 2e-2 in the test below.
"""

from __future__ import annotations

import copy

import pytest
import torch

import posbench.model.attention as attention
from posbench.encodings import ENCODINGS

from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from encoding_helpers import assert_close, bias_tensor, score_bias_of

pytestmark = pytest.mark.usefixtures("one_thread")

HEADS, HEAD_DIM = 4, 16
BIASED = ["alibi", "fire", "kerple", "sandwich", "t5"]
FAR = 8192


def build(name: str):
    torch.manual_seed(0)
    pe = ENCODINGS[name](2, HEADS, HEAD_DIM, HEADS * HEAD_DIM, 1024)
    with torch.no_grad():                       # learned biases away from their initial values
        for p in pe.parameters():
            p.add_(torch.randn(p.shape) * 0.05)
    return pe


def autocast_bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


@pytest.mark.parametrize("name", BIASED)
def test_every_bias_under_bf16_autocast_is_its_float32_evaluation(name):
    """Queries near 8,192 against every key: the materialised bias, the per-distance table and the kernel's
    score_mod, each built under bf16 autocast, equal the float64 evaluation (1e-5 of the largest entry)."""
    pe = build(name)
    reference = copy.deepcopy(pe).double()
    q_pos, k_pos = torch.arange(FAR - 4, FAR)[None], torch.arange(FAR)[None]
    expected = bias_tensor(reference, 1, q_pos, k_pos)
    with autocast_bf16():
        score_bias = score_bias_of(pe, 1)
        got = bias_tensor(pe, 1, q_pos, k_pos)
        mod = score_bias.score_mod(q_pos, k_pos)
        head, i, j = torch.arange(HEADS)[:, None, None], torch.arange(4)[None, :, None], torch.arange(FAR)[None, None]
        in_kernel = mod(torch.zeros(()), torch.tensor(0), head, i, j)
    assert got.dtype == torch.float32 and in_kernel.dtype == torch.float32
    assert_close(got, expected.float())
    assert_close(in_kernel, expected[0].float())
    if score_bias.relative:
        with autocast_bf16():
            table = score_bias.distance_table(HEADS, FAR, "cpu")
        assert table.dtype == torch.float32
        assert_close(table, expected[0, :, -1].flip(-1).float())      # distance d: key FAR - 1 - d


def test_fire_gives_64_values_to_the_64_nearest_keys_of_the_last_query_in_bf16():
    """The defect: FIRE's pieces were bf16 under autocast and the positions were cast to their dtype, so the last
    of 8,192 queries saw 3 distinct biases over its 64 nearest keys."""
    pe = build("fire")
    with autocast_bf16():
        bias = bias_tensor(pe, 0, torch.tensor([[FAR - 1]]), torch.arange(FAR - 64, FAR)[None])
    for h in range(HEADS):
        assert bias[0, h, 0].unique().numel() == 64


def far_keys_case():
    """One query at position 8,191 and 64 keys at positions 0..63 (a cache's explicit positions), q = 0 so the
    weights are softmax(bias), values j / 64 (exact in bf16): the output is the bias-weighted mean key index."""
    q = torch.zeros(1, HEADS, 1, HEAD_DIM, dtype=torch.bfloat16)
    k = torch.randn(1, HEADS, 64, HEAD_DIM, generator=torch.Generator().manual_seed(0)).bfloat16()
    v = (torch.arange(64, dtype=torch.float32) / 64).view(1, 1, 64, 1).expand(1, HEADS, 64, HEAD_DIM).bfloat16()
    return q, k, v, torch.tensor([[FAR - 1]]), torch.arange(64)[None]


@pytest.mark.parametrize("backend", ["auto", "sdpa", "eager"])
def test_a_decoding_step_in_bf16_adds_the_bias_in_float32(backend):
    """ALiBi at distances near 8,150: SDPA takes a mask only in q's dtype, and a bias rounded to bf16 moved the
    output by 2e-2; every backend now matches the float64 reference within bf16's rounding of the output."""
    q, k, v, q_pos, k_pos = far_keys_case()
    bias = score_bias_of(build("alibi"), 0)
    expected = attention.eager_attention(q.double(), k.double(), v.double(), bias, q_pos, k_pos)
    got = attention.attend(q, k, v, bias, backend, q_pos=q_pos, k_pos=k_pos)
    assert (got.double() - expected).abs().max() <= 4e-3


def test_decoding_equals_prefill_in_bf16():
    """The last query's output: alone (a decoding step) and as the last row of a 32-query prefill at positions
    8,160..8,191 over the same 64 keys, both in bf16, agree within bf16's rounding and both match float64."""
    q, k, v, q_pos, k_pos = far_keys_case()
    q_many = torch.zeros(1, HEADS, 32, HEAD_DIM, dtype=torch.bfloat16)
    bias = score_bias_of(build("alibi"), 0)
    prefill = attention.attend(q_many, k, v, bias, q_pos=torch.arange(FAR - 32, FAR)[None], k_pos=k_pos)[:, :, -1:]
    decode = attention.attend(q, k, v, bias, q_pos=q_pos, k_pos=k_pos)
    expected = attention.eager_attention(q.double(), k.double(), v.double(), bias, q_pos, k_pos)
    assert (decode.double() - expected).abs().max() <= 4e-3
    assert (prefill.double() - expected).abs().max() <= 4e-3
    assert (decode.double() - prefill.double()).abs().max() <= 8e-3
