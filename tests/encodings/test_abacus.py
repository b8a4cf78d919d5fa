"""Abacus embeddings (McLeish et al. 2024): the digit index against a plain Python derivation, the training
offset (range, one per example, none at evaluation), the table and its clamp, the equation of the embedding,
KV-cache decoding equal to recomputation (the digit count continues across cached calls), and the run
configuration: the arithmetic task gives the digit ids, every other task refuses the encoding in one line.

Index comparisons are exact (integers). Logits: 1e-5 relative to the largest entry (float32, ``assert_close``).
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from posbench.cli import main
from posbench.data.char import CharTokenizer
from posbench.encodings import ENCODINGS
from posbench.options import OptionError
from posbench.model import ModelConfig, Transformer

from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from encoding_helpers import assert_close, digit_rich

pytestmark = pytest.mark.usefixtures("one_thread")

TOKENIZER = CharTokenizer()                     # the arithmetic task's: digits 0-9 are ids 4-13
DIGIT_IDS = [TOKENIZER.id_of(str(d)) for d in range(10)]
VOCAB = TOKENIZER.vocab_size


def model(max_seq_len: int = 32, seed: int = 0, **options) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, max_seq_len=max_seq_len,
                                   encoding="abacus", init_std=0.2,
                                   encoding_options={"digit_ids": DIGIT_IDS, **options}))


def ids(text: str) -> torch.Tensor:
    return torch.tensor([TOKENIZER.encode(text)])


def loop_indices(text: str) -> list[int]:
    """The independent derivation: walk the characters; a digit's index is one more than the previous
    character's if that was a digit, else 1; anything else is 0."""
    out, run = [], 0
    for char in text:
        run = run + 1 if char in "0123456789" else 0
        out.append(run)
    return out


def places(pe, tokens: torch.Tensor, memory: dict | None = None) -> torch.Tensor:
    """Abacus's state for ``tokens``: each token's row of the table (the positions are not read)."""
    return pe.init_state(torch.arange(tokens.shape[1]).expand_as(tokens), tokens, memory)


TEXTS = ["123+4567=", "21+9=12", "=5", "1234567890", "+", "007+0=7", "9+99=801", "1-2x3=45678",
         "+-x=", "5"]


@pytest.mark.parametrize("text", TEXTS)
def test_the_digit_index_equals_a_python_loop(text):
    pe = model().encoding.eval()
    got = places(pe, ids(text))
    assert got[0].tolist() == loop_indices(text)


def test_hand_written_indices():
    """The brief's example, written out: 1 for the first digit in the order the task writes them."""
    assert loop_indices("123+4567=") == [1, 2, 3, 0, 1, 2, 3, 4, 0]
    pe = model().encoding.eval()
    assert places(pe, ids("123+4567=")).tolist() == [[1, 2, 3, 0, 1, 2, 3, 4, 0]]


def test_a_batch_of_random_rows_equals_the_loop_row_by_row():
    pe = model().encoding.eval()
    x = digit_rich(16, 30, seed=4) % VOCAB         # ids 4-13 are digits, any other id is not
    got = places(pe, x)
    for row in range(16):
        text = "".join(str(i - 4) if 4 <= i <= 13 else "+" for i in x[row].tolist())
        assert got[row].tolist() == loop_indices(text)


@pytest.mark.parametrize("cut", range(1, 9))
def test_a_kv_cache_memory_continues_the_count_across_calls(cut):
    """The state of the tokens after ``cut`` (a second call that sees only them, with the first call's memory)
    equals the whole sequence's state there, also when the cut splits a number."""
    pe = model().encoding.eval()
    x = ids("123+4567=")
    full = places(pe, x)
    memory: dict = {}
    first = places(pe, x[:, :cut], memory)
    second = places(pe, x[:, cut:], memory)
    assert torch.equal(torch.cat((first, second), 1), full)


def test_one_token_at_a_time_with_memory():
    pe = model().encoding.eval()
    x = digit_rich(3, 20, seed=2) % VOCAB
    memory: dict = {}
    steps = [places(pe, x[:, i:i + 1], memory) for i in range(20)]
    assert torch.equal(torch.cat(steps, 1), places(pe, x))


