"""The study tools and study files given hostile or odd input (issue 48): a published result.json naming paths
outside its cell (restore.py), control characters bound for a SLURM job script, links in a sweep or a page
(publish.py), unbounded sizes (a study's seeds and cells, passkey's lengths), and the module path of the
processes the study tools start. Each is refused or skipped in one line; nothing is written outside its folder."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from posbench.cli import main
from posbench.sweep.slurm import SlurmError, SlurmOptions, job_parameters, slurm_options
from posbench.sweep.study import StudyError, read_study

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "studies"))

import changes  # noqa: E402  (scripts of studies/, not a package)
import publish  # noqa: E402
import restore  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "study"
A_CELL = "passkey-rope-tiny-s0"
MAX_SEEDS, MAX_CELLS = 1000, 10_000          # a study's bounds (posbench.sweep.study; run --seeds stops at 1,000)


def one_error_line(err: str) -> str:
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ---- 1: restore.py writes only inside its cells -------------------------------------------------------------

def page_with(tmp_path: Path, **record) -> Path:
    """A published page of one cell (the fixture's passkey cell) whose result.json says ``record``'s keys."""
    page = tmp_path / "page"
    shutil.copytree(FIXTURE / "runs" / A_CELL, page / "runs" / A_CELL)
    result = page / "runs" / A_CELL / "result.json"
    result.write_text(json.dumps({**json.loads(result.read_text()), **record}))
    return page


@pytest.mark.parametrize("key, value", [("task", "/ABSOLUTE/escaped"), ("task", "../../../escaped"),
                                        ("encoding", ".."), ("run_id", "a/../../../../escaped"),
                                        ("run_id", "run\nid"), ("encoding", 3)])
def test_restore_refuses_a_path_that_leaves_its_cell(tmp_path, capsys, key, value):
    target = tmp_path / "target"
    value = value.replace("/ABSOLUTE", str(tmp_path / "elsewhere")) if isinstance(value, str) else value
    page = page_with(tmp_path, **{key: value})
    assert restore.main([str(page), str(target)]) == 2
    err = one_error_line(capsys.readouterr().err)
    assert key in err and "folder name" in err or "not a name" in err
    written = [p for p in tmp_path.rglob("*") if p.is_file() and page not in p.parents]
    assert written == []                              # nothing anywhere: not in the target, not beside it


def test_restore_checks_every_cell_before_writing_any(tmp_path, capsys):
    page = page_with(tmp_path, task="../x")
    shutil.copytree(FIXTURE / "runs" / "passkey-alibi-tiny-s0", page / "runs" / "passkey-alibi-tiny-s0")
    assert restore.main([str(page), str(tmp_path / "target")]) == 2
    one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "target").exists()


def test_restore_skips_a_linked_cell_or_file_with_a_line(tmp_path, capsys):
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"secret": 1}\n')
    page = page_with(tmp_path)
    (page / "runs" / A_CELL / "predictions.jsonl").unlink()
    (page / "runs" / A_CELL / "predictions.jsonl").symlink_to(secret)
    (page / "runs" / "passkey-alibi-tiny-s0").symlink_to(FIXTURE / "runs" / "passkey-alibi-tiny-s0")
    target = tmp_path / "target"
    assert restore.main([str(page), str(target)]) == 0
    captured = capsys.readouterr()
    assert "0 finished cell(s) restored" in captured.out
    assert captured.err.count("symbolic link") == 2 and captured.err.count("\n") == 2
    assert not any(target.rglob("*.jsonl"))


def test_restore_and_publish_skip_a_file_past_what_compare_reads(tmp_path, capsys, monkeypatch):
    """A gzip bomb in a page: its predictions inflate past the bound (here made small), found out in chunks; the
    cell is skipped with a line, the others restored. publish.py skips a sweep's cell alike."""
    import gzip

    page = page_with(tmp_path)
    predictions = page / "runs" / A_CELL / "predictions.jsonl"
    bomb = gzip.compress(b"\n" * 10_000_000)
    predictions.unlink()
    predictions.with_name("predictions.jsonl.gz").write_bytes(bomb)
    shutil.copytree(FIXTURE / "runs" / "passkey-alibi-tiny-s0", page / "runs" / "passkey-alibi-tiny-s0")
    monkeypatch.setitem(publish.LIMITS, "predictions.jsonl", 1_000_000)
    target = tmp_path / "target"
    assert restore.main([str(page), str(target)]) == 0
    captured = capsys.readouterr()
    assert "1 finished cell(s) restored" in captured.out
    assert captured.err.count("\n") == 1 and f"skipped cell {A_CELL}" in captured.err and "inflates" in captured.err
    sweep = sweep_with(tmp_path / "sweep", [A_CELL, "passkey-alibi-tiny-s0"])
    next((sweep / "cells" / A_CELL).rglob("predictions.jsonl")).write_bytes(b"\n" * 1_000_001)
    skipped: list[str] = []
    assert sorted(publish.finished_runs(sweep, skipped)) == ["passkey-alibi-tiny-s0"]
    assert len(skipped) == 1 and "more than" in skipped[0]


# ---- 2: no control character reaches a SLURM job script -----------------------------------------------------

def study_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "study.toml"
    path.write_text('encodings = ["rope"]\ntasks = ["arithmetic"]\n' + text)
    return path


@pytest.mark.parametrize("text", [
    '[slurm]\npartition = "gpu\\nrm -rf ~"\n',
    '[slurm]\naccount = "lab\\r\\necho pwned"\n',
    '[slurm]\nadditional = { mail-type = "END\\necho pwned" }\n',
    '[slurm]\nadditional = { "exclusive\\necho pwned" = true }\n',
    'name = "study\\n"\n',
    '[variants]\n"base\\n" = []\n',
    'set = ["train.log_every=5\\n# posbench sweep: a forged log line"]\n',
    'presets = ["tiny\\u0000"]\n',
])
def test_a_control_character_in_a_study_is_refused_in_one_line(tmp_path, capsys, text):
    with pytest.raises(StudyError) as caught:
        read_study(study_file(tmp_path, text))
    assert "\n" not in str(caught.value) and "control character" in str(caught.value)
    assert main(["sweep", str(tmp_path / "study.toml"), "--dry-run", "--executor", "slurm"]) == 2
    one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("given", [{"partition": "gpu\nrm -rf ~"}, {"mem": "32G\n"}, {"qos": "\x1b[2Jhigh"}])
def test_slurm_options_from_the_command_line_are_one_line_too(given):
    with pytest.raises(SlurmError) as caught:
        slurm_options({}, given)
    assert "\n" not in str(caught.value) and "control character" in str(caught.value)


@pytest.mark.parametrize("additional", [{"mail type": "END"}, {"x=y": 1}, {"nodelist": ["a", "b"]}])
def test_additional_sbatch_options_are_names_and_plain_values(additional):
    with pytest.raises(SlurmError):
        slurm_options({"additional": additional}, {})


def test_no_option_line_of_a_job_script_is_split():
    """The last check, on every #SBATCH value the job is submitted with (whoever built the options)."""
    spec = {"id": "arithmetic-rope-tiny-s0", "expected_s": 60.0}
    assert job_parameters(SlurmOptions(partition="gpu", additional={"mail-type": "END"}), spec)["partition"] == "gpu"
    for options, in_spec in ((SlurmOptions(constraint="a100\necho pwned"), {}),
                             (SlurmOptions(additional={"comment": "x\ny"}), {}),
                             (SlurmOptions(), {"id": "cell\necho pwned"})):
        with pytest.raises(SlurmError):
            job_parameters(options, {**spec, **in_spec})


# ---- 5: the study tools start Python without the working directory on its path ------------------------------

def test_publish_starts_compare_without_the_working_directory_on_the_path(tmp_path, monkeypatch):
    """compare is started as ``python -P -m posbench``: a ``posbench/`` (an older checkout, say) or an
    ``fcntl.py`` where the script is run is not imported instead of the real one. The command the script
    builds is run here with ``--help`` in place of compare's arguments, from such a folder. changes.py starts
    no process (its compare runs in its own, which imported the real posbench to start)."""
    started = []

    def record(argv, **_):
        started.append(argv)
        return subprocess.CompletedProcess(argv, 0, '{"tables": []}', "")

    monkeypatch.setattr(subprocess, "run", record)
    publish.compare(tmp_path, "--format", "markdown")
    assert len(started) == 1
    assert changes.differences(FIXTURE / publish.RUNS, "rope") and len(started) == 1
    here = tmp_path / "cwd"
    (here / "posbench").mkdir(parents=True)
    marker = tmp_path / "imported"
    hostile = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\nraise SystemExit(3)\n"
    (here / "posbench" / "__init__.py").write_text(hostile)
    (here / "fcntl.py").write_text(hostile)
    monkeypatch.undo()
    for argv in started:
        command = argv[:argv.index("posbench") + 1] + ["--help"]
        done = subprocess.run(command, cwd=here, capture_output=True, text=True)
        assert done.returncode == 0 and "compare" in done.stdout, (command, done.stderr)
    assert not marker.exists()


# ---- 6: publish.py copies only what is inside the sweep, writes only inside the page ------------------------

def sweep_with(root: Path, cells: list[str]) -> Path:
    """A sweep output whose cells hold the fixture's runs."""
    for cell in cells:
        run = root / "cells" / cell / "passkey" / "rope" / "20261125-000000-abcdef"
        run.mkdir(parents=True)
        (run / "config.json").write_text("{}")
        for name in publish.COPIED:
            if (FIXTURE / "runs" / cell / name).is_file():
                shutil.copyfile(FIXTURE / "runs" / cell / name, run / name)
    return root


def test_publish_skips_a_linked_file_or_folder_of_the_sweep_with_a_line(tmp_path):
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"secret": "not for the page"}\n')
    secret.chmod(0o600)
    sweep = sweep_with(tmp_path / "sweep", [A_CELL, "passkey-rope-tiny-s1"])
    linked = next((sweep / "cells" / A_CELL).rglob("predictions.jsonl"))
    linked.unlink()
    linked.symlink_to(secret)
    outside = sweep_with(tmp_path / "other", ["passkey-alibi-tiny-s0"]) / "cells" / "passkey-alibi-tiny-s0"
    (sweep / "cells" / "passkey-alibi-tiny-s0").symlink_to(outside)
    skipped: list[str] = []
    runs = publish.finished_runs(sweep, skipped)
    assert sorted(runs) == ["passkey-rope-tiny-s1"]
    assert len(skipped) == 2 and all("symbolic link" in line and "\n" not in line for line in skipped)
    page = tmp_path / "page"
    publish.copy_runs(runs, page)
    assert not any(b"not for the page" in p.read_bytes() for p in page.rglob("*") if p.is_file())


