"""RandPE as Ruoss et al.: sorted random positions at evaluation as in training, seeded and recorded, from a span
that covers the task's longest evaluation; each sequence its own draw (keyed on eval_seed and its tokens), so a
number never depends on batching; with a KV cache, a prompt and its generated tokens read one draw of the whole
sequence's length.

Compared against RoPE with the same weights at explicit positions (an independent path: RoPE's own code), to
1e-5 relative (float32)."""

from __future__ import annotations

import pytest
import torch

from posbench.model import ModelConfig, Transformer
from posbench.runs.config import resolve_run_config

TOL = dict(rtol=1e-5, atol=1e-5)


def pair(**options) -> tuple[Transformer, Transformer]:
    torch.manual_seed(0)
    shape = dict(vocab_size=50, d_model=32, n_layers=2, n_heads=4, max_seq_len=16, init_std=0.2)
    randpe = Transformer(ModelConfig(encoding="randpe", encoding_options=options, **shape))
    rope = Transformer(ModelConfig(encoding="rope", **shape))
    rope.load_state_dict(randpe.state_dict())
    return randpe.eval(), rope.eval()


def tokens(n: int = 12, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 50, (batch, n), generator=torch.Generator().manual_seed(seed))


def test_a_default_randpe_does_not_evaluate_at_0_to_n():
    randpe, rope = pair()
    x = tokens()
    with torch.no_grad():
        assert (randpe(x) - rope(x)).abs().max() > 1e-3


def test_each_sequence_gets_its_own_sorted_draw_which_repeats():
    randpe, rope = pair(eval_length_factor=8.0)
    pe = randpe.encoding
    assert randpe.config.encoding_options["eval_random"] is True and pe.span == 8 * 16
    x = tokens()
    a, b = pe.evaluation_draw(x[0], 12), pe.evaluation_draw(x[1], 12)
    for d in (a, b):
        assert (d.diff() > 0).all() and d.max() < 128 and not torch.equal(d, torch.arange(12))   # sorted, in span
    assert not torch.equal(a, b)                                          # two sequences, two draws
    assert torch.equal(a, pe.evaluation_draw(x[0], 12))                  # the same sequence, the same draw
    with torch.no_grad():
        logits = randpe(x)
        torch.testing.assert_close(randpe(x), logits, rtol=0, atol=0)    # repeatable
        for row, drawn in ((0, a), (1, b)):                               # RoPE at each row's own draw
            torch.testing.assert_close(logits[row:row + 1], rope(x[row:row + 1], positions=drawn), **TOL)


def test_a_batch_gives_each_row_what_it_gets_alone_padded_or_not():
    """The draw is per sequence: batching (eval_batch_size, processes) changes no number; a left-padded row draws
    as many positions as its real tokens."""
    randpe, _ = pair(eval_length_factor=8.0)
    x = tokens(12, batch=3)
    with torch.no_grad():
        together = randpe(x)
        for row in range(3):
            torch.testing.assert_close(together[row:row + 1], randpe(x[row:row + 1]), **TOL)
        short = tokens(8, batch=1, seed=5)
        padded = torch.cat((torch.zeros(1, 4, dtype=torch.long), short), dim=1)
        mask = torch.cat((torch.zeros(1, 4), torch.ones(1, 8)), dim=1).long()
        batch = torch.cat((padded, x[:1]), dim=0)
        masks = torch.cat((mask, torch.ones(1, 12, dtype=torch.long)), dim=0)
        got = randpe(batch, attention_mask=masks)
        torch.testing.assert_close(got[0, 4:], randpe(short)[0], **TOL)


def test_the_seed_is_recorded_and_changes_the_draw():
    randpe, _ = pair(eval_length_factor=8.0, eval_seed=3)
    other, _ = pair(eval_length_factor=8.0, eval_seed=4)
    x = tokens()
    assert randpe.config.encoding_options["eval_seed"] == 3
    with torch.no_grad():
        assert (other(x) - randpe(x)).abs().max() > 1e-3


def test_with_eval_random_off_evaluation_is_rope():
    randpe, rope = pair(eval_random=False)
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(randpe(x), rope(x), rtol=0, atol=0)


def test_a_cached_generation_reads_one_draw_of_the_whole_sequence():
    """Greedy decoding makes the cache for the prompt and its new tokens: the first call draws that many positions
    (keyed on the prompt), and each new token reads the next; RoPE at those positions gives the same logits."""
    from posbench.encodings.randpe import DRAW
    from posbench.model.generate import PLANNED

    randpe, rope = pair(eval_length_factor=8.0)
    prompt = tokens(10)
    cache = randpe.new_cache()
    cache.memory[PLANNED] = 13                      # the prompt and 3 new tokens
    with torch.no_grad():
        first = randpe(prompt, cache=cache)
        draw = cache.memory[DRAW]
        assert draw.shape == (2, 13) and (draw.diff(dim=-1) > 0).all() and draw.max() < 128
        for row in range(2):
            assert torch.equal(draw[row], randpe.encoding.evaluation_draw(prompt[row], 13))
            torch.testing.assert_close(first[row:row + 1], rope(prompt[row:row + 1], positions=draw[row, :10]), **TOL)
        step = tokens(1)[:, :1]
        second = randpe(step, cache=cache)
        for row in range(2):
            full = rope(torch.cat((prompt, step), dim=1)[row:row + 1], positions=draw[row, :11])
            torch.testing.assert_close(second[row, -1], full[0, -1], **TOL)
        assert torch.equal(cache.memory[DRAW], draw)                       # the same draw, not a new one
    generated = randpe.generate(prompt, 3)                                  # greedy decoding sets PLANNED itself
    assert generated.shape == (2, 3)


def test_a_cached_sequence_longer_than_the_span_runs_at_its_own_positions():
    randpe, rope = pair()                                              # span 2 x 16 = 32
    prompt = torch.randint(0, 50, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(randpe(prompt, cache=randpe.new_cache()), rope(prompt), **TOL)


@pytest.mark.parametrize("task, preset, factor, span", [("perplexity", "small", 8.0, 2048), ("passkey", "small", 4.0, 1088),
                                                        ("pretrain", "small", 0.0, 512)])
def test_the_span_covers_the_tasks_longest_evaluation(task, preset, factor, span):
    config = resolve_run_config(task, "randpe", preset)
    assert config.encoding_options["eval_length_factor"] == factor
    pe = Transformer(ModelConfig(vocab_size=8, encoding="randpe", encoding_options=config.encoding_options,
                                 **{k: v for k, v in config.model.items()
                                    if k in ("d_model", "n_layers", "n_heads", "max_seq_len")})).encoding
    assert pe.span == span


def test_the_task_gives_the_factor_not_set():
    from posbench.errors import ConfigError

    with pytest.raises(ConfigError, match="the task gives this option"):
        resolve_run_config("perplexity", "randpe", "small", sets=["encoding.eval_length_factor=2"])