# ---- the training offset --------------------------------------------------------------------------------
def offsets(pe, text: str, rows: int) -> torch.Tensor:
    """k of every row (train index minus eval index at the digits), after checking it is one k per row."""
    x = ids(text).repeat(rows, 1)
    pe.eval()
    base = places(pe, x)
    pe.train()
    shifted = places(pe, x)
    digit = base > 0
    assert torch.equal(shifted[~digit], base[~digit]), "non-digits never get an offset"
    k = shifted - base
    per_row = k.masked_fill(~digit, -1).max(1).values
    assert torch.equal(k, torch.where(digit, per_row[:, None], 0)), "the same k at every digit of a row"
    return per_row


def test_the_offset_is_in_range_one_per_example_and_uniform():
    torch.manual_seed(0)
    pe = model(max_k=3, per_example=True).encoding
    k = offsets(pe, "123+4567=", 4000)
    assert int(k.min()) >= 0 and int(k.max()) <= 3
    counts = torch.bincount(k, minlength=4)
    # each of the 4 values: 1000 expected, sd 27; 150 is > 5 sd
    assert ((counts - 1000).abs() <= 150).all(), counts


def test_the_default_offset_range_is_the_released_codes():
    """k ~ U{0..99} (mcleish7/arithmetic: random.randint(0, 99)), so the first digit sits at 1..100."""
    torch.manual_seed(1)
    pe = model().encoding
    assert pe.options["max_k"] == 99 and pe.options["per_example"] is False
    k = torch.cat([offsets(pe, "12+3=", 2) for _ in range(3000)])
    assert int(k.min()) == 0 and int(k.max()) == 99 and len(k.unique()) == 100


def test_by_default_one_k_for_the_whole_batch_as_the_released_code():
    torch.manual_seed(2)
    pe = model().encoding
    for _ in range(5):
        k = offsets(pe, "123+45=", 64)
        assert len(k.unique()) == 1


def test_no_offset_at_evaluation_and_none_with_max_k_zero():
    pe = model().encoding.eval()
    x = ids("123+4567=").repeat(8, 1)
    for _ in range(3):
        assert torch.equal(places(pe, x), torch.tensor(loop_indices("123+4567=")).expand(8, -1))
    pe = model(max_k=0).encoding.train()
    assert torch.equal(places(pe, x), torch.tensor(loop_indices("123+4567=")).expand(8, -1))


def test_the_offset_comes_from_torchs_generator_not_pythons():
    pe = model().encoding.train()
    x = ids("123+4567=").repeat(16, 1)
    torch.manual_seed(5)
    random.seed(0)
    a = places(pe, x)
    torch.manual_seed(5)
    random.seed(1)
    b = places(pe, x)
    assert torch.equal(a, b)


def test_a_cache_used_in_training_keeps_each_rows_offset():
    pe = model().encoding.train()
    x = ids("1234+5678=").repeat(32, 1)
    torch.manual_seed(3)
    full = places(pe, x)
    torch.manual_seed(3)
    memory: dict = {}
    parts = [places(pe, x[:, :2], memory), places(pe, x[:, 2:7], memory),
             places(pe, x[:, 7:], memory)]
    assert torch.equal(torch.cat(parts, 1), full)


# ---- the table --------------------------------------------------------------------------------------------
def test_the_table_covers_max_k_plus_max_digits_and_clamps_beyond():
    pe = model(max_seq_len=12, max_k=5).encoding
    assert pe.table.num_embeddings == 5 + 12 + 1                   # max_digits 0: the model's max_seq_len
    assert model(max_seq_len=12, max_k=5, max_digits=40).encoding.table.num_embeddings == 5 + 40 + 1
    twelve = ids("123456789012")
    pe.train()
    for _ in range(20):                                            # the longest number trained: never clamped
        got = places(pe, twelve)
        assert torch.equal(got - got[0, 0] + 1, torch.arange(1, 13)[None]) and int(got.max()) <= 17
    pe.eval()
    long = ids("1" * 30)                                           # 30 digits: rows 1..17, then row 17 again
    assert places(pe, long)[0].tolist() == list(range(1, 18)) + [17] * 13


def test_the_embedding_is_the_token_embedding_plus_the_table_row():
    m = model().eval()
    x = ids("123+4567=")
    rows = torch.tensor([loop_indices("123+4567=")])
    expected = m.embed(x) + m.encoding.table.weight[rows]
    state = m.encoding.init_state(torch.arange(9)[None], x, None)
    assert_close(m.encoding.embed(m.embed(x), state), expected)


