"""What a new user trips on (issue 48, item 12), each said where it happens: an unknown flag's suggestion reads
what the command's own options are for (``--results`` is ``--out``, not ``--resume``); ``ls presets tiny`` says
tiny is a preset; ``check NAME`` of a plugin's encoding names ``--plugins``; a tiny run says it is a smoke test,
as ``ls presets`` and docs/running.md do; docs/extending.md says plugins are code that runs; nothing cites a file
the repository does not hold (``reference/tape-and-baselines.md``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from posbench.cli import main

ROOT = Path(__file__).resolve().parents[1]


def one_error(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return " ".join(err.split())


@pytest.mark.parametrize("flag, meant", [("--results", "--out"), ("--output", "--out"), ("--stepz", "--steps"),
                                         ("--preset-name", "--preset")])
def test_an_unknown_flag_suggests_what_was_meant(capsys, flag, meant):
    err = one_error(capsys, "run", "-e", "rope", "-t", "arithmetic", flag, "x")
    assert f"No such option: {flag} (Possible options: " in err                  # click's words, posbench's pick
    assert meant in err.split("(Possible options: ")[1].split(")")[0].split(", ")
    assert "--resume" not in err


def test_ls_presets_of_a_preset_name_says_it_is_a_preset(capsys):
    err = one_error(capsys, "ls", "presets", "tiny")
    assert err.startswith("error: 'tiny' is a preset, not a task: 'posbench ls presets TASK' shows a task's presets")
    assert "arithmetic" in err and "pretrain" in err and "Did you mean" not in err
    err = one_error(capsys, "ls", "presets", "tinyy")               # any other name: an unknown task, as before
    assert err.startswith("error: unknown task 'tinyy'")


def test_check_of_an_unknown_name_names_plugins(capsys):
    err = one_error(capsys, "check", "my-encoding")
    assert err.startswith("error: unknown encoding or task 'my-encoding'.")
    assert "posbench --plugins FILE.py check my-encoding" in err and "POSBENCH_PLUGINS" in err


def test_a_tiny_run_says_it_is_a_smoke_test(tmp_path, capsys):
    from posbench.cli.run import TINY_NOTE

    assert main(["run", "-e", "rope", "-t", "arithmetic", "-p", "tiny", "--steps", "2", "-q", "-o", str(tmp_path),
                 "--set", "task.eval_samples=2", "--set", "train.threads=1"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith(TINY_NOTE) and "smoke test" in TINY_NOTE
    assert main(["ls", "presets"]) == 0
    assert "tiny is a smoke test" in " ".join(capsys.readouterr().out.split())
    running = " ".join((ROOT / "docs" / "running.md").read_text(encoding="utf-8").split())
    assert "`tiny` (seconds: a smoke test that the pipeline runs" in running


def test_extending_says_plugins_are_code_that_runs():
    page = " ".join((ROOT / "docs" / "extending.md").read_text(encoding="utf-8").split())
    assert "**They are code, and it runs.** A plugin, a file dropped into posbench's folders and an installed " \
           "package's entry points are Python modules that posbench imports" in page


def test_nothing_cites_the_missing_reference_notes():
    """docs/paper.md, posbench/hf/tape_llama.py and tests/encodings/test_tape.py cited ``reference/tape-and-baselines.md``,
    which is not in the repository; they now cite the paper, the release's files at a commit, or a section here."""
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "posbench").rglob("*.py"),
             *(ROOT / "tests").glob("*.py")]
    citing = [str(f.relative_to(ROOT)) for f in files if f != Path(__file__).resolve()
              and re.search(r"tape-and-baselines\.md", f.read_text(encoding="utf-8", errors="replace"))]
    assert citing == []
    assert "(#what-the-arithmetic-release-ran)" in (ROOT / "docs" / "paper.md").read_text(encoding="utf-8")
