import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Idle OpenMP threads sleep instead of spinning, in this process and every process a test starts (set before torch
# loads its OpenMP runtime, which reads it once). The workers share the cores, and a run a test starts picks its
# threads from the cores it may use, not from what the other worker runs: two such runs side by side kept four
# threads on two cores, the idle ones spinning. Measured on this project's 2-core Xeon: test_contextual's ten tiny
# runs on two workers took 61 s spinning, 11 s with this (each alone: 1 to 3 s). It changes no result, only waiting.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:              # not Linux
        return os.cpu_count() or 1


# pytest-xdist (the README's command: -n auto): each worker gets its share of the cores, so two workers on two
# cores run one torch thread each; one process alone keeps two
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, torch.get_num_threads(), cpus() // WORKERS)))
torch.set_flush_denormal(True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject's addopts): one worker per CPU, at most 8; none (one process, as without xdist) on
    a single CPU, and for the GPU tests alone (``-m gpu``, as benchmarks/gpu/run.sh runs them): they share one
    device."""
    if config.getoption("markexpr", "") == "gpu":
        return 0
    n = min(8, cpus())
    return n if n >= 2 else 0


def shares_a_module_fixture(item) -> bool:
    """Whether the test uses a fixture its module's tests share (scope module, class or package): the tests of
    such a module run in one worker, so that the fixture is made once (a worker makes its own of each)."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(d and d[-1].scope in ("module", "class", "package") for d in defs)


#: a folder the main process makes for a run with workers: each worker writes there the group of each test that has
#: one, and the scheduler below reads it
GROUPS = "POSBENCH_TEST_GROUPS"


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        return
    compile_the_package()
    if getattr(config.option, "numprocesses", None):
        config.posbench_groups = os.environ[GROUPS] = tempfile.mkdtemp(prefix="posbench-test-groups-")


def compile_the_package() -> None:
    """posbench's bytecode, written once before any test: the suite starts a few hundred Python processes
    (``posbench`` commands, sweep cells, the GPU call's phases), and where ``PYTHONDONTWRITEBYTECODE`` is set (as in
    CI's image and many Python containers) each would compile every module it imports from source again (about
    0.25 s a process on a fresh clone). Python reads bytecode it may not write; a module edited since is compiled
    from source as before. Up-to-date files are skipped, so a second run pays nothing."""
    import compileall

    package = Path(__file__).resolve().parent.parent / "posbench"
    if package.is_dir():
        compileall.compile_dir(str(package), quiet=2)        # a read-only checkout: compiled per process, as before


def pytest_unconfigure(config):
    folder = getattr(config, "posbench_groups", None)       # this process's own (a pytest a test starts inherits it)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        if os.environ.get(GROUPS) == folder:
            del os.environ[GROUPS]


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """Each test is a unit of work, sent to whichever worker is free, except the tests of one ``xdist_group``: one
    unit, one worker, in turn. Units go out in the order collected (the slow tests first).

    xdist's own ``--dist loadgroup`` passes a test's group to the scheduler inside its node id, which pytest 9.2
    no longer lets a plugin change: it silently stops grouping (pytest-dev/pytest-xdist#1386). The groups travel
    here through files instead."""
    from xdist.scheduler import LoadScopeScheduling

    folder = os.environ.get(GROUPS)
    if not folder:
        return None
    config.option.loadscopereorder = False          # xdist would put the units with the most tests first

    class GroupScheduling(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:                 # first called once every worker has collected (and written)
                self.groups = {}
                for path in Path(folder).glob("*.json"):
                    self.groups.update(json.loads(path.read_text()))
            return self.groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)


def group_of(item) -> str | None:
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    return "_".join(names) or None


@pytest.hookimpl(tryfirst=True)      # before xdist's own hook (it renames grouped tests, where pytest lets it)
def pytest_collection_modifyitems(config, items):
    # the slow tests first (a stable sort), so that with workers they start early and the fast ones fill in
    # around them: the whole run ends with short tests, not one worker finishing a long one alone
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    for item in items:
        if shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    if torch.cuda.is_available():       # the GPU tests share one device: one worker runs them all, in turn
        for item in items:
            if item.get_closest_marker("gpu") is not None:
                item.add_marker(pytest.mark.xdist_group("gpu"))
    if hasattr(config, "workerinput") and os.environ.get(GROUPS):
        groups = {item.nodeid: group for item in items if (group := group_of(item)) is not None}
        path = Path(os.environ[GROUPS]) / f"{config.workerinput['workerid']}.json"
        path.with_suffix(".tmp").write_text(json.dumps(groups))
        path.with_suffix(".tmp").replace(path)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu") is not None:     # the marker: keywords also hold folder names ("gpu")
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True, tryfirst=True)     # around pytest's own: the line comes after its short summary
def pytest_terminal_summary(terminalreporter):
    """One line when peer tests of an authors' release skipped because the release is not fetched
    (tests/release_source.py): which test files, and how to fetch it."""
    try:
        return (yield)
    finally:
        try:
            from release_source import skipped_releases_line       # beside this file, on the path pytest gives
        except ImportError:                                          # tests (not under --import-mode=importlib)
            skipped_releases_line = None
        line = skipped_releases_line and skipped_releases_line(terminalreporter.stats.get("skipped", []))
        if line:
            terminalreporter.write_line(line)
