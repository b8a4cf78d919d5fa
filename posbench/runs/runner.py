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
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from posbench.cells import flattened
from posbench.evaluation.metrics import METRICS
from posbench.files import check_name, json_object, sha256_file
from posbench.loggers import make_loggers as build_loggers
from posbench.model.config import ModelConfig, current_names
from posbench.options import declared
from posbench.registry import loaded_plugins
from posbench.reporters import NullReporter
from posbench.runs.config import RECORDED_SECTIONS, RunConfig, check_recorded, task_class, with_source
from posbench.runs.code import CodeState, capture
from posbench.runs.record import RESULT_FILE, ResultError, RunRecord, Timings, environment_info, posbench_info, \
    total_seconds, write_record
from posbench.runs.store import (CHECKPOINT_DIR, RunLock, new_run_dir, now_iso, read_config, read_phase,
                                 remove_unstarted, write_config, write_phase, write_predictions)
from posbench.setting_facts import earlier_values
from posbench.tasks import Task
from posbench.train import distributed
from posbench.train.checkpoint import CONFIG, STATE, checkpoint_path
from posbench.train.compile_watch import EagerFallbacks
from posbench.train.config import TrainConfig
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
    started = time.perf_counter()
    main = ctx.is_main
    code = capture() if main else CodeState()   # the code this process imported, read now (a commit made while
                                                # it trains is not it); only rank 0 writes the record and the patch
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
            code.write_patch(run_dir)
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
        command=list(stored.get("command") or command or []), posbench=posbench_info(code),
        plugins=loaded_plugins(),
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
        if resume:
            distributed.run_on_main(lambda: check_checkpoint(run_dir, checkpoint_dir, task.config, model,
                                                              phase.train))
        trainer = Trainer(model, phase.stream(), phase.train, device=device, checkpoint_dir=checkpoint_dir,
                          resume=resume, callbacks=callbacks, reporter=reporter,
                          seed=task.config.seed, description=f"{task.config.label} {phase.name}", loggers=loggers,
                          phase=phase.name, probe=phase.probe, settings=run_settings(task.config))
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


def run_settings(config: RunConfig) -> dict[str, Any]:
    """What a checkpoint keeps of its run's configuration (``run_settings`` in ``train_state.json``), flat
    (``task``, ``seed``, ``model.d_model``, ``encoding.theta``, ``train.lr``, ``task.train_digits``, ...): all but
    the device, which ``--resume --device`` may change; and the SHA-256 of each plugin's code (``plugin NAME``)."""
    flat = {name: getattr(config, name) for name in ("task", "encoding", "label", "task_version", "seed", "init")}
    for section, key in RECORDED_SECTIONS.items():
        flat.update({f"{section}.{name}": value for name, value in getattr(config, key).items()})
    flat.update({f"plugin {plugin['module']}": plugin["sha256"] for plugin in loaded_plugins()})
    return flat


ABSENT = object()      # a setting the run's configuration does not hold


def check_checkpoint(run_dir: Path, checkpoint_dir: Path, config: RunConfig, model: Any, train: Any) -> None:
    """Refuse, in one line, to resume a checkpoint its run's configuration no longer describes (``config.json``
    edited after the run started): the settings the checkpoint kept (``run_settings``), the model it saved
    (``model_config.json``, for posbench's own model) and its training settings (``train_config``) must equal the
    run's, but for the settings that change no result (``changes_results=False``: threads, a batch size of
    evaluation). A setting the checkpoint lacks (written before the setting existed) is compared at the value
    runs had before it (``Added``); one without such a value is not compared."""
    found = checkpoint_path(checkpoint_dir)
    state = json_object(found / STATE) or {}
    before = flattened(earlier_values(config.encoding, config.task))
    ignored = settings_changing_nothing(config)
    pairs = [(state.get("run_settings"), run_settings(config)),
             (flat_train(state.get("train_config")), flat_train(train.to_dict()))]
    if isinstance(getattr(model, "config", None), ModelConfig):
        pairs.append((flat_model(json_object(found / CONFIG)), flat_model(model.config.to_dict())))
    differing: dict[str, tuple[Any, Any]] = {}
    for kept, now in pairs:
        if not isinstance(kept, dict):
            continue
        for name in [*kept, *(n for n in now if n not in kept and n in before)]:
            then = kept[name] if name in kept else before[name]
            if name not in ignored and name not in differing and (name not in now or now[name] != then):
                differing[name] = (now.get(name, ABSENT), then)
    if differing:
        def show(name: str, value: Any) -> str:
            if name.startswith("plugin "):          # a plugin's code: the start of its hash, or not loaded now
                return "not loaded" if value is ABSENT or value is None else str(value)[:12]
            return "absent" if value is ABSENT else repr(value)

        shown = "; ".join(f"{name} {show(name, now)} now, {show(name, then)} in the checkpoint"
                          for name, (now, then) in list(differing.items())[:4])
        more = f" (and {len(differing) - 4} more)" if len(differing) > 4 else ""
        raise ResultError(f"{run_dir / 'config.json'} (with the plugins loaded now) does not describe the run its "
                          f"checkpoint {found} holds: {shown}{more}; it was edited after the run started (or a "
                          f"plugin's code changed), and the checkpoint was trained as it said then. Restore it, or "
                          f"start a new run with the settings you want")


