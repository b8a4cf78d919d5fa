"""Every option states its valid range; a value outside it is refused as bad input (one line, exit code 2,
nothing written) instead of training into a NaN, and the same check runs from Python (``ModelConfig(...)``,
``TrainConfig(...)``) as from the command line (``--set``)."""

from __future__ import annotations

import pytest

from posbench.checks.encoding import build
from posbench.checks.options import declared_well, refused
from posbench.cli import main
from posbench.encodings import ENCODINGS
from posbench.hf.methods import METHODS
from posbench.model import ModelConfig
from posbench.options import Bound, OneOf, OptionError
from posbench.tasks import TASKS
from posbench.train.config import TrainConfig
from posbench.tasks.presets import presets_of


@pytest.mark.parametrize("name", sorted(ENCODINGS))
def test_every_encoding_option_is_declared_with_a_range_and_refused_outside_it(name):
    """The contract kit's options checks (``posbench check``), on every registered encoding."""
    context = {"digit_ids": list(range(4, 14))} if "digit_ids" in ENCODINGS[name].task_context else {}
    declared_well(ENCODINGS[name])
    refused(ENCODINGS[name], lambda options: build(name, {**context, **options}, 50, "eager"))


@pytest.mark.parametrize("name", sorted(n for n in TASKS if n != "extend"))      # extend needs a pretrained --init
def test_every_task_option_is_declared_with_a_range_and_refused_outside_it(name):
    from posbench.checks.task import configure

    preset = "tiny" if "tiny" in presets_of(TASKS[name]) else None
    declared_well(TASKS[name])
    refused(TASKS[name], lambda options: configure(name, "rope", preset, (), options))


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_option_is_declared_with_a_range_and_refused_outside_it(name):
    declared_well(METHODS[name])
    refused(METHODS[name], lambda options: METHODS[name](**options))


@pytest.mark.parametrize("owner", [ModelConfig, TrainConfig])
def test_the_model_and_training_options_are_declared_and_refused_alike(owner):
    declared_well(owner)
    refused(owner, lambda options: owner(**options), unknown=False)      # an unknown keyword: Python's TypeError


def test_a_model_config_built_in_python_is_checked_as_the_command_line_checks_it(tmp_path, capsys):
    with pytest.raises(OptionError) as info:
        ModelConfig(n_layers=-1, attention="nonsense")
    assert str(info.value) == "model.n_layers=-1 is out of range: it must be >= 1"
    with pytest.raises(OptionError) as info:
        ModelConfig(attention="nonsense")
    message = "model.attention='nonsense' is out of range: it must be one of auto, eager, flash_attn, flex, sdpa, " \
              "sdpa_split"
    assert str(info.value) == message
    assert ModelConfig(n_layers="3").n_layers == 3                              # text is coerced, as from --set
    code = main(["run", "-e", "rope", "-t", "arithmetic", "-p", "tiny", "--set", "model.attention=nonsense",
                 "--out", str(tmp_path / "results"), "--quiet"])
    assert code == 2 and capsys.readouterr().err.strip() == f"error: {message}"


def test_old_style_declarations_are_refused_with_the_way_to_declare():
    from posbench.encodings import PositionalEncoding

    with pytest.raises(TypeError, match=r"declares its options in defaults, limits; declare each once in OPTIONS"):
        class Old(PositionalEncoding):
            name = "test-old-style"
            defaults = {"theta": 1.0}
            limits = {"theta": Bound(low=0)}
    assert "test-old-style" not in ENCODINGS


def test_bounds_by_hand():
    positive = Bound(low=0, low_strict=True)
    assert positive.describe() == "> 0"
    assert [positive.admits(x) for x in (-1, 0, 1e-9, 5)] == [False, False, True, True]
    assert not positive.admits(float("inf")) and not positive.admits(float("nan"))
    closed = Bound(low=1, high=3)
    assert closed.describe() == ">= 1 and <= 3"
    assert [closed.admits(x) for x in (0.5, 1, 3, 3.5)] == [False, True, True, False]
    assert OneOf(("a", "b")).describe() == "one of a, b" and not OneOf(("a", "b")).admits("c")


@pytest.mark.parametrize("encoding, setting, message", [
    ("rope", "encoding.theta=-3", "encoding 'rope' option theta=-3.0 is out of range: it must be > 0"),
    ("tape", "encoding.scale=0", "encoding 'tape' option scale=0.0 is out of range: it must be > 0"),
    ("fire", "encoding.hidden=0", "encoding 'fire' option hidden=0 is out of range: it must be >= 1"),
    ("xpos", "encoding.scale_base=-1", "encoding 'xpos' option scale_base=-1.0 is out of range: it must be > 0"),
    ("cope", "encoding.npos_max=-1", "encoding 'cope' option npos_max=-1 is out of range: it must be >= 0"),
    ("cope", "encoding.npos_max=1", "encoding 'cope' option npos_max=1 is out of range: it must be 0 "
                                    "(max_seq_len + 1) or at least 2"),
    ("dape", "encoding.hidden=0", "encoding 'dape' option hidden=0 is out of range: it must be >= 1"),
    ("dape", "encoding.base=t5", "encoding 'dape' option base='t5' is out of range: it must be one of alibi, fire, kerple"),
    ("kerple", "encoding.eps=0", "encoding 'kerple' option eps=0.0 is out of range: it must be > 0"),
    ("kerple", "encoding.variant=cubic",
     "encoding 'kerple' option variant='cubic' is out of range: it must be one of log, power"),
    ("sandwich", "encoding.d_bar=-2", "encoding 'sandwich' option d_bar=-2 is out of range: it must be >= 0"),
])
def test_the_cli_refuses_an_out_of_range_option_before_writing_anything(encoding, setting, message, tmp_path,
                                                                         capsys):
    code = main(["run", "-e", encoding, "-t", "arithmetic", "--preset", "tiny", "--set", setting,
                 "--out", str(tmp_path / "results"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == f"error: {message}"
    assert not (tmp_path / "results").exists()


def test_a_constraint_between_options_is_refused_before_writing_anything(tmp_path, capsys):
    """T5's max_distance must exceed num_buckets / 2 (where its log buckets start): a constraint between two
    options, checked with the ranges, so no run directory is created."""
    code = main(["run", "-e", "t5", "-t", "arithmetic", "--preset", "tiny", "--set", "encoding.max_distance=16",
                 "--out", str(tmp_path / "results"), "--quiet"])
    assert code == 2
    assert "max_distance=16 is out of range: it must be > num_buckets / 2 (32)" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()
