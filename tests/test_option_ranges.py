"""Every encoding option states its valid range; a value outside it is refused as bad input (one line, exit
code 2, nothing written) instead of training into a NaN."""

from __future__ import annotations

import pytest

from posbench.cli import main
from posbench.encodings import ENCODINGS
from posbench.encodings.options import Bound, Each, OneOf

BUILTIN = ["abacus", "alibi", "cope", "dape", "fire", "kerple", "nope", "randpe", "rope", "sandwich", "t5", "tape", "xpos"]


@pytest.mark.parametrize("name", BUILTIN)
def test_every_non_boolean_option_has_a_range(name):
    cls = ENCODINGS[name]
    for key, default in cls.defaults.items():
        if isinstance(default, bool):
            continue
        assert key in cls.limits, f"{name}.{key} states no valid range"
        limit = cls.limits[key]
        assert isinstance(limit, (Bound, OneOf, Each))
        assert limit.admits(default), f"{name}.{key}'s default {default!r} is outside {limit.describe()}"
    assert set(cls.limits) <= set(cls.defaults)


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
