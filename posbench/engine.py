"""The training engine: device, precision, AdamW with warmup + linear decay, accumulation, clipping,
optional ``torch.compile``, seeding, progress, checkpoints and exact resume.

A task hands the engine a **train stream** (see ``posbench.tasks.base.TrainStream``): an object with
``next_batch(batch_size) -> Batch`` and ``state_dict()`` / ``load_state_dict()``. A ``Batch`` holds
``tokens [B, N]`` and ``targets [B, N]`` (the token to predict at each position, ``IGNORE_INDEX`` where no
loss is taken: padding, prompts), optionally ``positions``. The loss of a step is the mean cross-entropy
over every target token of its ``grad_accum`` micro-batches, so accumulating gives the same gradient as one
big batch.

Checkpoints (``checkpoint_every`` steps and at the end) are a directory::

    checkpoint/model.safetensors   weights
    checkpoint/model_config.json   ModelConfig.to_dict()
    checkpoint/train_state.pt      step, optimizer, scheduler, data stream state, RNG states, history

written as ``checkpoint.tmp`` and then swapped in, so a kill at any moment leaves one complete checkpoint.
``train(..., resume=True)`` restores everything and continues; on CPU the final weights are bitwise equal to
an uninterrupted run's. A non-finite loss or gradient norm raises ``NonFiniteLossError`` (one line naming
the step) without writing a checkpoint, so the last good one stays.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posbench.errors import UserError
from posbench.progress import NullReporter
from posbench.results import atomic_save, atomic_write_json

IGNORE_INDEX = -100


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN/inf loss or gradient; ``str()`` names the step and the last good checkpoint."""


class CheckpointError(UserError):
    """A missing or unreadable checkpoint; ``str()`` is one line."""


class DeviceError(UserError):
    """An unavailable device; ``str()`` is one line."""


class StopTraining(Exception):
    """Raise from a callback to stop at once, as a kill would (no checkpoint is written)."""


@dataclass
class TrainConfig:
    """The optimisation recipe. Defaults follow the TAPE paper's (HF Trainer) recipe: AdamW (0.9, 0.999,
    eps 1e-8), weight decay 0.01, linear warmup over ``warmup_ratio`` of the steps, linear decay to
    ``min_lr_ratio * lr``, gradient clipping at 1.0."""

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
    log_every: int = 50             # plain progress lines when not on a terminal
    precision: str = "auto"         # auto (bf16 autocast on CUDA, fp32 elsewhere) | fp32 | bf16
    compile: bool = False
    threads: int = 0                # CPU threads; 0: the free cores (see setup_device)

    def __post_init__(self):
        if self.steps < 0:
            raise ValueError(f"train.steps must be >= 0, got {self.steps}")
        if self.grad_accum < 1 or self.batch_size < 1 or self.batch_size % self.grad_accum:
            raise ValueError(f"train.batch_size {self.batch_size} must be a positive multiple of "
                             f"train.grad_accum {self.grad_accum}")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"train.precision must be auto, fp32 or bf16, got {self.precision!r}")

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

    def to(self, device: torch.device) -> Batch:
        pos = self.positions.to(device) if self.positions is not None else None
        return Batch(self.tokens.to(device), self.targets.to(device), pos)

    @property
    def n_targets(self) -> int:
        return int((self.targets != IGNORE_INDEX).sum())


@dataclass
class TrainResult:
    steps: int = 0
    tokens: int = 0                  # input tokens processed (all micro-batches, padding included)
    target_tokens: int = 0           # tokens that carried loss
    final_loss: float | None = None
    loss_history: list[list[float]] = field(default_factory=list)   # [[step, loss], ...]
    train_s: float = 0.0             # wall time spent in steps (summed over resumes)
    resumed_from: list[int] = field(default_factory=list)
    device: str = "cpu"
    precision: str = "fp32"
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
    average): on a shared machine, more threads than free cores make every step several times slower
    (threads spin-wait for each other), so a busy 2-core machine gets 1 thread.
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
    return max(1, min(cores, int(round(cores - busy))))


