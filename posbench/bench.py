"""``posbench bench``: the cost of each encoding, measured the same way for all of them.

For every encoding and sequence length: the median milliseconds of one step after warm-up (CUDA events on a
GPU, the wall clock elsewhere), tokens per second, model-FLOPs utilisation, peak memory and the ratio to RoPE
measured in the same run. A step is, by ``mode``:

- ``train``: forward, cross-entropy, backward, gradient clipping and an AdamW step, exactly as the engine
  trains (``engine.make_optimizer``; bf16 autocast on CUDA);
- ``forward``: one forward pass without gradients (evaluation mode);
- ``decode``: one new token with the KV cache after a prompt of ``length`` tokens (greedy, as ``generate``);
  reported per token.

MFU uses the PaLM count: 6 x N + 12 x layers x width x sequence FLOPs per trained token (a third of that for a
forward pass), N = every parameter that multiplies activations (all but the input embedding table, a lookup),
against the device's dense bf16 peak, named in the result. A cell that runs out of memory is reported as
``oom`` and the run goes on. On a CPU the encodings are timed round robin (one step of each in turn), so a
neighbouring process slows all of them alike.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from posbench.errors import UserError

BASELINE = "rope"

#: model shapes: ``small`` is the CPU benchmark (4 layers of 256), ``paper`` the TAPE paper's 12 x 768 model
SIZES: dict[str, dict[str, Any]] = {
    "small": {"model": {"d_model": 256, "n_layers": 4, "n_heads": 4, "d_ff": 1024, "vocab_size": 256},
              "batch": [8], "lengths": [256], "new_tokens": 32},
    "paper": {"model": {"d_model": 768, "n_layers": 12, "n_heads": 12, "d_ff": 3072, "vocab_size": 32000},
              "batch": [16, 1], "lengths": [1024, 8192], "new_tokens": 128},
}
MODES = ("train", "forward", "decode")

#: dense bf16 tensor-core peaks (TFLOP/s, no sparsity), matched against ``torch.cuda.get_device_name()``;
#: the first matching entry wins
PEAK_TFLOPS: list[tuple[tuple[str, ...], float, str]] = [
    (("H100", "PCIE"), 756.0, "H100 PCIe dense bf16"),
    (("H100", "NVL"), 835.0, "H100 NVL dense bf16"),
    (("H100",), 989.0, "H100 SXM dense bf16"),
    (("H200",), 989.0, "H200 dense bf16"),
    (("H800",), 989.0, "H800 dense bf16"),
    (("B200",), 2250.0, "B200 dense bf16"),
    (("A100",), 312.0, "A100 dense bf16"),
    (("A800",), 312.0, "A800 dense bf16"),
    (("L40S",), 362.0, "L40S dense bf16"),
    (("L4",), 121.0, "L4 dense bf16"),
]


class BenchError(UserError):
    """Bad benchmark settings; ``str()`` is one line."""


@dataclass
class BenchConfig:
    encodings: list[str]
    size: str = "small"
    batch: list[int] = field(default_factory=list)       # one per length, or one for all
    lengths: list[int] = field(default_factory=list)
    mode: str = "train"
    compile: bool = False
    device: str = "auto"
    precision: str = "auto"
    attention: str = "auto"
    warmup: int = 3
    steps: int = 10
    new_tokens: int = 0
    threads: int = 0
    peak_tflops: float | None = None

    def __post_init__(self):
        if self.size not in SIZES:
            raise BenchError(f"unknown size '{self.size}'; sizes: {', '.join(SIZES)}")
        if self.mode not in MODES:
            raise BenchError(f"unknown mode '{self.mode}'; modes: {', '.join(MODES)}")
        preset = SIZES[self.size]
        self.lengths = list(self.lengths or preset["lengths"])
        if not self.batch:        # the preset's batch per length for its lengths, else its first for every length
            self.batch = list(preset["batch"] if self.lengths == preset["lengths"] else preset["batch"][:1])
        if len(self.batch) == 1:
            self.batch = self.batch * len(self.lengths)
        if len(self.batch) != len(self.lengths):
            raise BenchError(f"--batch gives {len(self.batch)} values for {len(self.lengths)} lengths; give one, "
                             f"or one per length")
        self.new_tokens = self.new_tokens or preset["new_tokens"]
        for name, values in (("--lengths", self.lengths), ("--batch", self.batch)):
            if not values or any(v < 1 for v in values):
                raise BenchError(f"{name} must be positive integers, got {values}")
        if self.steps < 1 or self.warmup < 0:
            raise BenchError(f"--steps must be >= 1 and --warmup >= 0, got {self.steps} and {self.warmup}")
        if self.peak_tflops is not None and self.peak_tflops <= 0:
            raise BenchError(f"--peak-tflops must be positive, got {self.peak_tflops}")
        # ratios are to RoPE measured in the same run: it is always measured, and listed first
        self.encodings = list(dict.fromkeys([BASELINE, *self.encodings]))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Cell:
    encoding: str
    length: int
    batch: int
    status: str = "ok"              # ok | oom | error
    ms: float | None = None         # median per step (train, forward) or per new token (decode)
    ms_all: list[float] = field(default_factory=list)
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_gib: float | None = None
    x_rope: float | None = None
    params: int | None = None
    flops_per_token: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def device_peak(device: torch.device, override: float | None) -> tuple[float | None, str]:
    """The dense bf16 peak in TFLOP/s and where it comes from."""
    if override is not None:
        return override, "given with --peak-tflops"
    if device.type != "cuda":
        return None, "unknown for this device (give --peak-tflops for an MFU)"
    name = torch.cuda.get_device_name(device).upper()
    for keys, tflops, label in PEAK_TFLOPS:
        if all(k in name for k in keys):
            return tflops, label
    return None, f"unknown for {name} (give --peak-tflops for an MFU)"


def matmul_parameters(model: torch.nn.Module) -> int:
    """Parameters that multiply activations: all but the input embedding table."""
    embedding = sum(p.numel() for p in model.embed.parameters())
    return model.num_parameters() - embedding


def flops_per_token(model: torch.nn.Module, length: int, mode: str) -> float:
    cfg = model.config
    train = 6 * matmul_parameters(model) + 12 * cfg.n_layers * cfg.d_model * length
    return train / 3 if mode == "forward" else train


class Timer:
    """Milliseconds of ``fn()``: CUDA events on a GPU (no host wall-clock noise), the wall clock elsewhere."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], Any]) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1000


