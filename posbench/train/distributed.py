"""Several processes through PyTorch's own engine: ``torchrun`` starts them, this module joins them.

    torchrun --nproc_per_node 8 -m posbench run -e rope -t arithmetic --preset gpu
    torchrun --nnodes 2 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 -m posbench run ...

``setup(device)`` reads torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``) and joins the
process group once per process: ``gloo`` on a CPU, ``cpu:gloo,cuda:nccl`` on GPUs (CUDA tensors through
NCCL, the few CPU tensors -- checkpoint state, gathered evaluation results -- through gloo), each process on
``cuda:LOCAL_RANK``. Without torchrun it changes nothing: one process, ``current().world == 1``.

What the ranks share (see ``posbench.train.trainer``):

- **Data.** The global batch stays the preset's ``train.batch_size``. ``RankBatches`` gives each rank a
  disjoint slice of the same deterministic stream, so the union over ranks is exactly what one process
  sees. Streams that can skip examples (``tasks.base.IndexedStream``) give rank r examples
  ``[r * B / N, (r + 1) * B / N)`` of each step's ``B``; the per-rank micro-batch is the largest divisor of
  ``B / N`` not above the preset's micro-batch, and the accumulation steps follow. Any other stream is
  read whole by every rank and each keeps its rows of every micro-batch.
- **Model.** ``wrap`` returns DistributedDataParallel, or FSDP2 (``torch.distributed.fsdp.fully_shard``,
  one unit per block plus the root) when ``train.parallel=fsdp``. Parameters that never reach the loss
  (TAPE's last layer) are frozen by the encoding's ``init_weights()`` when the model is built, so
  DDP registers no hook for them and needs no ``find_unused_parameters`` graph walk.
- **Evaluation.** ``shard_map`` runs a list of independent work items (batches of prompts or windows) split
  across ranks and gathers the results in the original order, so metrics equal one process's.

**A process that stops answering.** The process group has a timeout (``POSBENCH_DIST_TIMEOUT`` seconds,
default 300): a collective that waits longer for a frozen (``SIGSTOP``), hung or vanished rank fails instead
of hanging for torch's default 30 minutes. ``peers_watched`` (around every run) then holds a roll call in the
job's rendezvous store and stops with one line that names the ranks that did not answer (exit code 1, from
the lowest rank that did; torchrun then ends the others). With NCCL, torch's watchdog enforces the same
timeout on GPU collectives and ends the process itself.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import datetime
import inspect
import itertools
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel

from posbench.errors import ConfigError, EnvironmentFault, UserError

TIMEOUT_ENV, DEFAULT_TIMEOUT_S = "POSBENCH_DIST_TIMEOUT", 300.0
ROLL_CALL_S = 30.0                  # the most a roll call waits for the ranks that are alive to answer


class PeerLost(EnvironmentFault):
    """A rank of the job stopped answering; ``announce`` is False on all but one rank (one line per job)."""

    def __init__(self, message: object = "", announce: bool = True):
        super().__init__(message)
        self.announce = announce


@dataclass(frozen=True)
class Context:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


_CURRENT = Context()


def current() -> Context:
    """The process group this process belongs to (one process by default)."""
    return _CURRENT


def is_main() -> bool:
    return _CURRENT.is_main


def launched_world() -> int:
    """The world size torchrun asked for (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def setup(device: torch.device) -> tuple[Context, torch.device]:
    """Join torchrun's process group (once per process) and return it with this rank's device."""
    global _CURRENT
    device = torch.device(device)
    if _CURRENT.enabled:
        return _CURRENT, _rank_device(device, _CURRENT)
    if dist.is_available() and dist.is_initialized():      # a caller (a test) made the group itself
        _CURRENT = Context(dist.get_rank(), dist.get_world_size(),
                           int(os.environ.get("LOCAL_RANK", dist.get_rank())), dist.get_backend())
        return _CURRENT, _rank_device(device, _CURRENT)
    if launched_world() <= 1:
        return _CURRENT, device
    if not dist.is_available():
        raise ConfigError("torchrun started several processes but this PyTorch has no torch.distributed")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"local rank {local_rank} has no GPU ({torch.cuda.device_count()} here); use "
                              f"--nproc_per_node <= {torch.cuda.device_count()}")
        torch.cuda.set_device(local_rank)
        backend = "cpu:gloo,cuda:nccl"
    elif device.type == "cpu":
        backend = "gloo"
    else:
        raise ConfigError(f"several processes need CUDA or CPU devices, not {device.type}")
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s()))
    atexit.register(shutdown)
    _CURRENT = Context(dist.get_rank(), dist.get_world_size(), local_rank, backend)
    return _CURRENT, _rank_device(device, _CURRENT)