def test_options_are_checked():
    with pytest.raises(OptionError, match="needs digit_ids"):
        ENCODINGS["abacus"].resolve({})
    with pytest.raises(OptionError, match="10 distinct"):
        ENCODINGS["abacus"].resolve({"digit_ids": [4, 5, 6]})
    with pytest.raises(OptionError, match="10 distinct"):
        ENCODINGS["abacus"].resolve({"digit_ids": [4] * 10})
    with pytest.raises(OptionError, match="max_k=-2 is out of range"):
        ENCODINGS["abacus"].resolve({"digit_ids": DIGIT_IDS, "max_k": -2})


@pytest.mark.parametrize("given, max_k", [
    ({}, 99),                                            # no lengths from the task: the release's 99
    ({"number_digits": [6, 11]}, 5),                     # 5 -> 10-digit operands: sums of 6 and 11 digits
    ({"number_digits": [21, 121]}, 100),                 # the paper's 20 -> 120 digits: its k = 100
    ({"number_digits": [6, 11], "max_k": 40}, 40),       # set: kept
    ({"number_digits": [6, 6]}, 0),                      # nothing longer at evaluation: no offset
])
def test_the_default_offset_covers_the_longest_evaluated_number(given, max_k):
    resolved = ENCODINGS["abacus"].resolve({"digit_ids": DIGIT_IDS, **given})
    assert resolved["max_k"] == max_k
    assert ENCODINGS["abacus"].resolve(resolved) == resolved            # resolving again changes nothing


def test_the_arithmetic_task_gives_its_number_lengths():
    from posbench.runs.config import resolve_run_config

    from posbench.tasks import TASKS

    for sets, max_k in ((["task.train_digits=5", "task.eval_digits=0"], 5),       # 0: twice the training's
                        (["task.train_digits=5", "task.eval_digits=20"], 15),
                        (["task.train_digits=3", "encoding.max_k=99"], 99)):
        config = resolve_run_config("arithmetic", "abacus", "tiny", sets=sets)
        assert config.encoding_options["max_k"] == max_k
        model = Transformer(TASKS["arithmetic"](config).model_config())
        assert model.encoding.table.num_embeddings == max_k + model.config.max_seq_len + 1


# ---- inside the model -------------------------------------------------------------------------------------
def test_cached_generation_equals_recomputation_on_numbers():
    m = model()
    prompts = torch.cat([ids(text) for text in ("4321+987=", "1234+567=", "5555+555=")])
    cached = m.generate(prompts, max_new_tokens=12)
    full = m.generate(prompts, max_new_tokens=12, use_cache=False)
    assert torch.equal(cached, full)


def test_prefix_then_suffix_logits_split_inside_numbers():
    m = model().eval()
    x = torch.cat([ids("12345+6789=13579"), ids("98765+4321=02468")])
    with torch.no_grad():
        full = m(x)
        cache = m.new_cache()
        parts = [m(x[:, :3], cache=cache), m(x[:, 3:8], cache=cache), m(x[:, 8:9], cache=cache),
                 m(x[:, 9:], cache=cache)]
    assert_close(torch.cat(parts, 1), full)


def test_the_digit_order_is_a_signal_only_through_the_table():
    """The table is the model's one position signal: in a one-layer model, reversing a number's digits changes
    the last logits, and with the table zeroed the model is order-blind (attention alone sees a set)."""
    m = model().eval()
    m2 = Transformer(ModelConfig(**{**m.config.to_dict(), "n_layers": 1}))
    a, b = ids("123+45=5"), ids("321+45=5")
    with torch.no_grad():
        assert (m2(a)[0, -1] - m2(b)[0, -1]).abs().max() > 1e-3
        m2.encoding.table.weight.zero_()
        torch.testing.assert_close(m2(a)[0, -1], m2(b)[0, -1], rtol=1e-5, atol=1e-5)


# ---- the command line -------------------------------------------------------------------------------------
def test_ls_lists_it(capsys):
    assert main(["ls", "encodings"]) == 0
    assert "abacus" in capsys.readouterr().out


