"""compare's accuracy by the longer operand's length (``posbench.report.by_length``), against values worked out by
hand on small grids: a 4 x 4 grid of operand lengths trained up to 2 has the in-distribution cells (1,1), (1,2),
(2,1), (2,2), then the cells of longer length 3 ((1,3), (2,3), (3,3), (3,1), (3,2)) and of longer length 4."""

from __future__ import annotations

import pytest

from posbench import report
from tests.report.test_compare import make_run

LENGTHS = [1, 2, 3, 4]


def grid(values, train=2, axes=("len_a", "len_b")):
    return {"accuracy": {"metric": "accuracy", "higher_is_better": True,
                         "axes": [{"name": axes[0], "values": LENGTHS}, {"name": axes[1], "values": LENGTHS}],
                         "values": values, "meta": {"train_max": {axes[0]: train, axes[1]: train}, "unit": "%"}}}


# rows: len_a 1..4, columns: len_b 1..4
VALUES = [[100, 90, 30, 0],
          [80, 70, 20, 0],
          [10, 40, 60, 5],
          [0, 0, 10, None]]


def test_each_column_is_the_mean_of_the_cells_at_that_longer_length(tmp_path):
    make_run(tmp_path, "arithmetic", "rope", 0, {"accuracy": 1.0}, grids=grid(VALUES))
    tables = report.collect(tmp_path).tables
    derived = next(t for t in tables if t.kind == "by_length")
    assert derived.columns == ["<= 2", "3", "4"]
    (row,) = derived.rows
    assert row.cells["<= 2"].value == pytest.approx((100 + 90 + 80 + 70) / 4)
    assert row.cells["3"].value == pytest.approx((30 + 20 + 10 + 40 + 60) / 5)
    assert row.cells["4"].value == pytest.approx((0 + 0 + 5 + 0 + 0 + 10) / 6)    # the missing cell is left out
    assert "max(len_a, len_b)" in derived.heading


def test_seeds_pool_into_a_mean_with_the_student_t_interval(tmp_path):
    for seed, shift in enumerate((0.0, 10.0, 20.0)):
        values = [[v if v is None else min(100, v + shift) for v in row] for row in VALUES]
        make_run(tmp_path, "arithmetic", "rope", seed, {"accuracy": 1.0}, grids=grid(values))
    derived = next(t for t in report.collect(tmp_path).tables if t.kind == "by_length")
    (row,) = derived.rows
    threes = [(min(100, 30 + s) + min(100, 20 + s) + min(100, 10 + s) + min(100, 40 + s) + min(100, 60 + s)) / 5
              for s in (0.0, 10.0, 20.0)]
    cell = row.cells["3"]
    assert cell.value == pytest.approx(sum(threes) / 3) and cell.seeds == 3
    # t(0.975, 2) = 4.3027; the three means are 32, 42, 52: sd 10
    assert cell.half_width == pytest.approx(4.302653 * 10 / 3 ** 0.5, rel=1e-5)


def test_no_table_for_a_grid_of_two_different_quantities(tmp_path):
    """passkey's grid is length x depth: its axes differ, so there is no 'longer length'."""
    passkey = grid(VALUES, axes=("length", "depth"))
    passkey["accuracy"]["axes"][1]["values"] = [0.0, 0.25, 0.5, 1.0]
    passkey["accuracy"]["meta"]["train_max"] = {"length": 2, "depth": 1.0}
    make_run(tmp_path, "passkey", "rope", 0, {"accuracy": 1.0}, grids=passkey)
    assert [t.kind for t in report.collect(tmp_path).tables] == ["metrics"]


def test_rows_trained_to_other_lengths_get_a_table_of_their_own(tmp_path):
    make_run(tmp_path, "arithmetic", "rope", 0, {"accuracy": 1.0}, grids=grid(VALUES, train=2),
             task_options={"train_digits": 2})
    make_run(tmp_path, "arithmetic", "alibi", 0, {"accuracy": 1.0}, grids=grid(VALUES, train=3),
             task_options={"train_digits": 3})
    derived = [t for t in report.collect(tmp_path).tables if t.kind == "by_length"]
    assert sorted(t.columns for t in derived) == [["<= 2", "3", "4"], ["<= 3", "4"]]
    three = next(t for t in derived if t.columns == ["<= 3", "4"])
    (row,) = three.rows
    assert row.encoding == "alibi" and "(trained to 3)" in three.heading
    assert row.cells["<= 3"].value == pytest.approx((100 + 90 + 30 + 80 + 70 + 20 + 10 + 40 + 60) / 9)


def test_a_length_whose_cells_are_all_missing_has_no_value():
    from posbench.report.by_length import by_longer_axis

    values = [[100, None], [None, None]]
    found = by_longer_axis({"axes": [{"name": "len_a", "values": [1, 2]}, {"name": "len_b", "values": [1, 2]}],
                            "values": values, "meta": {"train_max": {"len_a": 1, "len_b": 1}}})
    assert found == {"<= 1": 100.0}