def timeout_s() -> float:
    """How long a collective waits for the other processes: ``POSBENCH_DIST_TIMEOUT`` seconds (default 300)."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e7:
        raise ConfigError(f"{TIMEOUT_ENV}={raw!r}: expected a number of seconds > 0")
    return value


_ROLL_CALLS = itertools.count()


@contextlib.contextmanager
def peers_watched():
    """Turn a collective that failed because a rank stopped answering (a timeout, a closed connection) into one
    line naming that rank (``PeerLost``); any other error goes through unchanged."""
    try:
        yield
    except RuntimeError as exc:
        failed_collective = type(exc) is RuntimeError or isinstance(exc, getattr(dist, "DistError", ()))
        if not (_CURRENT.enabled and failed_collective and dist.is_initialized()):
            raise
        missing = roll_call(min(ROLL_CALL_S, timeout_s()))
        if missing == []:                       # every rank is alive: not a lost process, a real error
            raise
        ctx = _CURRENT
        if missing is None:
            who, first_alive = "the rendezvous store (held by rank 0 or torchrun)", ctx.rank
        else:
            names = ", ".join(map(str, missing))
            who = f"rank {names} of {ctx.world}" if len(missing) == 1 else f"ranks {names} of {ctx.world}"
            first_alive = min(r for r in range(ctx.world) if r not in missing)
        raise PeerLost(f"{who} stopped answering: no reply within {timeout_s():g} s (frozen, killed or stuck); "
                       f"the job stops ({TIMEOUT_ENV}=SECONDS sets the limit)",
                       announce=ctx.rank == first_alive) from None


def roll_call(wait_s: float) -> list[int] | None:
    """The ranks that do not check in within ``wait_s`` seconds after this one did, through the job's
    rendezvous store (every rank that is alive checks in when its collective fails); None when the store itself
    does not answer."""
    ctx, call = _CURRENT, next(_ROLL_CALLS)
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set_timeout(datetime.timedelta(seconds=max(wait_s, 1.0)))
        store.set(f"posbench/roll/{call}/{ctx.rank}", "here")
        deadline = time.monotonic() + wait_s
        while True:
            missing = [r for r in range(ctx.world) if not store.check([f"posbench/roll/{call}/{r}"])]
            if not missing or time.monotonic() > deadline:
                return missing
            time.sleep(0.1)
    except Exception:   # noqa: BLE001 - the store is gone (its host froze or died) or this torch has none
        return None


def _rank_device(device: torch.device, ctx: Context) -> torch.device:
    if device.type == "cuda" and ctx.enabled:
        return torch.device("cuda", ctx.local_rank)
    return device


def shutdown() -> None:
    """Leave the process group (at the end of a command)."""
    global _CURRENT
    if _CURRENT.enabled and dist.is_initialized():
        dist.destroy_process_group()
    _CURRENT = Context()


def use(ctx: Context) -> None:
    """Make ``ctx`` current (tests that build their own process group)."""
    global _CURRENT
    _CURRENT = ctx


# ---- collectives on Python objects --------------------------------------------------------------------------

def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` as rank ``src`` has it, on every rank."""
    if not _CURRENT.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def run_on_main(fn: Callable[[], Any]) -> Any:
    """Call ``fn`` on rank 0 only and hand its value -- or the ``UserError`` it raised -- to every rank."""
    if not _CURRENT.enabled:
        return fn()
    outcome: tuple[str, Any] = ("ok", None)
    if _CURRENT.is_main:
        try:
            outcome = ("ok", fn())
        except UserError as exc:
            outcome = ("error", exc)
    kind, value = broadcast_object(outcome)
    if kind == "error":
        raise value
    return value


def all_gather_objects(obj: Any) -> list[Any]:
    if not _CURRENT.enabled:
        return [obj]
    out: list[Any] = [None] * _CURRENT.world
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if _CURRENT.enabled:
        dist.barrier()


