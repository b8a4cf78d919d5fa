"""The training engine: device, precision, AdamW with warmup + linear decay, accumulation, clipping,
``torch.compile``, seeding, progress, checkpoints, exact resume, and several processes (DDP or FSDP).

A task hands the engine a **train stream** (see ``posbench.tasks.base.TrainStream``): an object with
``next_batch(batch_size) -> Batch`` and ``state_dict()`` / ``load_state_dict()``. A ``Batch`` holds
``tokens [B, N]`` and ``targets [B, N]`` (the token to predict at each position, ``IGNORE_INDEX`` where no
loss is taken: padding, prompts), optionally ``positions``. The loss of a step is the mean cross-entropy
over every target token of the step's global batch (all micro-batches of all processes), so accumulating,
or splitting the batch over processes, gives the same gradient as one big batch.

Under ``torchrun`` (see ``posbench.distributed``) every process runs ``train``: each reads its slice of the
stream, the model is wrapped in DDP (or sharded with FSDP2, ``train.parallel=fsdp``), gradients are
all-reduced once per step (``no_sync`` during accumulation micro-steps), and rank 0 alone writes
checkpoints and shows progress (global tokens/s).

The step never waits for the GPU: batches are copied from pinned memory without blocking, the number of
target tokens is counted on the host, and the loss and gradient norm stay on the device until a log step
(``log_every``), a checkpoint or the end, when they are read once for all pending steps. A non-finite loss
or gradient norm is caught there and raises ``NonFiniteLossError`` (one line naming the first bad step)
before any checkpoint is written, so the last good checkpoint is never overwritten. With ``callbacks``
(which receive each step's loss) every step is a log step.

Checkpoints (``checkpoint_every`` steps and at the end; see ``posbench.checkpoint``) hold the full weights
and optimizer state in safetensors and everything else in JSON, so they run no code when loaded and fit any
world size. ``train(..., resume=True)`` restores everything and continues; on CPU the final weights are
bitwise equal to an uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posbench import distributed
# checkpoints live in posbench.checkpoint; these names stay importable from the engine
from posbench.checkpoint import (CheckpointError, checkpoint_path, load_train_state, load_weights,  # noqa: F401
                                 read_model_config, rng_state, save_checkpoint, set_rng_state)
from posbench.errors import UserError
from posbench.progress import NullReporter

IGNORE_INDEX = -100


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN/inf loss or gradient; ``str()`` names the step and the last good checkpoint."""


class DeviceError(UserError):
    """An unavailable device; ``str()`` is one line."""


class StopTraining(Exception):
    """Raise from a callback to stop at once, as a kill would (no checkpoint is written)."""


COMPILE_WORDS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False,
                 "off": False, "auto": "auto"}


