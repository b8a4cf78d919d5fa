"""Hostile result files and paths (issue 36, item 8): a metric written as a JSON integer beyond float64's range
reads as an infinity, as the float 1e400 does (the whole compare used to fail with a 64-line OverflowError
traceback); an --html or --plots path under a file is refused in one line before any work (it used to print the
whole table first)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from posbench.cli import main

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference-runs" / "perplexity-3seeds"


def tree_with(tmp_path: Path, value: str) -> Path:
    root = shutil.copytree(REFERENCE, tmp_path / "runs")
    path = sorted((root / "perplexity" / "rope").glob("*/result.json"))[0]
    text = path.read_text()
    changed = re.sub(r'("ppl_8x": \{\s*"value": )[0-9.eE+-]+', lambda m: m.group(1) + value, text, count=1)
    assert changed != text
    path.write_text(changed)
    return root


@pytest.mark.parametrize("value", ["1" + "0" * 400, "-1" + "0" * 400])
def test_an_integer_beyond_float_range_reads_as_an_infinity_like_1e400(tmp_path, capsys, value):
    huge = tree_with(tmp_path / "int", value)
    assert main(["compare", str(huge), "--format", "markdown"]) == 0
    as_int = capsys.readouterr()
    float_value = "1e400" if not value.startswith("-") else "-1e400"
    assert main(["compare", str(tree_with(tmp_path / "float", float_value)), "--format", "markdown"]) == 0
    as_float = capsys.readouterr()
    assert as_int.out == as_float.out and "unreadable" not in as_int.err
    assert ("inf (1 of 3 seeds)" if not value.startswith("-") else "-inf") in as_int.out


@pytest.mark.parametrize("flag, below", [("--html", "sub/report.html"), ("--plots", "figures")])
def test_an_output_under_a_file_is_one_line_before_any_work(tmp_path, capsys, flag, below):
    (tmp_path / "afile").write_text("x")
    target = tmp_path / "afile" / below
    assert main(["compare", str(REFERENCE), flag, str(target)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""                                           # no table printed first
    assert captured.err.strip() == f"error: {flag} {target}: {tmp_path / 'afile'} is a file, not a folder"
