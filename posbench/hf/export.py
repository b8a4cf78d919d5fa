"""``posbench export RUN_DIR OUT_DIR``: a run's trained model and tokenizer as a Hugging Face model directory,
and the way back (``read_export`` / ``load_export``, for ``--init``). An ``extend`` run's model is exported by
``posbench.hf.export_extended``.

``OUT_DIR`` holds::

    config.json, model.safetensors,   save_pretrained: a RoPE run is a plain ``LlamaForCausalLM``
    generation_config.json            (``posbench.hf.export_llama``); any other encoding is a
                                      ``PosbenchForCausalLM`` (model_type ``posbench``, ``posbench.hf.modeling``),
                                      whose config.json has ``auto_map`` for ``trust_remote_code``
    configuration_posbench.py,        posbench-typed only: two lines each, importing ``posbench.hf.modeling``
    modeling_posbench.py              (posbench must be installed where the model is loaded)
    tokenizer.json,                   the run's tokenizer (``posbench.hf.export_tokenizer``): the same ids as
    tokenizer_config.json             posbench's ``encode``, the same BOS / EOS / PAD ids
    posbench_export.json              written last: format, kind (llama | posbench), the source run, its
                                      ModelConfig and its tokenizer's description

The directory is written as a temporary sibling and renamed when complete; an existing ``OUT_DIR`` that holds
anything is never overwritten (``--force`` replaces it whole). Loading needs ``transformers`` (and, for the posbench type, ``posbench``): either import
``posbench.hf.modeling`` first (it registers the classes with ``AutoConfig`` / ``AutoModelForCausalLM``) or pass
``trust_remote_code=True``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor
from transformers import LlamaConfig, LlamaForCausalLM

from posbench.data.char import CharTokenizer
from posbench.data.errors import DataError
from posbench.data.progress import library_bars_off
from posbench.data.tokenizer import BPETokenizer, ByteTokenizer, HFTokenizer, tokenizer_from_spec
from posbench.files import atomic_write_json, json_object, read_json, sha256_file
from posbench.hf.export_extended import export_extended
from posbench.hf.export_llama import from_llama, llama_config, model_config_from_llama, to_llama
from posbench.hf.export_tokenizer import hf_tokenizer, posbench_tokenizer, spec_of
from posbench.hf.loading import _quiet
from posbench.hf.modeling import MODEL_FIELDS, PosbenchConfig, PosbenchForCausalLM
from posbench.model import Transformer
from posbench.model.config import BACKBONE, ModelConfig, current_names
from posbench.hf.export_dir import ExportError, building, check_target
from posbench.train.checkpoint import CONFIG, WEIGHTS, checkpoint_path

FORMAT = 1
META_FILE = "posbench_export.json"
REMOTE_FILES = {
    "configuration_posbench.py": '"""A posbench export (trust_remote_code): the class lives in posbench, which must be '
                                 'installed."""\nfrom posbench.hf.modeling import PosbenchConfig  # noqa: F401\n',
    "modeling_posbench.py": '"""A posbench export (trust_remote_code): the class lives in posbench, which must be '
                            'installed."""\nfrom posbench.hf.modeling import PosbenchForCausalLM  # noqa: F401\n',
}
AUTO_MAP = {"AutoConfig": "configuration_posbench.PosbenchConfig",
            "AutoModelForCausalLM": "modeling_posbench.PosbenchForCausalLM"}


# ---- the run ---------------------------------------------------------------------------------------------------

@dataclass
class RunModel:
    """What an export takes from a run directory."""

    run_dir: Path
    task: str
    encoding: str
    model_config: dict[str, Any]
    state_dict: dict[str, Tensor]
    tokenizer: Any
    weights: Path


def run_task(run_dir: str | Path) -> str | None:
    """The task of a run directory (its config.json), or None."""
    stored = json_object(Path(run_dir) / "config.json")
    config = stored.get("config") if isinstance(stored, dict) else None
    return str(config["task"]) if isinstance(config, dict) and "task" in config else None


