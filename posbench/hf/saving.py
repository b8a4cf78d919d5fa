"""Saving an extended model and loading it back to identical logits.

An extended model is a directory that any transformers tool reads as a Llama, plus what posbench needs to
rebuild the method::

    config.json, model.safetensors   save_pretrained of the Llama: its original tensor names, the trained
                                     embeddings and norms, rope_parameters with the interpolation (and theta),
                                     max_position_embeddings = the new length
    tokenizer files                  the base model's tokenizer (save_pretrained)
                                     tape: a TAPE-extended Llama of its own type (``posbench.hf.tape_model``:
                                     model_type posbench_tape_llama, TAPE's tensors model.layers.<i>.tape.* in
                                     model.safetensors, two remote-code files), which transformers loads only
                                     with posbench's code (earlier posbench: a Llama plus tape.safetensors)
    adapter/                         lora, longlora, theta, yarn: the peft adapter (adapter_config.json and
                                     weights; PeftModel.from_pretrained reads it)
    posbench_extend.json             method, its options, scale, length, base model; written last

The directory is written as ``<name>.tmp`` and renamed when complete, so a kill leaves no half model.
A directory without ``posbench_extend.json``, or whose description names no method (an export whose LoRA was
merged into the weights, ``posbench.hf.export_extended``), is loaded as a plain Llama.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from posbench.hf.loading import HFModelError, describe, load_llama
from posbench.hf.methods import Method, make_method
from posbench.hf.rope import llama_of
from posbench.files import atomic_write_json, read_json

META_FILE = "posbench_extend.json"
FORMAT = 1


def save_extended(model, method: Method, directory: Path, meta: dict[str, Any], tokenizer=None, *,
                  replace: bool = False) -> Path:
    """Write ``model`` (converted by ``method``) to ``directory``, which must not exist yet (``replace``: a run
    that was killed after saving and before its record saves again)."""
    directory = Path(directory)
    if directory.exists():
        if not replace:
            raise HFModelError(f"{directory} already exists; an extended model is never overwritten")
        shutil.rmtree(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_extended(model, method, tmp, meta, tokenizer)
    os.replace(tmp, directory)
    return directory


def write_extended(model, method: Method | None, directory: Path, meta: dict[str, Any], tokenizer=None) -> None:
    """The files of an extended model in ``directory`` (an empty one): the Llama (``method`` None: as it is,
    a method folded into its weights), the method's own files, the tokenizer, the description last."""
    llama = llama_of(model)
    state = {k: v.detach() for k, v in (method.base_state_dict(model) if method else llama.state_dict()).items()}
    llama.save_pretrained(str(directory), state_dict=state)
    files = method.save(model, directory) if method else []
    if tokenizer is not None:
        tokenizer.hf.save_pretrained(str(directory))
    atomic_write_json(directory / META_FILE, {"format": FORMAT, **meta, "method": method.name if method else None,
                                              "method_options": dict(method.options) if method else {},
                                              "files": files, "llama": describe(llama.config)})


def read_meta(directory: Path) -> dict[str, Any] | None:
    path = Path(directory) / META_FILE
    if not path.is_file():
        return None
    meta = read_json(path, missing="cannot read {path}: no such file", error=HFModelError)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or "method" not in meta:
        raise HFModelError(f"{path} is not a posbench extended-model description (format {FORMAT})")
    return meta


def load_extended(directory: Path, *, dtype: torch.dtype | None = None, device: str | torch.device = "cpu",
                  attention: str = "sdpa", trainable: bool = False):
    """``(model, method or None, meta or None)``: an extended model rebuilt, or a plain Llama.

    ``trainable``: the method's parameters, embeddings and norms require gradients (to train on); otherwise
    nothing does (evaluation)."""
    meta = read_meta(directory)
    method = None
    if meta is not None and meta["method"] is not None:
        method = make_method(meta["method"], meta.get("method_options") or {})
        model = method.load_model(Path(directory), dtype=dtype, device=device, attention=attention)
    else:
        model = load_llama(directory, dtype=dtype, device=device, attention=attention)
    if trainable and method is not None:
        method.mark_trainable(model)
    elif not trainable:
        for param in model.parameters():
            param.requires_grad_(False)
    return model.to(device).eval(), method, meta


def weights_digest(directory: Path) -> str:
    """SHA-256 over the model directory's weight and description files (name, then content), sorted."""
    digest = hashlib.sha256()
    files = sorted(p for p in Path(directory).rglob("*") if p.is_file() and
                   (p.suffix in (".safetensors", ".bin") or p.name in ("config.json", META_FILE,
                                                                         "adapter_config.json")))
    for path in files:
        digest.update(str(path.relative_to(directory)).encode() + b"\0")
        with open(path, "rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()
