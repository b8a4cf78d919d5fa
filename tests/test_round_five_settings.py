"""Settings that landed elsewhere than they said, found by a hostile user's run after round four:

- an integer written with a fraction too small for a float (``--steps 3.0000000000000000001``, ``1e-400``) was
  rounded through a float to an integer; it is refused as any other fraction is;
- an empty preset (``-p ""``) silently became the task's default;
- a flag or ``--set`` giving a setting that the task sets from another (passkey's ``model.max_seq_len`` from
  ``task.train_length``) was overwritten without a word; it is refused, naming the setting to give instead;
- ``--init RUN`` with a model setting of another architecture ended in a traceback (``--d-model``: other shapes) or
  loaded the weights into another model in silence (``--n-heads``); with a pretrained model's ``--init`` such a
  setting was recorded and not used;
- a plugin's number setting declared without a limit took ``nan`` and ``inf``; ``--steps ٣`` was 3.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_helpers import cli, one_error_line
from posbench.cli import main
from posbench.errors import ConfigError
from posbench.options import Option, OptionError, integer, resolve, whole_or_fraction
from posbench.runs.config import section_options
from posbench.tasks import TASKS
from posbench.tasks.build_model import fitted


@pytest.mark.parametrize("text", ["3.0000000000000000001", "0.99999999999999999999", "1e-400", "-1e-30", "2.5"])
def test_an_integer_with_any_fraction_is_refused_however_small(text):
    with pytest.raises(OptionError, match="expected an integer"):
        integer("train.steps", text)


@pytest.mark.parametrize("text, value", [("3.0", 3), ("1e3", 1000), ("30e-1", 3), ("9007199254740993",
                                                                                      9007199254740993)])
def test_whole_numbers_in_any_spelling_are_still_integers(text, value):
    assert integer("train.steps", text) == value and type(integer("train.steps", text)) is int
    assert whole_or_fraction("x", text) == value


@pytest.mark.parametrize("text", ["٣", "３", "1٫5", "²"])
def test_digits_of_other_scripts_are_not_numbers(text):
    with pytest.raises(OptionError, match="expected"):
        integer("train.steps", text)
    with pytest.raises(OptionError, match="expected a number"):
        resolve("train", {"lr": Option(0.5, "a rate")}, {"lr": text})


def test_a_number_setting_keeps_its_fractions():
    assert whole_or_fraction("x", "1.5") == 1.5 and whole_or_fraction("x", "1e-400") == 0.0


def test_the_command_line_refuses_a_tiny_fraction_of_an_integer(capsys):
    code, out, err = cli(capsys, "run", "-t", "arithmetic", "-e", "rope", "-p", "tiny", "--dry-run",
                         "--steps", "3.0000000000000000001")
    assert code == 2 and not out and "expected an integer" in one_error_line(err)


def test_an_empty_preset_is_refused_not_read_as_the_default(capsys):
    code, out, err = cli(capsys, "run", "-t", "arithmetic", "-e", "rope", "-p", "", "--dry-run")
    assert code == 2 and not out and "has no preset ''" in one_error_line(err)


@pytest.mark.parametrize("given", [["--max-seq-len", "100"], ["--set", "model.max_seq_len=100"],
                                   ["--set", "max_seq_len=100"]])
def test_a_setting_the_task_sets_from_another_is_refused_naming_it(capsys, given):
    code, out, err = cli(capsys, "run", "-t", "passkey", "-e", "rope", "-p", "tiny", "--dry-run", *given)
    line = one_error_line(err)
    assert code == 2 and not out
    assert "model.max_seq_len=100" in line and "sets it from task.train_length" in line and "(to 288 here)" in line


def test_the_value_the_task_would_set_anyway_is_taken(capsys):
    code, out, err = cli(capsys, "run", "-t", "passkey", "-e", "rope", "-p", "tiny", "--dry-run",
                         "--max-seq-len", "288")
    assert code == 0, err
    assert '"max_seq_len": 288' in out


def test_each_tasks_follows_names_settings_it_declares():
    for name in TASKS:
        task = TASKS[name]
        options = section_options(task)
        for derived, source in task.follows.items():
            for setting in (derived, source):
                section, key = setting.split(".")
                assert key in options[section], f"task {name}: {setting}"
    assert TASKS["passkey"].follows == {"model.max_seq_len": "task.train_length"}


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("init")
    assert main(["run", "-t", "arithmetic", "-e", "rope", "-p", "tiny", "--steps", "2", "--set", "task.eval_samples=2",
                 "--set", "train.threads=1", "--out", str(out), "-q"]) == 0
    (run,) = Path(out, "arithmetic", "rope").iterdir()
    return run


@pytest.mark.parametrize("given, words", [
    (["--d-model", "64"], "model.d_model=64 (its 32)"),                    # weights of other shapes: a traceback
    (["--n-heads", "4"], "model.n_heads=4 (its 2)"),                       # the same shapes: loaded in silence
    (["--set", "model.mlp=gelu", "--n-heads", "2"], "model.mlp='gelu' (its 'swiglu')"),
])
def test_an_init_runs_architecture_is_its_own(capsys, tmp_path, rope_run, given, words):
    for last in (["--dry-run"], ["--out", str(tmp_path), "-q"]):
        code, out, err = cli(capsys, "run", "-t", "arithmetic", "--init", rope_run, "-p", "tiny", "--steps", "1",
                             *given, *last)
        line = one_error_line(err)
        assert code == 2 and f"--init {rope_run} is a posbench model of its own architecture: {words}" in line
        assert "would be recorded and not built" in line and "n_heads=2" not in line    # its own value is taken


def test_an_init_run_takes_what_it_reads_from_the_flags(capsys, rope_run):
    code, out, err = cli(capsys, "run", "-t", "arithmetic", "--init", rope_run, "-p", "tiny", "--dry-run",
                         "--max-seq-len", "64", "--eval-recurrences", "1", "--attention", "sdpa", "--d-model", "32")
    assert code == 0, err
    assert '"max_seq_len": 64' in out and '"attention": "sdpa"' in out


def test_weights_that_do_not_fit_the_built_model_are_one_line():
    """The last guard (an encoding option that sizes a table, given against the init model's): one line naming the
    settings that differ from the init model's, not torch's traceback."""
    class Source:
        given, model = "runs/x", {"d_model": 32, "n_heads": 2}

    def load():
        raise RuntimeError("Error(s) in loading state_dict for Transformer:\n\tsize mismatch for table.weight")

    with pytest.raises(ConfigError, match=r"^--init runs/x: its weights do not fit the model these settings build "
                                          r"\(model.n_heads=4 \(its 2\)\); leave the model's shape to it$"):
        fitted(load, Source(), {"d_model": 32, "n_heads": 4})


@pytest.mark.parametrize("command", [["run", "-t", "perplexity", "--init"], ["extend", "--length", "128", "--data",
                                                                            "stdlib", "--method", "ntk", "--model"]])
def test_a_pretrained_models_architecture_is_not_set_by_flags_it_ignores(capsys, tmp_path, command):
    from posbench.hf.tiny import save_tiny_llama        # transformers: this test alone needs it

    llama = save_tiny_llama(tmp_path / "llama")
    capsys.readouterr()                                 # (transformers' progress bar)
    code, out, err = cli(capsys, *command, llama, "-p", "tiny", "--dry-run", "--d-model", "64", "--set",
                         "model.n_layers=7")
    line = one_error_line(err)
    assert code == 2 and not out
    assert f"{command[-1]} {llama} is a pretrained llama model" in line and "model.d_model=64, model.n_layers=7 would be" in line
    code, out, err = cli(capsys, *command, llama, "-p", "tiny", "--dry-run", "--attention", "sdpa")
    assert code == 0, err                               # what it reads: its attention backend
    assert '"attention": "sdpa"' in out


@pytest.mark.parametrize("text", ["nan", "inf", "-inf"])
def test_a_number_setting_without_a_limit_is_still_finite(text):
    options = {"width": Option(1.5, "a plugin's width, declared without a limit")}
    assert resolve("encoding 'plugin'", options, {"width": "2.5"}) == {"width": 2.5}
    with pytest.raises(OptionError, match="width=.* is out of range: it must be finite"):
        resolve("encoding 'plugin'", options, {"width": text})