def read_run(run_dir: str | Path) -> RunModel:
    """The trained model, its configuration and its tokenizer of a posbench run directory (one-line errors)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ExportError(f"{run_dir} is not a posbench run directory (no such directory)")
    stored = json_object(run_dir / "config.json")          # the run directory's layout: posbench.runs.store
    config = stored.get("config") if isinstance(stored, dict) else None
    if not isinstance(config, dict) or "task" not in config:
        raise ExportError(f"{run_dir} is not a posbench run directory (its config.json has no run config)")
    task = str(config["task"])
    found = checkpoint_path(run_dir / "checkpoint")
    if found is None:
        raise ExportError(f"{run_dir} has no checkpoint (checkpoint/{WEIGHTS}): nothing to export")
    model_config = read_json(found / CONFIG, error=ExportError)
    if not isinstance(model_config, dict) or model_config.get("kind") == "hf" or "encoding" not in model_config:
        raise ExportError(f"{run_dir} fine-tuned a Hugging Face model: its checkpoint holds only the trained "
                          f"tensors (export the model it started from, or use 'posbench extend')")
    result = json_object(run_dir / "result.json")
    tokenizer = run_tokenizer(run_dir, task, config, result)
    if tokenizer.vocab_size > int(model_config["vocab_size"]):
        raise ExportError(f"{run_dir}: the tokenizer has {tokenizer.vocab_size} tokens, the model only "
                          f"{model_config['vocab_size']}")
    return RunModel(run_dir, task, str(model_config["encoding"]), model_config, _load_safetensors([found / WEIGHTS]),
                    tokenizer, found / WEIGHTS)


def run_tokenizer(run_dir: Path, task: str, config: dict[str, Any], result: dict[str, Any] | None):
    """The tokenizer a run used: the one its result records, the arithmetic task's character tokenizer, or (an
    unfinished run) the one its task options name and its directory holds."""
    spec = ((result or {}).get("data") or {}).get("tokenizer")
    try:
        if isinstance(spec, dict):
            return tokenizer_from_spec(spec, run_dir)
        if task == "arithmetic":
            return CharTokenizer()
        named = str((config.get("task_options") or {}).get("tokenizer", ""))
        if (run_dir / BPETokenizer.FILE).is_file():
            return BPETokenizer.load(run_dir)
        if (run_dir / HFTokenizer.DIR).is_dir():
            return HFTokenizer.load(str(run_dir / HFTokenizer.DIR))
        if named in ("byte", "bytes"):
            return ByteTokenizer()
    except DataError as exc:
        raise ExportError(f"{run_dir}: cannot load the run's tokenizer ({exc})") from None
    raise ExportError(f"{run_dir}: cannot tell which tokenizer the run used (no tokenizer in its result.json)")


# ---- writing ---------------------------------------------------------------------------------------------------

def export_run(run_dir: str | Path, out_dir: str | Path, *, force: bool = False) -> dict[str, Any]:
    """Write ``run_dir``'s model and tokenizer to ``out_dir`` (new, or an empty directory; one that holds
    anything only with ``force``, and then replaced whole); returns the export's description
    (``posbench_export.json``, plus ``path``)."""
    out_dir = Path(out_dir)
    if run_task(run_dir) == "extend":
        return export_extended(Path(run_dir), out_dir, force=force)
    check_target(out_dir, force)
    run = read_run(run_dir)
    with building(out_dir, force) as tmp:
        kind = _write_model(run, tmp)
        tokenizer = hf_tokenizer(run.tokenizer)
        tokenizer.model_max_length = int(run.model_config["max_seq_len"])     # the length trained at
        tokenizer.save_pretrained(str(tmp))
        meta = {"format": FORMAT, "kind": kind, "model_config": run.model_config, "tokenizer": spec_of(run.tokenizer),
                "source": {"run": str(run.run_dir), "run_id": run.run_dir.name, "task": run.task,
                           "encoding": run.encoding, "checkpoint_sha256": _sha256(run.weights)}}
        atomic_write_json(tmp / META_FILE, meta)
    return {**meta, "path": str(out_dir)}


def _write_model(run: RunModel, directory: Path) -> str:
    """save_pretrained of the run's model in ``directory``; returns the kind (``llama`` or ``posbench``)."""
    _quiet()
    tok = run.tokenizer
    ids = {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id}
    if run.encoding == "rope" and default_backbone(run.model_config):
        config = llama_config(run.model_config, bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=tok.pad_id)
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
        _load_into(model, to_llama(run.state_dict, int(run.model_config["n_layers"])), run.run_dir)
        kind = "llama"
    else:
        config = PosbenchConfig.from_model_config(run.model_config, **ids)
        config.auto_map = dict(AUTO_MAP)
        with torch.device("meta"):
            model = PosbenchForCausalLM(config)
        _load_into(model, {f"model.{k}": v for k, v in run.state_dict.items()}, run.run_dir)
        for name, text in REMOTE_FILES.items():
            (directory / name).write_text(text, encoding="utf-8")
        kind = "posbench"
    for key, value in ids.items():
        setattr(model.generation_config, key, value)
    with library_bars_off():
        model.save_pretrained(str(directory))
    return kind


