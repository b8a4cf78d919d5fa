"""The code a run ran, recorded so that it can be rebuilt, and checked before a run is published.

When posbench runs from a git checkout, the record's ``posbench`` holds ``git_commit`` (HEAD), ``git_dirty`` (the
working tree, untracked files included, differs from HEAD) and ``tree``: the git tree hash of the whole working
tree as it was when the run's process started (untracked files that are not ignored included), which identifies
its source exactly, and ``package_tree``, the hash of its ``posbench/`` folder alone (two runs of one package tree ran the same
code, whatever else of the checkout differed). When that tree is not HEAD's, or HEAD is not yet in the published history (the upstream
branch, where the checkout has one), the run directory gets ``code.patch``: the binary diff from ``base_commit``
(the upstream's merge base, else HEAD) to that tree, and the record names it (``patch``, ``patch_sha256``).
``git checkout BASE && git apply code.patch`` rebuilds the tree; ``git diff BASE TREE`` is the same patch.

``unrecoverable`` says why a record's code cannot be rebuilt from a repository (its commit is in none of its
history, its patch is missing or altered, it was dirty and kept no patch); studies/publish.py refuses such a
record in one line.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posbench.files import atomic_save

PATCH_FILE = "code.patch"
ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass
class CodeState:
    facts: dict[str, Any] = field(default_factory=dict)      # what the record's ``posbench`` holds
    patch: bytes | None = None                                # base -> working tree, when they differ

    def write_patch(self, run_dir: Path) -> None:
        """``code.patch`` in ``run_dir`` (atomically), and its name and hash in the facts; nothing without one."""
        if not self.patch:
            return
        atomic_save(Path(run_dir) / PATCH_FILE, lambda tmp: Path(tmp).write_bytes(self.patch))
        self.facts["patch"] = PATCH_FILE
        self.facts["patch_sha256"] = hashlib.sha256(self.patch).hexdigest()


def git(repo: Path, *args: str, env: dict[str, str] | None = None, text: bool = True) -> str | bytes | None:
    """``git -C repo args`` output, or None when git fails (not a checkout, no git)."""
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=30, text=text,
                              env={**os.environ, **(env or {})})
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() if text else done.stdout


#: each checkout's state, read once per process: the code a process runs is what it imported when it started, so a
#: second run in the same process (``posbench run -e a,b``, a test session) ran the same code
_CAPTURED: dict[str, CodeState] = {}


def capture(repo: Path | None = None) -> CodeState:
    """The state of the checkout ``repo`` (posbench's own by default; see the module docstring), read the first time
    this process asks (a copy each time); empty facts outside a git checkout."""
    repo = ROOT if repo is None else repo
    key = str(Path(repo).resolve())
    if key not in _CAPTURED:
        _CAPTURED[key] = read_state(Path(repo))
    state = _CAPTURED[key]
    return CodeState(dict(state.facts), state.patch)


def read_state(repo: Path) -> CodeState:
    """The checkout's state now."""
    commit = git(repo, "rev-parse", "HEAD")
    top = git(repo, "rev-parse", "--show-toplevel")
    if not commit or top is None or Path(top).resolve() != Path(repo).resolve():
        # not a checkout of its own: posbench installed into another project's tree (a .venv inside a
        # repository) would otherwise record that project's commit
        return CodeState({"git_commit": None, "git_dirty": None})
    tree = working_tree(repo)
    head_tree = git(repo, "rev-parse", "HEAD^{tree}")
    upstream = git(repo, "rev-parse", "--verify", "--quiet", "@{upstream}")
    base = (git(repo, "merge-base", "HEAD", upstream) if upstream else None) or commit
    facts: dict[str, Any] = {"git_commit": commit, "git_dirty": tree is not None and tree != head_tree}
    if tree is None:
        return CodeState(facts)
    facts["tree"] = tree
    package = git(repo, "rev-parse", f"{tree}:posbench")
    if package:
        facts["package_tree"] = package          # the posbench package alone: what the numbers depend on
    if tree == git(repo, "rev-parse", f"{base}^{{tree}}"):
        return CodeState(facts)
    facts["base_commit"] = base
    patch = git(repo, "diff", "--binary", "--full-index", base, tree, text=False)
    return CodeState(facts, patch if isinstance(patch, bytes) else None)


def working_tree(repo: Path) -> str | None:
    """The tree hash of the working tree, untracked files included, through a temporary index (the checkout's own
    index is not touched)."""
    with tempfile.TemporaryDirectory() as tmp:
        index = Path(tmp) / "index"
        env = {"GIT_INDEX_FILE": str(index)}
        own = git(repo, "rev-parse", "--path-format=absolute", "--git-path", "index")
        try:                                   # a copy of the checkout's index: its cached file states spare
            shutil.copy2(str(own), index)      # hashing every unchanged file again (its mtime kept: git
                                               # re-hashes the files changed in its last second, racy git)
        except (OSError, TypeError):
            if git(repo, "read-tree", "HEAD", env=env) is None:
                return None
        if git(repo, "add", "-A", env=env) is None:
            return None
        return git(repo, "write-tree", env=env)


def unrecoverable(facts: dict[str, Any], run_dir: Path, repo: Path | None = None) -> str | None:
    """Why the code of a run (its record's ``posbench``) cannot be rebuilt from ``repo``'s history (posbench's own
    checkout by default), or None."""
    repo = ROOT if repo is None else repo
    commit = facts.get("git_commit")
    if not commit:
        return "it recorded no commit (posbench did not run from a git checkout)"
    base = facts.get("base_commit") or commit
    if not in_history(repo, base):
        return f"its commit {str(base)[:12]} is in no history of {repo} (a rewritten or never published commit)"
    patch = facts.get("patch")
    if patch:
        path = Path(run_dir) / str(patch)
        if not path.is_file():
            return f"its patch {path} is missing"
        if hashlib.sha256(path.read_bytes()).hexdigest() != facts.get("patch_sha256"):
            return f"its patch {path} is not the one it recorded (SHA-256 differs)"
        return None
    if facts.get("git_dirty"):
        return (f"it ran from a working tree with changes not in commit {str(commit)[:12]} and kept no patch of "
                f"them (recorded before posbench kept {PATCH_FILE})")
    return None


def in_history(repo: Path, commit: str) -> bool:
    """Whether ``commit`` exists in ``repo`` and is an ancestor of its HEAD."""
    return git(repo, "merge-base", "--is-ancestor", str(commit), "HEAD") is not None
