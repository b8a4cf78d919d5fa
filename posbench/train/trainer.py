"""The training loop: ``Trainer`` holds a run's training state; ``step`` does one optimizer step, ``flush``
reads the pending losses, ``save`` writes a checkpoint, ``run`` loops. ``train(...)`` is ``Trainer(...).run()``.

A task hands the trainer a **train stream**: an object with ``next_batch(batch_size) -> Batch`` (see
``posbench.data.batch``) and ``state_dict()`` / ``load_state_dict()``. Under ``torchrun`` (see
``posbench.train.distributed``) every process runs the trainer: each reads its slice of the stream, the model
is wrapped in DDP (or sharded with FSDP2, ``train.parallel=fsdp``), gradients are all-reduced once per step
(``no_sync`` during accumulation micro-steps), and rank 0 alone writes checkpoints and shows progress.

The step never waits for the GPU: batches are copied from pinned memory without blocking, the number of target
tokens is counted on the host, and the loss and gradient norm stay on the device until a log step
(``log_every``), a checkpoint or the end, when ``flush`` reads them once for all pending steps. A non-finite loss
or gradient norm is caught there and raises ``NonFiniteLossError`` (one line naming the first bad step) before
any checkpoint is written, so the last good checkpoint is never overwritten. With ``callbacks`` (which receive
each step's loss) every step is a log step.

A **probe** (``probe(model, device) -> {name: value}``, a task's quick in-distribution metric) runs every
``probe_every`` steps and at the end, in eval mode under ``no_grad`` with torch's random state forked, so a run
trains and evaluates bitwise alike with or without it; its values go to ``probe_history`` and the loggers, its
time to ``probe_s`` (not ``train_s``).

Checkpoints (``checkpoint_every`` steps and at the end; see ``posbench.train.checkpoint``) hold the full
weights and optimizer state in safetensors and everything else in JSON. ``resume=True`` restores everything and
continues; on CPU the final weights are bitwise equal to an uninterrupted run's.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from posbench.data.batch import Batch, masked_cross_entropy
from posbench.errors import ConfigError
from posbench.reporters import NullReporter
from posbench.train import distributed
from posbench.train.checkpoint import (CheckpointError, checkpoint_path, load_train_state, load_weights, rng_state,
                                       save_checkpoint, set_rng_state)
from posbench.train.config import TrainConfig
from posbench.train.device import autocast, resolve_compile, resolve_precision
from posbench.train.optim import make_optimizer, make_scheduler
from posbench.train.seeds import seed_rank

StepCallback = Callable[[int, nn.Module, float], None]
Probe = Callable[[nn.Module, torch.device], dict[str, float]]
LossFn = Callable[[nn.Module, Batch], tuple[Tensor, int]]


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN/inf loss or gradient; ``str()`` names the step and the last good checkpoint."""


class StopTraining(Exception):
    """Raise from a callback to stop at once, as a kill would (no checkpoint is written)."""


@dataclass
class TrainResult:
    steps: int = 0
    tokens: int = 0                  # input tokens processed (all micro-batches, all ranks, padding included)
    target_tokens: int = 0           # tokens that carried loss
    final_loss: float | None = None
    loss_history: list[list[float]] = field(default_factory=list)   # [[step, loss], ...]
    probe_history: list[list[Any]] = field(default_factory=list)    # [[step, {name: value}], ...] (with a probe)
    train_s: float = 0.0             # wall time spent in steps (summed over resumes)
    probe_s: float = 0.0             # wall time spent in probes
    resumed_from: list[int] = field(default_factory=list)
    device: str = "cpu"
    precision: str = "fp32"
    compile: bool = False            # train.compile as resolved for the device
    fused_optimizer: bool = False
    parallel: dict[str, Any] = field(default_factory=dict)   # world size, ddp/fsdp, per-rank batch plan
    seed: int | None = None

    RESTORED = ("tokens", "target_tokens", "loss_history", "probe_history", "train_s", "probe_s", "resumed_from",
                "final_loss")

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.train_s if self.train_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["tokens_per_s"] = self.tokens_per_s
        if not self.probe_history:               # runs without a probe keep the record they always had
            del data["probe_history"], data["probe_s"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainResult:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in names})


@dataclass
class Pending:
    """A step whose loss (and gradient norm) is still on the device."""

    step: int
    loss: Tensor
    grad_norm: Tensor | None
    lr: float                        # the learning rate the step used