@dataclass
class TrainConfig:
    """The optimisation recipe. Defaults follow the TAPE paper's (HF Trainer) recipe: AdamW (0.9, 0.999,
    eps 1e-8), weight decay 0.01, linear warmup over ``warmup_ratio`` of the steps, linear decay to
    ``min_lr_ratio * lr``, gradient clipping at 1.0.

    ``batch_size`` is the global batch of one optimizer step and ``grad_accum`` splits it for one device;
    with several processes the per-process micro-batch and accumulation are derived from them
    (``distributed.plan_batches``)."""

    steps: int = 1000
    batch_size: int = 64            # sequences per optimizer step (split into grad_accum micro-batches)
    grad_accum: int = 1
    lr: float = 1e-4
    warmup_ratio: float = 0.02
    warmup_steps: int = -1          # >= 0 overrides warmup_ratio
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0          # 0 disables clipping
    checkpoint_every: int = 0       # 0: only at the end
    log_every: int = 50             # loss read from the device (and plain progress lines) every N steps
    precision: str = "auto"         # auto (bf16 autocast on CUDA, fp32 elsewhere) | fp32 | bf16
    compile: Any = "auto"           # auto (on for CUDA, off elsewhere) | true | false
    parallel: str = "ddp"           # several processes: ddp (replicas) | fsdp (FSDP2 shards)
    threads: int = 0                # CPU threads; 0: the free cores (see setup_device)

    def __post_init__(self):
        if self.steps < 0:
            raise ValueError(f"train.steps must be >= 0, got {self.steps}")
        if self.grad_accum < 1 or self.batch_size < 1 or self.batch_size % self.grad_accum:
            raise ValueError(f"train.batch_size {self.batch_size} must be a positive multiple of "
                             f"train.grad_accum {self.grad_accum}")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"train.precision must be auto, fp32 or bf16, got {self.precision!r}")
        word = self.compile if isinstance(self.compile, bool) else COMPILE_WORDS.get(str(self.compile).lower())
        if word is None:
            raise ValueError(f"train.compile={self.compile!r}: expected true or false (or auto)")
        self.compile = word
        if self.parallel not in distributed.PARALLEL_MODES:
            raise ValueError(f"train.parallel must be one of {', '.join(distributed.PARALLEL_MODES)}, "
                             f"got {self.parallel!r}")

    @property
    def micro_batch(self) -> int:
        return self.batch_size // self.grad_accum

    def warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps >= 0 else int(round(self.warmup_ratio * self.steps))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Batch:
    tokens: Tensor                   # [B, N] inputs
    targets: Tensor                  # [B, N] next tokens, IGNORE_INDEX where no loss is taken
    positions: Tensor | None = None  # [N] or [B, N]; None: 0..N-1
    target_count: int | None = field(default=None, repr=False, compare=False)   # counted on the host

    def to(self, device: torch.device | str) -> Batch:
        """On ``device``; from the CPU to CUDA through pinned memory without waiting (no device sync). The
        number of target tokens is counted here, on the host, so nothing reads it back from the device."""
        device = torch.device(device)
        count = self.n_targets if self.targets.device.type == "cpu" else self.target_count

        def move(t: Tensor) -> Tensor:
            if device.type == "cuda" and t.device.type == "cpu":
                return t.pin_memory().to(device, non_blocking=True)
            return t.to(device)
        pos = move(self.positions) if self.positions is not None else None
        return Batch(move(self.tokens), move(self.targets), pos, count)

    @property
    def n_targets(self) -> int:
        if self.target_count is None:
            self.target_count = int((self.targets != IGNORE_INDEX).sum())
        return self.target_count


@dataclass
class TrainResult:
    steps: int = 0
    tokens: int = 0                  # input tokens processed (all micro-batches, all ranks, padding included)
    target_tokens: int = 0           # tokens that carried loss
    final_loss: float | None = None
    loss_history: list[list[float]] = field(default_factory=list)   # [[step, loss], ...]
    train_s: float = 0.0             # wall time spent in steps (summed over resumes)
    resumed_from: list[int] = field(default_factory=list)
    device: str = "cpu"
    precision: str = "fp32"
    compile: bool = False            # train.compile as resolved for the device
    fused_optimizer: bool = False
    parallel: dict[str, Any] = field(default_factory=dict)   # world size, ddp/fsdp, per-rank batch plan
    seed: int | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.train_s if self.train_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["tokens_per_s"] = self.tokens_per_s
        return data


# ---- device, threads, seeds ------------------------------------------------------------------------------