def shard_map(fn: Callable[[Any], Any], items: Sequence[Any], *, cost: Callable[[Any], float] | None = None,
              on_done: Callable[[int], None] | None = None) -> list[Any]:
    """``[fn(item) for item in items]``, the items split across ranks, the results gathered in order.

    Each item is computed by exactly one rank, exactly as one process would compute it (the same batch),
    so the gathered results are the single-process ones. ``cost(item)`` balances the ranks (the largest
    items first, each to the least loaded rank); ``on_done(n)`` reports progress as an estimate of the
    items finished over all ranks.
    """
    ctx = _CURRENT
    if not ctx.enabled:
        out = []
        for item in items:
            out.append(fn(item))
            if on_done:
                on_done(len(out))
        return out
    mine = assign(items, ctx.world, cost)[ctx.rank]
    results: dict[int, Any] = {}
    for index in mine:
        results[index] = fn(items[index])
        if on_done:
            on_done(min(len(items), len(results) * ctx.world))
    merged: dict[int, Any] = {}
    for part in all_gather_objects(results):
        merged.update(part)
    return [merged[i] for i in range(len(items))]


def assign(items: Sequence[Any], world: int, cost: Callable[[Any], float] | None = None) -> list[list[int]]:
    """Item indices per rank: round robin, or longest-first onto the least loaded rank with ``cost``."""
    if cost is None:
        return [list(range(r, len(items), world)) for r in range(world)]
    loads, parts = [0.0] * world, [[] for _ in range(world)]
    for index in sorted(range(len(items)), key=lambda i: (-cost(items[i]), i)):
        rank = min(range(world), key=lambda r: (loads[r], r))
        parts[rank].append(index)
        loads[rank] += cost(items[index])
    return [sorted(p) for p in parts]


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    if _CURRENT.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


# ---- data: each rank's slice of the global batch ------------------------------------------------------------

@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step's ``global_batch`` sequences are split: per rank, ``grad_accum`` micro-batches of
    ``micro_batch`` sequences; ``sharding`` says how a rank finds its rows in the stream."""

    global_batch: int
    world: int
    micro_batch: int
    grad_accum: int
    sharding: str            # "none" | "examples" (skip to the rank's slice) | "rows" (rows of each micro-batch)

    def to_dict(self) -> dict[str, Any]:
        return {"world_size": self.world, "global_batch": self.global_batch,
                "micro_batch_per_rank": self.micro_batch, "grad_accum_per_rank": self.grad_accum,
                "data_sharding": self.sharding}


def plan_batches(batch_size: int, grad_accum: int, world: int, stream: Any) -> BatchPlan:
    """The per-rank micro-batch and accumulation steps for a global batch of ``batch_size``; the preset's
    micro-batch (``batch_size / grad_accum``) is the most one device is asked to hold."""
    micro = batch_size // grad_accum
    if world == 1:
        return BatchPlan(batch_size, 1, micro, grad_accum, "none")
    if hasattr(stream, "skip"):
        if batch_size % world:
            raise ConfigError(f"train.batch_size {batch_size} does not split over {world} processes; use a "
                              f"multiple of {world}")
        per_rank = batch_size // world
        size = max(d for d in range(1, min(micro, per_rank) + 1) if per_rank % d == 0)
        return BatchPlan(batch_size, world, size, per_rank // size, "examples")
    if micro % world:
        raise ConfigError(f"the micro-batch of {micro} sequences (train.batch_size / train.grad_accum) does not "
                          f"split over {world} processes for this task's data; make it a multiple of {world}")
    return BatchPlan(batch_size, world, micro // world, grad_accum, "rows")


class RankBatches:
    """This rank's micro-batches of each step, read from the shared deterministic ``stream``."""

    def __init__(self, stream: Any, plan: BatchPlan, rank: int):
        self.stream, self.plan, self.rank = stream, plan, rank

    def next_step(self) -> list[Any]:
        p, stream = self.plan, self.stream
        if p.sharding == "none":
            return [stream.next_batch(p.micro_batch) for _ in range(p.grad_accum)]
        if p.sharding == "examples":
            per_rank = p.global_batch // p.world
            stream.skip(self.rank * per_rank)
            batches = [stream.next_batch(p.micro_batch) for _ in range(p.grad_accum)]
            stream.skip((p.world - 1 - self.rank) * per_rank)
            return batches
        full = p.micro_batch * p.world
        rows = slice(self.rank * p.micro_batch, (self.rank + 1) * p.micro_batch)
        return [stream.next_batch(full).rows(rows) for _ in range(p.grad_accum)]


# ---- the model -------------------------------------------------------------------------------------------------

def state_dict_api():
    """``torch.distributed.checkpoint.state_dict``: the full (unsharded) state of a replicated or sharded model
    and its optimizer."""
    from torch.distributed.checkpoint import state_dict  # torch.distributed.checkpoint: ~1 s, several processes only

    return state_dict


