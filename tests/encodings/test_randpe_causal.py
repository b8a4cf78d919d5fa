"""RandPE's evaluation is causal (issue 48, item 13): each token's random position is keyed on ``eval_seed`` and
the tokens up to it, drawn one position after another, so no later token changes an earlier logit (the draw was
keyed on a hash of the whole sequence: two sequences equal in their first 12 tokens got different logits there,
and a perplexity was not a product of p(x_i | x_<i)). Batching still changes nothing, and the draw is still a
uniform sorted draw of the sequence's length from the span.

Tolerance: logits compared to 1e-5 relative and absolute (float32, rows of one batch or separate calls)."""

from __future__ import annotations

import itertools
import math

import torch

from posbench.model import ModelConfig, Transformer

TOL = dict(rtol=1e-5, atol=1e-5)


def randpe(**options) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, max_seq_len=16, init_std=0.2,
                                   encoding="randpe", encoding_options={"eval_length_factor": 8.0, **options})).eval()


def shared_prefix(seed: int = 1) -> torch.Tensor:
    """Two sequences of 16 tokens equal in their first 12, different in the last 4."""
    x = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(seed))
    x[1, :12] = x[0, :12]
    x[1, 12:] = (x[0, 12:] + 1 + torch.arange(4)) % 50
    return x


def test_two_sequences_equal_in_their_first_12_tokens_get_equal_logits_there():
    model = randpe()
    x = shared_prefix()
    with torch.no_grad():
        together = model(x)
        alone = [model(x[row:row + 1])[0] for row in range(2)]
    torch.testing.assert_close(together[0, :12], together[1, :12], **TOL)
    torch.testing.assert_close(alone[0][:12], alone[1][:12], **TOL)
    assert (together[0, 12:] - together[1, 12:]).abs().max() > 1e-3      # where they differ, they differ
    draws = [model.encoding.evaluation_draw(x[row], 16) for row in range(2)]
    assert torch.equal(draws[0][:12], draws[1][:12]) and not torch.equal(draws[0], draws[1])


def test_no_later_token_changes_an_earlier_logit():
    """The contract's causality check (``posbench check`` runs it with ``eval_random`` off), on the random
    evaluation: a token changed at 6 or at 15 changes no logit before it."""
    model = randpe(eval_seed=3)
    x = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        base = model(x)
        for changed in (6, 15):
            y = x.clone()
            y[:, changed] = (y[:, changed] + 7) % 50
            torch.testing.assert_close(model(y)[:, :changed], base[:, :changed], **TOL)


def test_batching_does_not_change_the_logits():
    model = randpe()
    x = torch.cat((shared_prefix(), torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(9))))
    with torch.no_grad():
        together = model(x)
        pairs = torch.cat((model(x[:2]), model(x[2:])))
        for row in range(4):
            torch.testing.assert_close(together[row:row + 1], model(x[row:row + 1]), **TOL)
    torch.testing.assert_close(together, pairs, **TOL)


def test_the_draw_is_still_a_uniform_sorted_draw():
    """Span 4, two positions: each of the 6 subsets comes up with probability 1/6 over 6,000 sequences (within 5
    standard errors), sorted; and a sequence as long as the span reads every position in order."""
    torch.manual_seed(0)
    pe = Transformer(ModelConfig(vocab_size=50, d_model=32, n_layers=1, n_heads=4, max_seq_len=2,
                                 encoding="randpe")).encoding.eval()
    assert pe.span == 4
    x = torch.randint(0, 2 ** 31, (6000, 2), generator=torch.Generator().manual_seed(4))    # 6,000 first tokens
    counts = {subset: 0 for subset in itertools.combinations(range(4), 2)}
    for row in x:
        counts[tuple(pe.evaluation_draw(row, 2).tolist())] += 1
    bound = 5 * math.sqrt(6000 * (1 / 6) * (5 / 6))
    assert all(abs(n - 1000) < bound for n in counts.values()), counts
    assert pe.evaluation_draw(x[0, :1], 4).tolist() == [0, 1, 2, 3]