@pytest.mark.parametrize("linked", ["runs", f"runs/{A_CELL}", "figures"])
def test_publish_refuses_a_page_whose_folders_are_links(tmp_path, capsys, linked):
    sweep = sweep_with(tmp_path / "sweep", [A_CELL])
    page, outside = tmp_path / "page", tmp_path / "outside"
    outside.mkdir()
    (page / linked).parent.mkdir(parents=True, exist_ok=True)
    (page / linked).symlink_to(outside)
    assert publish.main([str(sweep), str(page)]) == 2
    assert "symbolic link" in one_error_line(capsys.readouterr().err)
    assert list(outside.iterdir()) == []               # nothing written through the link
    assert not (page / publish.TABLES).exists()


def test_a_published_copy_is_never_wider_than_its_original(tmp_path, monkeypatch):
    sweep = sweep_with(tmp_path / "sweep", [A_CELL])
    for f in (sweep / "cells").rglob("*.json*"):
        f.chmod(0o600)
    page = tmp_path / "page"
    assert publish.copy_runs(publish.finished_runs(sweep), page) == 1
    for name in ("result.json", "predictions.jsonl"):
        assert stat.S_IMODE((page / "runs" / A_CELL / name).stat().st_mode) == 0o600
    monkeypatch.setattr(publish, "GZIP_ABOVE", 10)                    # the gzipped form too
    next((sweep / "cells").rglob("predictions.jsonl")).write_text('{"changed": 1}\n' * 10)
    assert publish.copy_runs(publish.finished_runs(sweep), page) == 1
    assert stat.S_IMODE((page / "runs" / A_CELL / "predictions.jsonl.gz").stat().st_mode) == 0o600


