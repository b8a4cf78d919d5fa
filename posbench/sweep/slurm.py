"""``--executor slurm``: every cell is one SLURM job, submitted through submitit (``pip install
'posbench[slurm]'``) from the machine the sweep runs on (a login node), into the same output directory (a
shared file system, as submitit needs).

submitit writes the ``sbatch`` script, pickles the cell (``posbench.sweep.cell.CellJob``) and runs it under
``srun`` in the job; the cell runs ``posbench run`` as a child process, or ``torchrun --standalone
--nproc_per_node G`` for a cell with G GPUs. Submission options (partition, time, GPUs and CPUs per cell,
account, QOS, constraint, memory, any other ``sbatch`` option under ``additional``) come from the study's
``[slurm]`` table and the command line. Without ``time`` a cell asks for twice its preset's expected time plus
15 minutes.

A job that is preempted or near its time limit gets SIGUSR2 (submitit's ``--signal=USR2@90``): submitit calls
``CellJob.checkpoint`` and requeues the same job, which resumes the cell from its last checkpoint.

The sweep follows its jobs with one ``squeue`` call per poll (not ``sacct``: clusters without an accounting
database have none, and ``squeue`` shows finished jobs for ``MinJobAge`` seconds). A job that has left the
queue without writing its cell's final state was cancelled, timed out or lost its node: the cell is ``killed``,
and the next sweep resumes it from its checkpoint. A job still queued or running when a sweep starts (an
earlier sweep was stopped) is followed, not submitted again: its id is in the cell's ``job.json``.
"""

from __future__ import annotations

import math
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posbench.errors import UserError
from posbench.files import atomic_write_json, json_object
from posbench.options import OptionError, at_least, declared, option, resolve
from posbench.sweep.cell import SPEC_FILE, CellJob, is_locked
from posbench.sweep.text import control_character, shown_list

JOB_FILE = "job.json"
#: an sbatch option's name, as ``[slurm] additional`` may give one (``exclusive``, ``mail-type``, ``mail_user``)
SBATCH_OPTION = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
          "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}


class SlurmError(UserError):
    """No SLURM here, no submitit, or sbatch refused a job (one line)."""


@dataclass
class SlurmOptions:
    """The SLURM executor's settings, each declared once: the study's ``[slurm]`` table, the sweep's flags
    (``--partition gpu``, made from these declarations) and its ``--help`` read them. Empty text: not asked for."""

    partition: str = option("", "the partition (empty: the cluster's default)")
    time: Any = option(None, "time limit per cell, minutes or [D-]HH:MM:SS (none: twice the preset's expected time "
                             "+ 15 min)")
    gpus_per_cell: int = option(0, "GPUs per cell; more than one runs the cell under torchrun (local executor too)",
                                at_least(0))
    cpus_per_cell: int = option(1, "CPUs per job (and the cell's train.threads)", at_least(1))
    account: str = option("", "the account to charge")
    qos: str = option("", "the quality of service")
    constraint: str = option("", "the node features a job needs (sbatch --constraint)")
    mem: str = option("", "memory per node, e.g. 32G")
    max_jobs: int = option(0, "cells queued or running at once (0: every cell that is ready)", at_least(0))
    additional: Any = option(None, "any other sbatch option, a table: { exclusive = true }")


@dataclass
class SlurmHandle:
    cell_id: str
    cell_dir: Path
    job_id: str | None
    started: float = field(default_factory=time.monotonic)
    state: str = "PENDING"                  # the last state squeue showed ("GONE" once it has left the queue)
    last_state: str = ""                    # the state it ended in, when squeue still showed it

    def describe(self) -> str:
        return f"job {self.job_id}" if self.job_id else "another sweep"


