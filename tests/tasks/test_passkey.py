"""Passkey prompts: LongLoRA's template character for character, and exact-length token grids."""

import numpy as np
import pytest

from posbench.data.tokenizer import ByteTokenizer
from posbench.evaluation import passkey as pk

UNIT = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
HEAD = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
        "I will quiz you about the important information there.")


def test_longlora_prompt_character_for_character():
    for n_garbage, seed in [(3072, 0), (1024, 7), (200, 19), (7168, 3)]:
        prompt, key = pk.longlora_prompt(n_garbage, seed)
        rs = np.random.RandomState(seed)                 # LongLoRA: numpy.random.seed(i), then two randints
        n_prefix = rs.randint(0, n_garbage)
        pass_key = rs.randint(1, 50000)
        garbage = " ".join([UNIT] * 5000)
        expected = "\n".join([HEAD, garbage[:n_prefix],
                              f"The pass key is {pass_key}. Remember it. {pass_key} is the pass key.",
                              garbage[:n_garbage - n_prefix], "What is the pass key? The pass key is"])
        assert prompt == expected and key == str(pass_key)
        assert 1 <= int(key) < 50000
        # the prompt's garbage is exactly n_garbage characters
        assert len(prompt) == len(expected) == len(HEAD) + n_garbage + len(pk.information_line(key)) + 37 + 4


def test_longlora_prompt_matches_numpy_global_state_semantics():
    np.random.seed(5)
    a = np.random.randint(0, 3072), np.random.randint(1, 50000)
    prompt, key = pk.longlora_prompt(3072, 5)
    assert key == str(a[1]) and f"{HEAD}\n{' '.join([UNIT] * 5000)[:a[0]]}\nThe pass key" in prompt


def test_longlora_length_points():
    # n_garbage = int(3.75 * (i + 1) * interval // 1024 * 1024): 3750 // 1024 = 3 -> 3072, 7500 -> 7168, ...
    assert pk.longlora_points(32000, 1000)[:4] == [3072, 7168, 10240, 14336]
    assert len(pk.longlora_points(32000, 1000)) == 32
    assert pk.longlora_points(8192, 1000) == [3072, 7168, 10240, 14336, 18432, 21504, 25600, 29696]
    assert pk.longlora_n_garbage(0, 300) == 1024 and pk.longlora_n_garbage(0, 100) == 0


def test_grid_prompts_have_exact_length_and_depth():
    tok = ByteTokenizer()
    builder = pk.GridBuilder(tok)
    for length in (300, 517, 1024):
        for depth in (0.0, 0.25, 0.5, 1.0):
            p = builder.build(length, depth, 12345)
            assert len(p.prompt_ids) == length
            text = tok.decode(p.prompt_ids)
            assert text.startswith(HEAD + "\n") and text.endswith("\nWhat is the pass key? The pass key is")
            assert tok.decode(p.answer_ids) == " 12345"
            assert text.index("The pass key is 12345.") == p.key_position + 1   # after the "\n"
            assert abs(p.actual_depth - depth) < 0.01
    p0 = builder.build(400, 0.0, 7)
    assert tok.decode(p0.prompt_ids).startswith(HEAD + "\n\nThe pass key is 7. Remember it.")
    with pytest.raises(ValueError, match="at least"):
        builder.build(100, 0.5, 1)


def test_trial_seeds_and_keys_are_fixed():
    s = pk.trial_seed(0, 512, 2, 3)
    assert s == pk.trial_seed(0, 512, 2, 3) and s != pk.trial_seed(0, 512, 2, 4)
    assert pk.grid_key(s) == pk.grid_key(s) and 1 <= pk.grid_key(s) < 50000