def build_model(cfg: BenchConfig, encoding: str, length: int, device: torch.device):
    from posbench.model import ModelConfig, Transformer

    shape = SIZES[cfg.size]["model"]
    torch.manual_seed(0)
    model = Transformer(ModelConfig(encoding=encoding, max_seq_len=length, attention=cfg.attention, **shape))
    return model.to(device)


def make_step(cfg: BenchConfig, model, length: int, batch: int, device: torch.device, precision: str):
    """A closure running one benchmark step of ``cfg.mode``."""
    from posbench.engine import TrainConfig, autocast, make_optimizer

    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(1)
    runner = torch.compile(model) if cfg.compile else model
    if cfg.mode == "train":
        model.train()
        tokens = torch.randint(0, vocab, (batch, length + 1), generator=generator).to(device)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        train_cfg = TrainConfig()
        optimizer = make_optimizer(model, train_cfg)
        params = [p for p in model.parameters() if p.requires_grad]

        def train_step() -> None:
            optimizer.zero_grad(set_to_none=True)
            with autocast(device, precision):
                logits = runner(inputs)
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, train_cfg.grad_clip)
            optimizer.step()
        return train_step

    model.eval()
    if cfg.mode == "forward":
        tokens = torch.randint(0, vocab, (batch, length), generator=generator).to(device)

        def forward_step() -> None:
            with torch.no_grad(), autocast(device, precision):
                runner(tokens)
        return forward_step

    prompt = torch.randint(0, vocab, (batch, length), generator=generator).to(device)
    new = cfg.new_tokens

    def decode_run() -> float:
        """Prefill untimed, then ``new`` single-token steps; returns ms per token."""
        with torch.no_grad(), autocast(device, precision):
            cache = model.new_cache(length + new)
            token = runner(prompt, cache=cache)[:, -1:].argmax(-1)
            timer = Timer(device)

            def steps() -> None:
                nonlocal token
                for _ in range(new):
                    token = runner(token, cache=cache)[:, -1:].argmax(-1)
            return timer(steps) / new
    return decode_run


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def run_cells(cfg: BenchConfig, device: torch.device, precision: str, progress: Callable[[int], None]
              ) -> list[Cell]:
    """Measure every (length, encoding) cell; ``progress(k)`` after each timed or warm-up step. On a GPU one
    cell at a time (its peak memory is its own); elsewhere round robin."""
    cells: list[Cell] = []
    done = 0
    for length, batch in zip(cfg.lengths, cfg.batch):
        group = [Cell(encoding, length, batch) for encoding in cfg.encodings]
        if device.type == "cuda":
            for cell in group:
                done = _time_alone(cfg, cell, device, precision, progress, done)
                _release(device)                   # the cell's model is gone before the next one is built
        else:
            done = _time_round_robin(cfg, group, device, precision, progress, done)
            _release(device)
        for cell in group:
            _summarise(cell, cfg)
        cells += group
    _ratios(cells)
    return cells


def _prepare(cfg: BenchConfig, cell: Cell, device: torch.device, precision: str) -> Callable | None:
    """Build the cell's model and its step (recording its size); None if that fails (recorded in the cell)."""
    try:
        model = build_model(cfg, cell.encoding, cell.length, device)
        cell.params = model.num_parameters()
        cell.flops_per_token = flops_per_token(model, cell.length, cfg.mode)
        return make_step(cfg, model, cell.length, cell.batch, device, precision)
    except Exception as exc:  # noqa: BLE001 - a failed cell is recorded, the run goes on
        _fail(cell, exc)
        return None


