"""Checkpoints that run no code: weights and optimizer tensors in safetensors, everything else in JSON.

A checkpoint is a directory::

    model.safetensors       the full (unsharded) weights, named as ``model.state_dict()`` names them
    model_config.json       ModelConfig.to_dict()
    optimizer.safetensors   the full optimizer state, one tensor per (parameter name, slot): "NAME/exp_avg"
    train_state.json        step, scheduler, data-stream state, RNG states (per rank), history, the
                            optimizer's param groups, the batch plan

Nothing in it is unpickled: ``safetensors`` and ``json`` only read data. Because every tensor is full and
keyed by parameter name, a checkpoint that N processes (DDP or FSDP) wrote loads into one process and back,
at any world size. Older checkpoints stored ``train_state.pt`` (a pickle, whose loading can run any code
the file holds): such a file is refused with one line and never opened.

It is written into a temporary directory of its own writer (``<dir>.tmp.<host>.<pid>.<random>``) and then
swapped in (``<dir>`` -> ``<dir>.old`` -> gone), so a kill at any moment leaves one complete checkpoint;
``checkpoint_path`` finds the ``.old`` one a kill mid-swap left. A write the machine refuses (disk full) is one
line (``posbench.errors.EnvironmentFault``) and removes its temporary directory; the last checkpoint stays.
Temporary directories that killed writers of this host left are removed by the next save.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import secrets
import shutil
import socket
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from posbench.errors import UserError, os_error
from posbench.files import atomic_save, atomic_write_json

FORMAT = "posbench-train-state"
VERSION = 1
WEIGHTS, CONFIG = "model.safetensors", "model_config.json"
OPTIMIZER, STATE = "optimizer.safetensors", "train_state.json"
PICKLED_STATE = "train_state.pt"
SEP = "/"


class CheckpointError(UserError):
    """A missing, unreadable or unsafe checkpoint; ``str()`` is one line."""


# ---- writing ---------------------------------------------------------------------------------------------------

def save_checkpoint(directory: Path, model: nn.Module, train_state: dict[str, Any],
                    optimizer_state: dict[str, Any] | None = None, *,
                    weights: dict[str, Tensor] | None = None) -> Path:
    """Write a complete checkpoint into a temporary directory of this writer, then swap it in for ``directory``.

    ``model``: the module (its config is saved; its weights unless ``weights``, the full state dict, is
    given, as FSDP gathers it); ``train_state``: plain JSON (``rng_state()`` is); ``optimizer_state``: a
    full, name-keyed optimizer state dict
    (``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict(..., full_state_dict=True)``).
    """
    directory = Path(directory)
    tmp = directory.with_name(f"{directory.name}.tmp.{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(3)}")
    old = directory.with_name(directory.name + ".old")
    try:
        _remove_abandoned(directory)
        tmp.mkdir(parents=True)
        _write(tmp, model, train_state, optimizer_state, weights)
        if directory.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(directory, old)
        os.replace(tmp, directory)
    except OSError as exc:
        raise os_error(OSError(exc.errno, exc.strerror, str(directory)), "write the checkpoint") from None
    except UserError as exc:                    # a file of it (atomic_save): name the checkpoint, not the file
        if not hasattr(exc, "reason"):
            raise
        raise type(exc)(f"cannot write the checkpoint {directory}: {exc.reason}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    return directory


def _write(tmp: Path, model: nn.Module, train_state: dict[str, Any], optimizer_state: dict[str, Any] | None,
           weights: dict[str, Tensor] | None) -> None:
    state_dict = model.state_dict() if weights is None else weights
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()}
    atomic_save(tmp / WEIGHTS, lambda p: save_safetensors(tensors, p))
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        atomic_write_json(tmp / CONFIG, config.to_dict())
    state = {"format": FORMAT, "version": VERSION, **train_state}
    if optimizer_state is not None:
        slots, described = split_optimizer_state(optimizer_state)
        atomic_save(tmp / OPTIMIZER, lambda p: save_safetensors(slots, p))
        state["optimizer"] = described
    try:
        json.dumps(state, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"training state is not plain JSON: {exc}") from None
    atomic_write_json(tmp / STATE, state)


def save_safetensors(tensors: dict[str, Tensor], path: Path) -> None:
    """``safetensors.torch.save_file``, whose failures to write (a Rust I/O error in a ``SafetensorError``)
    come out as the ``OSError`` they are (``os error 28`` is a full disk)."""
    try:
        save_file(tensors, str(path), metadata={"format": "pt"})
    except SafetensorError as exc:
        code = re.search(r"(?:os error|code:) (\d+)", str(exc))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from None


def _remove_abandoned(directory: Path) -> None:
    """Temporary checkpoints of writers on this host that are no longer running (killed mid-write)."""
    host = socket.gethostname()
    for tmp in directory.parent.glob(f"{directory.name}.tmp.*"):
        parts = tmp.name[len(directory.name) + len(".tmp."):].rsplit(".", 2)
        if len(parts) == 3 and parts[0] == host and parts[1].isdigit() and not _alive(int(parts[1])):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                 # it exists (another user's process)
        return True
    return True


def split_optimizer_state(state: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """``{"state": {name: {slot: tensor | number}}, "param_groups": [...]}`` -> (tensors for safetensors,
    the JSON rest)."""
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for name, slots in state.get("state", {}).items():
        for slot, value in slots.items():
            if isinstance(value, Tensor):
                tensors[f"{name}{SEP}{slot}"] = value.detach().to("cpu").contiguous().clone()
            else:
                scalars.setdefault(str(name), {})[slot] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items()}
              for group in state.get("param_groups", [])]
    return tensors, {"param_groups": groups, "scalars": scalars}


# ---- reading ---------------------------------------------------------------------------------------------------

def checkpoint_path(directory: Path) -> Path | None:
    """The checkpoint in ``directory`` (or the ``.old`` one a kill mid-swap left), if there is one.

    A directory that holds weights and a pickled ``train_state.pt`` counts, so that resuming it is refused
    (rather than silently starting over)."""
    directory = Path(directory)
    for candidate in (directory, directory.with_name(directory.name + ".old")):
        if (candidate / WEIGHTS).is_file() and ((candidate / STATE).is_file() or (candidate / PICKLED_STATE).exists()):
            return candidate
    return None


def load_train_state(directory: Path) -> dict[str, Any]:
    """The training state of the checkpoint in ``directory``, with ``state["optimizer"]`` a full, name-keyed
    optimizer state dict (tensors on the CPU). Refuses anything that is not this format."""
    found = checkpoint_path(directory)
    if found is None:
        raise CheckpointError(f"no complete checkpoint in {directory}")
    path = found / STATE
    if not path.is_file():
        raise CheckpointError(f"{found / PICKLED_STATE} is a pickle, which can run code when loaded; posbench "
                              f"does not open it (a checkpoint from an older posbench or not from posbench): "
                              f"start a new run, or reuse the weights with --init")
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a posbench training state")
    if state.get("version") != VERSION:
        raise CheckpointError(f"{path} has format version {state.get('version')!r}; this posbench reads {VERSION}")
    if "optimizer" in state:
        try:
            tensors = load_file(str(found / OPTIMIZER))
        except (OSError, SafetensorError, ValueError) as exc:
            raise CheckpointError(f"cannot read {found / OPTIMIZER}: {exc}") from None
        state["optimizer"] = join_optimizer_state(tensors, state["optimizer"], found / OPTIMIZER)
    return state


def join_optimizer_state(tensors: dict[str, Tensor], described: Any, where: Path) -> dict[str, Any]:
    if not isinstance(described, dict) or not isinstance(described.get("param_groups"), list):
        raise CheckpointError(f"the optimizer section of {where.with_name(STATE)} is malformed")
    state: dict[str, dict[str, Any]] = {}
    for key, value in tensors.items():
        name, sep, slot = key.rpartition(SEP)
        if not sep:
            raise CheckpointError(f"{where}: unexpected tensor name {key!r}")
        state.setdefault(name, {})[slot] = value
    for name, slots in (described.get("scalars") or {}).items():
        state.setdefault(name, {}).update(slots)
    groups = []
    for group in described["param_groups"]:
        group = dict(group)
        if isinstance(group.get("betas"), list):
            group["betas"] = tuple(group["betas"])
        groups.append(group)
    return {"state": state, "param_groups": groups}


def load_weights(model: nn.Module, path: Path) -> None:
    """Load ``model.safetensors`` (a file, or a checkpoint directory holding one) into ``model``."""
    path = Path(path)
    if path.is_dir():
        path = path / WEIGHTS
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



# ---- random number generator states as JSON ----------------------------------------------------------------

def rng_state() -> dict[str, Any]:
    """Python's, NumPy's and torch's (CPU and every CUDA device) generator states, as plain JSON."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": [version, list(internal), gauss],
             "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
             "torch": _b64(torch.get_rng_state())}
    if torch.cuda.is_available():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    try:
        version, internal, gauss = state["python"]
        random.setstate((int(version), tuple(int(x) for x in internal), gauss))
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((str(kind), np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)))
        torch.set_rng_state(_unb64(state["torch"]))
        if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"the checkpoint's random generator state is malformed ({exc})") from None


def _b64(t: Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _unb64(text: str) -> Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text, validate=True)), dtype=torch.uint8).clone()
