"""Issue 59, items 1 to 6: a setting that lands somewhere else, or changes on the way.

1. An encoding that runs on one pass of the blocks (TAPE) on a recurrent model is refused when the configuration is
   resolved (run, its dry run, a study's dry run, bench), before anything runs; bench says why a cell failed.
2. Whole numbers never pass through floats: recorded exactly, or refused beyond a 64-bit integer.
3. A flag reaches every chosen encoding that declares it, or is refused as ambiguous: choosing another encoding
   never moves where a flag lands.
4. Of two flags that set one setting, the one given last counts.
5. A plan of identical runs (a repeated encoding, variants that spell one setting several ways) or of a cell whose
   folder cannot be named is refused by the dry run.
6. ``check --set`` with a bad setting is one line, exit code 2, before any check runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_one_line_errors import cli, one_error_line


def dry(capsys, *argv) -> list[dict]:
    code, out, err = cli(capsys, "run", "-t", "arithmetic", "-p", "tiny", "--dry-run", *argv)
    assert code == 0, err
    return json.loads(out)


def refused(capsys, *argv) -> str:
    code, out, err = cli(capsys, *argv)
    assert code == 2, (out, err)
    return one_error_line(err)


def study(tmp_path: Path, text: str, name: str = "study.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---- 1. TAPE on recurrent blocks: refused when resolved ------------------------------------------------------

@pytest.mark.parametrize("setting", [["--recurrences", "2"], ["--eval-recurrences", "3"],
                                     ["--set", "model.recurrences=2"]])
def test_tape_on_recurrent_blocks_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch, setting):
    from posbench.runs import runner

    def ran(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(runner, "execute", ran)
    line = refused(capsys, "run", "-e", "rope,tape", "-t", "arithmetic", "-p", "tiny", "--out", tmp_path, *setting)
    assert "'tape' runs on one pass of the blocks" in line
    assert not any(tmp_path.iterdir())                              # RoPE neither trained nor wrote anything
    assert "one pass" in refused(capsys, "run", "-e", "tape", "-t", "arithmetic", "-p", "tiny", "--dry-run",
                                 *setting)


def test_a_study_dry_run_plans_no_tape_cell_on_recurrent_blocks(tmp_path, capsys):
    path = study(tmp_path, 'encodings = ["rope", "tape"]\ntasks = ["arithmetic"]\npresets = "tiny"\n'
                           'set = ["model.recurrences=2"]\n')
    line = refused(capsys, "sweep", path, "--dry-run", "--out", tmp_path / "out")
    assert "arithmetic-tape-tiny-s0" in line and "one pass" in line


def test_bench_refuses_tape_on_recurrent_blocks(capsys):
    line = refused(capsys, "bench", "--encodings", "rope,tape", "--recurrences", "2", "--dry-run")
    assert "one pass" in line and "--encodings rope" in line
    assert "one pass" in refused(capsys, "bench", "--recurrences", "2", "--dry-run")   # every encoding: TAPE too


def test_bench_says_why_a_cell_failed(tmp_path, capsys, monkeypatch):
    from posbench.bench import speed

    step = speed.train_step

    def failing(model, *args, **kwargs):
        if model.encoding.name == "alibi":
            raise RuntimeError("no kernel for this shape")
        return step(model, *args, **kwargs)

    monkeypatch.setattr(speed, "train_step", failing)
    code, out, err = cli(capsys, "bench", "-e", "alibi", "--lengths", "8", "--batch", "1", "--timed-steps", "1",
                         "--warmup", "0", "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--device", "cpu",
                         "--out", tmp_path, "-q")
    assert code == 0, err
    assert "alibi (1 x 8): error: no kernel for this shape" in " ".join(out.split())


# ---- 2. whole numbers, exactly --------------------------------------------------------------------------------

def test_whole_numbers_are_recorded_exactly(capsys):
    (config,) = dry(capsys, "-e", "rope", "--eval-seed", "9007199254740993", "--set", "train.log_every=1e3")
    assert config["task_options"]["eval_seed"] == 9007199254740993
    assert config["train"]["log_every"] == 1000                     # an integer in any spelling, still
    (config,) = dry(capsys, "-e", "rope", "--set", "task.eval_seed=9007199254740993.0")
    assert config["task_options"]["eval_seed"] == 9007199254740993


@pytest.mark.parametrize("argv", [["--steps", "99999999999999999999999"], ["--set", "train.steps=1e23"],
                                  ["--eval-seed", "9223372036854775808"], ["--steps", "9" * 5000]])
def test_whole_numbers_beyond_64_bits_are_refused(capsys, argv):
    line = refused(capsys, "run", "-e", "rope", "-t", "arithmetic", "-p", "tiny", "--dry-run", *argv)
    assert "64-bit integer" in line and len(line) < 300


def test_an_integer_option_never_reads_through_a_float():
    from posbench.options import Fractions, OptionError, at_least, coerce, parse

    assert coerce("x", "9007199254740993", 0) == 9007199254740993
    assert parse("f", "1,1.5,2.0,9007199254740993", [1], Fractions(at_least(1))) == [1, 1.5, 2, 9007199254740993]
    with pytest.raises(OptionError, match="2\\*\\*53"):
        coerce("x", 2.0 ** 60, 0)                                   # a float that large may not be what was written


# ---- 3. a flag lands where it says, whatever the encodings --------------------------------------------------

@pytest.mark.parametrize("argv", [["-e", "dape,fire", "--fire-init-l", "5"],
                                  ["-e", "abacus,fire", "--attention-bias", "fire", "--fire-init-l", "512"],
                                  ["-e", "dape,sandwich", "--base", "5"]])
def test_a_flag_that_would_mean_two_settings_is_refused(capsys, argv):
    line = refused(capsys, "run", "-t", "arithmetic", "-p", "tiny", "--dry-run", *argv)
    assert "ambiguous" in line and "--set encoding.KEY=VALUE" in line


def test_a_flag_reaches_every_chosen_encoding_that_declares_it(capsys):
    (dape,) = dry(capsys, "-e", "dape", "--fire-init-l", "5")
    assert dape["encoding_options"]["fire_init_l"] == 5
    dape, abacus = dry(capsys, "-e", "dape,abacus", "--attention-bias", "fire", "--fire-init-l", "5")
    assert dape["encoding_options"]["fire_init_l"] == abacus["encoding_options"]["fire_init_l"] == 5
    dape, fire = dry(capsys, "-e", "dape,fire", "--dape-fire-init-l", "5", "--init-l", "7")   # each its own
    assert (dape["encoding_options"]["fire_init_l"], fire["encoding_options"]["init_l"]) == (5, 7)


def test_an_encodings_named_flag_never_takes_a_settings_flag(capsys):
    from posbench.encodings import ENCODINGS
    from posbench.encodings.base import PositionalEncoding
    from posbench.options import Option

    class Max(PositionalEncoding):             # --max-seq-len: this encoding's seq_len, and model.max_seq_len
        name = "max"
        OPTIONS = {"seq_len": Option(4, "a length")}

    try:
        (rope,) = dry(capsys, "-e", "rope", "--max-seq-len", "64")
        assert rope["model"]["max_seq_len"] == 64
        line = refused(capsys, "run", "-t", "arithmetic", "-p", "tiny", "--dry-run", "-e", "max", "--max-seq-len",
                       "64")
        assert "ambiguous" in line and "--set model.max_seq_len=VALUE" in line
    finally:
        ENCODINGS.remove("max")
    assert Max.name == "max"


# ---- 4. the last value given ----------------------------------------------------------------------------------

def test_of_two_flags_of_one_setting_the_last_counts(capsys):
    (rope,) = dry(capsys, "-e", "rope", "--theta", "1", "--rope-theta", "2", "--theta", "3")
    assert rope["encoding_options"]["theta"] == 3
    (rope,) = dry(capsys, "-e", "rope", "--rope-theta", "2", "--theta", "3", "--rope-theta", "4")
    assert rope["encoding_options"]["theta"] == 4
    rope, xpos = dry(capsys, "-e", "rope,xpos", "--xpos-theta", "5", "--rope-theta", "2", "--theta", "3")
    assert rope["encoding_options"]["theta"] == xpos["encoding_options"]["theta"] == 3
    (rope,) = dry(capsys, "-e", "rope", "--no-rope-random-offset", "--random-offset")
    assert rope["encoding_options"]["random_offset"] is True
    (rope,) = dry(capsys, "-e", "rope", "--random-offset", "--no-rope-random-offset", "--lr", "1", "--random-offset",
                  "--no-rope-random-offset")
    assert rope["encoding_options"]["random_offset"] is False


# ---- 5. plans of identical runs, or of folders that cannot be named -----------------------------------------

def test_a_repeated_encoding_is_refused(capsys):
    assert "repeated (t5)" in refused(capsys, "run", "-e", "t5,t5", "-t", "arithmetic", "-p", "tiny", "--dry-run")
    assert "alibi given twice" in refused(capsys, "bench", "-e", "alibi,alibi", "--dry-run")


def test_variants_that_spell_one_setting_several_ways_are_refused(tmp_path, capsys):
    path = study(tmp_path, 'encodings = ["rope"]\ntasks = ["arithmetic"]\npresets = "tiny"\n[variants]\n'
                           'a = ["lr=1e-3"]\nb = ["train.lr=1e-3"]\nc = ["train.lr=0.001"]\n')
    line = refused(capsys, "sweep", path, "--dry-run", "--out", tmp_path / "out")
    assert "arithmetic-rope-tiny-a-s0 and arithmetic-rope-tiny-b-s0" in line and "one configuration" in line
    path = study(tmp_path, 'encodings = ["rope"]\ntasks = ["arithmetic"]\npresets = "tiny"\n[variants]\n'
                           'a = ["lr=1e-3"]\nb = ["train.lr=2e-3"]\n')
    code, out, err = cli(capsys, "sweep", path, "--dry-run", "--out", tmp_path / "out")
    assert code == 0, err                                            # two settings: two cells


def test_a_cell_whose_folder_cannot_be_named_is_refused_by_the_dry_run(tmp_path, capsys):
    path = study(tmp_path, 'encodings = ["rope"]\ntasks = ["arithmetic"]\npresets = "tiny"\n[variants]\n'
                           f'{"v" * 300} = ["lr=1e-3"]\n')
    line = refused(capsys, "sweep", path, "--dry-run", "--out", tmp_path / "out")
    assert "255" in line and "shorten variant" in line
    path = study(tmp_path, f'name = "{"n" * 300}"\nencodings = ["rope"]\ntasks = ["arithmetic"]\n')
    assert "255" in refused(capsys, "sweep", path, "--dry-run", "--out", tmp_path / "out")


# ---- 6. check --set: the user's mistake, before any check -------------------------------------------------

@pytest.mark.parametrize("argv, words", [
    (["t5", "--set", "encoding.table_init=bogus"], "table_init='bogus' is out of range"),
    (["arithmetic", "--set", "task.train_digits=-1"], "task.train_digits=-1 is out of range"),
    (["t5", "-t", "perplexity", "-p", "bogus"], "no preset 'bogus'"),
    (["rope", "--set", "model.n_heads=3"], "heads"),
    (["scrolls", "--set", "task.max_eval_examples=-1"], "max_eval_examples=-1 is out of range"),
])
def test_a_bad_check_setting_is_one_line_before_any_check(capsys, argv, words):
    code, out, err = cli(capsys, "check", *argv)
    assert code == 2 and words in one_error_line(err) and out == ""