def minutes(value: Any, where: str) -> int:
    """SLURM's time formats -> minutes (seconds rounded up): ``90`` (minutes), ``"MM:SS"``, ``"HH:MM:SS"``,
    ``"D-HH"``, ``"D-HH:MM"``, ``"D-HH:MM:SS"``; every part a whole number >= 0 (``"-5"`` is refused)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        days, dash, clock = value.strip().partition("-")
        if not dash:
            days, clock = "", days
        parts = [days] * bool(dash) + clock.split(":")
        if all(p.isascii() and p.isdigit() for p in parts) and len(clock.split(":")) <= 3:
            numbers = [int(p) for p in clock.split(":")]
            if dash:                                      # D-HH[:MM[:SS]]
                h, m, s = (numbers + [0, 0])[:3]
                total = int(days) * 1440 + h * 60 + m + math.ceil(s / 60)
            else:                                         # MM, MM:SS, HH:MM:SS
                h, m, s = (0, numbers[0], 0) if len(numbers) == 1 else ([0] * (3 - len(numbers)) + numbers)
                total = h * 60 + m + math.ceil(s / 60)
            if total > 0:
                return total
    raise SlurmError(f"{where}: time {value!r}: give minutes (90), HH:MM:SS or D-HH[:MM[:SS]] (SLURM's formats)")


class SlurmExecutor:
    name = "slurm"

    def __init__(self, folder: Path, options: SlurmOptions):
        missing = [p for p in ("sbatch", "squeue", "srun") if shutil.which(p) is None]
        if missing:
            raise SlurmError(f"--executor slurm: no {', '.join(missing)} on PATH (run the sweep on a machine that "
                             f"submits SLURM jobs, e.g. a login node)")
        try:
            import submitit  # submitit: optional (posbench[slurm]), only --executor slurm
        except ImportError:
            raise SlurmError("--executor slurm needs the submitit package: pip install 'posbench[slurm]'") from None
        self.options = options
        self.folder = Path(folder)
        one_line(str(self.folder), "the sweep's output folder")       # it becomes #SBATCH --output=...
        # the job's Python without the working directory on its module path (-P), as a local cell's
        self.submitit = submitit.SlurmExecutor(folder=str(self.folder / "%j"),
                                               python=f"{shlex.quote(sys.executable)} -P")
        self.handles: list[SlurmHandle] = []

    @property
    def capacity(self) -> int:
        return self.options.max_jobs or 1_000_000

    def has_room(self) -> bool:
        active = sum(1 for h in self.handles if h.state != "GONE")
        return active < self.capacity

    def describe(self) -> str:
        return describe(self.options)

    def threads(self) -> int:
        return self.options.cpus_per_cell

    def start(self, spec: dict[str, Any]) -> SlurmHandle:
        spec = {**spec, "gpus": self.options.gpus_per_cell}
        cell_dir = Path(spec["dir"])
        cell_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(cell_dir / SPEC_FILE, spec)
        try:
            self.submitit.update_parameters(**job_parameters(self.options, spec))
            job = self.submitit.submit(CellJob(spec))
        except (subprocess.CalledProcessError, ValueError, OSError) as exc:
            detail = getattr(exc, "stderr", None) or getattr(exc, "output", None) or str(exc)
            detail = detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
            lines = [x for x in detail.strip().splitlines() if x.strip()]
            raise SlurmError(f"sbatch refused cell {spec['id']}: {lines[-1] if lines else exc}") from None
        atomic_write_json(cell_dir / JOB_FILE, {"executor": "slurm", "job_id": str(job.job_id),
                                                "submitted": time.time(), "folder": str(job.paths.folder)})
        handle = SlurmHandle(spec["id"], cell_dir, str(job.job_id))
        self.handles.append(handle)
        return handle

    def state_of(self, cell_dir: Path) -> str | None:
        """"queued" or "running" while an earlier sweep's job has the cell (or another process holds its lock),
        else None; nothing is registered (``attach`` follows it)."""
        job = (json_object(Path(cell_dir) / JOB_FILE) or {}).get("job_id")
        if job:
            state = (queue_states([str(job)]) or {}).get(str(job))
            if state in ACTIVE:
                return "queued" if state == "PENDING" else "running"
        return "running" if is_locked(cell_dir) else None

    def attach(self, cell_id: str, cell_dir: Path) -> SlurmHandle | None:
        """The cell's job from an earlier sweep, while it is still queued or running; or a cell whose lock another
        process holds."""
        job = (json_object(Path(cell_dir) / JOB_FILE) or {}).get("job_id")
        if job:
            states = queue_states([str(job)]) or {}
            if states.get(str(job)) in ACTIVE:
                handle = SlurmHandle(cell_id, Path(cell_dir), str(job), state=states[str(job)])
                self.handles.append(handle)
                return handle
        if is_locked(cell_dir):
            handle = SlurmHandle(cell_id, Path(cell_dir), None, state="RUNNING")
            self.handles.append(handle)
            return handle
        return None

    def refresh(self) -> None:
        ids = [h.job_id for h in self.handles if h.job_id and h.state != "GONE"]
        if not ids:
            return
        states = queue_states(ids)
        if states is None:                        # slurmctld busy or down: nothing has changed
            return
        for handle in self.handles:
            if handle.job_id in ids:
                seen = states.get(handle.job_id)
                handle.state = seen if seen in ACTIVE else "GONE"
                handle.last_state = seen if seen and seen not in ACTIVE else handle.last_state

    def running(self, handle: SlurmHandle) -> bool:
        if handle.job_id is None:
            alive = is_locked(handle.cell_dir)
            handle.state = "RUNNING" if alive else "GONE"
            return alive
        return handle.state in ACTIVE

    def end_state(self, handle: SlurmHandle, record: dict) -> str:
        """How a killed cell's job ended: its last state in the queue (or in sacct)."""
        if handle.job_id is None:
            return "the other sweep's cell ended"
        last = handle.last_state or final_state(handle.job_id)
        return f"SLURM job {handle.job_id} ended {last}" if last else f"SLURM job {handle.job_id} left the queue"

    def interrupt(self, handles: list[SlurmHandle], timeout: float = 0.0, sig: int = 0) -> None:
        """Ctrl-C (or SIGTERM, ``sig``) stops the sweep, not its jobs: they go on, and the next sweep follows
        them."""

    def still_running(self, handles: list[SlurmHandle]) -> str:
        jobs = [h.job_id for h in handles if h.job_id]
        if not jobs:
            return ""
        return (f"{len(jobs)} SLURM job(s) still queued or running ({', '.join(jobs)}): rerun the same command to "
                f"follow them, or 'scancel {' '.join(jobs)}' to stop them")