def flat_model(values: Any) -> dict[str, Any] | None:
    """A model configuration (``ModelConfig.to_dict()``, a checkpoint's ``model_config.json``) flat, named as a
    run's settings are (``model.d_model``, ``encoding.theta``)."""
    if not isinstance(values, dict):
        return None
    flat = {f"model.{k}": v for k, v in current_names(values).items() if k != "encoding_options"}
    options = values.get("encoding_options")
    flat.update({f"encoding.{k}": v for k, v in (options.items() if isinstance(options, dict) else ())})
    return flat


def flat_train(values: Any) -> dict[str, Any] | None:
    return {f"train.{k}": v for k, v in values.items()} if isinstance(values, dict) else None


def settings_changing_nothing(config: RunConfig) -> set[str]:
    """The run's settings declared ``changes_results=False`` (``model.attention``, ``train.threads``, ...), and
    ``device``: a resume may change them."""
    task_cls = task_class(config.task)
    encoding_cls = task_cls.model_source.encodings().get(config.encoding) if config.encoding is not None else None
    owners = {"model": ModelConfig, "train": TrainConfig, "encoding": encoding_cls, "task": task_cls}
    return {"device", *(f"{section}.{name}" for section, owner in owners.items() if owner is not None
                        for name, option in declared(owner).items() if not option.changes_results)}


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
    if model is None:
        return {}
    weights = run_dir / CHECKPOINT_DIR / "model.safetensors"
    return {"parameters": model.num_parameters(),
            "checkpoint": f"{CHECKPOINT_DIR}/model.safetensors" if weights.is_file() else None,
            "checkpoint_sha256": sha256_file(weights) if weights.is_file() else None}


def make_loggers(config: RunConfig, run_dir: Path) -> list:
    if not config.logs:
        return []
    return build_loggers(config.logs, run_dir, config)


def resume(run_dir: Path | str, *, device: str | None = None, reporter: Any = None, callbacks: tuple = ()
           ) -> RunOutcome:
    """Continue a killed run in place (at any number of processes: a checkpoint holds the full state)."""
    run_dir = Path(run_dir)
    distributed.setup(pick_device(device or "auto"))

    def read() -> RunConfig:
        if (run_dir / RESULT_FILE).exists():
            raise ResultError(f"{run_dir} has already finished (result.json exists); start a new run instead")
        return resumed_config(run_dir)

    with distributed.peers_watched():
        config = distributed.run_on_main(read)
    if device is not None:
        config.device = device
    return execute(config, run_dir.parent.parent.parent, reporter=reporter, callbacks=callbacks, run_dir=run_dir)


def resumed_config(run_dir: Path | str) -> RunConfig:
    """The configuration a run directory's ``config.json`` records, for running it again (``--resume``, and its
    dry run), checked as a new one is (``runs.config.check_recorded``): one line when it is not one this posbench
    runs (a setting it does not declare, a section that is not an object, a value out of range)."""
    run_dir = Path(run_dir)
    where = run_dir / "config.json"
    stored = read_config(run_dir)
    unknown = sorted(set(stored["config"]) - {field.name for field in fields(RunConfig)})
    if unknown:
        raise ResultError(f"{where}: {', '.join(unknown)} is not a field of a run config this posbench records "
                          f"(a record of another posbench version, or edited?); it cannot be run again as recorded")
    try:
        config = RunConfig.from_dict(stored["config"], earlier_values=True)
    except TypeError as exc:
        raise ResultError(f"{where} is not a posbench run config ({exc})") from None
    for field in ("task", "label"):
        check_name(getattr(config, field), f"{where}: the run's {field}", ResultError)
    config = with_source(config)
    check_recorded(config, str(where))
    return config
