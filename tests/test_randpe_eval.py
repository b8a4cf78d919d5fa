"""RandPE as Ruoss et al.: sorted random positions at evaluation as in training, seeded and recorded, from a span
that covers the task's longest evaluation; with a KV cache, a prompt and its generated tokens read one draw.

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


def tokens(n: int = 12) -> torch.Tensor:
    return torch.randint(0, 50, (2, n), generator=torch.Generator().manual_seed(1))


def test_evaluation_draws_sorted_random_positions_by_default():
    randpe, rope = pair(eval_length_factor=8.0)
    assert randpe.config.encoding_options["eval_random"] is True
    assert randpe.encoding.span == 8 * 16
    positions = randpe.encoding.sample_positions(torch.arange(12).expand(2, 12))
    assert (positions.diff(dim=-1) > 0).all() and positions.max() < 8 * 16       # sorted, distinct, in the span
    assert not torch.equal(positions[0], torch.arange(12))
    assert torch.equal(positions[0], positions[1])                              # one draw for the batch
    x = tokens()
    with torch.no_grad():
        first, second = randpe(x), randpe(x)
    assert (first - second).abs().max() > 1e-3                                  # a new draw every pass
    assert (first - rope(x)).abs().max() > 1e-3                                 # not RoPE at 0..N-1


def test_evaluation_is_seeded_repeatable_and_equals_rope_at_the_drawn_positions():
    randpe, rope = pair(eval_length_factor=8.0, eval_seed=3)
    x = tokens()
    with torch.no_grad():
        a = randpe.eval()(x)
        b = randpe.train().eval()(x)                              # entering eval mode resets the generator
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    drawn = torch.randperm(128, generator=torch.Generator().manual_seed(3))[:12].sort().values
    with torch.no_grad():
        torch.testing.assert_close(a, rope(x, positions=drawn), **TOL)
    other, _ = pair(eval_length_factor=8.0, eval_seed=4)
    with torch.no_grad():
        assert (other(x) - a).abs().max() > 1e-3
    assert randpe.config.encoding_options["eval_seed"] == 3                     # recorded with the run's options


def test_with_eval_random_off_evaluation_is_rope():
    randpe, rope = pair(eval_random=False)
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(randpe(x), rope(x), rtol=0, atol=0)


def test_a_cached_generation_reads_one_sorted_draw():
    from posbench.encodings.randpe import DECODE_RESERVE, DRAW

    randpe, rope = pair(eval_length_factor=8.0)
    prompt = tokens(10)
    cache = randpe.new_cache()
    with torch.no_grad():
        first = randpe(prompt, cache=cache)
        draw = cache.memory[DRAW]
        assert draw.shape == (10 + DECODE_RESERVE,) and (draw.diff() > 0).all() and draw.max() < 128
        torch.testing.assert_close(first, rope(prompt, positions=draw[:10]), **TOL)
        step = tokens(1)[:, :1]
        second = randpe(step, cache=cache)
        full = rope(torch.cat((prompt, step), dim=1), positions=draw[:11])
        torch.testing.assert_close(second[:, -1], full[:, -1], **TOL)
        assert torch.equal(cache.memory[DRAW], draw)                       # the same draw, not a new one


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


def test_a_default_randpe_does_not_evaluate_at_0_to_n():
    randpe, rope = pair()
    x = tokens()
    with torch.no_grad():
        assert (randpe(x) - rope(x)).abs().max() > 1e-3
