"""Settings have one vocabulary (issue 58, item 1): the sections and where a run's record holds each are defined
once, in ``posbench.options``, and every reader agrees with them; a value given on the command line reaches the
run in one typed form."""

from __future__ import annotations

import dataclasses

import pytest

from posbench.cells import PREFIXES, flat
from posbench.errors import ConfigError
from posbench import setting_facts
from posbench.options import RECORDED_SECTIONS, SECTIONS, Setting, declared, typed
from posbench.runs import run_config
from posbench.runs.config import RunConfig, resolve_run_config
from posbench.tasks.presets import PRESET_SECTIONS
from posbench.train.config import TrainConfig


def test_every_section_is_held_by_a_field_of_the_record_and_read_alike():
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    assert set(RECORDED_SECTIONS) == set(SECTIONS) and set(RECORDED_SECTIONS.values()) <= fields
    assert {section: PREFIXES[field] for section, field in RECORDED_SECTIONS.items()} == {s: s for s in SECTIONS}
    assert set(PRESET_SECTIONS) == {*SECTIONS, "expected"}
    config = resolve_run_config("arithmetic", "rope", "tiny", sets=["train.lr=0.5", "encoding.theta=7"])
    for section, field in RECORDED_SECTIONS.items():
        assert config.section(section) is getattr(config, field)


def test_a_flag_and_set_give_one_typed_value_that_reaches_the_training():
    config = resolve_run_config("arithmetic", "rope", "tiny", settings=[Setting("train", "steps", 7)],
                                sets=["train.lr=0.5"])
    assert isinstance(config.training, TrainConfig) and config.training is config.training    # built once
    assert (config.training.steps, config.training.lr) == (config.train["steps"], config.train["lr"]) == (7, 0.5)
    assert config.training.to_dict() == config.train == RunConfig.from_dict(config.to_dict()).training.to_dict()
    assert flat(type("Run", (), {"config": config, "model_config": None})())["train.steps"] == 7


def test_the_settings_of_one_named_encoding_reach_that_encodings_run_only():
    given = [Setting("encoding", "theta", 9.0), Setting("encoding:xpos", "theta", 3.0)]
    rope = resolve_run_config("arithmetic", "rope", "tiny", settings=given)
    xpos = resolve_run_config("arithmetic", "xpos", "tiny", settings=given)
    alibi = resolve_run_config("arithmetic", "alibi", "tiny", settings=given)     # ALiBi declares no theta
    assert (rope.encoding_options["theta"], xpos.encoding_options["theta"]) == (9.0, 3.0)
    assert "theta" not in alibi.encoding_options


def test_the_earlier_values_have_one_reader():
    assert run_config.setting_facts is setting_facts     # what a --resume fills in: setting_facts.earlier_values
    earlier = setting_facts.earlier_values("t5", "arithmetic")
    assert earlier["train"] == {k: o.added.before for k, o in declared(TrainConfig).items() if o.added}
    assert earlier["encoding"] == {"table_init": "x-transformers"}
    assert typed("x.new", "3", 4) == 3 and typed("x.flag", "yes", False) is True


def test_an_encoding_setting_no_encoding_declares_is_refused_not_dropped():
    """``-e rope,alibi --theta 500`` sets RoPE's theta and leaves ALiBi's run alone; a key that no encoding declares
    (a typo from Python: the command line has no such flag) is refused in one line, not silently left out."""
    theta = Setting("encoding", "theta", 500.0)
    assert resolve_run_config("arithmetic", "rope", "tiny", settings=[theta]).encoding_options["theta"] == 500.0
    assert "theta" not in resolve_run_config("arithmetic", "alibi", "tiny", settings=[theta]).encoding_options
    with pytest.raises(ConfigError, match="encoding.thetaa: unknown setting"):
        resolve_run_config("arithmetic", "rope", "tiny", settings=[Setting("encoding", "thetaa", 1.0)])
