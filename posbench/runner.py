"""The generic run flow the CLI drives: config -> model -> engine.train -> task.evaluate -> run directory.

``execute(config, out_root)`` starts a fresh run; ``resume(run_dir)`` continues a killed one from its last
checkpoint (same directory, same config). Both return the finished run's directory and result dict.

Under ``torchrun`` every process runs the same flow (``posbench.distributed``): rank 0 alone creates the run
directory and writes config, checkpoints, predictions and the result; every rank trains its slice and
evaluates its share of the work; only rank 0 shows progress.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from posbench import distributed, engine
from posbench.config import ConfigError, RunConfig
from posbench.results import (CHECKPOINT_DIR, CONFIG_FILE, PREDICTIONS_FILE, RESULT_FILE, ResultError,
                              atomic_write_json, new_run_dir, now_iso, read_run_config, result_header,
                              result_timings, sha256_file, write_predictions)


@dataclass
class RunOutcome:
    run_dir: Path
    result: dict[str, Any]
    main: bool = True           # False on torchrun's other ranks, which write and print nothing


def execute(config: RunConfig, out_root: Path | str = "results", *, reporter: Any = None,
            callbacks: tuple = (), command: list[str] | None = None, run_dir: Path | None = None,
            resume: bool = False) -> RunOutcome:
    """Run one (task, encoding) end to end and write ``<out_root>/<task>/<encoding>/<run-id>/``."""
    from posbench.tasks import TASKS

    from posbench.progress import NullReporter

    started = time.perf_counter()
    ctx, device = distributed.setup(engine.pick_device(config.device))
    main = ctx.is_main
    reporter = reporter if (reporter is not None and main) else NullReporter()
    task = TASKS.get(config.task)(config)
    task.validate()
    train_cfg = engine.TrainConfig(**config.train)
    engine.setup_device(device, train_cfg.threads)
    created = now_iso()
    if run_dir is None:
        made = distributed.run_on_main(lambda: str(new_run_dir(Path(out_root), config.task, config.encoding)))
        run_dir = Path(made)
    task.run_dir = run_dir if main else None   # tasks that save files with the run (a trained tokenizer)
    if main and not (run_dir / CONFIG_FILE).exists():
        atomic_write_json(run_dir / CONFIG_FILE, {"config": config.to_dict(), "created": created,
                                                  "command": command or sys.argv})
    seeds = engine.seed_everything(config.seed)

    from posbench.hf.runs import build_init_model

    hf_init = build_init_model(config, task, device)     # (model, init record) for a Hugging Face --init, else None
    if hf_init is not None:
        model, init_info = hf_init
    else:
        model, init_info = _posbench_model(config, task, resume)

    stream = task.train_stream() if train_cfg.steps > 0 else None
    checkpoint_dir = run_dir / CHECKPOINT_DIR
    train_result = engine.train(model, stream, train_cfg, device=device, checkpoint_dir=checkpoint_dir,
                                resume=resume, loss_fn=task.loss, callbacks=callbacks, reporter=reporter,
                                seed=config.seed, description=f"{config.encoding} train")
    precision = engine.resolve_precision(train_cfg.precision, device)
    eval_start = time.perf_counter()
    model.eval()
    with torch.no_grad(), engine.autocast(device, precision):
        evaluation = task.evaluate(model, device, reporter)
    if not main:
        return RunOutcome(run_dir, {}, main=False)
    n_predictions = write_predictions(run_dir / PREDICTIONS_FILE, evaluation.predictions)
    eval_s = time.perf_counter() - eval_start

    weights = checkpoint_dir / "model.safetensors"
    result = {
        **result_header(run_dir, config.task, config.encoding, config.preset, created=created, command=command,
                        device=device, precision=precision, resumed=resume),
        "seeds": {**seeds, **task.seeds()},
        "config": {**config.to_dict(), "model_config": model.config.to_dict()},
        "model": {"parameters": model.num_parameters(),
                  "checkpoint": f"{CHECKPOINT_DIR}/model.safetensors" if weights.is_file() else None,
                  "checkpoint_sha256": sha256_file(weights) if weights.is_file() else None},
        "init": init_info,
        "data": task.data_info(),
        "training": train_result.to_dict(),
        "timings": result_timings(train_result.train_s, eval_s, started, train_result.tokens_per_s),
        "metrics": {name: metric.to_dict() for name, metric in evaluation.metrics.items()},
        "primary_metric": evaluation.primary,
        "grids": {name: grid.to_dict() for name, grid in evaluation.grids.items()},
        "evaluation": evaluation.info,
        "predictions": PREDICTIONS_FILE if n_predictions else None,
        "n_predictions": n_predictions,
    }
    atomic_write_json(run_dir / RESULT_FILE, result)
    return RunOutcome(run_dir, result)


def _posbench_model(config: RunConfig, task: Any, resume: bool) -> tuple[Any, dict[str, Any] | None]:
    """The run's ``Transformer``: from the task's config, or from an ``--init`` run (its architecture, then its
    weights unless resuming, which loads the run's own checkpoint); and the init record for the result."""
    from posbench.model import ModelConfig, Transformer

    if config.init is None:
        return Transformer(task.model_config()), None
    from posbench.config import read_init_model_config

    model_dict = task.init_model_config(read_init_model_config(config.init))
    model_dict.update({k: v for k, v in config.model.items() if k in model_dict})
    model_dict["encoding_options"] = dict(config.encoding_options)
    model_cfg = ModelConfig(**model_dict)
    if model_cfg.vocab_size != task.vocab_size():
        raise ConfigError(f"--init run {config.init} has vocabulary {model_cfg.vocab_size}, task "
                          f"'{config.task}' needs {task.vocab_size()}")
    model = Transformer(model_cfg)
    weights = Path(config.init) / CHECKPOINT_DIR / "model.safetensors"
    if not resume:
        engine.load_weights(model, weights)
    return model, {"run": str(config.init), "checkpoint_sha256": sha256_file(weights) if weights.is_file() else None}


def resume(run_dir: Path | str, *, device: str | None = None, reporter: Any = None, callbacks: tuple = ()
           ) -> RunOutcome:
    """Continue a killed run in place from its last checkpoint (at any number of processes: the checkpoint
    holds the full state). Rank 0 reads the run directory and tells the others."""
    run_dir = Path(run_dir)
    distributed.setup(engine.pick_device(device or "auto"))

    def read() -> tuple[RunConfig, bool]:
        stored = read_run_config(run_dir)
        if (run_dir / RESULT_FILE).exists():
            raise ResultError(f"{run_dir} has already finished (result.json exists); start a new run instead")
        try:
            config = RunConfig.from_dict(stored["config"])
        except (KeyError, TypeError) as exc:
            raise ResultError(f"{run_dir / CONFIG_FILE} is not a posbench run config ({exc})") from None
        return config, engine.checkpoint_path(run_dir / CHECKPOINT_DIR) is not None

    config, has_checkpoint = distributed.run_on_main(read)
    if device is not None:
        config.device = device
    return execute(config, run_dir.parent.parent.parent, reporter=reporter, callbacks=callbacks,
                   run_dir=run_dir, resume=has_checkpoint)
