"""Read an authors' public release at a pinned commit and load its Python files at test time.

A release is a bare git mirror of its public repository (no work tree), at ``ROOT/<owner>+<name>/repo`` (or
``ROOT/<owner>+<name>``), ROOT being ``$POSBENCH_RELEASES`` when set, else ``/work/.mirror`` (where the search
tool's fetch puts ``github:<owner>/<name>``). Nothing of the release is copied into posbench: a test reads the
file with ``git show COMMIT:PATH`` when it runs and executes that text as a module, and skips when the mirror
or the commit is absent (``require``).

Modules load into a private package per commit (``_release.<owner>_<name>_<commit>.<folder>``), so the
release's relative imports (``from .embeddings import ...``) resolve to the same commit's files, and its
absolute imports that a test does not exercise can be replaced by stubs for the duration of the load only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import types
from contextlib import contextmanager
from pathlib import Path

import pytest

DEFAULT_ROOT = Path("/work/.mirror")
ROOT_ENV = "POSBENCH_RELEASES"


def releases_root() -> Path:
    return Path(os.environ.get(ROOT_ENV) or DEFAULT_ROOT)


def locate(owner: str, name: str) -> Path | None:
    """The release's git directory, or None when no mirror of it is there (or git is not installed)."""
    if shutil.which("git") is None:
        return None
    base = releases_root() / f"{owner}+{name}"
    for candidate in (base / "repo", base):
        if candidate.is_dir() and _git(candidate, "rev-parse", "--git-dir", check=False).returncode == 0:
            return candidate
    return None


def _git(path: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=check)


