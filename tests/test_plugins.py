"""The three ways an encoding and a task get in, each exactly as docs/extending.md says and with no other file
edited: dropped into the package's folders, named with ``--plugins`` / ``POSBENCH_PLUGINS``, and declared as entry
points of an installed package. Each writes the docs' ``learned.py`` and ``copy_task.py``, runs the docs' commands in
a fresh Python process (``python -m posbench``) and reads the runs back with ``compare``.

Nothing is written into the source tree: the drop-in copies the package into the test's temporary directory and
puts that copy first on the path; the entry points are a ``.dist-info`` directory there, what ``pip install``
writes for a package's ``pyproject.toml`` (``entry_points.txt``). So parallel test runs never see each other's
files."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import posbench

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "extending.md"
PACKAGE = Path(posbench.__file__).resolve().parent


def doc_file(name: str) -> str:
    """The Python block of docs/extending.md that is the file ``name``."""
    found = [b for b in re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S) if b.startswith(f"# {name}:")]
    assert len(found) == 1, name
    return found[0]


def doc_commands(block: int) -> list[str]:
    """The commands of the ``block``-th ```sh block of docs/extending.md."""
    blocks = re.findall(r"```sh\n(.*?)```", DOCS.read_text(), re.S)
    return [line.strip() for line in blocks[block].splitlines() if line.strip()]


def run_commands(commands: list[str], cwd: Path, path: list[Path] = ()) -> str:
    """Each command as a shell would run it (``VAR=value posbench ...``), ``posbench`` being ``python -m
    posbench`` with ``path`` first on the Python path; every run quiet and on one thread. Returns the output."""
    output = []
    for command in commands:
        words = shlex.split(command)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, [*path, os.environ.get("PYTHONPATH", "")]))}
        env.pop("POSBENCH_PLUGINS", None)
        while "=" in words[0]:
            key, value = words.pop(0).split("=", 1)
            env[key] = value
        assert words[0] == "posbench", command
        args = words[1:]
        if "run" in args:
            args += ["-q", "--set", "train.threads=1"]
        done = subprocess.run([sys.executable, "-m", "posbench", *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, f"{command}: {done.stderr[-2000:]}"
        output.append(done.stdout)
    return "\n".join(output)


def finished(results: Path, task: str, encoding: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((results / task / encoding).glob("*/result.json"))]


def assert_compared(output: str, seeds_of_learned: int) -> None:
    assert "copy" in output and "learned" in output and "alibi" in output
    if seeds_of_learned > 1:
        assert re.search(r"learned .*±", output), output


@pytest.mark.slow  # the docs' commands, each a fresh process
def test_a_file_dropped_into_each_folder(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(PACKAGE, site / "posbench", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "posbench" / "encodings" / "learned.py").write_text(doc_file("learned.py"))
    (site / "posbench" / "tasks" / "copy_task.py").write_text(doc_file("copy_task.py"))
    work = tmp_path / "work"
    work.mkdir()
    output = run_commands(doc_commands(1), work, [site])
    assert_compared(output, 1)
    record = finished(work / "results", "copy", "learned")[0]
    assert record["config"]["task_version"] == 1 and record["config"]["encoding_options"] == {"max_positions": 1024}
    assert finished(work / "results", "copy", "alibi")
    listed = run_commands(["posbench ls encodings learned"], work, [site])
    assert "origin: added to posbench (posbench/encodings/learned), posbench.encodings.learned.LearnedAbsolute" in \
        " ".join(listed.split())                                    # a dropped-in file is no built-in (issue 37)
    assert not (PACKAGE / "encodings" / "learned.py").exists() and not (PACKAGE / "tasks" / "copy_task.py").exists()


@pytest.mark.slow  # the docs' commands, each a fresh process
def test_modules_named_with_plugins_and_the_environment_variable(tmp_path):
    (tmp_path / "learned.py").write_text(doc_file("learned.py"))
    (tmp_path / "copy_task.py").write_text(doc_file("copy_task.py"))
    output = run_commands(doc_commands(0), tmp_path)
    assert_compared(output, 2)                      # --plugins made seed 0, POSBENCH_PLUGINS seed 1: pooled
    assert [r["config"]["seed"] for r in finished(tmp_path / "results", "copy", "learned")] == [0, 1]
    checked = run_commands(doc_commands(2), tmp_path)
    assert "FAIL" not in checked and "ok    encoding 'learned': a KV cache equals recomputation" in checked
    assert "ok    task 'copy': a short run (2 steps) is recorded and compare reads it" in checked
    listed = run_commands(["posbench --plugins learned.py ls encodings"], tmp_path)
    assert re.search(r"learned .*plugin \(learned\)", " ".join(listed.split())), listed


@pytest.mark.slow  # the docs' commands, each a fresh process
def test_entry_points_of_an_installed_package(tmp_path):
    site = tmp_path / "site"
    package = site / "my_package"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "learned.py").write_text(doc_file("learned.py"))
    (package / "copy_task.py").write_text(doc_file("copy_task.py"))
    (toml,) = [b for b in re.findall(r"```toml\n(.*?)```", DOCS.read_text(), re.S) if "entry-points" in b]
    info = site / "my_package-0.1.dist-info"         # what pip writes for that pyproject.toml
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-package\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(toml.replace("[project.entry-points.", "[").replace('"', ""))
    work = tmp_path / "work"
    work.mkdir()
    output = run_commands(doc_commands(1), work, [site])
    assert_compared(output, 1)
    listed = run_commands(["posbench ls tasks copy"], work, [site])
    assert "origin: plugin (my-package)" in listed


def test_a_plugin_cannot_take_a_built_in_name_before_its_module_is_imported(tmp_path):
    """Built-in modules are imported when their name is first looked up, plugins before: a plugin's class named
    'rope' is still refused in one line (the built-in of that name registers first), in a fresh process where
    nothing has imported posbench.encodings.rope yet."""
    plugin = tmp_path / "mine.py"
    plugin.write_text("from posbench.encodings.base import PositionalEncoding\n\n\n"
                      "class Mine(PositionalEncoding):\n    name = 'rope'\n")
    done = subprocess.run([sys.executable, "-m", "posbench", "--plugins", str(plugin), "run", "-t", "arithmetic",
                           "-e", "rope", "--dry-run"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "already registered by posbench.encodings.rope.RoPE" in line
