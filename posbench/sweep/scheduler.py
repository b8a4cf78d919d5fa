"""The sweep itself: which cells to start, when, and how each one ended.

Before anything starts, every cell's folder says where it stands: a finished run -> ``complete`` (skipped); a
cell another sweep is running, or a SLURM job of an earlier sweep still queued -> followed; a cell that failed
-> ``failed`` again (started only with ``retry_failed``); anything else waits (a killed one resumes from its
checkpoint when it starts). Then cells start in plan order as the executor has room, a cell only once the cell
it starts from has finished; a cell whose parent failed, was killed or is blocked is ``blocked`` (reported, not
started). Each ended cell's state is the one its cell process wrote (``cell.json``), or ``killed`` when the
process or job ended without writing one.

Ctrl-C, SIGTERM and SIGHUP stop the sweep the same way, between two of its steps (never half-way through
starting a cell): the running cells get the signal (Ctrl-C's SIGINT; SIGTERM for the other two), the sweep
waits for them to record their end and raises ``KeyboardInterrupt`` (``Stopped`` for a signal other than
Ctrl-C's), so that the caller prints the table of every cell. A second signal stops the wait.
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posbench.files import json_object
from posbench.runs.record import record_seconds
from posbench.sweep.cell import CELL_FILE, LOG_FILE, SPEC_FILE, finished_run, last_line, read_record, \
    unfinished_run, write
from posbench.sweep.plan import Cell
from posbench.sweep.study import StudyError

CELLS_DIR = "cells"
FINISHED = ("done", "resumed", "complete")
ENDED_BADLY = ("failed", "killed", "blocked")
STOPPING = (signal.SIGINT, signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else []))


class Stopped(KeyboardInterrupt):
    """The sweep was stopped by a signal other than Ctrl-C (SIGTERM, SIGHUP): handled as Ctrl-C is."""

    def __init__(self, sig: int):
        super().__init__(f"stopped by {signal.Signals(sig).name}")
        self.signal = sig


@dataclass
class Outcome:
    cell: Cell
    state: str                      # waiting | queued | running | done | resumed | complete | failed | killed | blocked
    note: str = ""
    run_dir: str = ""
    log: str = ""
    seconds: float | None = None
    resumes: bool = False           # waiting with a run to resume
    handle: Any = None
    metric: str = ""                # the run's primary metric, once it has finished

    @property
    def ended(self) -> bool:
        return self.state in FINISHED or self.state in ENDED_BADLY


@dataclass
class Sweep:
    cells: list[Cell]
    out: Path
    executor: Any
    display: Any = None
    retry_failed: bool = False
    poll_s: float = 0.5
    outcomes: dict[str, Outcome] = field(default_factory=dict)

    def cell_dir(self, cell: Cell) -> Path:
        return self.out / CELLS_DIR / cell.id

    def spec(self, cell: Cell) -> dict[str, Any]:
        """What the cell process is given (the executor adds its cores or GPUs)."""
        args = cell.run_args()
        threads = self.executor.threads()
        if threads and not any(item.split("=", 1)[0].strip() in ("train.threads", "threads") for item in cell.sets):
            args += ["--set", f"train.threads={threads}"]
        parent = next((c for c in self.cells if c.id == cell.parent), None)
        return {"id": cell.id, "fingerprint": cell.fingerprint(), "dir": str(self.cell_dir(cell)), "args": args,
                "init_from": str(self.cell_dir(parent)) if parent is not None else None, "python": sys.executable,
                "expected_s": cell.expected_s}

    # ---- where each cell stands before the sweep ------------------------------------------------------------
    def check_folders(self) -> None:
        """A cell folder made by a different study (other settings under the same id) stops the sweep at once."""
        for cell in self.cells:
            made = json_object(self.cell_dir(cell) / SPEC_FILE)
            if made is not None and made.get("fingerprint") != cell.fingerprint():
                raise StudyError(f"{self.cell_dir(cell)} holds cell {cell.id} with other settings (was the study "
                                 f"changed?); give another --out, or remove that folder to run it anew")

    def initial(self, cell: Cell) -> Outcome:
        folder = self.cell_dir(cell)
        log = str(folder / LOG_FILE)
        done = finished_run(folder)
        if done is not None:
            return finished(cell, "complete", done, log, "finished before this sweep")
        handle = self.executor.attach(cell.id, folder)
        if handle is not None:
            state = "queued" if getattr(handle, "state", "") == "PENDING" else "running"
            return Outcome(cell, state, note=f"followed ({handle.describe()})", log=log, handle=handle)
        record = read_record(folder)
        if record.get("state") == "failed" and not self.retry_failed:
            return Outcome(cell, "failed", note=record.get("note") or last_line(folder / LOG_FILE), log=log,
                           run_dir=record.get("run_dir") or "")
        return Outcome(cell, "waiting", log=log, resumes=unfinished_run(folder) is not None)

    # ---- the loop -------------------------------------------------------------------------------------------
    def run(self) -> dict[str, Outcome]:
        self.check_folders()
        self.outcomes = {cell.id: self.initial(cell) for cell in self.cells}
        received: list[int] = []
        previous = catch_signals(received)
        try:
            while True:
                if received:
                    raise KeyboardInterrupt if received[0] == signal.SIGINT else Stopped(received[0])
                self.step()
                if self.display is not None:
                    self.display.update(self.outcomes)
                if not any(o.state in ("waiting", "queued", "running") for o in self.outcomes.values()):
                    break
                time.sleep(self.poll_s)
        except KeyboardInterrupt as stop:
            restore_signals(previous)                   # a second Ctrl-C now stops the wait below
            previous = {}
            sig = signal.SIGTERM if isinstance(stop, Stopped) else signal.SIGINT
            running = [o.handle for o in self.outcomes.values() if o.handle is not None and not o.ended]
            self.executor.interrupt(running, sig=sig)
            self.executor.refresh()
            for outcome in self.outcomes.values():
                if outcome.handle is not None and not outcome.ended and not self.executor.running(outcome.handle):
                    self.end(outcome)
            raise
        finally:
            restore_signals(previous)
        return self.outcomes

    def step(self) -> None:
        self.executor.refresh()
        for outcome in self.outcomes.values():
            if outcome.state in ("queued", "running") and not self.executor.running(outcome.handle):
                self.end(outcome)
            elif outcome.state == "queued" and getattr(outcome.handle, "state", "") == "RUNNING":
                outcome.state = "running"
                self.announce(outcome)
        for cell in self.cells:
            outcome = self.outcomes[cell.id]
            if outcome.state != "waiting":
                continue
            parent = self.outcomes.get(cell.parent) if cell.parent else None
            if parent is not None and parent.state in ENDED_BADLY:
                outcome.state, outcome.note = "blocked", f"not started: {parent.cell.id} {parent.state}"
                self.announce(outcome)
            elif (parent is None or parent.state in FINISHED) and self.executor.has_room():
                self.start(outcome)

    def start(self, outcome: Outcome) -> None:
        folder = self.cell_dir(outcome.cell)
        folder.mkdir(parents=True, exist_ok=True)
        write(folder, {**read_record(folder), "id": outcome.cell.id, "state": "queued"})
        outcome.handle = self.executor.start(self.spec(outcome.cell))
        outcome.state = "running" if self.executor.name == "local" else "queued"
        outcome.note = outcome.handle.describe() + (", resuming its run" if outcome.resumes else "")
        self.announce(outcome)

    def end(self, outcome: Outcome) -> None:
        folder = self.cell_dir(outcome.cell)
        record = json_object(folder / CELL_FILE) or {}
        state = record.get("state")
        outcome.seconds = time.monotonic() - outcome.handle.started
        if state == "done":
            kind = {"resume": "resumed", "none": "complete"}.get(record.get("action"), "done")
            done = finished(outcome.cell, kind, Path(record["run_dir"]), outcome.log, "")
            self.outcomes[outcome.cell.id] = outcome = done
        elif state == "failed":
            outcome.state, outcome.note = state, record.get("note") or ""
            outcome.run_dir = record.get("run_dir") or ""
        elif state not in ("killed", "failed") and finished_run(folder) is not None:
            # the cell process ended without writing its end, after its run had finished (result.json is the
            # run's last write): the cell is done, as the next plan will say
            ended = self.executor.end_state(outcome.handle, record)
            run_dir = finished_run(folder)
            write(folder, {**record, "state": "done", "run_dir": str(run_dir), "note": f"{ended} after its run "
                                                                                     f"finished"})
            self.outcomes[outcome.cell.id] = outcome = finished(outcome.cell, "done", run_dir, outcome.log, "")
        else:                                   # killed, or the process or job ended without writing its end
            ended = self.executor.end_state(outcome.handle, record)
            outcome.state, outcome.note = "killed", f"{ended}: rerun the sweep to resume it"
            outcome.run_dir = record.get("run_dir") or ""
            if state != "killed":
                write(folder, {**record, "state": "killed", "note": ended})
        self.announce(outcome)

    def announce(self, outcome: Outcome) -> None:
        if self.display is not None:
            self.display.event(outcome)


def catch_signals(received: list[int]) -> dict[int, Any]:
    """Ctrl-C, SIGTERM and SIGHUP recorded in ``received`` (the loop stops at its next step); a second one raises
    at once. A signal that is ignored (``nohup``, a shell's background job) is left so. Nothing is caught off the
    main thread."""
    def record(sig: int, _frame: Any) -> None:
        if received:
            raise KeyboardInterrupt if sig == signal.SIGINT else Stopped(sig)
        received.append(sig)

    previous: dict[int, Any] = {}
    for sig in STOPPING:
        try:
            if signal.getsignal(sig) is signal.SIG_IGN:    # nohup, or a shell's background job
                continue
            previous[sig] = signal.signal(sig, record)
        except ValueError:                                # not the main thread
            break
    return previous


def restore_signals(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def finished(cell: Cell, state: str, run_dir: Path, log: str, note: str) -> Outcome:
    """An outcome for a cell with a finished run: its primary metric and its time from ``result.json`` (the run's
    own ``total_s`` as ``record_seconds`` reads it, whichever sweep finished it: a rerun shows the same time for
    the same cell)."""
    result = json_object(Path(run_dir) / "result.json") or {}
    primary = result.get("primary_metric")
    metric = (result.get("metrics") or {}).get(primary) or {}
    value = metric.get("value")
    resumed = (result.get("training") or {}).get("resumed_from") or []
    if state == "resumed" and resumed:
        note = f"resumed from step {resumed[-1]}"
    text = f"{primary} {value:.4g}" if isinstance(value, (int, float)) else ""
    return Outcome(cell, state, note=note, run_dir=str(run_dir), log=log, metric=text,
                   seconds=record_seconds(result))