def _time_alone(cfg: BenchConfig, cell: Cell, device: torch.device, precision: str,
                progress: Callable[[int], None], done: int) -> int:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step = _prepare(cfg, cell, device, precision)
    if step is None:
        return done
    timer = Timer(device)
    try:
        for i in range(cfg.warmup + cfg.steps):
            ms = _one(step, timer, cfg.mode)
            if i >= cfg.warmup:
                cell.ms_all.append(ms)
            done += 1
            progress(done)
    except Exception as exc:  # noqa: BLE001
        _fail(cell, exc)
        return done
    if device.type == "cuda":
        cell.peak_gib = torch.cuda.max_memory_allocated(device) / 2**30
    return done


def _time_round_robin(cfg: BenchConfig, group: list[Cell], device: torch.device, precision: str,
                      progress: Callable[[int], None], done: int) -> int:
    """One step of each encoding in turn, so a neighbouring process slows all of them alike."""
    steps = {cell.encoding: step for cell in group if (step := _prepare(cfg, cell, device, precision))}
    timer = Timer(device)
    for round_ in range(cfg.warmup + cfg.steps):
        for cell in group:
            if cell.encoding not in steps:
                continue
            try:
                ms = _one(steps[cell.encoding], timer, cfg.mode)
            except Exception as exc:  # noqa: BLE001
                _fail(cell, exc)
                del steps[cell.encoding]
                continue
            if round_ >= cfg.warmup:
                cell.ms_all.append(ms)
            done += 1
            progress(done)
    return done


def _one(step: Callable, timer: Timer, mode: str) -> float:
    return step() if mode == "decode" else timer(step)


def _summarise(cell: Cell, cfg: BenchConfig) -> None:
    if cell.status != "ok" or not cell.ms_all:
        return
    cell.ms = statistics.median(cell.ms_all)
    tokens = cell.batch if cfg.mode == "decode" else cell.batch * cell.length
    cell.tokens_per_s = tokens / (cell.ms / 1000)
    peak = cfg.peak_tflops
    if peak and cfg.mode != "decode" and cell.flops_per_token:
        cell.mfu = cell.flops_per_token * cell.tokens_per_s / (peak * 1e12)


def _ratios(cells: list[Cell]) -> None:
    baseline = {c.length: c.ms for c in cells if c.encoding == BASELINE and c.ms}
    for cell in cells:
        if cell.ms and baseline.get(cell.length):
            cell.x_rope = cell.ms / baseline[cell.length]


def _fail(cell: Cell, exc: BaseException) -> None:
    cell.status = "oom" if is_oom(exc) else "error"
    cell.error = " ".join(str(exc).split())[:300] or type(exc).__name__
    cell.ms_all = []


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def total_steps(cfg: BenchConfig) -> int:
    return len(cfg.lengths) * len(cfg.encodings) * (cfg.warmup + cfg.steps)


def run_bench(cfg: BenchConfig, out_root, *, reporter: Any = None, command: list[str] | None = None
              ) -> tuple[Any, dict[str, Any]]:
    """Measure, then write ``<out_root>/bench/<mode>/<run-id>/result.json``; returns (run dir, result)."""
    from pathlib import Path

    from posbench.engine import pick_device, resolve_precision, setup_device
    from posbench.progress import NullReporter
    from posbench.results import RESULT_FILE, atomic_write_json, new_run_dir, now_iso, result_header

    from posbench.encodings import ENCODINGS

    for name in cfg.encodings:
        ENCODINGS.get(name)                          # unknown names: one line, before anything runs
    device = pick_device(cfg.device)
    setup_device(device, cfg.threads)
    precision = resolve_precision(cfg.precision, device)
    peak, peak_source = device_peak(device, cfg.peak_tflops)
    cfg.peak_tflops = peak
    created = now_iso()
    reporter = reporter or NullReporter()
    bar = reporter.task(f"bench {cfg.mode}", total=total_steps(cfg), unit="step")
    try:
        cells = run_cells(cfg, device, precision, lambda done: bar.update(done))
    finally:
        bar.close()
    run_dir = new_run_dir(Path(out_root), "bench", cfg.mode)
    header = result_header(run_dir, "bench", ",".join(cfg.encodings), cfg.size, created=created, command=command,
                           device=device, precision=precision)
    result = {
        **header,
        "config": {**cfg.to_dict(), "device": str(device), "precision": precision,
                   "model": dict(SIZES[cfg.size]["model"])},
        "metrics": {},
        "bench": {"device_name": header["environment"]["device_name"], "peak_tflops": peak, "peak_source": peak_source,
                  "timer": "cuda events" if device.type == "cuda" else "perf_counter",
                  "unit": "ms/token" if cfg.mode == "decode" else "ms/step",
                  "flops": "6 N + 12 layers width length per trained token (a third for forward); N excludes "
                           "the input embedding table",
                  "cells": [cell.to_dict() for cell in cells]},
    }
    atomic_write_json(run_dir / RESULT_FILE, result)
    return run_dir, result
