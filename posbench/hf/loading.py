"""Loading and checking a pretrained Llama (``LlamaForCausalLM``) and its tokenizer with ``transformers``.

``NAME_OR_PATH`` is a local directory in the ``save_pretrained`` layout (always works: no network is touched)
or a hub name such as ``meta-llama/Llama-2-7b-hf`` (only when the hub is reachable; offline it is a one-line
error that says what to pass). Anything that is not a Llama (no ``config.json``, another ``model_type``) is a
one-line :class:`HFModelError`. Weights load in bfloat16 on a GPU and in float32 on a CPU.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import huggingface_hub
import torch

from posbench.data.errors import DataError
from posbench.data.hub_env import hub_offline
from posbench.data.hub_errors import explain
from posbench.data.progress import apply_to
from posbench.data.tokenizer import HFTokenizer
from posbench.errors import UserError
from posbench.files import json_object


class HFModelError(UserError):
    """A missing, unreadable, unsupported or non-Llama model; ``str()`` is one line."""


LOCAL_HINT = "pass a local directory in the save_pretrained layout (config.json, *.safetensors, tokenizer files)"


def _quiet():
    """``transformers``, quiet: transformers and peft warn about deprecations that are theirs, not the user's; the
    download and loading bars follow ``posbench.data.progress.library_progress`` (on unless ``--quiet``)."""
    import transformers  # transformers: heavy, only a Hugging Face model needs it

    transformers.logging.set_verbosity_error()
    apply_to(transformers)
    apply_to(huggingface_hub)
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"(transformers|peft)\b.*")
    return transformers


def tape_model():
    """``posbench.hf.tape_model``: TAPE's Llama as a transformers model type, registered when it is imported (so that
    AutoConfig and AutoTokenizer read a saved one)."""
    from posbench.hf import tape_model as module  # transformers: only a TAPE Llama or a tokenizer needs it

    return module


def hub_failure(exc: BaseException, name: str) -> str | None:
    """One line for a hub failure of the model ``name`` (gated, missing, offline...), or None."""
    return explain(exc, name, repo_type="model", offline=LOCAL_HINT)


def is_local(name_or_path: str | Path) -> bool:
    return Path(os.path.expanduser(str(name_or_path))).exists()


def local_files_only(name_or_path: str | Path) -> bool:
    """True for a local directory, and for a hub name while the hub is marked offline (then it is an error)."""
    if is_local(name_or_path):
        return True
    if hub_offline():
        raise HFModelError(f"cannot load '{name_or_path}' from the Hugging Face hub offline: {LOCAL_HINT}")
    return False


def read_config_json(directory: Path) -> dict[str, Any] | None:
    """The raw ``config.json`` of a local model directory (None when there is none or it is not a model's)."""
    data = json_object(Path(directory) / "config.json")
    return data if data is not None and "model_type" in data else None


def load_config(name_or_path: str | Path):
    """The model's ``LlamaConfig``; refuses anything that is not a Llama."""
    transformers = _quiet()
    name = str(name_or_path)
    local = local_files_only(name)
    if local:
        path = Path(os.path.expanduser(name))
        if not path.is_dir():
            raise HFModelError(f"{name} is not a model directory: {LOCAL_HINT}")
        raw = read_config_json(path)
        if raw is None:
            raise HFModelError(f"{name} is not a Hugging Face model directory (no config.json with a model_type)")
        if raw["model_type"] != "llama":
            raise HFModelError(f"{name} is a '{raw['model_type']}' model, not a Llama (model_type 'llama'); "
                               f"posbench extends LlamaForCausalLM models")
        name = str(path)
    try:
        config = transformers.AutoConfig.from_pretrained(name, local_files_only=local)
    except Exception as exc:  # noqa: BLE001 - missing files, bad JSON, network: one line
        message = None if local else hub_failure(exc, str(name_or_path))
        if message:                                  # gated / not found / offline keep their meaning
            raise HFModelError(message) from None
        raise HFModelError(f"cannot read the config of '{name_or_path}' ({type(exc).__name__}): {LOCAL_HINT}") from None
    if not isinstance(config, transformers.LlamaConfig):
        raise HFModelError(f"'{name_or_path}' is a '{config.model_type}' model, not a Llama")
    return config


def default_dtype(device: torch.device | str) -> torch.dtype:
    """bfloat16 weights on a GPU (a 7B model in 13.5 GB), float32 on a CPU (exact tests)."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def load_llama(name_or_path: str | Path, *, dtype: torch.dtype | None = None, device: str | torch.device = "cpu",
               attention: str = "sdpa"):
    """``LlamaForCausalLM.from_pretrained`` with posbench's checks; weights on ``device`` in ``dtype``."""
    return _load(_quiet().LlamaForCausalLM, load_config(name_or_path), name_or_path, dtype, device, attention)


def load_tape_llama(directory: str | Path, *, dtype: torch.dtype | None = None, device: str | torch.device = "cpu",
                    attention: str = "sdpa"):
    """A saved TAPE-extended Llama (``posbench.hf.tape_model``), as ``load_llama`` loads a Llama."""
    _quiet()
    tape = tape_model()
    try:
        config = tape.TapeLlamaConfig.from_pretrained(str(directory))
    except Exception as exc:  # noqa: BLE001 - missing or bad config: one line
        raise HFModelError(f"cannot read the config of '{directory}' ({type(exc).__name__})") from None
    return _load(tape.TapeLlamaForCausalLM, config, directory, dtype, device, attention)


def _load(cls, config, name_or_path: str | Path, dtype: torch.dtype | None, device: str | torch.device,
          attention: str):
    dtype = dtype or default_dtype(device)
    name = str(Path(os.path.expanduser(str(name_or_path)))) if is_local(name_or_path) else str(name_or_path)
    try:
        model = cls.from_pretrained(name, config=config, dtype=dtype, local_files_only=local_files_only(name_or_path),
                                    attn_implementation=attention)
    except HFModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - missing or corrupt weights: one line
        message = None if is_local(name_or_path) else hub_failure(exc, str(name_or_path))
        if message:
            raise HFModelError(message) from None
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise HFModelError(f"cannot load the weights of '{name_or_path}' ({type(exc).__name__}: {first[:200]})") from None
    return model.to(device)


def load_tokenizer(name_or_path: str | Path):
    """The model's tokenizer as a posbench ``Tokenizer`` (``posbench.data.tokenizer.HFTokenizer``)."""
    tape_model()            # registers its model type: AutoTokenizer reads config.json
    _quiet()
    try:
        return HFTokenizer.load(str(name_or_path))
    except DataError as exc:
        raise HFModelError(f"'{name_or_path}' has no usable tokenizer ({exc})") from None


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def describe(config) -> dict[str, Any]:
    """What a result records about a Llama's architecture."""
    return {"model_type": config.model_type, "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_hidden_layers,
            "num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
            "head_dim": head_dim(config), "vocab_size": config.vocab_size,
            "max_position_embeddings": config.max_position_embeddings,
            "rope_parameters": dict(config.rope_parameters), "rms_norm_eps": config.rms_norm_eps,
            "tie_word_embeddings": bool(config.tie_word_embeddings)}
