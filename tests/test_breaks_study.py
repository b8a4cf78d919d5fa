"""The study "Where each encoding breaks" (docs/studies/breaks.md) cannot drift from its data: its summary.md is what
studies/breaks_summary.py computes from the committed runs and their analyses, the page's copy is summary.md, and the
study file plans the 24 cells the page describes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "studies" / "breaks"
sys.path.insert(0, str(ROOT / "studies"))

import breaks_summary  # noqa: E402  (a script of studies/)


def test_the_summary_is_the_runs_numbers():
    assert breaks_summary.summary(PAGE / "runs") == (PAGE / "summary.md").read_text()


def test_the_page_quotes_the_summary_word_for_word():
    text = (ROOT / "docs" / "studies" / "breaks.md").read_text()
    assert breaks_summary.refresh_copy(text, "summary.md", (PAGE / "summary.md").read_text()) == text


def test_every_published_cell_kept_its_analysis_and_its_probe():
    for cell in (PAGE / "runs").iterdir():
        assert (cell / "analysis.json").is_file(), cell
        assert '"nll_8x"' in (cell / "result.json").read_text(), cell


def test_the_study_file_plans_every_cell():
    proc = subprocess.run([sys.executable, "-m", "posbench", "sweep", str(ROOT / "studies" / "breaks.toml"), "--dry-run",
                           "--jobs", "2", "--out", "/nonexistent/posbench-plan-only"], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert "plan: 24 cells" in proc.stdout
