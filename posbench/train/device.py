"""Where and how a run computes: the device, CPU threads, precision (autocast) and compilation."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import platform
from typing import Any

import torch

from posbench.errors import UserError


class DeviceError(UserError):
    """An unavailable device; ``str()`` is one line."""


def pick_device(name: str = "auto") -> torch.device:
    """``auto``: cuda, then mps, then cpu. An explicit name must be available."""
    name = (name or "auto").lower()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise DeviceError(f"unknown device '{name}'; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise DeviceError(f"unsupported device '{name}'; use auto, cpu, cuda or mps")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"device '{name}' requested but CUDA is not available here; use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise DeviceError(f"device '{name}' does not exist; {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not _mps_available():
        raise DeviceError(f"device '{name}' requested but MPS is not available here; use --device cpu")
    return device


def _mps_available() -> bool:
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def setup_device(device: torch.device, threads: int = 0) -> int:
    """CPU: flush denormals (they slow softmax gradients 3-7x) and pick the thread count; returns it.

    ``threads=0`` (auto): ``auto_threads()``, the cores this process may run on, shared among the processes
    posbench started on this machine; any other number is used as it is.
    """
    if device.type == "cpu":
        torch.set_flush_denormal(True)
        keep_freed_memory()
        torch.set_num_threads(max(1, threads if threads > 0 else auto_threads()))
    elif device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return torch.get_num_threads()


#: glibc's mallopt parameters, and the values set: no block is mapped on its own, and up to 2 GiB of freed memory
#: at the heap's top stays with the process (the largest value a C int holds)
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
TRIM_THRESHOLD = 2**31 - 1


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed memory for the next allocation instead of returning it to the system.

    By default a block over 128 KiB (raised to at most 32 MiB as such blocks are freed) is mapped fresh from the
    system and unmapped when freed, and the heap's free top is trimmed, so every step's large temporaries
    (scores, activations, their gradients) are page-faulted in again. Measured on a 2-core AMD EPYC (the small
    model, 1 x 2048 tokens, float32): copying 32 MB into new tensors took 14 ms instead of 2.4; a CoPE
    training step (its [B, H, N, N] tensors are larger than 32 MiB) spent most of its 6.5 s in the kernel and
    took 2.5 s with this; RoPE's step 0.81 s -> 0.73 s. All blocks then come from the heap, and the process keeps
    its peak memory (it reuses it every step). Returns whether it applied (glibc only; elsewhere nothing
    changes)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def auto_threads() -> int:
    """The cores this process may run on (its CPU affinity: what ``taskset``, a container's cpuset, SLURM or a
    sweep's slot gives it), shared among the processes posbench itself started on this machine: torchrun's ranks
    here (``LOCAL_WORLD_SIZE``). A sweep that runs several CPU cells at once pins each to its share of the cores
    and passes ``train.threads`` itself.

    Not the load average: it counts the past minute, not what runs now, and it counts posbench's own work (a
    previous run, ``pip install``): on a quiet 2-core machine it was about 1 right after any command, and the
    run took one thread (a step 1.8x slower than with two)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:                      # no affinity (macOS, Windows): every core
        cores = os.cpu_count() or 1
    try:
        local = int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
    except ValueError:
        local = 1
    return max(1, cores // max(1, local))


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision == "auto":
        return "bf16" if torch.device(device).type == "cuda" else "fp32"
    return precision


def resolve_compile(value: Any, device: torch.device) -> bool:
    """``train.compile``: ``auto`` compiles on CUDA only (on a CPU compiling costs more than it saves)."""
    if value == "auto":
        return torch.device(device).type == "cuda"
    return bool(value)


def autocast(device: torch.device, precision: str):
    if precision == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model with the instruction set torch's kernels use on it, e.g.
    ``AMD EPYC (AVX512)``: the same run on two CPU models can round differently (an Intel Xeon and an AMD EPYC did,
    both AVX512 to torch: docs/studies/cpu/v1.md), so a run records which."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_model()} ({torch.backends.cpu.get_cpu_capability()})"


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name (Linux's ``/proc/cpuinfo``), else what ``platform`` knows (``x86_64`` at least)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine()