def pick_device(name: str = "auto") -> torch.device:
    """``auto``: cuda, then mps, then cpu. An explicit name must be available."""
    name = (name or "auto").lower()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise DeviceError(f"unknown device '{name}'; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"device '{name}' requested but CUDA is not available here; use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise DeviceError(f"device '{name}' does not exist; {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise DeviceError(f"device '{name}' requested but MPS is not available here; use --device cpu")
    if device.type not in ("cpu", "cuda", "mps"):
        raise DeviceError(f"unsupported device '{name}'; use auto, cpu, cuda or mps")
    return device


def setup_device(device: torch.device, threads: int = 0) -> int:
    """CPU: flush denormals (they slow softmax gradients 3-7x) and pick the thread count; returns it.

    ``threads=0`` (auto) uses the cores this process may run on that are not already busy (1-minute load
    average), shared among the processes torchrun started on this machine: on a shared machine, more
    threads than free cores make every step several times slower (threads spin-wait for each other).
    """
    if device.type == "cpu":
        torch.set_flush_denormal(True)
        if threads <= 0:
            threads = auto_threads()
        torch.set_num_threads(max(1, threads))
        return torch.get_num_threads()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return torch.get_num_threads()


def auto_threads() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0]
    except (AttributeError, OSError):
        busy = 0.0
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(1, min(cores, int(round(cores - busy))) // local)


def seed_everything(seed: int) -> dict[str, int]:
    """Seed Python, NumPy and torch (all devices); returns the seeds recorded in result.json."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return {"python": seed, "numpy": seed % 2**32, "torch": seed}


def seed_rank(rank: int, step: int) -> None:
    """Ranks other than 0 draw their own random numbers (TAPE's offsets, RandPE's positions), derived from
    the run's seed, the rank and the step they start at; rank 0 keeps the one-process sequence."""
    seed_everything(int(np.random.SeedSequence([torch.initial_seed(), rank, step]).generate_state(1)[0]))


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return precision


def resolve_compile(value: Any, device: torch.device) -> bool:
    """``train.compile``: ``auto`` compiles on CUDA only (on a CPU compiling costs more than it saves)."""
    if value == "auto":
        return torch.device(device).type == "cuda"
    return bool(value)


def autocast(device: torch.device, precision: str):
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# ---- optimisation ----------------------------------------------------------------------------------------

def make_optimizer(params: nn.Module | Sequence[nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not on norms, gains and other vectors). Fused (one kernel for
    all parameters) when every parameter is a plain CUDA tensor."""
    if isinstance(params, nn.Module):
        params = [p for p in params.parameters() if p.requires_grad]
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = fusable(params)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                             **({"fused": True} if fused else {}))


def fusable(params: Sequence[Tensor]) -> bool:
    if not params or not all(p.is_cuda for p in params):
        return False
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return True
    return not any(isinstance(p, DTensor) for p in params)     # FSDP shards keep the default (foreach)


def lr_lambda(cfg: TrainConfig) -> Callable[[int], float]:
    warmup, total, floor = cfg.warmup(), max(cfg.steps, 1), cfg.min_lr_ratio

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        remaining = max(total - warmup, 1)
        return floor + (1.0 - floor) * max(0.0, (total - step) / remaining)
    return factor


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))


def masked_cross_entropy(model: nn.Module, batch: Batch) -> tuple[Tensor, int]:
    """Sum of token cross-entropies over ``targets != IGNORE_INDEX`` and the number of such tokens."""
    logits = model(batch.tokens, positions=batch.positions) if batch.positions is not None else model(batch.tokens)
    loss = F.cross_entropy(logits.float().flatten(0, 1), batch.targets.flatten(), ignore_index=IGNORE_INDEX,
                           reduction="sum")
    return loss, batch.n_targets


# ---- the loop --------------------------------------------------------------------------------------------

StepCallback = Callable[[int, nn.Module, float], None]


def train(model: nn.Module, stream: Any, cfg: TrainConfig, *, device: torch.device | str = "cpu",
          checkpoint_dir: Path | None = None, resume: bool = False,
          loss_fn: Callable[[nn.Module, Batch], tuple[Tensor, int]] = masked_cross_entropy,
          callbacks: Sequence[StepCallback] = (), reporter: Any = None, seed: int | None = None,
          description: str = "train") -> TrainResult:
    """Train ``model`` in place for ``cfg.steps`` optimizer steps on batches from ``stream``.

    ``resume=True`` loads ``checkpoint_dir`` (optimizer, scheduler, stream and RNG states, weights) and
    continues. ``callbacks`` are called as ``cb(step, model, loss)`` after every step (1-based ``step``;
    under FSDP ``model`` receives the trained weights only at the end); raising ``StopTraining`` in one
    stops at once without a checkpoint, as a kill would. The caller seeds
    (``seed_everything``) before building the model; ``seed`` is only recorded. Under torchrun every
    process calls this with the same arguments (``posbench.distributed``).
    """
    ctx = distributed.current()
    device = torch.device(device)
    reporter = reporter if (reporter is not None and ctx.is_main) else NullReporter()
    precision = resolve_precision(cfg.precision, device)
    result = TrainResult(device=str(device), precision=precision, seed=seed,
                         compile=resolve_compile(cfg.compile, device))
    start_step, state, optimizer_state = 0, None, None
    if resume:
        if checkpoint_dir is None:
            raise CheckpointError("resume needs a checkpoint directory")
        state, optimizer_state = _read_checkpoint(model, checkpoint_dir)
        start_step = _restore_result(result, state, checkpoint_dir)
    if cfg.steps <= start_step:                  # nothing (left) to train
        model.to(device)
        distributed.broadcast_module(model)
        model.eval()
        return result

    plan = distributed.plan_batches(cfg.batch_size, cfg.grad_accum, ctx.world, stream)
    replica = distributed.wrap(model, device, cfg.parallel)
    result.parallel = {"mode": replica.kind, "backend": ctx.backend, **plan.to_dict()}
    optimizer = make_optimizer(replica.parameters(), cfg)
    result.fused_optimizer = bool(optimizer.defaults.get("fused"))
    scheduler = make_scheduler(optimizer, cfg)
    if state is not None:
        _restore_training(state, optimizer_state, replica, optimizer, scheduler, stream, checkpoint_dir, start_step)
    elif ctx.rank > 0:
        seed_rank(ctx.rank, 0)
    batches = distributed.RankBatches(stream, plan, ctx.rank)
    forward = torch.compile(replica.module) if result.compile else replica.module
    replica.module.train()
    last_good = checkpoint_path(checkpoint_dir) if (checkpoint_dir is not None and ctx.is_main) else None
    last_good = distributed.broadcast_object(last_good)
    last_good_step = start_step if last_good is not None else None
    history_every = max(1, cfg.steps // 200)
    log_every = max(1, cfg.log_every)
    pending: list[tuple[int, Tensor, Tensor | None]] = []     # (step, loss on the device, grad norm or None)

    def flush() -> None:
        """Read the pending steps' losses (one device sync, one all-reduce) and check them."""
        if not pending:
            return
        t0 = time.perf_counter()
        losses = torch.stack([loss for _, loss, _ in pending])
        norms = torch.stack([g if g is not None else torch.zeros_like(loss) for _, loss, g in pending])
        if ctx.rank > 0:
            norms = torch.zeros_like(norms)      # every rank holds the same (global) norm: count it once
        values = distributed.all_reduce_sum(torch.stack((losses, norms)).to(torch.float64)).tolist()
        for (step, _, norm), loss_value, norm_value in zip(pending, *values):
            bad = (f"loss ({loss_value})" if not math.isfinite(loss_value) else
                   f"gradient norm ({norm_value})" if norm is not None and not math.isfinite(norm_value) else None)
            if bad is not None:
                where = (f"last good checkpoint: step {last_good_step} in {last_good}"
                         if last_good is not None else "no checkpoint was written")
                raise NonFiniteLossError(f"non-finite {bad} at step {step}; training stopped, {where}")
            if step % history_every == 0 or step == cfg.steps:
                result.loss_history.append([step, loss_value])
            result.final_loss = loss_value
        pending.clear()
        result.train_s += time.perf_counter() - t0

    def save(step: int) -> Path | None:
        flush()                                 # a non-finite state never reaches a checkpoint
        weights = replica.model_state()
        optimizer_full = replica.optimizer_state(optimizer)
        rngs = distributed.all_gather_objects(rng_state())
        if not ctx.is_main:
            return None
        snapshot = {"step": step, "scheduler": scheduler.state_dict(), "data": stream.state_dict(), "rng": rngs,
                    "tokens": result.tokens, "target_tokens": result.target_tokens,
                    "loss_history": result.loss_history, "train_s": result.train_s,
                    "resumed_from": result.resumed_from, "final_loss": result.final_loss,
                    "train_config": cfg.to_dict(), "batch_plan": plan.to_dict()}
        return save_checkpoint(checkpoint_dir, model, snapshot, optimizer_full, weights=weights)

    bar = reporter.task(description, total=cfg.steps, completed=start_step, log_every=cfg.log_every)
    try:
        for step in range(start_step, cfg.steps):
            t0 = time.perf_counter()
            host = batches.next_step()
            counts = [sum(b.n_targets for b in host), sum(b.tokens.numel() for b in host)]
            if ctx.enabled:                      # a CPU all-reduce (gloo): no device sync
                counts = [int(x) for x in distributed.all_reduce_sum(torch.tensor(counts, dtype=torch.int64))]
            n_targets, n_tokens = counts
            denominator = max(n_targets, 1) / ctx.world     # DDP / FSDP average the ranks' gradients
            optimizer.zero_grad(set_to_none=True)
            step_loss = None
            for i, batch in enumerate(host):
                batch = batch.to(device)
                with replica.sync_gradients(i == len(host) - 1):
                    with autocast(device, precision):
                        loss_sum, _ = loss_fn(forward, batch)
                    loss = loss_sum / denominator
                    loss.backward()
                part = loss.detach().float() / ctx.world
                step_loss = part if step_loss is None else step_loss + part
            grad_norm = None
            if cfg.grad_clip > 0:
                grad_norm = torch.nn.utils.clip_grad_norm_(replica.parameters(), cfg.grad_clip)
                grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
                grad_norm = grad_norm.detach().float()
            optimizer.step()
            scheduler.step()
            pending.append((step + 1, step_loss, grad_norm))
            result.train_s += time.perf_counter() - t0
            result.steps = step + 1
            result.tokens += n_tokens
            result.target_tokens += n_targets
            checkpoint_due = (checkpoint_dir is not None and cfg.checkpoint_every > 0
                              and (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.steps)
            if callbacks or checkpoint_due or (step + 1) % log_every == 0 or step + 1 == cfg.steps:
                flush()
            bar.update(step + 1, loss=result.final_loss, rate=f"{_human(result.tokens_per_s)} tok/s")
            if checkpoint_due:
                saved = save(step + 1)
                last_good, last_good_step = distributed.broadcast_object(saved), step + 1
            for callback in callbacks:
                callback(step + 1, model, result.final_loss)
        flush()
    finally:
        bar.close()
    if checkpoint_dir is not None and result.steps == cfg.steps:
        save(result.steps)
    replica.finish()
    model.eval()
    return result


def _read_checkpoint(model: nn.Module, checkpoint_dir: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Rank 0 reads the checkpoint and loads its weights; every rank gets the training state (the
    optimizer tensors stay on rank 0, which broadcasts them when they are loaded)."""
    held: dict[str, Any] = {}

    def read() -> dict[str, Any]:
        state = load_train_state(checkpoint_dir)
        load_weights(model, checkpoint_path(checkpoint_dir))
        held["optimizer"] = state.pop("optimizer", None)
        return state
    state = distributed.run_on_main(read)
    return state, held.get("optimizer")


def _restore_result(result: TrainResult, state: dict[str, Any], checkpoint_dir: Path) -> int:
    try:
        start_step = int(state["step"])
        for key in ("tokens", "target_tokens", "loss_history", "train_s", "resumed_from", "final_loss"):
            if key in state:
                setattr(result, key, state[key])
        result.resumed_from = [int(s) for s in result.resumed_from] + [start_step]
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"the checkpoint in {checkpoint_dir} is malformed ({exc})") from None
    result.steps = start_step
    return start_step


def _restore_training(state: dict[str, Any], optimizer_state: dict[str, Any] | None, replica: Any,
                      optimizer: torch.optim.Optimizer, scheduler: Any, stream: Any, checkpoint_dir: Path,
                      start_step: int) -> None:
    ctx = distributed.current()
    has_optimizer = distributed.broadcast_object(optimizer_state is not None)
    try:
        if has_optimizer:
            replica.load_optimizer_state(optimizer, optimizer_state)
        scheduler.load_state_dict(state["scheduler"])
        stream.load_state_dict(state["data"])
        rngs = state["rng"]
        rngs = rngs if isinstance(rngs, list) else [rngs]
        if len(rngs) == ctx.world or ctx.rank == 0:
            set_rng_state(rngs[ctx.rank])
        else:                                    # a different world size: new ranks derive their own
            seed_rank(ctx.rank, start_step)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as exc:
        raise CheckpointError(f"the checkpoint in {checkpoint_dir} does not fit this run ({exc})") from None


def _human(x: float) -> str:
    for unit in ("", "k", "M", "G"):
        if abs(x) < 1000:
            return f"{x:.1f}{unit}"
        x /= 1000
    return f"{x:.1f}T"