class Replica:
    """One process: the model itself. ``Parallel`` subclasses add DDP or FSDP with the same interface."""

    kind = "none"

    def __init__(self, model: nn.Module, device: torch.device):
        self.model = model                  # the caller's module: trained in place, evaluated afterwards
        self.module: nn.Module = model      # what the training step calls
        self.device = device

    def parameters(self) -> list[nn.Parameter]:
        """The trainable parameters, as the optimizer must see them."""
        return [p for p in self.module.parameters() if p.requires_grad]

    def sync_gradients(self, enabled: bool):
        """Context for one micro-batch's backward: ``enabled=False`` defers the gradient all-reduce."""
        return contextlib.nullcontext()

    def model_state(self) -> dict[str, torch.Tensor]:
        """The full (unsharded) weights, on rank 0 (a collective under FSDP: call it on every rank)."""
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The full optimizer state keyed by parameter name, on rank 0 (a collective under FSDP)."""
        api = state_dict_api()
        return api.get_optimizer_state_dict(self.module, optimizer,
                                            options=api.StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any] | None) -> None:
        """Load a full, name-keyed optimizer state that rank 0 holds (``None`` elsewhere) into every rank."""
        api = state_dict_api()
        enabled = current().enabled
        api.set_optimizer_state_dict(self.module, optimizer, state if state is not None else {},
                                     options=api.StateDictOptions(full_state_dict=True, broadcast_from_rank0=enabled))

    def finish(self) -> None:
        """After training: ``self.model`` holds the trained weights on ``self.device`` on every rank."""


class DDPReplica(Replica):
    kind = "ddp"

    def __init__(self, model: nn.Module, device: torch.device):
        super().__init__(model, device)
        model.to(device)
        broadcast_module(model)
        ids = [device.index] if device.type == "cuda" else None
        # no find_unused_parameters: parameters that never reach the loss are frozen (requires_grad=False)
        # when the model is built, and DDP registers hooks only for parameters that require gradients
        # buffers are constants (no batch statistics): do not re-broadcast them every forward
        names = inspect.signature(DistributedDataParallel).parameters
        buffers = {"forward_sync_buffers": False} if "forward_sync_buffers" in names else {"broadcast_buffers": False}
        self.module = DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True, **buffers)

    def sync_gradients(self, enabled: bool):
        return contextlib.nullcontext() if enabled else self.module.no_sync()


class FSDPReplica(Replica):
    """FSDP2 trains a sharded copy; ``finish`` gathers the trained weights back into the caller's model."""

    kind = "fsdp"

    def __init__(self, model: nn.Module, device: torch.device):
        from torch.distributed.fsdp import fully_shard  # torch.distributed.fsdp: about a second, FSDP only

        super().__init__(model, device)
        model.to("cpu")
        broadcast_module(model)                         # rank 0's weights everywhere, then shard them
        sharded = copy.deepcopy(model)
        mesh = init_device_mesh(device.type, (current().world,))
        warnings.filterwarnings("ignore", message=".*returned a view tensor.*")   # blocks return (x, state)
        for block in getattr(sharded, "blocks", []):
            fully_shard(block, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        self.module = sharded

    def parameters(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def sync_gradients(self, enabled: bool):
        self.module.set_requires_gradient_sync(enabled)
        return contextlib.nullcontext()

    def model_state(self) -> dict[str, torch.Tensor]:
        api = state_dict_api()
        return api.get_model_state_dict(self.module,
                                        options=api.StateDictOptions(full_state_dict=True, cpu_offload=True))

    def finish(self) -> None:
        api = state_dict_api()
        full = api.get_model_state_dict(self.module, options=api.StateDictOptions(full_state_dict=True))
        self.model.load_state_dict({k: v.to("cpu") for k, v in full.items()})
        self.model.to(self.device)
        self.module = self.model


def wrap(model: nn.Module, device: torch.device, parallel: str = "ddp") -> Replica:
    """The model as the training step runs it: itself (one process), DDP, or FSDP2."""
    if not current().enabled:
        model.to(device)
        return Replica(model, device)
    return (FSDPReplica if parallel == "fsdp" else DDPReplica)(model, device)


def broadcast_module(model: nn.Module, src: int = 0) -> None:
    """Rank ``src``'s parameters and buffers on every rank (a resumed or ``--init`` model starts alike)."""
    if not current().enabled:
        return
    with torch.no_grad():
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=src)