# ---- 7: sizes bounded where they are read -------------------------------------------------------------------

@pytest.mark.parametrize("text, words", [
    (f"seeds = {MAX_SEEDS + 1}\n", "between 1 and 1,000"),
    ("seeds = 1000000\n", "between 1 and 1,000"),           # 100,000,000 took 3.4 GB to a MemoryError
    (f"seeds = {list(range(MAX_SEEDS + 1))}\n", "at most 1,000"),
    ("seeds = [0, 4294967296]\n", "NumPy's range"),
    ("seeds = 1000\n[variants]\n" + "".join(f'v{i} = []\n' for i in range(MAX_CELLS // 1000 + 1)),
     "split it into several studies"),
])
def test_a_study_too_large_is_refused_in_one_line(tmp_path, capsys, text, words):
    path = study_file(tmp_path, text)
    with pytest.raises(StudyError) as caught:
        read_study(path)
    assert words in str(caught.value) and len(str(caught.value)) < 300
    assert main(["sweep", str(path), "--dry-run"]) == 2
    one_error_line(capsys.readouterr().err)


def test_a_study_file_too_large_is_not_read(tmp_path):
    path = study_file(tmp_path, "# " + "x" * (2 * 1024 * 1024) + "\n")
    with pytest.raises(StudyError, match="over 1024 KiB"):
        read_study(path)


@pytest.mark.parametrize("sets, words", [
    (["task.mode=longlora", "task.max_tokens=1000000000000"], "task.max_tokens=1000000000000 is out of range"),
    (["task.length_factors=1,1000", "task.train_length=1000"], "prompts of 1,000,000 tokens"),
    (["task.mode=longlora", "task.max_tokens=300000", "task.interval=2"], "length points"),
    (["task.trials=1000000000000"], "task.trials=1000000000000 is out of range"),
])
def test_passkey_lengths_past_its_bound_are_refused_by_a_dry_run(tmp_path, capsys, sets, words):
    code = main(["run", "-e", "rope", "-t", "passkey", "-p", "tiny", "--dry-run", "--out", str(tmp_path / "r"),
                 *[word for item in sets for word in ("--set", item)]])
    assert code == 2
    assert words in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "r").exists()
