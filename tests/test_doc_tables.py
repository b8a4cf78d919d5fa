"""Every table in the docs that claims to be ``posbench compare``'s output is checked against compare (issue 36,
item 5): it sits right under a marker ``<!-- compare: ARGS -->`` naming the command's arguments (paths from the
repository's root), and each of its rows must be a row of one of the tables that ``posbench compare ARGS --format
markdown`` prints, cell for cell, restricted to the columns the docs show (an excerpt may leave columns out, never
change a cell, its bold included)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"<!-- compare: (.+?) -->\n((?:\|.*\n)+)")


def parse(block: str) -> tuple[list[str], list[list[str]]]:
    lines = [line.strip() for line in block.strip().splitlines() if line.strip().startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return cells[0], [row for row in cells[2:]]


@cache
def compare_tables(args: str) -> list[tuple[list[str], list[list[str]]]]:
    proc = subprocess.run([sys.executable, "-m", "posbench", "compare", *shlex.split(args), "--format", "markdown"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    blocks = re.findall(r"((?:^\|.*\n)+)", proc.stdout, re.M)
    return [parse(block) for block in blocks]


def quoted() -> list[tuple[str, str, str]]:
    return [(str(path.relative_to(ROOT)), m.group(1), m.group(2)) for path in DOCS
            for m in MARK.finditer(path.read_text())]


def test_the_docs_mark_the_tables_they_quote():
    where = {path for path, _, _ in quoted()}
    assert {"README.md", "docs/comparing.md"} <= where


@pytest.mark.parametrize("path, args, block", quoted(), ids=lambda x: x if len(str(x)) < 40 else str(x)[:40])
def test_a_quoted_table_is_what_compare_prints(path, args, block):
    header, rows = parse(block)
    for columns, printed in compare_tables(args):
        if all(name in columns for name in header):
            index = [columns.index(name) for name in header]
            projected = [[row[i] for i in index] for row in printed]
            missing = [row for row in rows if row not in projected]
            assert not missing, f"{path}: rows compare does not print: {missing}"
            return
    pytest.fail(f"{path}: no table of 'posbench compare {args}' has the columns {header}")
