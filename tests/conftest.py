import os

import pytest
import torch

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


@pytest.hookimpl(tryfirst=True)      # before xdist reads the xdist_group marks
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
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu") is not None:     # the marker: keywords also hold folder names ("gpu")
            item.add_marker(skip)
