"""The arithmetic task: data format against hand-worked examples, bucket balance, loss mask, scorer."""

from collections import Counter

import pytest
import torch

from posbench.errors import ConfigError
from posbench.runs.config import resolve_run_config
from posbench.data.char import EOS, PAD, CharTokenizer
from posbench.data.batch import IGNORE_INDEX
from posbench.reporters import NullReporter
from posbench.tasks import TASKS
from posbench.tasks.arithmetic.task import (AdditionStream, bucket_pairs, cell_stderr, format_example, random_operand,
                                       score_answers, sequence_length, summarise)

from arithmetic_oracle import encode_examples, exact_match
from posbench.tasks.presets import presets_of

TOK = CharTokenizer()


def test_tokenizer_ids_match_mcleish():
    assert [TOK.to_id[c] for c in "0123456789"] == list(range(4, 14))
    assert (TOK.to_id["+"], TOK.to_id["-"], TOK.to_id["x"], TOK.to_id["="]) == (14, 15, 16, 17)
    assert TOK.to_id[" "] == PAD == 0 and EOS == 3 and TOK.vocab_size == 18
    assert TOK.decode([6, 5, 14, 13, 17, 5, 6, EOS, PAD]) == "21+9=12"


@pytest.mark.parametrize("a,b,prompt,answer", [
    (12, 9, "21+9=", "12"),             # 12 + 9 = 21, every number least-significant digit first
    (95, 7, "59+7=", "201"),            # 95 + 7 = 102: the carry makes the answer one digit longer
    (0, 0, "0+0=", "0"),
    (1000, 1, "0001+1=", "1001"),       # 1001 reads the same both ways
    (123, 4567, "321+7654=", "0964"),   # 4690 -> "0964": a trailing zero of the reversal is kept
])
def test_format_reverses_operands_and_sum(a, b, prompt, answer):
    assert format_example(a, b) == (prompt, answer)


def test_encoding_masks_everything_up_to_equals():
    batch = encode_examples([(12, 9)], length=10)
    # "21+9=12" + EOS -> ids 6 5 14 13 17 5 6 3; inputs drop the last id, targets drop the first
    assert batch.tokens.tolist() == [[6, 5, 14, 13, 17, 5, 6, PAD, PAD]]
    i = IGNORE_INDEX
    # loss on the predictions made at '=' and after: answer digits '1' '2' and EOS
    assert batch.targets.tolist() == [[i, i, i, i, 5, 6, EOS, i, i]]
    assert batch.n_targets == 3


def test_operands_have_exact_length_and_no_leading_zero():
    import numpy as np

    rng = np.random.default_rng(0)
    for digits in range(1, 25):
        for _ in range(20):
            x = random_operand(rng, digits)
            assert len(str(x)) == digits


def test_bucket_sampling_is_balanced_and_deterministic():
    stream = AdditionStream(seed=3, train_digits=3)
    pairs = bucket_pairs(3)
    assert len(pairs) == 9 and (1, 3) in pairs and (3, 1) in pairs
    seen = Counter()
    for _ in range(4):
        batch = stream.next_batch(18)
        assert batch.tokens.shape == (18, sequence_length(3) - 1)
        for row in batch.tokens.tolist():
            text = TOK.decode(row)
            a, rest = text.split("+")
            b, c = rest.split("=")
            seen[(len(a), len(b))] += 1
            assert int(a[::-1]) + int(b[::-1]) == int(c[::-1])
    assert set(seen) == set(pairs) and set(seen.values()) == {8}   # 72 examples / 9 pairs
    # example g depends only on (seed, g): a resumed stream yields the same batches (the state counts
    # examples since the stream became example-indexed for several processes; it counted batches before)
    resumed = AdditionStream(seed=3, train_digits=3)
    resumed.load_state_dict({"seed": 3, "examples": 36})
    again = AdditionStream(seed=3, train_digits=3)
    again.next_batch(18), again.next_batch(18)
    assert again.state_dict() == {"seed": 3, "examples": 36}
    assert torch.equal(resumed.next_batch(18).tokens, again.next_batch(18).tokens)
    assert not torch.equal(AdditionStream(4, 3).next_batch(18).tokens, AdditionStream(3, 3).next_batch(18).tokens)


def decode_rows(batch):
    """(a, b) of every row, read back from the token ids."""
    pairs = []
    for row in batch.tokens.tolist():
        a, rest = TOK.decode(row).split("+")
        b, _ = rest.split("=")
        pairs.append((a, b))
    return pairs


