"""The one way through: configuration -> run directory -> model -> training phases -> evaluation -> record.

``execute(config)`` starts a run (``posbench run``, ``posbench extend`` and ``posbench bench`` all come here);
``resume(run_dir)`` continues a killed one in place: it reads the run's ``config.json`` and calls ``execute``
on the same directory, where each training phase resumes from its checkpoint and finished phases are skipped.

Under ``torchrun`` every process runs the same flow (``posbench.train.distributed``): rank 0 alone creates the
run directory and writes config, checkpoints, predictions and the record; every rank trains its slice and
evaluates its share of the work; only rank 0 shows progress.
"""

from __future__ import annotations

import copy
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from posbench.evaluation.metrics import METRICS
from posbench.files import check_name
from posbench.reporters import NullReporter
from posbench.runs.config import RunConfig, task_class, with_source
from posbench.runs.record import RESULT_FILE, ResultError, RunRecord, Timings, environment_info, posbench_info, \
    total_seconds, write_record
from posbench.runs.store import (CHECKPOINT_DIR, RunLock, new_run_dir, now_iso, read_config, read_phase,
                                 remove_unstarted, write_config, write_phase, write_predictions)
from posbench.train import distributed
from posbench.train.checkpoint import checkpoint_path
from posbench.train.compile_watch import EagerFallbacks
from posbench.train.device import autocast, pick_device, resolve_precision, setup_device
from posbench.train.seeds import seed_everything
from posbench.train.trainer import Trainer


@dataclass
class RunOutcome:
    run_dir: Path
    record: RunRecord | None
    main: bool = True           # False on torchrun's other ranks, which write and print nothing


def execute(config: RunConfig, out_root: Path | str = "results", *, reporter: Any = None, callbacks: tuple = (),
            command: list[str] | None = None, run_dir: Path | None = None) -> RunOutcome:
    """Run ``config`` end to end into ``<out_root>/<task>/<label>/<run-id>/`` (or continue ``run_dir``).

    The run directory is locked while this runs (a second ``--resume`` of it is refused). ``config.json`` is
    written once the run is fully checked (the task's data, the model and its tokenizer, the loggers): a run
    that stops before that removes the directory it created, so nothing is left that ``--resume`` or
    ``compare`` would find."""
    ctx, device = distributed.setup(pick_device(config.device))
    with distributed.peers_watched():
        lock: list[RunLock] = []
        try:
            return _execute(config, Path(out_root), ctx, device, reporter, callbacks, command, run_dir, lock)
        finally:
            for held in lock:
                held.release(finished=(held.path.parent / RESULT_FILE).is_file())


def _execute(config: RunConfig, out_root: Path, ctx: Any, device: torch.device, reporter: Any, callbacks: tuple,
             command: list[str] | None, run_dir: Path | None, lock: list) -> RunOutcome:
    from posbench.tasks import Task

    started = time.perf_counter()
    main = ctx.is_main
    code = posbench_info() if main else {}   # the commit this process imported, read now (a commit made while it
                                             # trains is not it); only rank 0 writes the record
    reporter = reporter if (reporter is not None and main) else NullReporter()
    task = task_class(config.task)(config)
    task.validate()
    setup_device(device, config.training.threads)
    fresh = run_dir is None
    run_dir = Path(distributed.run_on_main(lambda: str(open_run_dir(out_root, config, run_dir, lock))))
    try:
        if main:
            task.run_dir = run_dir
        seeds = seed_everything(config.seed)
        model, init_record = task.model_source.build(task, device)
        if model is not None:
            model.to(device)
        loggers = make_loggers(config, run_dir) if main else []
        if main:
            write_config(run_dir, config, command)
    except BaseException:
        if fresh and main:
            remove_unstarted(run_dir, out_root)
        raise
    fallbacks = EagerFallbacks()
    try:
        with fallbacks:
            trained = run_phases(task, model, run_dir, device, reporter, callbacks, loggers)
            precision = resolve_precision(config.training.precision, device)
            eval_start = time.perf_counter()
            if model is not None:
                model.eval()
            if isinstance(task, Task):
                with torch.no_grad(), autocast(device, precision):
                    evaluation = task.evaluate(model, device, reporter, trained)
            else:       # bench (posbench.bench): it builds its models and each timed step enters autocast itself
                evaluation = task.evaluate(model, device, reporter, trained)
    except BaseException:
        for logger in loggers:
            logger.close()
        raise
    if not main:
        return RunOutcome(run_dir, None, main=False)
    n_predictions = write_predictions(run_dir, evaluation.predictions)
    eval_s = time.perf_counter() - eval_start
    stored = read_config(run_dir)
    training = training_record(trained)
    record = RunRecord(
        run_id=run_dir.name, task=config.task, encoding=config.label, preset=config.preset, config=config,
        metrics=METRICS.as_declared(config.task, evaluation.metrics), primary_metric=evaluation.primary,
        grids=dict(evaluation.grids),
        model_config=model.config.to_dict() if model is not None else {}, training=training,
        timings=Timings(round(training.get("train_s", 0.0), 3), round(eval_s, 3),
                        round(total_seconds(time.perf_counter() - started, training.get("train_s", 0.0), eval_s,
                                            training.get("probe_s", 0.0)), 3),
                        round(training.get("tokens_per_s", 0.0), 1)),
        environment={**environment_info(device, precision),
                     **({"compile_fallbacks": fallbacks.found} if fallbacks.found else {})},
        seeds={**seeds, **task.seeds()},
        model={**model_facts(model, run_dir), **task.finish(model, run_dir)}, init=init_record,
        data=task.data_info(), evaluation=dict(evaluation.info), created=stored.get("created"), finished=now_iso(),
        command=list(stored.get("command") or command or []), posbench=code,
        predictions="predictions.jsonl" if n_predictions else None, n_predictions=n_predictions)
    if fallbacks.note():
        print(fallbacks.note(), file=sys.stderr)
    for logger in loggers:
        logger.finish({name: m.value for name, m in record.metrics.items()})
    write_record(run_dir, record)
    return RunOutcome(run_dir, record)


