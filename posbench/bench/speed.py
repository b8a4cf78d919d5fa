"""Measuring speed: a timer (CUDA events on a GPU), the step each benchmark mode times, model FLOPs and the
device's peak, for the model-FLOPs utilisation.

A step is, by mode:

- ``train``: one optimizer step of the engine's own ``Trainer`` (forward, cross-entropy, backward, gradient
  clipping, AdamW, schedule; bf16 autocast on CUDA; compiled when ``train.compile`` says so);
- ``forward``: one forward pass without gradients (evaluation mode);
- ``decode``: ``new_tokens`` single-token steps after an untimed prompt (greedy), reported per token, with a
  static cache (``posbench.model.generate.Decoder``): compiled, one graph serves every step (a CUDA graph on CUDA).

Compilation (``compiled=True``) uses ``torch.compile`` with the given options (the backend: Inductor, or
``eager`` to trace without generating code). ``strict_compilation()`` surrounds a benchmark: each cell starts
from a fresh compiler (``fresh_compiler()``: every earlier graph forgotten, the counters zeroed), and a hit
recompile limit raises instead of running the function eagerly in silence (dynamo's default: past 8 entries
per code object, which 13 encodings, or 5 score_mods at 2 lengths, reach in one process); ``compile_counts()``
tells how many graphs a cell compiled and how many graph breaks it had.

MFU uses the PaLM count: 6 x N + 12 x layers x width x sequence FLOPs per trained token (a third of that for a
forward pass), N = every parameter that multiplies activations (all but the input embedding table, a lookup),
against the device's dense bf16 peak.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from posbench.data.batch import Batch
from posbench.model.generate import Decoder
from posbench.train.device import autocast
from posbench.train.trainer import Trainer

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


def device_peak(device: torch.device, override: float | None) -> tuple[float | None, str]:
    """The dense bf16 peak in TFLOP/s and where it comes from."""
    if override:
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
    """Training FLOPs per token (a forward pass: a third); the blocks count once per recurrence they run."""
    cfg = model.config
    passes = cfg.recurrences if mode != "forward" else (cfg.eval_recurrences or cfg.recurrences)
    blocks = sum(p.numel() for p in model.blocks.parameters())
    train = 6 * (matmul_parameters(model) + (passes - 1) * blocks) + 12 * passes * cfg.n_layers * cfg.d_model * length
    return train / 3 if mode == "forward" else train


class Timer:
    """Milliseconds of ``fn()``: CUDA events on a GPU (no host wall-clock noise), the wall clock elsewhere."""

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"

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


class FixedBatch:
    """A train stream that yields one batch again and again (random tokens, every target counted)."""

    def __init__(self, batch):
        self.batch = batch

    def next_batch(self, batch_size: int):
        return self.batch

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def random_tokens(vocab: int, batch: int, length: int, device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (batch, length), generator=generator).to(device)


@contextlib.contextmanager
def strict_compilation() -> Iterator[None]:
    """Within: a hit recompile limit is an error (``FailOnRecompileLimitHit``), not an eager fallback."""
    config = torch._dynamo.config
    name = next((n for n in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit") if hasattr(config, n)), None)
    before = getattr(config, name) if name else None
    if name:
        setattr(config, name, True)
    try:
        yield
    finally:
        if name:
            setattr(config, name, before)
        torch._dynamo.reset()


def fresh_compiler() -> None:
    """Forget every compiled graph (each cell compiles its own, within the recompile limit) and zero the counts."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


def compile_counts() -> tuple[int, int]:
    """(graphs compiled, graph breaks) since ``fresh_compiler()``."""
    counters = torch._dynamo.utils.counters
    return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))


def train_step(model, length: int, batch: int, device: torch.device, train: Any, rounds: int,
               compile_options: dict[str, Any] | None = None) -> Callable[[], float]:
    """One optimizer step of the engine's ``Trainer`` per call; returns its milliseconds. ``compile_options``
    (when given): the model compiled as the engine does (``torch.compile`` of the module), with these options.
    ``train``: the run's ``TrainConfig``, its recipe kept and its schedule made the timed one's."""
    tokens = random_tokens(model.config.vocab_size, batch, length + 1, device)
    data = Batch(tokens[:, :-1], tokens[:, 1:], target_count=batch * length)
    cfg = dataclasses.replace(train, steps=rounds, batch_size=batch, grad_accum=1, checkpoint_every=0,
                              log_every=rounds, checkpointing=False, compile=False)
    trainer = Trainer(model, FixedBatch(data), cfg, device=device)
    if compile_options is not None:
        trainer.forward = torch.compile(trainer.replica.module, **compile_options)
        trainer.result.compile = True
    timer, done = Timer(device), [0]

    def step() -> float:
        ms = timer(lambda: trainer.step(done[0]))
        done[0] += 1
        trainer.pending.clear()              # the losses are never read: nothing syncs with the device
        return ms
    return step


def forward_step(model, length: int, batch: int, device: torch.device, precision: str,
                 compile_options: dict[str, Any] | None = None) -> Callable[[], float]:
    model.eval()
    runner = torch.compile(model, **compile_options) if compile_options is not None else model
    tokens = random_tokens(model.config.vocab_size, batch, length, device)
    timer = Timer(device)

    def step() -> float:
        def forward() -> None:
            with torch.no_grad(), autocast(device, precision):
                runner(tokens)
        return timer(forward)
    return step


def decode_step(model, length: int, batch: int, device: torch.device, precision: str,
                compile_options: dict[str, Any] | None, new_tokens: int) -> Callable[[], float]:
    """Prefill untimed, then ``new_tokens`` single-token steps with a static cache; returns ms per token. The
    same cache (emptied) and, when compiled, the same compiled step serve every call."""
    model.eval()
    decoder = Decoder(model, compile_options if compile_options is not None else False)
    prompt = random_tokens(model.config.vocab_size, batch, length, device)
    timer = Timer(device)

    def run() -> float:
        with torch.no_grad(), autocast(device, precision):
            cache, token = decoder.prefill(prompt, new_tokens)

            def steps() -> None:
                nonlocal token
                for _ in range(new_tokens):
                    token = decoder.next(token, cache)
            return timer(steps) / new_tokens
    return run


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()