@pytest.mark.parametrize("digits", [1, 2, 5, 20])
def test_vectorised_examples_equal_the_one_by_one_encoding(digits):
    # the NumPy path (digit arrays, carries, layout, mask) against encode_examples on Python integers
    stream = AdditionStream(seed=5, train_digits=digits)
    for size in (1, 7, 300):
        batch = stream.next_batch(size)
        pairs = [(int(a[::-1]), int(b[::-1])) for a, b in decode_rows(batch)]
        reference = encode_examples(pairs, sequence_length(digits))
        assert torch.equal(batch.tokens, reference.tokens) and torch.equal(batch.targets, reference.targets)
        assert batch.tokens.dtype == torch.long and batch.n_targets == reference.n_targets


def test_examples_do_not_depend_on_how_the_stream_is_cut():
    # several processes read slices of one stream: any cut gives the same examples (blocks of 256 straddled)
    whole = AdditionStream(seed=1, train_digits=4).next_batch(700)
    pieces = AdditionStream(seed=1, train_digits=4)
    parts = [pieces.next_batch(100)]
    pieces.skip(200)
    parts += [pieces.next_batch(300), pieces.next_batch(100)]
    for part, rows in zip(parts, (slice(0, 100), slice(300, 600), slice(600, 700))):
        assert torch.equal(part.tokens, whole.tokens[rows]) and torch.equal(part.targets, whole.targets[rows])


def test_operand_digits_are_uniform_with_no_leading_zero():
    # the law of random_operand: exactly i digits, leading digit 1-9 (0-9 for one digit), others 0-9
    import numpy as np

    batch = AdditionStream(seed=0, train_digits=4).next_batch(16 * 600)
    pairs = decode_rows(batch)
    lengths = Counter((len(a), len(b)) for a, b in pairs)
    assert set(lengths) == set(bucket_pairs(4)) and set(lengths.values()) == {600}
    leading = Counter(x[-1] for a, b in pairs for x in (a, b) if len(x) > 1)   # reversed: leading digit last
    single = Counter(x for a, b in pairs for x in (a, b) if len(x) == 1)
    inner = Counter(d for a, b in pairs for x in (a, b) if len(x) > 1 for d in x[:-1])
    assert "0" not in leading and set(leading) == set("123456789") and set(single) == set("0123456789")
    for counts, k in ((leading, 9), (single, 10), (inner, 10)):
        observed = np.array(list(counts.values()), dtype=float)
        expected = observed.sum() / k
        chi2 = ((observed - expected) ** 2 / expected).sum()
        assert chi2 < 35, (counts, chi2)      # chi-square, 8-9 degrees of freedom: p < 1e-4 for 35


def test_exact_match_scorer_on_known_predictions():
    target = TOK.encode("201", eos=True)                      # 95 + 7
    assert exact_match(TOK.encode("201", eos=True), target)
    assert exact_match(TOK.encode("201", eos=True) + [EOS, EOS], target)     # padding after EOS
    assert exact_match(TOK.encode("201", eos=True) + TOK.encode("77"), target)  # junk after EOS is ignored
    assert not exact_match(TOK.encode("2015"), target)        # never stopped
    assert not exact_match(TOK.encode("20", eos=True), target)  # stopped early
    assert not exact_match(TOK.encode("2011", eos=True), target)  # one digit too many
    assert not exact_match(TOK.encode("211", eos=True), target)   # one digit wrong
    assert not exact_match([EOS], target)


def test_vectorised_scorer_agrees_with_exact_match_on_known_predictions():
    """score_answers (what evaluation runs: every row of a decoded batch at once) on the cases above, each
    prediction padded with '7's to the decoding width, as exact_match scores them."""
    import numpy as np

    target = TOK.encode("201", eos=True)
    cases = [TOK.encode("201", eos=True), TOK.encode("201", eos=True) + [EOS, EOS],
             TOK.encode("201", eos=True) + TOK.encode("77"), TOK.encode("2015"), TOK.encode("20", eos=True),
             TOK.encode("2011", eos=True), TOK.encode("211", eos=True), [EOS]]
    width = 8
    rows = np.array([c + TOK.encode("7") * (width - len(c)) for c in cases])
    expected = [exact_match(list(row), target) for row in rows]
    assert expected == [True, True, True, False, False, False, False, False]
    assert score_answers(["201"] * len(cases), rows).tolist() == expected