@pytest.mark.parametrize("task", ["passkey", "perplexity", "pretrain", "scrolls", "ruler"])
def test_every_task_without_digits_refuses_it_in_one_line(task, tmp_path, capsys):
    out = tmp_path / "results"
    code = main(["run", "-e", "abacus", "-t", task, "-p", "tiny", "-q", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == (f"error: encoding 'abacus' needs digit_ids (the token ids of the digits 0-9), which task "
                           f"'{task}' does not give (tasks that do: arithmetic)")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_the_task_gives_the_digit_ids_not_set(tmp_path, capsys):
    out = tmp_path / "results"
    code = main(["run", "-e", "abacus", "-t", "arithmetic", "-p", "tiny", "-q", "-o", str(out),
                 "--set", "encoding.digit_ids=1,2,3"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "the task gives this option" in err
    assert not out.exists()
    code = main(["run", "-e", "abacus", "-t", "arithmetic", "-p", "tiny", "-q", "-o", str(out),
                 "--set", "encoding.max_k=-2"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == ("error: encoding 'abacus' option max_k=-2 is out of range: it must be "
                                         ">= -1")
    assert not out.exists()


def test_dry_run_shows_the_task_given_digit_ids(capsys):
    assert main(["run", "-e", "abacus", "-t", "arithmetic", "-p", "tiny", "--dry-run"]) == 0
    config = json.loads(capsys.readouterr().out)[0]
    assert config["encoding_options"]["digit_ids"] == DIGIT_IDS


def test_it_trains_on_arithmetic_with_the_tiny_preset_and_draws_the_heatmap(tmp_path, capsys):
    out = tmp_path / "results"
    assert main(["run", "-e", "abacus", "-t", "arithmetic", "-p", "tiny", "-q", "-o", str(out),
                 "--set", "task.eval_samples=4"]) == 0, capsys.readouterr().err
    record = json.loads(next((out / "arithmetic" / "abacus").glob("*/result.json")).read_text())
    assert record["config"]["encoding_options"]["digit_ids"] == DIGIT_IDS
    assert record["grids"]["accuracy"]["axes"][0]["values"] == [1, 2, 3]
    capsys.readouterr()
    assert main(["compare", str(out), "--plots", str(tmp_path / "figs")]) == 0
    assert "abacus" in capsys.readouterr().out
    assert (tmp_path / "figs" / "arithmetic_accuracy.png").is_file()


def test_bench_times_it(tmp_path):
    from posbench.runs import runner
    from posbench.runs.config import resolve_run_config

    for mode in ("train", "decode"):
        config = resolve_run_config("bench", None, "small", sets=[
            "task.lengths=16", "task.batch=2", "task.warmup=1", "task.steps=2", "train.threads=1",
            "task.encodings=abacus", f"task.mode={mode}", "task.new_tokens=4"])
        assert config.task_options["encodings"] == ["rope", "abacus"]
        record = runner.execute(config, tmp_path, command=["posbench", "bench"]).record
        cells = {c["encoding"]: c for c in record.bench["cells"]}
        assert cells["abacus"]["status"] == "ok", cells["abacus"]["error"]
        assert cells["abacus"]["params"] > cells["rope"]["params"]      # its table


def test_a_transformers_cache_continues_the_count(tmp_path, capsys):
    """An exported Abacus model under transformers: a forward pass in pieces through a DynamicCache (cut inside
    numbers) gives the one-pass logits, and cached generation equals recomputation (the digit run is kept on
    the cache object, as posbench's KVCache.memory)."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM, DynamicCache

    from test_hf_export import export, fake_run, logits

    digits = [ord(str(d)) for d in range(10)]                    # a byte tokenizer's digits
    out = export(capsys, fake_run(tmp_path, "abacus", digit_ids=digits), tmp_path / "out")
    hf = AutoModelForCausalLM.from_pretrained(str(out))
    x = torch.tensor([list(b"1234+56789=97531"), list(b"98765+4321=02468")])
    cache = DynamicCache(config=hf.config)
    with torch.no_grad():
        parts = [hf(input_ids=x[:, :3], past_key_values=cache).logits,
                 hf(input_ids=x[:, 3:8], past_key_values=cache).logits,
                 hf(input_ids=x[:, 8:9], past_key_values=cache).logits,
                 hf(input_ids=x[:, 9:], past_key_values=cache).logits]
    assert_close(torch.cat(parts, 1), logits(hf, x))
    cached = hf.generate(x[:, :12], max_new_tokens=8, do_sample=False)
    full = hf.generate(x[:, :12], max_new_tokens=8, do_sample=False, use_cache=False)
    assert torch.equal(cached, full)
