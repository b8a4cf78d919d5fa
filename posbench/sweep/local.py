"""``--executor local``: N cells at a time on this machine, each a process of its own.

The machine is cut into N slots. With GPUs (the study's device is not ``cpu`` and CUDA sees some), a slot is
``gpus_per_cell`` of them, given to the cell as ``CUDA_VISIBLE_DEVICES`` (a slot of several runs the cell
under torchrun), and N is the number of such groups unless ``--jobs`` says fewer. On CPUs a slot is
``cores / N`` of the cores this process may use: the cell's process is pinned to them and trains with that
many threads (``train.threads``), so two cells on two cores do not spin-wait for each other.

Each cell process leads a process group (a session) of its own, which its run joins: the pid the sweep prints
is that group's. A cell process that ends, however it ends (``kill`` of that pid, even ``kill -9``), takes its
whole group with it: the sweep ends what is left of the group (the run, torchrun's workers) before it records
the cell, so a cell it calls killed is not still training, and never finishes behind the sweep's back. Ctrl-C
and SIGTERM reach only the sweep (the cells are not in the terminal's group): it sends the same signal to every
running cell's group and waits for each to record its state.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posbench.files import atomic_write_json
from posbench.sweep.cell import LOG_FILE, SAFE_PATH, SPEC_FILE, describe_exit, is_locked
from posbench.sweep.study import StudyError

#: how long a cell's group has, after SIGTERM, before what is left of it gets SIGKILL
GRACE_S = 10.0


@dataclass
class Slot:
    cpus: list[int] | None
    gpus: list[str] = field(default_factory=list)
    threads: int = 1


@dataclass
class LocalHandle:
    cell_id: str
    cell_dir: Path
    process: subprocess.Popen | None        # None: a cell another sweep runs (its lock is held)
    slot: Slot | None
    started: float = field(default_factory=time.monotonic)

    def describe(self) -> str:
        return f"pid {self.process.pid}" if self.process is not None else "another sweep"


def usable_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return list(range(os.cpu_count() or 1))


def visible_gpus() -> list[str]:
    """The CUDA devices this process may use, as ``CUDA_VISIBLE_DEVICES`` names them."""
    import torch  # torch: only counting GPUs needs it (a sweep's plan is read without it)

    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed:
        return [g.strip() for g in listed.split(",") if g.strip()][:torch.cuda.device_count()]
    return [str(i) for i in range(torch.cuda.device_count())]


def make_slots(jobs: int | None, gpus: list[str], gpus_per_cell: int, cores: list[int]) -> list[Slot]:
    if gpus:
        groups = [gpus[i:i + gpus_per_cell] for i in range(0, len(gpus) - gpus_per_cell + 1, gpus_per_cell)]
        groups = groups[:jobs] if jobs else groups
        per = max(1, len(cores) // max(1, len(groups)))
        return [Slot(cores[i * per:(i + 1) * per] if len(groups) <= len(cores) else None, g, per)
                for i, g in enumerate(groups)]
    jobs = jobs or 1
    per = max(1, len(cores) // jobs)
    return [Slot(cores[i * per:(i + 1) * per] if jobs <= len(cores) else None, [], per) for i in range(jobs)]


class LocalExecutor:
    name = "local"

    def __init__(self, jobs: int | None = None, gpus_per_cell: int = 1, device: str = "auto"):
        gpus = [] if device == "cpu" else visible_gpus()
        if gpus and len(gpus) < gpus_per_cell:
            raise StudyError(f"--gpus-per-cell {gpus_per_cell}: this machine shows {len(gpus)} GPU(s)")
        self.slots = make_slots(jobs, gpus, gpus_per_cell if gpus else 0, usable_cores())
        self.free = list(self.slots)
        self.uses_gpus = bool(gpus)

    @property
    def capacity(self) -> int:
        return len(self.slots)

    def has_room(self) -> bool:
        return bool(self.free)

    def describe(self) -> str:
        slot = self.slots[0]
        if self.uses_gpus:
            each = f"{len(slot.gpus)} GPU(s) each ({' | '.join(','.join(s.gpus) for s in self.slots)})"
        elif self.threads():
            each = f"{slot.threads} core(s) and thread(s) each"
        else:
            each = "train.threads as the cell's settings say (default 0: the free cores)"
        return f"local: {self.capacity} cell(s) at a time, {each}"

    def threads(self) -> int | None:
        """``train.threads`` for each cell: its share of the cores when several CPU cells share the machine;
        None (posbench's own choice, the free cores) for one cell at a time or for GPU cells."""
        return self.slots[0].threads if len(self.slots) > 1 and not self.uses_gpus else None

    def start(self, spec: dict[str, Any]) -> LocalHandle:
        slot = self.free.pop(0)
        spec = {**spec, "cpus": slot.cpus, "gpus": len(slot.gpus), "own_group": True,
                "env": {"CUDA_VISIBLE_DEVICES": ",".join(slot.gpus)} if slot.gpus else {}}
        cell_dir = Path(spec["dir"])
        cell_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(cell_dir / SPEC_FILE, spec)
        with open(cell_dir / LOG_FILE, "ab") as log:
            process = subprocess.Popen([sys.executable, *SAFE_PATH, "-m", "posbench.sweep.cell",
                                        str(cell_dir / SPEC_FILE)], stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        return LocalHandle(spec["id"], cell_dir, process, slot)

    def state_of(self, cell_dir: Path) -> str | None:
        """"running" while another sweep runs the cell (its lock is held), else None."""
        return "running" if is_locked(cell_dir) else None

    def attach(self, cell_id: str, cell_dir: Path) -> LocalHandle | None:
        """A cell that another sweep is running now (its lock is held): followed, not started again."""
        return LocalHandle(cell_id, cell_dir, None, None) if is_locked(cell_dir) else None

    def refresh(self) -> None:
        pass

    def running(self, handle: LocalHandle) -> bool:
        if handle.process is None:
            return is_locked(handle.cell_dir)
        if handle.process.returncode is None:
            if not exited(handle.process):
                return True
            end_group(handle.process)                    # what the cell process leaves behind ends with it
        if handle.slot is not None and handle.slot not in self.free:
            self.free.append(handle.slot)
            self.free.sort(key=self.slots.index)
        return False

    def exit_code(self, handle: LocalHandle) -> int | None:
        return handle.process.returncode if handle.process is not None else None

    def end_state(self, handle: LocalHandle, record: dict) -> str:
        """How a killed cell ended: its run's exit, or the cell process's when it wrote no end."""
        if record.get("state") == "killed":
            return f"the run was {describe_exit(record.get('returncode'))}"
        code = self.exit_code(handle)
        return f"the cell process ended ({describe_exit(code)})" if code is not None else "it ended"

    def interrupt(self, handles: list[LocalHandle], timeout: float = 60.0, sig: int = signal.SIGINT) -> None:
        """After Ctrl-C or SIGTERM (``sig``), which only the sweep received: the same signal to every running cell's
        group (the cell process records the run's end), then wait for the cell processes; a cell still running
        after ``timeout`` seconds (or a second Ctrl-C) gets SIGTERM, then SIGKILL, group and all."""
        for handle in handles:
            if handle.process is not None and handle.process.returncode is None and not exited(handle.process):
                signal_group(handle.process, sig)
        deadline = time.monotonic() + timeout
        for handle in handles:
            if handle.process is None:
                continue
            try:
                while not exited(handle.process):
                    if time.monotonic() > deadline:
                        raise subprocess.TimeoutExpired(handle.process.args, timeout)
                    time.sleep(0.05)
            except (subprocess.TimeoutExpired, KeyboardInterrupt):
                signal_group(handle.process, signal.SIGTERM)
            end_group(handle.process)

    def still_running(self, handles: list[LocalHandle]) -> str:
        return ""


def exited(process: subprocess.Popen) -> bool:
    """Whether the cell process has ended, without reaping it: while it is unreaped its pid (its group's id) cannot
    be given to another process, so signalling its group reaches what is left of the cell and nothing else."""
    if process.returncode is not None:
        return True
    if not hasattr(os, "waitid") or not hasattr(os, "WNOWAIT"):      # (macOS) reaped as it is seen
        return process.poll() is not None
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:                           # already reaped elsewhere
        process.poll()
        return True


def signal_group(process: subprocess.Popen, sig: int) -> None:
    """``sig`` to the cell's process group (the cell process leads it: its pid is the group's id)."""
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def end_group(process: subprocess.Popen, grace_s: float | None = None) -> None:
    """End the cell's whole group (the cell process, a run it started, and whatever that started): SIGTERM, then
    after ``grace_s`` SIGKILL to what is left; then reap the cell process. A cell process that has ended with its
    group (the usual end) costs one look."""
    grace_s = GRACE_S if grace_s is None else grace_s
    if process.returncode is not None:
        return
    if not Path("/proc/self/stat").exists():              # no /proc to see the group's members: end them blind
        signal_group(process, signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            signal_group(process, signal.SIGKILL)
        process.wait()
        return

    def left() -> bool:
        return not exited(process) or group_has_others(process.pid)

    if left():
        signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while left() and time.monotonic() < deadline:
            time.sleep(0.05)
        if left():
            signal_group(process, signal.SIGKILL)
    process.wait()


def group_has_others(pgid: int) -> bool:
    """Whether a process other than the (ended, unreaped) leader ``pgid`` is still alive in its group (from /proc,
    Linux)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == pgid:
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()     # after "pid (comm) ": state, ppid, pgrp, ...
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False