def test_summary_averages_and_stderr():
    # train_digits 1, grid 2x2: cell (1,1) in distribution, the other three out of distribution
    counts = {(1, 1): (10, 10), (1, 2): (5, 10), (2, 1): (0, 10), (2, 2): (10, 10)}
    m = summarise(counts, train_digits=1)
    assert m["accuracy_id"].value == 100.0 and m["accuracy_id"].n == 10
    assert m["accuracy_ood"].value == pytest.approx(100 * 1.5 / 3)
    assert m["accuracy"].value == pytest.approx(100 * 2.5 / 4)
    assert m["accuracy_id"].stderr == 0.0
    half = cell_stderr(0.5, 10)
    assert half == pytest.approx((0.25 / 9) ** 0.5)
    assert m["accuracy"].stderr == pytest.approx(100 * half / 4)
    assert all(x.higher_is_better for x in m.values())


class OracleModel:
    """Answers every prompt correctly when both operands have at most ``limit`` digits, else garbage."""

    def __init__(self, limit: int):
        self.limit = limit

    def generate(self, prompt, max_new_tokens, eos_id=None):
        rows = []
        for ids in prompt.tolist():
            a, b = TOK.decode(ids).rstrip("=").split("+")
            if len(a) <= self.limit and len(b) <= self.limit:
                answer = TOK.encode(str(int(a[::-1]) + int(b[::-1]))[::-1], eos=True)
            else:
                answer = TOK.encode("9" * 3, eos=True)
            answer = (answer + [EOS] * max_new_tokens)[:max_new_tokens]
            rows.append(answer)
        return torch.tensor(rows)


def test_evaluate_grid_with_an_oracle():
    cfg = resolve_run_config("arithmetic", "rope", "tiny", sets=["task.train_digits=2", "task.eval_digits=4",
                                                                  "task.eval_samples=5"])
    task = TASKS["arithmetic"](cfg)
    ev = task.evaluate(OracleModel(limit=2), torch.device("cpu"), NullReporter(), {})
    assert ev.primary == "accuracy"
    assert ev.metrics["accuracy_id"].value == 100.0
    assert ev.metrics["accuracy_ood"].value < 5.0       # "999" is right only by accident
    grid = ev.grids["accuracy"]
    assert [a.name for a in grid.axes] == ["len_a", "len_b"] and grid.axes[0].values == [1, 2, 3, 4]
    assert grid.values[0][1] == 100.0 and grid.n[3][3] == 5
    assert grid.meta["train_max"] == {"len_a": 2, "len_b": 2}
    preds = list(ev.predictions)
    assert len(preds) == 16 * 5
    assert {"len_a", "len_b", "a", "b", "prompt", "target", "prediction", "correct"} <= set(preds[0])
    # the same examples for every encoding and every call (seeded by eval_seed and the cell)
    again = list(task.evaluate(OracleModel(limit=2), torch.device("cpu"), NullReporter(), {}).predictions)
    assert [p["prompt"] for p in again] == [p["prompt"] for p in preds]


def test_evaluate_real_model_uses_kv_cache_generation():
    from posbench.model import Transformer

    cfg = resolve_run_config("arithmetic", "tape", "tiny")
    task = TASKS["arithmetic"](cfg)
    model = Transformer(task.model_config()).eval()
    with torch.no_grad():
        ev = task.evaluate(model, torch.device("cpu"), NullReporter(), {})
    assert 0.0 <= ev.metrics["accuracy"].value <= 100.0
    assert model.config.max_seq_len == sequence_length(2)


def test_presets_and_validation():
    cls = TASKS["arithmetic"]
    assert set(presets_of(cls)) == {"tiny", "small", "gpu", "paper"} and cls.default_preset == "small"
    paper = resolve_run_config("arithmetic", "rope", "paper")
    assert (paper.model["n_layers"], paper.model["d_model"], paper.model["n_heads"]) == (16, 1024, 16)
    assert (paper.train["batch_size"], paper.train["steps"], paper.train["lr"]) == (512, 20000, 1e-4)
    assert paper.task_options["train_digits"] == 20 and paper.task_options["eval_digits"] == 40
    with pytest.raises(ConfigError, match="train_digits=0 is out of range: it must be >= 1"):
        resolve_run_config("arithmetic", "rope", "tiny", sets=["train_digits=0"])