def open_run_dir(out_root: Path, config: RunConfig, run_dir: Path | None, lock: list) -> Path:
    """A fresh run directory (``run_dir`` None) or the one to continue, locked (the lock appended to
    ``lock``); a run that has finished meanwhile is refused."""
    if run_dir is None:
        run_dir = new_run_dir(out_root, config.task, config.label)
    lock.append(RunLock(run_dir))
    if (Path(run_dir) / RESULT_FILE).exists():
        raise ResultError(f"{run_dir} has already finished (result.json exists); start a new run instead")
    return Path(run_dir)


def run_phases(task: Any, model: Any, run_dir: Path, device: torch.device, reporter: Any, callbacks: tuple,
               loggers: list) -> dict[str, dict[str, Any]]:
    """Train each of the task's phases (resuming from its checkpoint), evaluate it, save its outcome."""
    phases = task.phases()
    initial = copy.deepcopy(model.state_dict()) if any(p.from_start for p in phases) else None
    outcomes: dict[str, dict[str, Any]] = {}
    main = distributed.current().is_main
    for phase in phases:
        saved = distributed.run_on_main(lambda: read_phase(run_dir, phase.name)) if phase.evaluate else None
        if saved is not None:                           # finished before a kill: its outcome is kept
            outcomes[phase.name] = saved
            continue
        if phase.from_start:
            model.load_state_dict(initial)
        if phase.seed is not None:
            seed_everything(phase.seed)
        checkpoint_dir = run_dir / CHECKPOINT_DIR / ("" if phase.name == "train" else phase.name)
        resume = distributed.run_on_main(lambda: checkpoint_path(checkpoint_dir) is not None)
        trainer = Trainer(model, phase.stream(), phase.train, device=device, checkpoint_dir=checkpoint_dir,
                          resume=resume, callbacks=callbacks, reporter=reporter,
                          seed=task.config.seed, description=f"{task.config.label} {phase.name}", loggers=loggers,
                          phase=phase.name, probe=phase.probe)
        outcome: dict[str, Any] = {"training": trainer.run().to_dict()}
        if phase.evaluate is not None:
            model.eval()
            with torch.no_grad(), autocast(device, trainer.precision):
                outcome["evaluation"] = phase.evaluate(model, device, reporter)
            if main:
                write_phase(run_dir, phase.name, outcome)
                if phase.from_start:                    # the outcome is kept; the next phase starts anew
                    shutil.rmtree(checkpoint_dir, ignore_errors=True)
        outcomes[phase.name] = outcome
    if initial is not None:
        model.load_state_dict(initial)
    return outcomes


def training_record(outcomes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The record's ``training``: the one phase's, or for several phases their totals and each one's."""
    trained = {name: o["training"] for name, o in outcomes.items()}
    if not trained:
        return {"steps": 0, "tokens": 0, "train_s": 0.0, "tokens_per_s": 0.0, "loss_history": []}
    if list(trained) == ["train"]:
        return trained["train"]
    train_s = sum(t.get("train_s", 0.0) for t in trained.values())
    tokens = sum(t.get("tokens", 0) for t in trained.values())
    return {"steps": sum(t.get("steps", 0) for t in trained.values()), "tokens": tokens, "train_s": train_s,
            "tokens_per_s": tokens / train_s if train_s > 0 else 0.0, "loss_history": [], "phases": trained}


def model_facts(model: Any, run_dir: Path) -> dict[str, Any]:
    from posbench.files import sha256_file

    if model is None:
        return {}
    weights = run_dir / CHECKPOINT_DIR / "model.safetensors"
    return {"parameters": model.num_parameters(),
            "checkpoint": f"{CHECKPOINT_DIR}/model.safetensors" if weights.is_file() else None,
            "checkpoint_sha256": sha256_file(weights) if weights.is_file() else None}


def make_loggers(config: RunConfig, run_dir: Path) -> list:
    if not config.logs:
        return []
    from posbench.loggers import make_loggers as build

    return build(config.logs, run_dir, config)


def resume(run_dir: Path | str, *, device: str | None = None, reporter: Any = None, callbacks: tuple = ()
           ) -> RunOutcome:
    """Continue a killed run in place (at any number of processes: a checkpoint holds the full state)."""
    run_dir = Path(run_dir)
    distributed.setup(pick_device(device or "auto"))

    def read() -> RunConfig:
        if (run_dir / RESULT_FILE).exists():
            raise ResultError(f"{run_dir} has already finished (result.json exists); start a new run instead")
        stored = read_config(run_dir)
        try:
            config = RunConfig.from_dict(stored["config"], earlier_values=True)
        except TypeError as exc:
            raise ResultError(f"{run_dir / 'config.json'} is not a posbench run config ({exc})") from None
        for field in ("task", "label"):
            check_name(getattr(config, field), f"{run_dir / 'config.json'}: the run's {field}", ResultError)
        return with_source(config)

    with distributed.peers_watched():
        config = distributed.run_on_main(read)
    if device is not None:
        config.device = device
    return execute(config, run_dir.parent.parent.parent, reporter=reporter, callbacks=callbacks, run_dir=run_dir)
