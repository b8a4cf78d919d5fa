"""Effective length (``posbench.report.effective_length``) against values worked out by hand: the longest length up
to which the metric *stays* within its tolerance of the trained-length value (a length that holds after one that
failed does not count), in multiples of the training length; for perplexity, passkey's length x depth grid,
arithmetic's operand lengths and RULER's absolute threshold; shown by compare with its seed interval, paired
under --against, and changed by --eff."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from posbench import report
from posbench.cli import main
from posbench.cli.app import app
from posbench.report.effective_length import LengthCurve, Tolerance, effective
from tests.report.test_compare import make_run


def ppl_grid(values, lengths=(64, 128, 256, 512), train=64):
    return {"ppl_chunks": {"metric": "perplexity", "higher_is_better": False,
                           "axes": [{"name": "length", "values": list(lengths)}], "values": list(values),
                           "meta": {"train_max": {"length": train}, "protocol": "chunks"}}}


@pytest.mark.parametrize("values, eps, want", [
    ([10, 10.5, 12, 10.9], 0.1, 2.0),      # 4x fails (12 > 11): 8x holding again does not count
    ([10, 10.5, 10.9, 11.0], 0.1, 8.0),    # every length holds: the longest evaluated
    ([10, 11.5, 10, 10], 0.1, 1.0),        # the first length beyond training fails
    ([10, 11.5, 12.5, 30], 0.3, 4.0),      # a wider tolerance
])
def test_perplexity(values, eps, want):
    curve = LengthCurve([64, 128, 256, 512], values, 64, False, values[0])
    assert effective(curve, Tolerance(eps=eps)) == want


def test_accuracy_relative_and_absolute():
    # in distribution: lengths 128 and 256 (train 256), mean 95
    curve = LengthCurve([128, 256, 512, 1024], [100, 90, 86, 40], 256, True, 95.0)
    assert effective(curve, Tolerance(tau=0.9)) == 2.0                 # 86 >= 85.5, 40 < 85.5
    assert effective(curve, Tolerance(tau=0.95)) == 1.0                # 86 < 90.25
    assert effective(curve, Tolerance(absolute=85.6), absolute=True) == 2.0
    assert effective(curve, Tolerance(absolute=95), absolute=True) == 0.5   # 90 at 256 is below: up to 128
    weak = LengthCurve([256, 512], [50, 50], 256, True, 50.0)
    assert effective(weak, Tolerance(), absolute=True) == 0.0           # never at RULER's bar


def test_an_accuracy_of_zero_in_distribution_has_no_relative_effective_length():
    """Every length holds against 0 (0 >= 0.9 x 0): a run that fails everywhere would rank longest."""
    failed = LengthCurve([256, 512, 1024], [0.0, 0.0, 0.0], 256, True, 0.0)
    assert effective(failed, Tolerance()) is None
    assert effective(failed, Tolerance(), absolute=True) == 0.0        # the absolute bar still judges it
    barely = LengthCurve([256, 512, 1024], [2.0, 0.0, 0.0], 256, True, 2.0)
    assert effective(barely, Tolerance()) == 1.0


def test_compare_adds_the_columns_from_each_task(tmp_path):
    for seed, values in enumerate(([10, 10.5, 12, 10.9], [10, 10.2, 10.8, 10.9], [10, 11.5, 12, 13])):
        make_run(tmp_path, "perplexity", "rope", seed, {"ppl_8x": values[-1]}, grids=ppl_grid(values))
    passkey = {"accuracy": {"metric": "accuracy", "higher_is_better": True,
                            "axes": [{"name": "length", "values": [128, 256, 512]},
                                     {"name": "depth", "values": [0.0, 1.0]}],
                            "values": [[100, 100], [90, 100], [80, 90]],
                            "meta": {"train_max": {"length": 256, "depth": 1.0}, "unit": "%"}}}
    make_run(tmp_path, "passkey", "rope", 0, {"accuracy": 90.0}, grids=passkey)
    arithmetic = {"accuracy": {"metric": "accuracy", "higher_is_better": True,
                               "axes": [{"name": "len_a", "values": [1, 2, 3, 4]},
                                        {"name": "len_b", "values": [1, 2, 3, 4]}],
                               "values": [[100, 100, 95, 10], [100, 100, 95, 10], [95, 95, 95, 10],
                                          [10, 10, 10, 10]],
                               "meta": {"train_max": {"len_a": 2, "len_b": 2}, "unit": "%"}}}
    make_run(tmp_path, "arithmetic", "rope", 0, {"accuracy": 50.0}, grids=arithmetic)
    tables = {t.task: t for t in report.collect(tmp_path).tables if t.kind == "metrics"}
    cell = tables["perplexity"].rows[0].cells["eff_len"]
    assert cell.values == [2.0, 8.0, 1.0] and cell.seeds == 3
    assert cell.value == pytest.approx(11 / 3)
    assert any(note.startswith("eff_len:") and "lower bound" in note for note in tables["perplexity"].notes)
    # passkey: in distribution (100 + 100 + 90 + 100) / 4 = 97.5; 512: 85 < 0.9 x 97.5 = 87.75
    assert tables["passkey"].rows[0].cells["eff_len"].value == 1.0
    assert tables["passkey"].rows[0].cells["eff_len_abs"].value == 1.0      # 85 < 85.6 at 512
    # arithmetic: in distribution 100; longer length 3: 95 (>= 90); 4: 10
    assert tables["arithmetic"].rows[0].cells["eff_len"].value == 1.5
    wide = {t.task: t for t in report.collect(tmp_path, tolerance=Tolerance(eps=0.35)).tables
            if t.kind == "metrics"}
    assert wide["perplexity"].rows[0].cells["eff_len"].values == [8.0, 8.0, 8.0]


def test_against_pairs_the_effective_lengths_and_the_flags_change_them(tmp_path, capsys):
    for seed in range(3):
        make_run(tmp_path, "perplexity", "rope", seed, {"ppl_8x": 30.0}, grids=ppl_grid([10, 12, 20, 30]))
        make_run(tmp_path, "perplexity", "alibi", seed, {"ppl_8x": 10.0}, grids=ppl_grid([10, 10, 10, 10]))
    table = next(t for t in report.collect(tmp_path, against="rope").tables if t.kind == "metrics")
    (diff,) = [d for d in table.differences if d.metric == "eff_len"]
    assert diff.label == "alibi" and diff.difference.estimate == pytest.approx(7.0)
    runner = CliRunner()
    narrow = runner.invoke(app, ["compare", str(tmp_path), "--format", "json"])
    wide = runner.invoke(app, ["compare", str(tmp_path), "--format", "json", "--eff", "eps=0.25"])
    assert narrow.exit_code == 0 and wide.exit_code == 0, narrow.output + wide.output
    assert '"eff_len"' in narrow.stdout and json.loads(narrow.stdout) != json.loads(wide.stdout)
    for bad in ("tau=2", "eps=x", "gamma=1", "eps"):
        assert main(["compare", str(tmp_path), "--eff", bad]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and "--eff" in lines[0]
