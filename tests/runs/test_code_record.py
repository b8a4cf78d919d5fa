"""A run's code is recoverable (``posbench.runs.code``): the record names the commit and the working tree's hash,
and where the tree is not the commit's the run directory keeps ``code.patch``, from which the tree is rebuilt
exactly (checked here by applying it in a fresh clone and comparing tree hashes); ``unrecoverable`` says why a
record cannot be rebuilt, and studies/publish.py refuses such a record in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from posbench.runs import code
from posbench.runs import runner
from posbench.runs.config import resolve_run_config

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "studies"))
import publish  # noqa: E402  (a script of studies/)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    (repo / "a.py").write_text("x = 1\n")
    (repo / ".gitignore").write_text("results/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    return repo


def test_a_clean_checkout_records_its_commit_and_tree_and_no_patch(repo):
    state = code.capture(repo)
    assert state.facts == {"git_commit": git(repo, "rev-parse", "HEAD"), "git_dirty": False,
                           "tree": git(repo, "rev-parse", "HEAD^{tree}")}     # no posbench/ folder in this one
    assert state.patch is None


def test_a_changed_tree_is_rebuilt_from_its_patch(repo, tmp_path):
    (repo / "a.py").write_text("x = 2\n")
    (repo / "new.py").write_text("y = 3\n")                       # untracked, not ignored: part of the code
    (repo / "results").mkdir()
    (repo / "results" / "big.bin").write_bytes(b"\0" * 10)         # ignored: not code
    before = git(repo, "status", "--porcelain")
    state = code.capture(repo)
    assert git(repo, "status", "--porcelain") == before            # the checkout's own index untouched
    assert state.facts["git_dirty"] and state.facts["base_commit"] == git(repo, "rev-parse", "HEAD")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    state.write_patch(run_dir)
    assert state.facts["patch"] == "code.patch"
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    git(clone, "checkout", "-q", state.facts["base_commit"])
    git(clone, "apply", str(run_dir / "code.patch"))
    assert (clone / "new.py").read_text() == "y = 3\n" and not (clone / "results").exists()
    git(clone, "add", "-A")
    assert git(clone, "write-tree") == state.facts["tree"]
    assert code.unrecoverable(state.facts, run_dir, repo) is None


def test_why_a_record_cannot_be_recovered(repo, tmp_path):
    head = git(repo, "rev-parse", "HEAD")
    assert code.unrecoverable({"git_commit": head, "git_dirty": False}, tmp_path, repo) is None
    assert "no history" in code.unrecoverable({"git_commit": "b4783901ac232aeabcbcaf89bcbb0c5c909618f6"}, tmp_path,
                                              repo)
    assert "no commit" in code.unrecoverable({"git_commit": None}, tmp_path, repo)
    assert "kept no patch" in code.unrecoverable({"git_commit": head, "git_dirty": True}, tmp_path, repo)
    facts = {"git_commit": head, "git_dirty": True, "base_commit": head, "patch": "code.patch", "patch_sha256": "0"}
    assert "missing" in code.unrecoverable(facts, tmp_path, repo)
    (tmp_path / "code.patch").write_text("changed")
    assert "not the one it recorded" in code.unrecoverable(facts, tmp_path, repo)


def test_a_run_keeps_the_patch_of_the_tree_it_ran(repo, tmp_path, monkeypatch):
    (repo / "a.py").write_text("x = 5\n")
    monkeypatch.setattr(code, "ROOT", repo)
    runner.execute(resolve_run_config("arithmetic", "rope", "tiny", sets=["steps=2", "task.eval_samples=2"]),
                   tmp_path / "out")
    result = next((tmp_path / "out").rglob("result.json"))
    facts = json.loads(result.read_text())["posbench"]
    assert facts["patch"] == "code.patch" and (result.parent / "code.patch").read_text().count("x = 5") == 1
    assert code.unrecoverable(facts, result.parent, repo) is None


def test_publish_refuses_a_cell_whose_commit_is_in_no_history(tmp_path, capsys):
    run = tmp_path / "sweep" / "cells" / "perplexity-rope-tiny-s0" / "perplexity" / "rope" / "20261201-000000-abcdef"
    run.mkdir(parents=True)
    fixture = ROOT / "tests" / "fixtures" / "study" / "runs" / "perplexity-rope-tiny-s0" / "result.json"
    record = json.loads(fixture.read_text())
    record["posbench"]["git_commit"] = "b4783901ac232aeabcbcaf89bcbb0c5c909618f6"
    (run / "result.json").write_text(json.dumps(record))
    (run / "config.json").write_text("{}")
    page = tmp_path / "page"
    assert publish.main([str(tmp_path / "sweep"), str(page)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "b4783901ac23" in err
    assert not page.exists()


#: published records whose code cannot be rebuilt, each with where its page says so; a record leaves this list when
#: it is rerun from a landed commit (the protocols study's 25 cells of a lost commit did, bit for bit)
NOT_RECOVERABLE = {
    "docs/studies/cpu/v2/runs/passkey-kerple-study-s0": "cpu.md, Code",
    "docs/studies/cpu/v2/runs/passkey-tape-study-s0": "cpu.md, Code",
    "docs/studies/cpu/v2/runs/perplexity-xpos-study-s0": "cpu.md, Code",
}


def test_every_published_record_names_code_that_can_be_rebuilt():
    """Every result.json under docs/ (studies and reference runs) names a commit on this checkout's history, clean or
    with its patch, except the records listed above, which their pages name; a newly published record of lost code
    fails, and so does a listed one that has become recoverable (the list must shrink with it). Needs the
    repository's history: skipped in a shallow clone or outside a git checkout."""
    shallow = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"], capture_output=True,
                             text=True)
    if shallow.returncode != 0 or shallow.stdout.strip() != "false":
        pytest.skip("needs the repository's whole history (a shallow clone, or not a git checkout)")
    records = sorted((ROOT / "docs").rglob("result.json"))
    assert len(records) > 300                       # the studies' and the reference runs' records are there
    lost = {str(r.parent.relative_to(ROOT)) for r in records
            if code.unrecoverable(json.loads(r.read_text()).get("posbench") or {}, r.parent, ROOT) is not None}
    assert lost == set(NOT_RECOVERABLE)