def default_backbone(model_config: dict[str, Any]) -> bool:
    """Whether a run's model is the pre-norm decoder (a Llama); a record without the backbone settings is one."""
    defaults = ModelConfig()
    return all(model_config.get(name, getattr(defaults, name)) == getattr(defaults, name) for name in BACKBONE)


def _load_into(model, state: dict[str, Tensor], run_dir: Path) -> None:
    """The run's weights into the export's model, strictly: a module that knows how an older checkpoint lacks a
    tensor fills it as it loads (T5's ``scale``: 1 for a checkpoint saved before it existed)."""
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        reason = " ".join(str(exc).split())[:300]
        raise ExportError(f"{run_dir}: the checkpoint does not fit its model config ({reason})") from None


# ---- reading an export back ------------------------------------------------------------------------------------

@dataclass
class Exported:
    """An export read back: posbench's ``ModelConfig`` (a dict), the weights under posbench's names, the
    tokenizer as posbench's own class, and ``posbench_export.json``."""

    model_config: dict[str, Any]
    state_dict: dict[str, Tensor]
    tokenizer: Any
    meta: dict[str, Any]


def is_export(directory: str | Path) -> bool:
    """``directory`` is a posbench export (reads one small JSON file)."""
    return (Path(directory) / META_FILE).is_file()


def read_export_meta(directory: str | Path) -> dict[str, Any]:
    """``posbench_export.json`` (JSON only: no model is loaded); ``meta["model_config"]`` is the ModelConfig."""
    path = Path(directory) / META_FILE
    meta = read_json(path, missing=f"{directory} is not a posbench export (no {META_FILE})", error=ExportError)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("kind") not in ("llama", "posbench"):
        raise ExportError(f"{path} is not a posbench export description (format {FORMAT})")
    return meta


def read_export(directory: str | Path) -> Exported:
    """An export's ModelConfig, weights (posbench names) and tokenizer. The architecture is read from the
    exported ``config.json`` (what transformers loads), not from the description."""
    directory = Path(directory)
    meta = read_export_meta(directory)
    recorded = dict(meta.get("model_config") or {})
    state = _load_safetensors(_weight_files(directory))
    if meta["kind"] == "llama":
        extra = {k: v for k, v in (recorded.get("encoding_options") or {}).items() if k == "random_offset"}
        model_config = model_config_from_llama(LlamaConfig.from_pretrained(str(directory)), extra)
        state = from_llama(state, model_config["n_layers"])
        defaults = ModelConfig()        # a Llama is the pre-norm decoder
        model_config.update({name: getattr(defaults, name) for name in BACKBONE if name not in model_config})
    else:
        config = PosbenchConfig.from_pretrained(str(directory))
        model_config = {name: getattr(config, name) for name in MODEL_FIELDS}
        state = {k.removeprefix("model."): v for k, v in state.items()}
    model_config.setdefault("attention", recorded.get("attention", "auto"))
    return Exported(model_config, state, posbench_tokenizer(meta.get("tokenizer") or {}, directory), meta)


def load_export(directory: str | Path, device: str | torch.device = "cpu"):
    """``(Transformer, tokenizer)``: an export as posbench's own model (eval mode) and tokenizer."""
    exported = read_export(directory)
    model = Transformer(ModelConfig(**current_names(exported.model_config)))
    try:
        model.load_state_dict(exported.state_dict, strict=True)
    except RuntimeError as exc:
        raise ExportError(f"{directory}: the weights do not fit the exported config "
                          f"({str(exc).splitlines()[0][:200]})") from None
    return model.to(device).eval(), exported.tokenizer


# ---- files -----------------------------------------------------------------------------------------------------

def _weight_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set((json_object(index) or {}).get("weight_map", {}).values()))
        return [directory / name for name in shards]
    return [directory / "model.safetensors"]


def _load_safetensors(paths: list[Path]) -> dict[str, Tensor]:
    state: dict[str, Tensor] = {}
    for path in paths:
        try:
            state.update(load_file(str(path)))
        except Exception as exc:  # noqa: BLE001 - missing or corrupt file: one line
            raise ExportError(f"cannot read {path} ({type(exc).__name__})") from None
    return state



def _sha256(path: Path) -> str:
    return sha256_file(path)