@pytest.mark.parametrize("loss", ["all", "answer"])
def test_training_batches_take_the_loss_on_every_token_or_on_the_answer_only(loss):
    from posbench.data.batch import IGNORE_INDEX
    from posbench.tasks.passkey.task import PasskeyStream

    tok = ByteTokenizer()
    stream = PasskeyStream(0, pk.GridBuilder(tok), 300, tok.eos_id, tok.pad_id, loss)
    batch = stream.next_batch(3)
    assert batch.tokens.shape == batch.targets.shape == (3, 300)
    for x, y in zip(batch.tokens.tolist(), batch.targets.tolist()):
        kept = [t for t in y if t != IGNORE_INDEX]
        if loss == "all":
            assert kept == x[1:] + [tok.eos_id]
        else:                                                  # " K" and EOS: the key's digits, space, EOS
            text = tok.decode(kept[:-1])
            assert kept[-1] == tok.eos_id and text.startswith(" ") and text[1:].isdigit()
            assert y.index(kept[0]) == len(y) - len(kept)      # masked up to the answer, kept to the end


def test_grid_prompts_at_1x_are_drawn_from_the_training_distribution(monkeypatch):
    """A grid prompt and its answer together are the grid length, as a training example's are: at 1x every prompt
    is as long as a training prompt for the same key, and the key's place is the training example's at the same
    depth (task version 2; in version 1 the prompt alone was the grid length)."""
    import torch

    from posbench.model import ModelConfig, Transformer
    from posbench.runs.config import resolve_run_config
    from posbench.tasks import TASKS

    config = resolve_run_config("passkey", "rope", "tiny", sets=["task.depths=0.0,1.0", "task.trials=3"])
    task = TASKS["passkey"](config)
    length = task.train_length
    seen = []
    monkeypatch.setattr(type(task), "_decode_batch",
                        lambda self, model, device, prompts, answers: (seen.extend(zip(prompts, answers)), answers)[1])
    model = Transformer(ModelConfig(vocab_size=task.vocab_size(), encoding="rope", d_model=16, n_layers=1, n_heads=2,
                                    max_seq_len=length))
    evaluation = task.evaluate(model, torch.device("cpu"), None, {})
    assert evaluation.metrics["acc_1x"].value == 100.0           # the stand-in decoder answers right
    at_1x = [(p, a) for p, a in seen if len(p) + len(a) == length]
    assert len(at_1x) == 2 * 3                                   # every 1x prompt: prompt + answer = training length
    assert all(len(p) + len(a) in (length * f for f in config.task_options["length_factors"]) for p, a in seen)
    from posbench.tasks.passkey.task import PasskeyStream, build_like_training

    tok = task.tokenizer
    builder = task.builder
    stream = PasskeyStream(0, builder, length, tok.eos_id, tok.pad_id, "answer")
    for depth in (0.0, 1.0):
        key = 12345
        grid = build_like_training(builder, length, depth, key)
        answer_len = len(tok.encode(pk.answer_text(key)))
        trained = builder.build(stream.length - answer_len, depth, key)     # how make_batch builds an example
        assert grid.prompt_ids == trained.prompt_ids and grid.key_position == trained.key_position
    assert TASKS["passkey"].version == 2 and config.task_version == 2


def test_per_example_scores_of_a_record_without_its_training_length_name_their_columns_and_do_not_stop():
    """A grid record whose evaluation lacks ``train_length`` (hand-edited, or a hostile folder): the per-example
    scores still come back, the length columns named as a training length of 0 names them (``acc_0x``), where the
    division by it stopped ``compare --against``."""
    from types import SimpleNamespace

    from posbench.evaluation.outcome import length_factor
    from posbench.tasks.passkey.example_scores import example_scores

    rows = [{"correct": c, "length": 512, "depth": 0.5, "key": k} for k, c in ((1, True), (2, False))]
    scores = example_scores(SimpleNamespace(evaluation={"mode": "grid"}), rows)
    assert scores.terms["accuracy"].tolist() == [100.0, 0.0]
    assert "acc_0x" in scores.terms and "accuracy_beyond" in scores.terms
    assert [length_factor(512, 256), length_factor(384, 256), length_factor(512, 0)] == ["2", "1.5", "0"]