class Release:
    def __init__(self, owner: str, name: str, path: Path):
        self.owner, self.name, self.path = owner, name, path
        self._loaded: dict[tuple, types.ModuleType] = {}

    def __repr__(self) -> str:
        return f"Release({self.owner}/{self.name} at {self.path})"

    def has(self, commit: str) -> bool:
        return _git(self.path, "cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode == 0

    def show(self, commit: str, path: str) -> str:
        """The text of ``path`` at ``commit``."""
        return _git(self.path, "show", f"{commit}:{path}").stdout

    def files(self, commit: str) -> list[str]:
        return _git(self.path, "ls-tree", "-r", "--name-only", commit).stdout.split()

    def line_of(self, commit: str, path: str, text: str) -> int:
        """The 1-based line of the only line of ``path`` at ``commit`` holding ``text`` (an error when not one)."""
        hits = [i for i, line in enumerate(self.show(commit, path).splitlines(), 1) if text in line]
        assert len(hits) == 1, (commit, path, text, hits)
        return hits[0]

    def load(self, commit: str, path: str, *, source: str | None = None, tag: str = "",
             stubs: dict[str, types.ModuleType] | None = None) -> types.ModuleType:
        """Execute ``path`` at ``commit`` as a module of the commit's private package and return it.

        ``source`` replaces the file's text (a patched copy; give it a ``tag`` so it loads as its own module and
        the release's own stays as it is). A relative import loads the sibling file at the same commit first
        (same stubs, untagged). ``stubs`` maps absolute module names to stand-ins, in ``sys.modules`` only while
        the file executes. Loaded modules are cached per (commit, path, tag)."""
        key = (commit, path, tag)
        if key in self._loaded:
            return self._loaded[key]
        folder, _, filename = path.rpartition("/")
        package = self._package(commit, folder)
        stem = filename[:-3] if filename.endswith(".py") else filename
        text = self.show(commit, path) if source is None else source
        for sibling in _relative_imports(text):
            sibling_path = f"{folder}/{sibling}.py" if folder else f"{sibling}.py"
            if f"{package}.{sibling}" not in sys.modules:
                self.load(commit, sibling_path, stubs=stubs)
        module = types.ModuleType(f"{package}.{stem}{'_' + tag if tag else ''}")
        module.__package__ = package
        module.__file__ = f"{self.owner}/{self.name}@{commit}:{path}"
        sys.modules[module.__name__] = module
        try:
            with _stubbed(stubs or {}):
                exec(compile(text, module.__file__, "exec"), module.__dict__)
        except BaseException:
            del sys.modules[module.__name__]
            raise
        if not tag:
            setattr(sys.modules[package], stem, module)
        self._loaded[key] = module
        return module

    def _package(self, commit: str, folder: str) -> str:
        safe = re.sub(r"\W", "_", f"{self.owner}_{self.name}_{commit}")
        parts = ["_release", safe, *[re.sub(r"\W", "_", p) for p in folder.split("/") if p]]
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name not in sys.modules:
                package = types.ModuleType(name)
                package.__path__ = []                    # a package with nothing on disk: every module is exec'd
                sys.modules[name] = package
        return ".".join(parts)


def _relative_imports(text: str) -> list[str]:
    return sorted(set(re.findall(r"^\s*from \.(\w+) import", text, flags=re.M)))


@contextmanager
def _stubbed(stubs: dict[str, types.ModuleType]):
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update(stubs)
    try:
        yield
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous


def stub(name: str, **attributes) -> types.ModuleType:
    """A stand-in module ``name`` holding ``attributes``."""
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    return module


def require(owner: str, name: str, *commits: str) -> Release:
    """The release, or a skip saying how to fetch it when its mirror (or one of ``commits``) is not here."""
    path = locate(owner, name)
    where = releases_root() / f"{owner}+{name}" / "repo"
    if path is None:
        pytest.skip(f"release {owner}/{name} not fetched: no git mirror at {where} (fetch github:{owner}/{name} "
                    f"with the search tool's fetch, or set ${ROOT_ENV} to a folder of <owner>+<name>/repo mirrors)")
    release = Release(owner, name, path)
    missing = [c for c in commits if not release.has(c)]
    if missing:
        pytest.skip(f"release {owner}/{name} at {path} lacks commit(s) {', '.join(missing)}")
    return release


SKIPPED = re.compile(r"release ([\w.-]+/[\w.-]+) (not fetched|at \S+ lacks commit)")


def skipped_releases_line(reports) -> str | None:
    """The one line a test run prints (tests/conftest.py's ``pytest_terminal_summary``) when tests skipped because
    a release is not fetched (or its mirror lacks a pinned commit): the test files that skipped, and how to fetch
    each release; None when no test skipped so. ``reports``: the run's skip reports."""
    files: dict[str, int] = {}
    releases: dict[str, str] = {}
    for report in reports:
        longrepr = report.longrepr
        text = str(longrepr[2] if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3 else longrepr)
        found = SKIPPED.search(text)
        if found is None:
            continue
        path = report.nodeid.split("::")[0]
        files[path] = files.get(path, 0) + 1
        releases.setdefault(found.group(1), "not fetched" if found.group(2) == "not fetched" else "lacks a commit")
    if not files:
        return None
    which = ", ".join(f"{r} {why}" for r, why in sorted(releases.items()))
    tests = sum(files.values())
    fetch = " and ".join(f"github:{r}" for r in sorted(releases))
    clones = "; ".join(f"git clone --mirror https://github.com/{r} DIR/{r.replace('/', '+')}/repo"
                       for r in sorted(releases))
    return (f"release tests skipped ({which}): {', '.join(sorted(files))} ({tests} test{'s' * (tests != 1)}); "
            f"fetch {fetch} with the search tool's fetch (into {DEFAULT_ROOT}), or run {clones} and set "
            f"{ROOT_ENV}=DIR (now: {releases_root()})")


def cramming_stubs(bert_base: type, omegaconf: types.SimpleNamespace) -> dict[str, types.ModuleType]:
    """Stand-ins for the imports the arithmetic releases' ``cramming/architectures`` files make that the tests do not
    exercise: einops (RotaryEleutherAI only), BERT's attention (``bert_base`` as its base class), transformers'
    model registry (a ``PreTrainedModel`` that keeps its config, registrations that do nothing) and ``omegaconf``."""
    import torch

    class PreTrainedModel(torch.nn.Module):
        def __init__(self, config, *args, **kwargs):
            super().__init__()
            self.config = config

    auto = types.SimpleNamespace(register=lambda *args, **kwargs: None)
    return {
        "einops": stub("einops", repeat=None),
        "transformers.models.bert.modeling_bert": stub("transformers.models.bert.modeling_bert",
                                                       BertSelfAttention=bert_base),
        "transformers": stub("transformers", PretrainedConfig=object, PreTrainedModel=PreTrainedModel,
                             AutoConfig=auto, AutoModel=auto, AutoModelForCausalLM=auto),
        "omegaconf": stub("omegaconf", OmegaConf=omegaconf),
    }
