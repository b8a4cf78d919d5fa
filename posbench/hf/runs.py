"""A Hugging Face Llama as ``posbench run --init``: an ``extend`` run directory, or any local Llama directory.

The hooks the generic run flow calls (each returns None for a posbench checkpoint, so the usual path runs):

* :func:`init_model_config` (``config.read_init_model_config``): the run's encoding label (``llama+tape``,
  ``llama+lora``, ... or ``llama`` for a plain model) and the architecture, for the recorded run config;
  ``model.max_seq_len`` becomes the model's context length (the extension length for an extended model), so
  a task's length grid is relative to it unless ``--set model.max_seq_len=...`` says otherwise;
* :func:`build_init_model` (``runner.execute``): the model behind posbench's interface
  (``posbench.hf.adapter.HFCausalLM``) and the ``init`` record of the result;
* :func:`init_tokenizer` (``tasks._lm_common``): a plain Llama directory's own tokenizer (an extend run
  records its tokenizer, saved with its model, like any run).

This module reads JSON only; transformers is imported when a model is built.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from posbench.errors import ConfigError
from posbench.hf.loading import json_object

EXTEND_TASK = "extend"
MODEL_SUBDIR = "checkpoint/model"           # inside the run's checkpoint: compare skips it


def _is_extend_run(path: Path) -> bool:
    result = json_object(path / "result.json")
    if result is not None:
        return result.get("task") == EXTEND_TASK
    config = json_object(path / "config.json")
    return bool(config) and isinstance(config.get("config"), dict) and config["config"].get("task") == EXTEND_TASK


def _is_model_dir(path: Path) -> bool:
    config = json_object(path / "config.json")
    return config is not None and "model_type" in config


def is_hf_init(init: str | Path | None) -> bool:
    if init is None:
        return False
    path = Path(init)
    return path.is_dir() and (_is_extend_run(path) or _is_model_dir(path))


def model_dir(init: str | Path) -> Path:
    """The Hugging Face model directory of an ``--init``: ``RUN/checkpoint/model`` for an extend run, else the
    directory itself."""
    path = Path(init)
    if _is_extend_run(path):
        if not (path / "result.json").is_file() or not (path / MODEL_SUBDIR).is_dir():
            raise ConfigError(f"--init {init}: that extend run has not finished (no result.json and {MODEL_SUBDIR}/); "
                              f"continue it with 'posbench extend --resume {init}'")
        return path / MODEL_SUBDIR
    return path


def label_of(directory: Path) -> str:
    """``llama+tape`` for an extended model, ``llama`` for a plain one."""
    meta = json_object(directory / "posbench_extend.json")
    if meta is not None and meta.get("label"):
        return str(meta["label"])
    config = json_object(directory / "config.json") or {}
    return str(config.get("model_type", "hf"))


class HFModelEncoding:
    """What ``resolve_run_config`` asks of an encoding class, for a Hugging Face model: its positional encoding
    is the model's own (or the extension method's), with no posbench encoding options."""

    name = "hf"
    description = "the Hugging Face model's own positional encoding"
    defaults: dict[str, Any] = {}
    limits: dict[str, Any] = {}

    @classmethod
    def resolve(cls, options: dict[str, Any]) -> dict[str, Any]:
        from posbench.encodings.options import resolve_options

        return resolve_options(cls.name, cls.defaults, options)     # no options: any given one is refused


def init_model_config(init: str | Path) -> dict[str, Any] | None:
    """What ``resolve_run_config`` takes from an HF ``--init``: its encoding label and its architecture."""
    if not is_hf_init(init):
        return None
    directory = model_dir(init)
    raw = json_object(directory / "config.json")
    if raw is None or "model_type" not in raw:
        raise ConfigError(f"--init {init}: {directory} holds no Hugging Face config.json")
    heads = int(raw.get("num_attention_heads", 1))
    hidden = int(raw.get("hidden_size", 0))
    found = {"hf": True, "encoding": label_of(directory), "encoding_options": {},
             "n_layers": raw.get("num_hidden_layers"), "n_heads": heads, "d_ff": raw.get("intermediate_size"),
             "max_seq_len": raw.get("max_position_embeddings"), "norm_eps": raw.get("rms_norm_eps")}
    if hidden and hidden % heads == 0 and (hidden // heads) % 2 == 0:
        found["d_model"] = hidden
    return {k: v for k, v in found.items() if v is not None}


def init_tokenizer(init: str | Path):
    """A plain local model directory's tokenizer (None for runs, which record theirs)."""
    path = Path(init)
    if not is_hf_init(path) or _is_extend_run(path):
        return None
    from posbench.hf.loading import load_tokenizer

    return load_tokenizer(path)


def weights_digest(directory: Path) -> str:
    """SHA-256 over the model directory's weight and description files (name, then content), sorted."""
    digest = hashlib.sha256()
    files = sorted(p for p in Path(directory).rglob("*") if p.is_file() and
                   (p.suffix in (".safetensors", ".bin") or p.name in ("config.json", "posbench_extend.json",
                                                                         "adapter_config.json")))
    for path in files:
        digest.update(str(path.relative_to(directory)).encode() + b"\0")
        with open(path, "rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


ATTENTION = {"auto": "sdpa", "sdpa": "sdpa", "eager": "eager"}


def build_init_model(config, task, device) -> tuple[Any, dict[str, Any]] | None:
    """``(model, init record)`` when ``config.init`` is a Hugging Face model; None otherwise."""
    if not is_hf_init(config.init):
        return None
    from posbench.hf.adapter import HFCausalLM, HFModelConfig
    from posbench.hf.loading import default_dtype, describe
    from posbench.hf.saving import load_extended

    directory = model_dir(config.init)
    attention = config.model.get("attention", "auto")
    if attention not in ATTENTION:
        raise ConfigError(f"model.attention={attention!r}: a Hugging Face model runs with "
                          f"{', '.join(ATTENTION)}")
    model, method, meta = load_extended(directory, dtype=default_dtype(device), device="cpu",
                                        attention=ATTENTION[attention],
                                        trainable=int(config.train.get("steps", 0)) > 0)
    if task.vocab_size() > model.config.vocab_size:
        raise ConfigError(f"--init {config.init}: the tokenizer has {task.vocab_size()} tokens, the model's "
                          f"vocabulary only {model.config.vocab_size}")
    meta = meta or {}
    hf_config = HFModelConfig(label=config.encoding, method=method.name if method else None,
                              method_options=dict(method.options) if method else {},
                              base_model=meta.get("base_model", str(directory)), model_dir=str(directory),
                              scale=meta.get("scale"), length=meta.get("length", model.config.max_position_embeddings),
                              llama=describe(model.config))
    info = {"run": str(config.init), "kind": "hf", "label": config.encoding, "method": hf_config.method,
            "base_model": hf_config.base_model, "model_dir": str(directory),
            "checkpoint_sha256": weights_digest(directory)}
    return HFCausalLM(model, hf_config, method), info
