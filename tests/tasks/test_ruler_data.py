"""RULER retrieval generators: exact lengths, needles at their depth, answers recoverable by an independent
parser, variable-tracking chains resolved independently, seeds, RULER's scoring, training rows."""

import re

import pytest

from posbench.data.tokenizer import BPETokenizer, ByteTokenizer
from posbench.errors import UserError
from posbench.tasks.ruler.examples import data_spec, eval_seed, make_example, train_seed
from posbench.tasks.ruler.kinds import KINDS, RulerError
from posbench.tasks.ruler.scoring import (postprocess, prediction_record, ruler_score, score, string_match_all,
                                         string_match_part)
from posbench.tasks.ruler.training import training_batch, training_sequence
from posbench.tasks.ruler.haystack import DEPTHS

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
# RULER's strings, typed out here independently of posbench's constants
NIAH_PLURAL_HEAD = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
                    "I will quiz you about the numbers afterwards.\n")
NIAH_SINGULAR_HEAD = ("A special magic number is hidden within the following text. Make sure to memorize it. "
                      "I will quiz you about the number afterwards.\n")
VT_HEAD = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
NEEDLE_RE = re.compile(r"^One of the special magic (\w+) for (.+) is: (.+)\.$", re.M)
VT_RE = re.compile(r"^VAR ([A-Z]+) = (?:(\d+)|VAR ([A-Z]+) )$", re.M)
NIAH_KINDS = [k for k in KINDS if k.startswith("niah")]


@pytest.fixture(scope="module")
def bpe():
    texts = [NOISE, "One of the special magic numbers for quizzical-ATM is: 1234567.", "VAR ABCDE = VAR FGHIJ ",
             "def f(x):\n    return x + 1\n", "Memorize and track the chain(s) of variable assignment"] * 8
    return BPETokenizer.train(iter(texts), vocab_size=320)


@pytest.fixture(scope="module")
def byte():
    return ByteTokenizer()


def tokenizers(byte, bpe):
    return {"byte": byte, "bpe": bpe}