def seed_everything(seed: int) -> dict[str, int]:
    """Seed Python, NumPy and torch (all devices); returns the seeds recorded in result.json."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return {"python": seed, "numpy": seed % 2**32, "torch": seed}


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return precision


def autocast(device: torch.device, precision: str):
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# ---- optimisation ----------------------------------------------------------------------------------------

def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not on norms, gains and other vectors)."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)


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


# ---- checkpoints -----------------------------------------------------------------------------------------

def save_checkpoint(directory: Path, model: nn.Module, train_state: dict[str, Any]) -> Path:
    """Write a complete checkpoint to ``directory.tmp`` then swap it in for ``directory``."""
    from safetensors.torch import save_file

    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    old = directory.with_name(directory.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    atomic_save(tmp / "model.safetensors", lambda p: save_file(weights, str(p), metadata={"format": "pt"}))
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        atomic_write_json(tmp / "model_config.json", config.to_dict())
    atomic_save(tmp / "train_state.pt", lambda p: torch.save(train_state, p))
    if directory.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(directory, old)
    os.replace(tmp, directory)
    shutil.rmtree(old, ignore_errors=True)
    return directory


def checkpoint_path(directory: Path) -> Path | None:
    """The complete checkpoint in ``directory`` (or the ``.old`` one a kill mid-swap left), if any."""
    directory = Path(directory)
    for candidate in (directory, directory.with_name(directory.name + ".old")):
        if (candidate / "model.safetensors").is_file() and (candidate / "train_state.pt").is_file():
            return candidate
    return None


def load_weights(model: nn.Module, path: Path) -> None:
    """Load ``model.safetensors`` (a file, or a checkpoint directory holding one) into ``model``."""
    from safetensors.torch import load_file

    path = Path(path)
    if path.is_dir():
        path = path / "model.safetensors"
    if not path.is_file():
        raise CheckpointError(f"no weights at {path}")
    try:
        state = load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types
        raise CheckpointError(f"cannot read {path}: {exc}") from None
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{path} does not fit this model (missing {len(missing)} tensors, "
                              f"{len(unexpected)} unexpected)")


def load_train_state(directory: Path) -> dict[str, Any]:
    found = checkpoint_path(directory)
    if found is None:
        raise CheckpointError(f"no complete checkpoint in {directory}")
    try:
        return torch.load(found / "train_state.pt", map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001
        raise CheckpointError(f"cannot read {found / 'train_state.pt'}: {exc}") from None


# ---- the loop --------------------------------------------------------------------------------------------

StepCallback = Callable[[int, nn.Module, float], None]


def train(model: nn.Module, stream: Any, cfg: TrainConfig, *, device: torch.device | str = "cpu",
          checkpoint_dir: Path | None = None, resume: bool = False,
          loss_fn: Callable[[nn.Module, Batch], tuple[Tensor, int]] = masked_cross_entropy,
          callbacks: Sequence[StepCallback] = (), reporter: Any = None, seed: int | None = None,
          description: str = "train") -> TrainResult:
    """Train ``model`` in place for ``cfg.steps`` optimizer steps on batches from ``stream``.

    ``resume=True`` loads ``checkpoint_dir`` (optimizer, scheduler, stream and RNG states, weights) and
    continues. ``callbacks`` are called as ``cb(step, model, loss)`` after every step (1-based ``step``);
    raising ``StopTraining`` in one stops at once without a checkpoint, as a kill would. The caller seeds
    (``seed_everything``) before building the model; ``seed`` is only recorded.
    """
    device = torch.device(device)
    reporter = reporter or NullReporter()
    precision = resolve_precision(cfg.precision, device)
    model.to(device)
    model.train()
    optimizer = make_optimizer(model, cfg)
    scheduler = make_scheduler(optimizer, cfg)
    result = TrainResult(device=str(device), precision=precision, seed=seed)
    start_step = 0
    if resume:
        if checkpoint_dir is None:
            raise CheckpointError("resume needs a checkpoint directory")
        state = load_train_state(checkpoint_dir)
        load_weights(model, checkpoint_path(checkpoint_dir))
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        stream.load_state_dict(state["data"])
        set_rng_state(state["rng"])
        start_step = int(state["step"])
        for key in ("tokens", "target_tokens", "loss_history", "train_s", "resumed_from", "final_loss"):
            if key in state:
                setattr(result, key, state[key])
        result.resumed_from = list(result.resumed_from) + [start_step]
    result.steps = start_step
    forward = torch.compile(model) if cfg.compile else model
    last_good = checkpoint_path(checkpoint_dir) if checkpoint_dir is not None else None
    last_good_step = start_step if last_good is not None else None
    history_every = max(1, cfg.steps // 200)

    def snapshot(step: int) -> dict[str, Any]:
        return {"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "data": stream.state_dict(), "rng": rng_state(), "tokens": result.tokens,
                "target_tokens": result.target_tokens, "loss_history": result.loss_history,
                "train_s": result.train_s, "resumed_from": result.resumed_from,
                "final_loss": result.final_loss, "train_config": cfg.to_dict()}

    bar = reporter.task(description, total=cfg.steps, completed=start_step, log_every=cfg.log_every)
    try:
        for step in range(start_step, cfg.steps):
            t0 = time.perf_counter()
            batches = [stream.next_batch(cfg.micro_batch).to(device) for _ in range(cfg.grad_accum)]
            n_targets = sum(b.n_targets for b in batches)
            optimizer.zero_grad(set_to_none=True)
            total_loss = torch.zeros((), device=device)
            for batch in batches:
                with autocast(device, precision):
                    loss_sum, _ = loss_fn(forward, batch)
                loss = loss_sum / max(n_targets, 1)
                loss.backward()
                total_loss += loss.detach().float()
            loss_value = float(total_loss)
            grad_norm = None
            if cfg.grad_clip > 0:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))
            if not math.isfinite(loss_value) or (grad_norm is not None and not math.isfinite(grad_norm)):
                what = f"loss ({loss_value})" if not math.isfinite(loss_value) else f"gradient norm ({grad_norm})"
                where = (f"last good checkpoint: step {last_good_step} in {last_good}"
                         if last_good is not None else "no checkpoint was written")
                raise NonFiniteLossError(f"non-finite {what} at step {step + 1}; training stopped, {where}")
            optimizer.step()
            scheduler.step()
            result.train_s += time.perf_counter() - t0
            result.steps = step + 1
            result.tokens += sum(b.tokens.numel() for b in batches)
            result.target_tokens += n_targets
            result.final_loss = loss_value
            if (step + 1) % history_every == 0 or step + 1 == cfg.steps:
                result.loss_history.append([step + 1, loss_value])
            bar.update(step + 1, loss=loss_value, rate=f"{_human(result.tokens_per_s)} tok/s")
            if checkpoint_dir is not None and cfg.checkpoint_every > 0 and (step + 1) % cfg.checkpoint_every == 0 \
                    and step + 1 < cfg.steps:
                last_good, last_good_step = save_checkpoint(checkpoint_dir, model, snapshot(step + 1)), step + 1
            for callback in callbacks:
                callback(step + 1, model, loss_value)
    finally:
        bar.close()
    if checkpoint_dir is not None and cfg.steps > 0 and result.steps == cfg.steps:
        save_checkpoint(checkpoint_dir, model, snapshot(result.steps))
    model.eval()
    return result


def _human(x: float) -> str:
    for unit in ("", "k", "M", "G"):
        if abs(x) < 1000:
            return f"{x:.1f}{unit}"
        x /= 1000
    return f"{x:.1f}T"


def read_model_config(directory: Path) -> dict[str, Any]:
    path = Path(directory) / "model_config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from None
