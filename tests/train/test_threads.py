"""``train.threads=0`` (issue 48, item 14): a CPU run uses the cores its process may run on (its affinity), shared
only among the processes posbench started on the machine (torchrun's ranks: ``LOCAL_WORLD_SIZE``), not the cores
minus the 1-minute load average (about 1 right after any command, so a quiet 2-core machine trained on one
thread). A number given (by the user, or by a sweep for each of its cells) is used as it is."""

from __future__ import annotations

import os

import pytest
import torch

from posbench.train import device


@pytest.fixture
def machine(monkeypatch):
    """A machine of ``cores`` cores that this process may all run on, its 1-minute load average ``load``."""
    def make(cores: int, load: float = 0.0, local_world_size: str | None = None):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
        monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load), raising=False)
        if local_world_size is None:
            monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
        else:
            monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world_size)
    before = torch.get_num_threads()
    yield make
    torch.set_num_threads(before)


def test_a_quiet_two_core_machine_trains_on_both_cores_after_a_command(machine):
    machine(2, load=1.0)                # what the load average reads right after pip install or a previous run
    assert device.auto_threads() == 2
    assert device.setup_device(torch.device("cpu"), 0) == 2


def test_the_load_average_of_other_work_does_not_count(machine):
    machine(16, load=12.0)
    assert device.auto_threads() == 16


def test_torchrun_ranks_share_the_cores(machine):
    machine(16, local_world_size="4")
    assert device.auto_threads() == 4
    machine(2, local_world_size="4")    # more ranks than cores: one thread each
    assert device.auto_threads() == 1
    machine(8, local_world_size="")     # set but empty, or not a number: one process
    assert device.auto_threads() == 8
    machine(8, local_world_size="two")
    assert device.auto_threads() == 8


def test_only_the_cores_the_process_may_run_on(monkeypatch, machine):
    machine(2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5}, raising=False)    # pinned (a sweep's slot, taskset)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert device.auto_threads() == 1


def test_a_number_given_is_used_as_it_is(machine):
    """``train.threads=N``, which a sweep passes to each of several cells sharing the machine."""
    machine(2, load=0.0)
    assert device.setup_device(torch.device("cpu"), 1) == 1
    assert device.setup_device(torch.device("cpu"), 3) == 3