def describe(o: SlurmOptions) -> str:
    parts = [f"partition {o.partition}" if o.partition else "default partition",
             f"{o.gpus_per_cell} GPU(s)" if o.gpus_per_cell else "no GPU", f"{o.cpus_per_cell} CPU(s) per cell",
             f"{o.time} min per cell" if o.time else "time from the presets"]
    if o.account:
        parts.append(f"account {o.account}")
    if o.max_jobs:
        parts.append(f"at most {o.max_jobs} jobs at once")
    return "slurm: " + ", ".join(parts)


def job_parameters(o: SlurmOptions, spec: dict[str, Any]) -> dict[str, Any]:
    """submitit's ``SlurmExecutor`` parameters for one cell (the ``#SBATCH`` lines of its job)."""
    expected = spec.get("expected_s")
    time_min = o.time or (math.ceil(2 * expected / 60) + 15 if expected else 60)
    params: dict[str, Any] = {"job_name": f"posbench:{spec['id']}", "time": time_min, "nodes": 1,
                              "ntasks_per_node": 1, "cpus_per_task": o.cpus_per_cell, "stderr_to_stdout": True}
    optional = {"partition": o.partition, "account": o.account, "qos": o.qos, "constraint": o.constraint,
                "mem": o.mem, "gpus_per_node": o.gpus_per_cell}
    params.update({k: v for k, v in optional.items() if v})
    if o.additional:
        params["additional_parameters"] = dict(o.additional)
    for key, value in [*params.items(), *(params.get("additional_parameters") or {}).items()]:
        if isinstance(value, str):
            one_line(value, f"slurm {key}")       # each is a #SBATCH line of the job script: never two
    return params


def one_line(value: str, where: str) -> str:
    """``value`` when it holds no control character; else one line refusing it (a newline in an sbatch option
    would make a line of its own in the job script, which bash runs as a command)."""

    found = control_character(value)
    if found:
        raise SlurmError(f"{where} {shown_list(value)} holds a control character ({found}); SLURM options are one "
                         f"line of printable text")
    return value


def queue_states(job_ids: list[str]) -> dict[str, str] | None:
    """job id -> its state in ``squeue`` (finished jobs show for ``MinJobAge`` seconds); absent ids have left.
    None when squeue does not answer."""
    try:
        done = subprocess.run(["squeue", "--me", "-h", "-t", "all", "-o", "%i|%T"], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    wanted = set(job_ids)
    states = {}
    for line in done.stdout.splitlines():
        job, _, state = line.strip().partition("|")
        if job in wanted:
            states[job] = state.strip()
    return states


def final_state(job_id: str | None) -> str:
    """A finished job's state from ``sacct`` where the cluster keeps accounting; "" elsewhere."""
    if not job_id or shutil.which("sacct") is None:
        return ""
    try:
        done = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    words = done.stdout.split() if done.returncode == 0 else []
    return words[0] if words else ""


def slurm_options(table: dict[str, Any], overrides: dict[str, Any]) -> SlurmOptions:
    """The study's ``[slurm]`` table, then the command line's options (those given), each through its declaration
    (``SlurmOptions``); ``time`` in minutes."""
    given = {**table, **{k: v for k, v in overrides.items() if v is not None}}
    try:
        values = resolve("slurm", declared(SlurmOptions), given, label="slurm ")
    except OptionError as exc:
        raise SlurmError(str(exc)) from None
    if values["time"] is not None:
        values["time"] = minutes(values["time"], "slurm")
    if values["additional"] is not None and not isinstance(values["additional"], dict):
        raise SlurmError("slurm additional must be a table of sbatch options, e.g. { exclusive = true }")
    for key, value in values.items():
        if isinstance(value, str):
            one_line(value, f"slurm {key}")
    for key, value in (values["additional"] or {}).items():
        if not isinstance(key, str) or not SBATCH_OPTION.fullmatch(key):
            raise SlurmError(f"slurm additional: {key!r} is not an sbatch option's name (letters, digits, - and _, "
                             f"e.g. mail-type)")
        if isinstance(value, str):
            one_line(value, f"slurm additional {key}")
        elif not isinstance(value, (bool, int, float)):
            raise SlurmError(f"slurm additional {key} = {value!r}: give a string, a number or true")
    return SlurmOptions(**values)
