"""The rule a study states per cell: had the training loss stopped improving? (``posbench.report.plateau``)

Histories are made here with known window means, so each verdict is derived by hand: 100 logged steps give two
windows of 10 points; the rule is "the last window's mean is less than max(1% of the earlier mean, 0.01) below it".
"""

from __future__ import annotations

import pytest

from posbench.report.plateau import plateau, plateau_table


def history(earlier: float, last: float, n: int = 100) -> list[list[float]]:
    """n logged steps: 1.0 + noise-free filler, then 10 points at ``earlier`` and 10 at ``last``."""
    values = [5.0] * (n - 20) + [earlier] * 10 + [last] * 10
    return [[10 * (i + 1), v] for i, v in enumerate(values)]


@pytest.mark.parametrize("earlier, last, stopped", [
    (2.000, 1.990, True),       # drop 0.010 < 1% of 2.0 = 0.020
    (2.000, 1.970, False),      # drop 0.030 >= 0.020: still learning
    (0.500, 0.496, True),       # drop 0.004 < max(0.005, 0.01)
    (0.500, 0.480, False),      # drop 0.020 >= 0.01
    (0.002, 0.001, True),       # a copied key: the loss near zero, drop 0.001 < 0.01
    (1.000, 1.050, True),       # rising: not improving
])
def test_the_rule(earlier, last, stopped):
    found = plateau(history(earlier, last))
    assert found.steps == 1000 and found.earlier == pytest.approx(earlier) and found.last == pytest.approx(last)
    assert found.stopped is stopped
    assert found.drop == pytest.approx(earlier - last)


def test_windows_are_a_tenth_of_the_logged_steps_and_too_short_a_history_has_no_verdict():
    values = [3.0] * 180 + [2.0] * 20 + [1.0] * 20     # 220 points: windows of 22, the last straddles
    found = plateau([[i, v] for i, v in enumerate(values)])
    assert found.last == pytest.approx(1.0 * 20 / 22 + 2.0 * 2 / 22)
    assert found.earlier == pytest.approx(2.0 * 18 / 22 + 3.0 * 4 / 22)
    assert plateau([[i, 1.0] for i in range(19)]) is None


def test_the_table_marks_a_cell_still_learning():
    table = plateau_table({"a": {"training": {"loss_history": history(2.0, 1.99)}},
                           "b": {"training": {"loss_history": history(2.0, 1.5)}},
                           "c": {"training": {}}})
    lines = table.splitlines()
    assert lines[2] == "| a | 1000 | 2.0000 | 1.9900 | +0.0100 | yes |"
    assert lines[3] == "| b | 1000 | 2.0000 | 1.5000 | +0.5000 | **no** |"
    assert lines[4] == "| c | - | - | - | - | too few logged steps |"


def test_a_diverged_run_has_no_verdict_on_learning():
    found = plateau(history(2.0, float("nan")))
    assert found.diverged and not found.stopped
    assert "diverged (a non-finite loss)" in plateau_table({"a": {"training": {"loss_history": history(2.0, float("inf"))}}})
