"""Every command in the README and in docs/ is exercised, as written, and the README stays a front door.

Commands are read from the ```bash blocks (continuation lines joined, comments dropped). In a scratch
directory laid out like a user's (``results/pretrain/rope/RUN_ID`` and the other placeholders the docs use are
real tiny runs; ``./Llama-2-7b-hf`` and ``./tiny-llama`` a tiny Llama; ``scrolls_data`` the SCROLLS fixture):

- ``posbench run``, ``extend``, ``bench`` and ``sweep`` (and the ``posbench`` part of ``torchrun ... -m posbench ...``)
  run with ``--dry-run``: the whole configuration is resolved (names, presets, every option's type and range,
  ``--init``), nothing trains; a recipe for a GPU or a day of training is checked, not run;
- ``compare``, ``ls``, ``score``, ``export`` and ``python -m posbench.hf.tiny`` run for real;
- the Python blocks run (docs/extending.md's are run by tests/encodings/test_custom_encoding.py).

Hub names of models (no network here) stand for the tiny Llama.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from posbench.cli import main

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
HUB_MODELS = {"meta-llama/Llama-2-7b-hf": "./Llama-2-7b-hf"}
RUN_LIKE = {"run", "extend", "bench", "sweep"}
PYTHON_ELSEWHERE = {"extending.md"}          # tests/encodings/test_custom_encoding.py runs these blocks


def blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", page.read_text(encoding="utf-8"), re.S)


def commands(page: Path) -> list[list[str]]:
    """The posbench commands of a page's bash blocks, as argument lists (after ``posbench``)."""
    found = []
    for block in blocks(page, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if not line or line.startswith("#"):
                continue
            words = shlex.split(line)
            if "-m" in words and words[0] in ("torchrun", "python") and words[words.index("-m") + 1] == "posbench":
                words = ["posbench", *words[words.index("-m") + 2:]]
            elif words[:3] == ["python", "-m", "posbench.hf.tiny"]:
                found.append(["hf.tiny", *words[3:]])
                continue
            elif words[:3] == ["python", "-m", "posbench"]:
                words = ["posbench", *words[3:]]
            if words and words[0] == "posbench":
                found.append([HUB_MODELS.get(w, w) for w in words[1:]])
    return found


def all_commands() -> list[tuple[str, list[str]]]:
    return [(page.name, cmd) for page in PAGES for cmd in commands(page)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A directory laid out as the docs assume: the runs their placeholders name, a tiny Llama, SCROLLS data."""
    from posbench.hf.tiny import save_tiny_llama

    work = tmp_path_factory.mktemp("docs")
    made = work / "made"
    quiet = ["-q", "-o", str(made), "--set", "train.threads=1"]
    for args in (["-e", "rope,tape,alibi", "-t", "pretrain", "-p", "tiny"], ["-e", "tape", "-t", "arithmetic",
                                                                          "-p", "tiny"]):
        assert main(["run", *args, *quiet]) == 0
    save_tiny_llama(work / "Llama-2-7b-hf", max_positions=64, layers=2)
    assert main(["extend", "--model", str(work / "Llama-2-7b-hf"), "--method", "tape", "--length", "128", "--data",
                 "stdlib", "--preset", "tiny", "-q", "-o", str(made)]) == 0
    for task, label in (("pretrain", "rope"), ("pretrain", "tape"), ("pretrain", "alibi"), ("arithmetic", "tape"),
                        ("extend", "llama+tape")):
        run = next((made / task / label).iterdir())
        shutil.copytree(run, work / "results" / task / label / "RUN_ID")
    (work / "scrolls_data").symlink_to(ROOT / "tests" / "fixtures" / "scrolls")
    (work / "docs").symlink_to(ROOT / "docs")
    refs = [json.loads(line) for line in (ROOT / "tests/fixtures/scrolls/qasper/validation.jsonl").read_text()
            .splitlines()]
    (work / "predictions.json").write_text(json.dumps({r["id"]: "yes" for r in refs}))
    return work


def run_command(args: list[str], work: Path) -> tuple[int, str]:
    if args[0] == "hf.tiny":
        from posbench.hf.tiny import main as tiny

        tiny(args[1:])
        return 0, ""
    if args[0] in RUN_LIKE:
        args = [*args, "--dry-run"]
    if args[0] == "compare":            # each page is followed afresh: compare never overwrites an earlier page's
        for flag in ("--plots", "--html"):
            if flag in args:
                target = work / args[args.index(flag) + 1]
                shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue() + err.getvalue()


def test_every_documented_command_runs(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    found = all_commands()
    assert len(found) > 40, found
    subcommands = {cmd[0] for _, cmd in found}
    assert {"run", "extend", "bench", "compare", "ls", "export", "score", "hf.tiny"} <= subcommands
    failures = []
    for page, cmd in found:
        code, output = run_command(cmd, workdir)
        if code != 0:
            failures.append(f"{page}: posbench {shlex.join(cmd)} -> {code}: {output.strip()[-400:]}")
    assert not failures, "\n".join(failures)


def test_every_python_block_runs(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    ran = 0
    for page in PAGES:
        if page.name in PYTHON_ELSEWHERE:
            continue
        for block in blocks(page, "python"):
            exec(compile(block, str(page), "exec"), {"__name__": f"docs_{page.stem}"})
            ran += 1
    assert ran >= 3


def test_the_readme_is_a_front_door():
    """Under 250 lines; the quick start's two commands, the test command CI runs (through the lock), and a link to
    every page."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 250
    assert "posbench run --encoding rope,alibi --task perplexity" in readme
    command = 'python -m pip install -q "torch==2.13.0" -c constraints.txt -e ".[dev]" && python -m pytest -q'
    assert command in readme
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert command in ci
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{page.name})" in readme, page.name
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).exists(), link


def test_the_lock_pins_every_dependency_the_project_declares():
    """constraints.txt gives one exact version (``==``) for each runtime and dev dependency in pyproject.toml, and
    torch at the CPU build the test command installs."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["dev"]
    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, line
            pins[re.sub(r"[-_.]+", "-", name.lower())] = version
    for requirement in wanted:
        name = re.sub(r"[-_.]+", "-", re.split(r"[<>=!~\[ ]", requirement, maxsplit=1)[0].lower())
        assert name in pins, requirement
    assert pins["torch"] == "2.13.0"