@pytest.mark.parametrize("tok_name", ["byte", "bpe"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_prompts_have_exactly_the_requested_length(kind, tok_name, byte, bpe):
    tok = tokenizers(byte, bpe)[tok_name]
    for length in (1300, 2047):
        for depth in (None, 0.0, 0.5, 1.0):
            ex = make_example(kind, tok, length, depth, seed=length + 7)
            assert len(ex.prompt_ids) == length == ex.meta["length"]
            assert tok.decode(ex.answer_ids) == ex.answer_text
            # the prompt ends with RULER's answer prefix
            text = tok.decode(ex.prompt_ids)
            assert text.endswith("mentioned in the provided text are") or text.endswith(
                "mentioned in the provided text is") or text.endswith(", they are: ")


def _context_lines(text: str, head: str, tail_start: str) -> list[str]:
    assert text.startswith(head)
    end = text.rindex(tail_start) + 1                 # the context's last newline included
    return text[len(head):end].split("\n")[:-1]


@pytest.mark.parametrize("kind", ["niah_single_1", "niah_single_2", "niah_multikey_1", "niah_multikey_2",
                                  "niah_multivalue", "niah_multiquery"])
@pytest.mark.parametrize("depth", [0.0, 0.3, 0.77, 1.0])
def test_needles_sit_once_at_the_requested_depth_byte_text(kind, depth, byte):
    """With bytes, tokens are characters: depth is read off the text alone."""
    ex = make_example(kind, byte, 3000, depth, seed=11)
    text = byte.decode(ex.prompt_ids)
    head = NIAH_SINGULAR_HEAD if len(ex.answers) == 1 else NIAH_PLURAL_HEAD
    lines = _context_lines(text, head, "\nWhat ")
    asked = _asked_keys(text)
    filler_before, needles = 0, []
    for line in lines:
        m = NEEDLE_RE.match(line)
        if m and m.group(2) in asked:
            needles.append((filler_before, m.group(3)))
        elif not m:                                                    # distractors are not filler
            filler_before += len(line) + 1
    total, widest = filler_before, max(len(line) + 1 for line in lines)
    assert sorted(v for _, v in needles) == sorted(ex.answers)            # each answer needle exactly once
    for before, _ in needles:
        assert abs(before - depth * total) <= widest                     # within one filler line
    for answer in ex.answers:
        assert text.count(f" is: {answer}.") == 1


@pytest.mark.parametrize("kind", ["niah_multikey_1", "niah_multivalue", "niah_multikey_3", "vt"])
def test_needles_sit_at_the_requested_depth_bpe_tokens(kind, bpe):
    ex = make_example(kind, bpe, 2500, 0.6, seed=3)
    meta, ids = ex.meta, ex.prompt_ids
    needle_tokens = sum(n["tokens"] for n in meta["needles"])
    total = len(ids) - meta["head_tokens"] - meta["tail_tokens"] - needle_tokens
    assert total == meta["filler_tokens"]
    head = bpe.decode(ids[: meta["head_tokens"]])
    assert head.endswith(VT_HEAD if kind == "vt" else "afterwards.\n")
    unit = max(len(bpe.encode(line + "\n")) for line in bpe.decode(ids).split("\n"))
    for n in meta["needles"]:
        assert bpe.decode(ids[n["start"]: n["start"] + n["tokens"]]) == n["text"] + "\n"
        earlier = sum(o["tokens"] for o in meta["needles"] if o["start"] < n["start"])
        assert n["filler_before"] == n["start"] - meta["head_tokens"] - earlier
    firsts = [n for n in meta["needles"] if n["role"] == "target"] or [meta["needles"][0]]   # vt: the value
    for n in firsts:
        assert abs(n["filler_before"] - 0.6 * total) <= unit


def test_one_depth_per_answer_needle(byte):
    depths = [0.1, 0.4, 0.7, 0.95]
    ex = make_example("niah_multivalue", byte, 4000, depths, seed=2)
    got = sorted(n["depth"] for n in ex.meta["needles"] if n["role"] == "target")
    unit = len(NOISE) + 1
    corpus_line = max(len(line) + 1 for line in byte.decode(ex.prompt_ids).split("\n"))
    for want, have in zip(depths, got):
        assert abs(have - want) * ex.meta["filler_tokens"] <= max(unit, corpus_line)
    with pytest.raises(RulerError, match="4 needles"):
        make_example("niah_multivalue", byte, 4000, [0.5, 0.5], seed=2)


def _asked_keys(text: str) -> list[str]:
    query = re.search(r"for (.+) mentioned in the provided text\?", text).group(1)
    return re.split(r", and |, ", query)


@pytest.mark.parametrize("tok_name", ["byte", "bpe"])
@pytest.mark.parametrize("kind", NIAH_KINDS)
@pytest.mark.parametrize("depth", [None, 0.5])
def test_niah_answers_are_recoverable_by_a_regex(kind, depth, tok_name, byte, bpe):
    tok = tokenizers(byte, bpe)[tok_name]
    ex = make_example(kind, tok, 2200, depth, seed=5)
    text = tok.decode(ex.prompt_ids)
    needles = NEEDLE_RE.findall(text)
    values: dict[str, list[str]] = {}
    for _, key, value in needles:
        values.setdefault(key, []).append(value)
    asked = _asked_keys(text)
    params = ex.meta["params"]
    assert len(asked) == params["num_needle_q"]
    expected = [v for key in asked for v in values[key]]
    assert sorted(expected) == sorted(ex.answers)
    assert all(len(values[key]) == params["num_needle_v"] for key in asked)
    assert len(set(values)) == len(values)                                 # keys are distinct
    if params["type_haystack"] != "needle":
        assert len(values) == params["num_needle_k"]                      # the keys and nothing else
    value_re = {"numbers": r"\d{7}", "words": r"[^,]+-[^,]+", "uuids": r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}"}
    assert all(re.fullmatch(value_re[params["type_needle_v"]], a) for a in ex.answers)
    assert all(re.fullmatch(value_re[params["type_needle_k"]], k) for k in asked)
    assert score(kind, ex.answer_text, ex.answers) == 1.0


def _resolve(context: str) -> dict[str, str]:
    """Every variable's value, following each reference to an earlier assignment."""
    bound: dict[str, str] = {}
    for name, number, ref in VT_RE.findall(context):
        assert name not in bound
        bound[name] = number if number else bound[ref]       # a KeyError: used before it was assigned
    return bound


@pytest.mark.parametrize("tok_name", ["byte", "bpe"])
@pytest.mark.parametrize("params", [{}, {"num_chains": 3, "num_hops": 2}, {"num_hops": 7, "add_fewshot": False},
                                    {"type_haystack": "corpus", "num_chains": 2, "fewshot_length": 900}])
@pytest.mark.parametrize("depth", [None, 0.25])
def test_variable_tracking_chains_resolve_to_exactly_the_answers(params, depth, tok_name, byte, bpe):
    tok = tokenizers(byte, bpe)[tok_name]
    ex = make_example("vt", tok, 2600, depth, seed=9, **params)
    text = tok.decode(ex.prompt_ids)
    main = text[text.rindex(VT_HEAD):]                       # after the solved example, if any
    value = re.search(r"assigned the value (\d+) in the text above", main).group(1)
    num_v = int(re.search(r"above, (\d+) variables are assigned", main).group(1))
    bound = _resolve(main)
    found = [name for name, _, _ in VT_RE.findall(main) if bound[name] == value]   # in text order
    assert found == ex.answers and num_v == len(found) == ex.meta["params"]["num_hops"] + 1
    chains = ex.meta["params"]["num_chains"]
    assert len({v for v in bound.values()}) == chains and len(bound) == chains * num_v
    if ex.meta["params"]["add_fewshot"]:
        shot = text[: text.rindex(VT_HEAD)]
        shot_value = re.search(r"assigned the value (\d+) in the text above", shot).group(1)
        shot_bound = _resolve(shot)
        shot_names = [n for n, _, _ in VT_RE.findall(shot) if shot_bound[n] == shot_value]
        assert shot.endswith("they are:  " + " ".join(shot_names) + "\n\n")   # RULER's " " + outputs + "\n\n"
        assert all(len(n) == 3 for n in shot_names) and shot_value != value
    assert score("vt", ex.answer_text, ex.answers) == 1.0


def test_random_placement_follows_rulers_rules(byte):
    # corpus (RULER's essay rule): each needle after int(m * d / 100) filler lines for a d of the 40-point grid
    ex = make_example("niah_multikey_1", byte, 6000, None, seed=4)
    lines = _context_lines(byte.decode(ex.prompt_ids), NIAH_SINGULAR_HEAD, "\nWhat ")
    m = sum(1 for line in lines if not NEEDLE_RE.match(line))
    before, allowed = 0, {int(m * d / 100) for d in DEPTHS}
    for line in lines:
        if NEEDLE_RE.match(line):
            assert before in allowed
        else:
            before += 1
    # noise (RULER's noise rule): distinct slots, never after the last filler line
    for seed in range(5):
        ex = make_example("niah_multikey_1", byte, 3000, None, seed=seed, type_haystack="noise")
        lines = _context_lines(byte.decode(ex.prompt_ids), NIAH_SINGULAR_HEAD, "\nWhat ")
        kinds = ["n" if NEEDLE_RE.match(line) else "f" for line in lines]
        assert "nn" not in "".join(kinds) and kinds[-1] == "f"


def test_rulers_templates_word_for_word(byte):
    ex = make_example("niah_multivalue", byte, 1500, 0.5, seed=1, type_haystack="noise")
    text, key = byte.decode(ex.prompt_ids), ex.meta["queries"][0]
    assert text.startswith(NIAH_PLURAL_HEAD)
    assert text.endswith(f"\nWhat are all the special magic numbers for {key} mentioned in the provided text? "
                         f"The special magic numbers for {key} mentioned in the provided text are")
    assert f"\nOne of the special magic numbers for {key} is: {ex.answers[0]}.\n" in text
    assert NOISE + "\n" + NOISE + "\n" in text
    ex = make_example("niah_single_3", byte, 1500, 0.5, seed=1, type_haystack="noise")
    text, key = byte.decode(ex.prompt_ids), ex.meta["queries"][0]
    assert text.startswith(NIAH_SINGULAR_HEAD.replace("number", "uuid"))
    assert text.endswith(f"What is the special magic uuid for {key} mentioned in the provided text? "
                         f"The special magic uuid for {key} mentioned in the provided text is")
    assert f"\nOne of the special magic uuids for {key} is: {ex.answers[0]}.\n" in text
    ex = make_example("niah_multiquery", byte, 1500, 0.5, seed=1)
    keys = ex.meta["queries"]
    assert f"for {keys[0]}, {keys[1]}, {keys[2]}, and {keys[3]} mentioned" in byte.decode(ex.prompt_ids)
    ex = make_example("vt", byte, 1500, 0.5, seed=1, add_fewshot=False)
    value = ex.meta["query"]
    assert byte.decode(ex.prompt_ids).endswith(
        f"\nQuestion: Find all variables that are assigned the value {value} in the text above. Answer: According "
        f"to the chain(s) of variable assignment in the text above, 5 variables are assigned the value {value}, "
        f"they are: ")


def test_same_seed_same_example_and_train_eval_seeds_are_disjoint(byte):
    a = make_example("niah_multikey_2", byte, 1500, 0.5, seed=eval_seed(0, "niah_multikey_2", 1500, 2, 0))
    b = make_example("niah_multikey_2", byte, 1500, 0.5, seed=eval_seed(0, "niah_multikey_2", 1500, 2, 0))
    c = make_example("niah_multikey_2", byte, 1500, 0.5, seed=eval_seed(0, "niah_multikey_2", 1500, 2, 1))
    assert a.prompt_ids == b.prompt_ids and a.answers == b.answers and a.meta == b.meta
    assert c.prompt_ids != a.prompt_ids
    evals = {eval_seed(0, "niah_single_1", 512, d, t) for d in range(5) for t in range(20)}
    trains = {train_seed(0, i, r) for i in range(20) for r in range(5)}
    assert len(evals) == 100 and len(trains) == 100 and not evals & trains
    assert eval_seed(0, "niah_single_1", 512, 0, 0) != eval_seed(0, "niah_single_2", 512, 0, 0)
    # training rows read the corpus's training files, evaluation the held-out ones; their values differ
    eval_answers = {x for d in range(4) for t in range(5) for x in make_example(
        "niah_single_2", byte, 1200, None, eval_seed(0, "niah_single_2", 1200, d, t)).answers}
    train_ex = [make_example("niah_single_2", byte, 1200, None, train_seed(0, i, 0), split="train")
                for i in range(20)]
    assert not eval_answers & {x for ex in train_ex for x in ex.answers}
    assert {ex.meta["haystack"]["split"] for ex in train_ex} == {"train"}
    assert make_example("niah_single_2", byte, 1200, seed=1).meta["haystack"]["split"] == "validation"


def test_string_match_all_and_part_as_ruler_defines_them():
    refs = ["1234567", "Alpha-Beta", "9876543"]
    assert string_match_all("The numbers are 1234567 and alpha-beta.", refs) == pytest.approx(2 / 3)
    assert string_match_part("The numbers are 1234567 and alpha-beta.", refs) == 1.0
    assert string_match_all("nothing here", refs) == 0.0
    assert string_match_part("nothing here", refs) == 0.0
    assert string_match_all("  ALPHA-BETA 9876543 1234567  ", refs) == 1.0
    # postprocess_pred: control characters become newlines (a tab in the prediction matches a newline)
    assert postprocess("\t 12\t34 \x00") == "12\n34"
    assert string_match_all("12\t34", ["12\n34"]) == 1.0
    # a substring counts (RULER does no tokenisation): "123456" is found inside "1234567"
    assert string_match_all("1234567", ["123456"]) == 1.0
    # RULER's task score: mean x 100, rounded to 2 decimals
    preds, gold = ["a b", "c", "x"], [["a", "z"], ["c"], ["y"]]
    assert ruler_score("string_match_all", preds, gold) == 50.0          # (0.5 + 1 + 0) / 3
    assert ruler_score("string_match_part", preds, gold) == 66.67        # (1 + 1 + 0) / 3
    assert score("vt", "AB CD", ["AB", "CD", "EF"]) == pytest.approx(2 / 3)


def test_prediction_record_pairs_examples_by_key(byte):
    seed = eval_seed(0, "niah_multivalue", 1500, 1, 3)
    ex = make_example("niah_multivalue", byte, 1500, 0.25, seed)
    rec = prediction_record(ex, " " + ", ".join(ex.answers[:3]), trial=3)
    assert rec["key"] == "niah_multivalue|1500|0.25|3"
    assert rec["score"] == 0.75 and rec["correct"] is False and rec["metric"] == "string_match_all"
    assert rec["answers"] == ex.answers and len(rec["needle_depths"]) == 4
    again = prediction_record(make_example("niah_multivalue", byte, 1500, 0.25, seed), "", trial=3)
    assert again["key"] == rec["key"] and again["prompt_sha256"] == rec["prompt_sha256"]
    import json
    json.dumps(rec)


@pytest.mark.parametrize("kind", ["niah_multiquery", "vt"])
def test_training_rows_are_prompt_answer_eos_at_the_training_length(kind, byte):
    ids, loss_from = training_sequence(kind, byte, 1400, seed=train_seed(1, 0, 0))
    assert len(ids) == 1401 and ids[-1] == byte.eos_id
    answer = byte.decode(ids[loss_from:-1])
    prompt = byte.decode(ids[:loss_from])
    assert prompt.endswith(("text are", "they are: "))
    assert score(kind, answer, re.findall(r"[A-Z]{5}|\d{7}", answer)) == 1.0
    tokens, targets = training_batch(kind, byte, 1400, seed=1, batch_index=0, batch_size=2, loss="answer")
    assert tokens.shape == targets.shape == (2, 1400)
    assert tokens[0].tolist() == ids[:-1] and targets[0, loss_from - 1:].tolist() == ids[loss_from:]
    assert (targets[0, : loss_from - 1] == -100).all()
    _, all_targets = training_batch(kind, byte, 1400, seed=1, batch_index=0, batch_size=2)
    assert all_targets[0].tolist() == ids[1:]


def test_one_line_errors(byte):
    with pytest.raises(UserError, match="Valid: niah_multikey_1") as err:
        make_example("niah_mutlikey_1", byte, 1000)
    assert "\n" not in str(err.value) and "Did you mean 'niah_multikey_1'" in str(err.value)
    with pytest.raises(RulerError, match="unknown parameter.*num_needles"):
        make_example("niah_single_1", byte, 1000, num_needles=3)
    with pytest.raises(RulerError, match="essay"):
        make_example("niah_single_2", byte, 1000, type_haystack="essay")
    with pytest.raises(RulerError, match=r"needs at least \d+ tokens"):
        make_example("niah_multiquery", byte, 200)
    with pytest.raises(RulerError, match="fewshot_length"):
        make_example("vt", byte, 2000, fewshot_length=100)
    with pytest.raises(RulerError, match="depth"):
        make_example("niah_single_1", byte, 1000, depth=1.5)


def test_data_spec_records_the_sources(byte):
    spec = data_spec("niah_multikey_1")
    assert spec["params"]["num_needle_k"] == 4 and spec["metric"] == "string_match_all"
    assert spec["tokens_to_generate"] == 128 and len(spec["words"]["sha256"]) == 64
    assert spec["corpus"]["name"] == "stdlib"
    assert "words" not in data_spec("vt") and data_spec("vt")["tokens_to_generate"] == 30
    ex = make_example("niah_single_1", byte, 800, 0.5, seed=0)
    assert ex.meta["words"] == spec["words"]
