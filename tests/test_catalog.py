"""``posbench/catalog.py`` (issue 58): what the built-in declarations say, read without torch; generated from the
classes, so it can never drift from them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from posbench import catalog_build


def test_the_catalog_is_what_the_classes_declare():
    """Regenerated from the real classes it is the file, byte for byte: after changing a declaration, a
    description, a default or a preset, run ``python -m posbench.catalog_build``."""
    assert catalog_build.text(catalog_build.catalog()) == catalog_build.CATALOG.read_text(), \
        "posbench/catalog.py is stale: python -m posbench.catalog_build"


NO_TORCH = """
import sys
from pathlib import Path
from posbench.cli import main
sys.argv = ["posbench", *sys.argv[1:]]
try:
    main(sys.argv[1:])
finally:
    print("TORCH" if "torch" in sys.modules else "NO TORCH", file=sys.stderr)
"""


ROOT = Path(__file__).resolve().parents[1]
RUNS = str(ROOT / "docs" / "reference-runs")                 # committed records of two encodings
PAIRED = str(ROOT / "tests" / "fixtures" / "results-v1" / "arithmetic")   # RoPE and ALiBi, with predictions


@pytest.mark.parametrize("args", [["--help"], ["ls"], ["ls", "encodings"], ["ls", "presets"], ["compare", RUNS],
                                  ["compare", RUNS, "-f", "json"], ["compare", RUNS, "--by-model"],
                                  ["compare", PAIRED, "--against", "rope", "-f", "markdown"]])
def test_commands_that_build_no_model_do_not_import_torch(args, tmp_path):
    """``posbench --help``, ``posbench ls`` (no name) and ``posbench compare`` start without torch (a fresh process):
    they read the catalog, records and predictions, never an encoding's or a task's class; a built-in task's
    per-example scores (``--against``) come from its ``example_scorer`` module."""
    done = subprocess.run([sys.executable, "-c", NO_TORCH, *args], capture_output=True, text=True, cwd=tmp_path,
                          env={"PATH": "", "COLUMNS": "120"})
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "NO TORCH"
    if "--against" in args:                                        # paired example by example, not across seeds
        assert "| alibi | accuracy | 0.00 | [0.00, 0.00] | 1.000 | - | 2 seeds x 72 examples |" in done.stdout


BEYOND = """
import os, sys
from posbench.registry import beyond_catalog
print(beyond_catalog("encoding"), end=" ")
os.environ["POSBENCH_PLUGINS"] = sys.argv[1]
print(beyond_catalog("encoding"), beyond_catalog("task"))
"""


def test_a_plugin_named_takes_the_catalogs_place(tmp_path):
    """A plugin named in the environment: the registries themselves are read, not the catalog alone. In a fresh
    process: a class another test registered in this one is beyond the catalog too."""
    env = {k: v for k, v in os.environ.items() if k != "POSBENCH_PLUGINS"}
    done = subprocess.run([sys.executable, "-c", BEYOND, str(tmp_path / "mine.py")], capture_output=True, text=True,
                          cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "True"]


def test_check_says_whether_the_catalog_is_stale_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """``python -m posbench.catalog_build --check``: exit 0 when the file is current, else 1 and one line; it
    writes nothing either way."""
    current = tmp_path / "catalog.py"
    current.write_text(catalog_build.CATALOG.read_text())
    monkeypatch.setattr(catalog_build, "CATALOG", current)
    assert catalog_build.main(["--check"]) == 0
    stale = tmp_path / "stale.py"
    stale.write_text("ENCODINGS = {}\n")
    monkeypatch.setattr(catalog_build, "CATALOG", stale)
    capsys.readouterr()
    assert catalog_build.main(["--check"]) == 1
    assert stale.read_text() == "ENCODINGS = {}\n"
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_help_writes_nothing():
    """``--help`` prints the usage and exits 0 without rewriting the catalog."""
    before = catalog_build.CATALOG.stat().st_mtime_ns
    with pytest.raises(SystemExit) as exit_:
        catalog_build.main(["--help"])
    assert exit_.value.code == 0
    assert catalog_build.CATALOG.stat().st_mtime_ns == before