class Trainer:
    """Trains ``model`` in place for ``cfg.steps`` optimizer steps on batches from ``stream``.

    ``resume=True`` loads ``checkpoint_dir`` (optimizer, scheduler, stream and RNG states, weights) and
    continues. ``callbacks`` are called as ``cb(step, model, loss)`` after every step (1-based ``step``; under
    FSDP ``model`` receives the trained weights only at the end); raising ``StopTraining`` in one stops at once
    without a checkpoint, as a kill would. The caller seeds (``seed_everything``) before building the model;
    ``seed`` is only recorded. ``loggers`` receive every log step's loss, learning rate, gradient norm and
    throughput (rank 0 only), under ``phase`` (the runner's phase name: a run of several phases logs each
    against its own steps). ``probe``: see the module docstring (rank 0 runs it; not with FSDP shards).
    ``settings``: the run's configuration as the runner records it, kept in every checkpoint (``run_settings``)
    so that a resume can tell whether the run's config still says what trained it. Under torchrun every process
    builds a Trainer with the same arguments.
    """

    def __init__(self, model: nn.Module, stream: Any, cfg: TrainConfig, *, device: torch.device | str = "cpu",
                 checkpoint_dir: Path | None = None, resume: bool = False, loss_fn: LossFn = masked_cross_entropy,
                 callbacks: Sequence[StepCallback] = (), reporter: Any = None, seed: int | None = None,
                 description: str = "train", loggers: Sequence[Any] = (), phase: str = "train",
                 probe: Probe | None = None, settings: dict[str, Any] | None = None):
        self.ctx = distributed.current()
        self.probe = probe if cfg.probe_every > 0 else None
        if self.probe is not None and self.ctx.enabled and cfg.parallel == "fsdp":
            raise ConfigError("train.probe_every needs the whole model on one process: not with "
                              "train.parallel=fsdp")
        self.model, self.stream, self.cfg = model, stream, cfg
        self.device = torch.device(device)
        self.checkpoint_dir, self.loss_fn, self.callbacks = checkpoint_dir, loss_fn, list(callbacks)
        self.reporter = reporter if (reporter is not None and self.ctx.is_main) else NullReporter()
        self.loggers = list(loggers) if self.ctx.is_main else []
        self.description, self.phase, self.settings = description, phase, settings
        self.precision = resolve_precision(cfg.precision, self.device)
        self.result = TrainResult(device=str(self.device), precision=self.precision, seed=seed,
                                  compile=resolve_compile(cfg.compile, self.device))
        self.start_step = 0
        state = optimizer_state = None
        if resume:
            if checkpoint_dir is None:
                raise CheckpointError("resume needs a checkpoint directory")
            state, optimizer_state = self._read_checkpoint()
            self.start_step = self._restore_result(state)
        self.finished = cfg.steps <= self.start_step
        if self.finished:                          # nothing (left) to train
            return
        if cfg.checkpointing:
            enable = getattr(model, "enable_checkpointing", None)
            if enable is None:
                raise CheckpointError(f"train.checkpointing: {type(model).__name__} cannot recompute activations")
            enable()
        self.plan = distributed.plan_batches(cfg.batch_size, cfg.grad_accum, self.ctx.world, stream)
        self.replica = distributed.wrap(model, self.device, cfg.parallel)
        self.result.parallel = {"mode": self.replica.kind, "backend": self.ctx.backend, **self.plan.to_dict()}
        self.optimizer = make_optimizer(self.replica.parameters(), cfg)
        self.result.fused_optimizer = bool(self.optimizer.defaults.get("fused"))
        self.scheduler = make_scheduler(self.optimizer, cfg)
        if state is not None:
            self._restore_training(state, optimizer_state)
        elif self.ctx.rank > 0:
            seed_rank(self.ctx.rank, 0)
        self.batches = distributed.RankBatches(stream, self.plan, self.ctx.rank)
        self.forward = torch.compile(self.replica.module) if self.result.compile else self.replica.module
        self.replica.module.train()
        last_good = checkpoint_path(checkpoint_dir) if (checkpoint_dir is not None and self.ctx.is_main) else None
        self.last_good = distributed.broadcast_object(last_good)
        self.last_good_step = self.start_step if self.last_good is not None else None
        self.history_every = max(1, cfg.steps // 200)
        self.pending: list[Pending] = []

    # ---- one step ------------------------------------------------------------------------------------------
    def step(self, step: int) -> None:
        """Optimizer step ``step + 1``: the rank's micro-batches, forward, backward, clip, AdamW, schedule.
        Nothing is read back from the device."""
        t0 = time.perf_counter()
        host = self.batches.next_step()
        counts = [sum(b.n_targets for b in host), sum(b.tokens.numel() for b in host)]
        if self.ctx.enabled:                       # a CPU all-reduce (gloo): no device sync
            counts = [int(x) for x in distributed.all_reduce_sum(torch.tensor(counts, dtype=torch.int64))]
        n_targets, n_tokens = counts
        denominator = max(n_targets, 1) / self.ctx.world     # DDP / FSDP average the ranks' gradients
        self.optimizer.zero_grad(set_to_none=True)
        step_loss = None
        for i, batch in enumerate(host):
            batch = batch.to(self.device)
            with self.replica.sync_gradients(i == len(host) - 1):
                with autocast(self.device, self.precision):
                    loss_sum, _ = self.loss_fn(self.forward, batch)
                loss = loss_sum / denominator
                loss.backward()
            part = loss.detach().float() / self.ctx.world
            step_loss = part if step_loss is None else step_loss + part
        grad_norm = None
        if self.cfg.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.replica.parameters(), self.cfg.grad_clip)
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
            grad_norm = grad_norm.detach().float()
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.pending.append(Pending(step + 1, step_loss, grad_norm, lr))
        self.result.train_s += time.perf_counter() - t0
        self.result.steps = step + 1
        self.result.tokens += n_tokens
        self.result.target_tokens += n_targets

    # ---- reading the losses ----------------------------------------------------------------------------------
    def flush(self) -> None:
        """Read the pending steps' losses (one device sync, one all-reduce), check them, log them."""
        if not self.pending:
            return
        t0 = time.perf_counter()
        losses = torch.stack([p.loss for p in self.pending])
        norms = torch.stack([p.grad_norm if p.grad_norm is not None else torch.zeros_like(p.loss)
                             for p in self.pending])
        if self.ctx.rank > 0:
            norms = torch.zeros_like(norms)      # every rank holds the same (global) norm: count it once
        values = distributed.all_reduce_sum(torch.stack((losses, norms)).to(torch.float64)).tolist()
        for pending, loss_value, norm_value in zip(self.pending, *values):
            self._check(pending, loss_value, norm_value)
            if pending.step % self.history_every == 0 or pending.step == self.cfg.steps:
                self.result.loss_history.append([pending.step, loss_value])
            self.result.final_loss = loss_value
        self.result.train_s += time.perf_counter() - t0
        self._log(values[0], values[1])
        self.pending.clear()

    def _check(self, pending: Pending, loss_value: float, norm_value: float) -> None:
        bad = (f"loss ({loss_value})" if not math.isfinite(loss_value) else
               f"gradient norm ({norm_value})" if pending.grad_norm is not None and not math.isfinite(norm_value)
               else None)
        if bad is not None:
            where = (f"last good checkpoint: step {self.last_good_step} in {self.last_good}"
                     if self.last_good is not None else "no checkpoint was written")
            raise NonFiniteLossError(f"non-finite {bad} at step {pending.step}; training stopped, {where}")

    def _log(self, losses: list[float], norms: list[float]) -> None:
        """Every flushed step's loss, learning rate and gradient norm, and the throughput so far, to the
        loggers (rank 0 only)."""
        for logger in self.loggers:
            for pending, loss, norm in zip(self.pending, losses, norms):
                scalars = {"loss": loss, "lr": pending.lr}
                if pending.grad_norm is not None:
                    scalars["grad_norm"] = norm
                if pending is self.pending[-1]:
                    scalars["tokens_per_s"] = self.result.tokens_per_s
                logger.log_step(pending.step, scalars, phase=self.phase)

    # ---- the probe -------------------------------------------------------------------------------------------
    def _probe_due(self, step: int) -> bool:
        return self.probe is not None and (step % self.cfg.probe_every == 0 or step == self.cfg.steps)

    def run_probe(self, step: int) -> None:
        """The probe at ``step`` on rank 0 (the weights as trained so far), recorded and logged."""
        if not self.ctx.is_main:
            return
        t0 = time.perf_counter()
        self.model.eval()
        try:
            with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []), \
                    torch.no_grad(), autocast(self.device, self.precision):
                values = {name: float(v) for name, v in self.probe(self.model, self.device).items()}
        finally:
            self.model.train()
        self.result.probe_history.append([step, values])
        self.result.probe_s += time.perf_counter() - t0
        for logger in self.loggers:
            logger.log_step(step, {f"probe/{name}": v for name, v in values.items()}, phase=self.phase)

    # ---- checkpoints -----------------------------------------------------------------------------------------
    def save(self, step: int) -> Path | None:
        """A checkpoint of everything at ``step`` (rank 0 writes it; every rank takes part in gathering)."""
        self.flush()                               # a non-finite state never reaches a checkpoint
        weights = self.replica.model_state()
        optimizer_full = self.replica.optimizer_state(self.optimizer)
        rngs = distributed.all_gather_objects(rng_state())
        if not self.ctx.is_main:
            return None
        r = self.result
        snapshot = {"step": step, "scheduler": self.scheduler.state_dict(), "data": self.stream.state_dict(),
                    "rng": rngs, "tokens": r.tokens, "target_tokens": r.target_tokens,
                    "loss_history": r.loss_history, "probe_history": r.probe_history, "train_s": r.train_s,
                    "probe_s": r.probe_s, "resumed_from": r.resumed_from,
                    "final_loss": r.final_loss, "train_config": self.cfg.to_dict(), "batch_plan": self.plan.to_dict(),
                    **({"run_settings": self.settings} if self.settings is not None else {})}
        return save_checkpoint(self.checkpoint_dir, self.model, snapshot, optimizer_full, weights=weights)

    def _checkpoint_due(self, step: int) -> bool:
        every = self.cfg.checkpoint_every
        return self.checkpoint_dir is not None and every > 0 and step % every == 0 and step < self.cfg.steps

    # ---- the loop --------------------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        if self.finished:
            self.model.to(self.device)
            distributed.broadcast_module(self.model)
            self.model.eval()
            return self.result
        cfg = self.cfg
        bar = self.reporter.task(self.description, total=cfg.steps, completed=self.start_step,
                                 log_every=cfg.log_every)
        try:
            for step in range(self.start_step, cfg.steps):
                self.step(step)
                done = step + 1
                checkpoint_due = self._checkpoint_due(done)
                if self.callbacks or checkpoint_due or done % cfg.log_every == 0 or done == cfg.steps:
                    self.flush()
                bar.update(done, loss=self.result.final_loss, rate=f"{human(self.result.tokens_per_s)} tok/s")
                if self._probe_due(done):          # before the checkpoint, which then holds this probe
                    self.flush()                   # the loggers get the step's losses before its probe
                    self.run_probe(done)
                if checkpoint_due:
                    saved = self.save(done)
                    self.last_good, self.last_good_step = distributed.broadcast_object(saved), done
                for callback in self.callbacks:
                    callback(done, self.model, self.result.final_loss)
            self.flush()
        finally:
            bar.close()
        if self.checkpoint_dir is not None and self.result.steps == cfg.steps:
            self.save(self.result.steps)
        self.replica.finish()
        self.model.eval()
        return self.result

    # ---- resuming --------------------------------------------------------------------------------------------
    def _read_checkpoint(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """Rank 0 reads the checkpoint and loads its weights; every rank gets the training state (the optimizer
        tensors stay on rank 0, which broadcasts them when they are loaded)."""
        held: dict[str, Any] = {}

        def read() -> dict[str, Any]:
            state = load_train_state(self.checkpoint_dir)
            load_weights(self.model, checkpoint_path(self.checkpoint_dir))
            held["optimizer"] = state.pop("optimizer", None)
            return state
        state = distributed.run_on_main(read)
        return state, held.get("optimizer")

    def _restore_result(self, state: dict[str, Any]) -> int:
        try:
            start_step = int(state["step"])
            for key in TrainResult.RESTORED:
                if key in state:
                    setattr(self.result, key, state[key])
            self.result.resumed_from = [int(s) for s in self.result.resumed_from] + [start_step]
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"the checkpoint in {self.checkpoint_dir} is malformed ({exc})") from None
        self.result.steps = start_step
        return start_step

    def _restore_training(self, state: dict[str, Any], optimizer_state: dict[str, Any] | None) -> None:
        ctx = self.ctx
        has_optimizer = distributed.broadcast_object(optimizer_state is not None)
        try:
            if has_optimizer:
                self.replica.load_optimizer_state(self.optimizer, optimizer_state)
            self.scheduler.load_state_dict(state["scheduler"])
            self.stream.load_state_dict(state["data"])
            rngs = state["rng"]
            rngs = rngs if isinstance(rngs, list) else [rngs]
            if len(rngs) == ctx.world or ctx.rank == 0:
                set_rng_state(rngs[ctx.rank])
            else:                                    # a different world size: new ranks derive their own
                seed_rank(ctx.rank, self.start_step)
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as exc:
            raise CheckpointError(f"the checkpoint in {self.checkpoint_dir} does not fit this run ({exc})") from None


def train(model: nn.Module, stream: Any, cfg: TrainConfig, **kwargs: Any) -> TrainResult:
    """Train ``model`` in place (see ``Trainer`` for the keyword arguments) and return what happened."""
    return Trainer(model, stream, cfg, **kwargs).run()


def human(x: float) -> str:
    for unit in ("", "k", "M", "G"):
        if abs(x) < 1000:
            return f"{x:.1f}{unit}"
        x /= 1000
    return f"{x:.1f}T"
