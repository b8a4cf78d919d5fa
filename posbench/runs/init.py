"""``--init``: where a run's model comes from, resolved once, when the run's configuration is built.

``resolve_init(given)`` reads JSON only and returns an ``InitSource`` of one of four kinds:

========  =============================================================================================
run       a posbench run directory (its ``checkpoint/``: weights, model config; its recorded tokenizer)
export    a directory written by ``posbench export`` (a posbench model in Hugging Face layout: a Llama for a RoPE
          run, model_type ``posbench`` for the others), built back as posbench's own model
hf        a Hugging Face model directory (``config.json`` with a ``model_type``) or a hub name
extended  a ``posbench extend`` run directory (its extended model is ``checkpoint/model``)
========  =============================================================================================

Everything after this point (the tasks, the model builder, the report) reads the ``InitSource``; nothing else
opens init files. Only the ``hf`` and ``extended`` kinds lead into ``posbench.hf`` when the model is built.

A label, an encoding or a model type read from these files may become a directory name (the run's label), so
each must be a plain name (``posbench.files.check_name``): a model directory whose metadata says
``"label": "../../elsewhere"`` or an absolute path is refused in one line, before anything is written.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from posbench.errors import ConfigError
from posbench.files import check_name, json_object

KINDS = ("run", "export", "hf", "extended")
EXPORT_META = "posbench_export.json"
EXTENDED_MODEL_SUBDIR = "checkpoint/model"      # an extend run's saved model (compare skips checkpoint/)
EXTEND_META = "posbench_extend.json"
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class InitSource:
    given: str                          # what was passed to --init
    kind: str                           # run | export | hf | extended
    label: str                          # the model's name in tables: its encoding, or llama / llama+tape
    encoding: str | None = None         # run, export: the posbench encoding
    model: dict[str, Any] = field(default_factory=dict)   # run, export: ModelConfig; else the architecture
    model_dir: str | None = None        # export, hf, extended: the Hugging Face directory (or hub name)
    run_dir: str | None = None          # run, extended: the run directory
    tokenizer: dict[str, Any] | None = None   # run, export: the tokenizer it recorded (files in run_dir, model_dir)
    model_type: str | None = None       # export, hf, extended: the Hugging Face model type of model_dir

    @property
    def is_posbench(self) -> bool:
        """Built as posbench's own ``Transformer`` (else a Hugging Face model behind posbench's interface)."""
        return self.kind in ("run", "export")

    @property
    def weights(self) -> Path | None:
        return Path(self.run_dir) / "checkpoint" / "model.safetensors" if self.kind == "run" else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InitSource:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})


def resolve_init(given: str | Path, flag: str = "--init") -> InitSource:
    """What ``--init GIVEN`` names (one-line ``ConfigError`` when it names nothing usable; ``flag`` is the option
    the user wrote, ``--model`` for ``posbench extend``)."""
    given = str(given)
    path = Path(os.path.expanduser(given))
    if path.is_dir():
        stored = json_object(path / "config.json")
        if stored is not None and isinstance(stored.get("config"), dict) and "task" in stored["config"]:
            if stored["config"]["task"] == "extend":
                return _extended_run(given, path, flag)
            return _posbench_run(given, path, flag)
        if stored is not None and "model_type" in stored:
            if (path / EXPORT_META).is_file():
                return _export(given, path, stored, flag)
            return _hf_directory(given, path, stored, flag)
        raise ConfigError(f"{flag} {given}: not a Hugging Face model directory (no config.json with a model_type) "
                          f"nor a posbench run directory")
    if not path.exists() and _HUB_NAME.match(given) and not given.startswith((".", "/", "~")):
        return _hub_name(given, flag)
    raise ConfigError(f"{flag} {given}: no such run or model directory")


def _posbench_run(given: str, path: Path, flag: str) -> InitSource:
    model = json_object(path / "checkpoint" / "model_config.json")
    if model is None:
        raise ConfigError(f"{flag} {given}: no checkpoint/model_config.json there (did that run finish training?)")
    result = json_object(path / "result.json") or {}
    tokenizer = (result.get("data") or {}).get("tokenizer")
    encoding = _name(model.get("encoding", ""), f"{flag} {given}: the encoding in checkpoint/model_config.json")
    return InitSource(given, "run", encoding, encoding, model, None, str(path),
                      tokenizer if isinstance(tokenizer, dict) else None)


def _export(given: str, path: Path, raw: dict[str, Any], flag: str) -> InitSource:
    meta = json_object(path / EXPORT_META) or {}
    model = meta.get("model_config")
    if not isinstance(model, dict) or "encoding" not in model:
        raise ConfigError(f"{flag} {given}: {EXPORT_META} there holds no model_config")
    encoding = _name(model["encoding"], f"{flag} {given}: the encoding in {EXPORT_META}")
    model_type = _name(raw["model_type"], f"{flag} {given}: the model_type in config.json")
    return InitSource(given, "export", encoding, encoding, model, str(path), None, meta.get("tokenizer"), model_type)


def _hf_directory(given: str, path: Path, raw: dict[str, Any], flag: str) -> InitSource:
    meta = json_object(path / EXTEND_META) or {}
    model_type = _name(raw["model_type"], f"{flag} {given}: the model_type in config.json")
    label = _name(meta["label"], f"{flag} {given}: the label in {EXTEND_META}") if meta.get("label") else model_type
    return InitSource(given, "hf", label, None, architecture(raw, meta), str(path), model_type=model_type)


def _extended_run(given: str, path: Path, flag: str) -> InitSource:
    directory = path / EXTENDED_MODEL_SUBDIR
    if not (path / "result.json").is_file() or not directory.is_dir():
        raise ConfigError(f"{flag} {given}: that extend run has not finished (no result.json and "
                          f"{EXTENDED_MODEL_SUBDIR}/); continue it with 'posbench extend --resume {given}'")
    raw = json_object(directory / "config.json") or {}
    meta = json_object(directory / EXTEND_META) or {}
    where = f"{flag} {given}: {EXTENDED_MODEL_SUBDIR}"
    model_type = _name(raw.get("model_type", "hf"), f"{where}/config.json's model_type")
    label = _name(meta["label"], f"{where}/{EXTEND_META}'s label") if meta.get("label") else model_type
    return InitSource(given, "extended", label, None, architecture(raw, meta), str(directory), str(path),
                      model_type=model_type)


def _hub_name(given: str, flag: str) -> InitSource:
    from posbench.hf.loading import load_config  # torch (hf.loading): only a hub model's config needs it

    config = load_config(given)
    model_type = _name(config.model_type, f"{flag} {given}: the hub model's model_type")
    return InitSource(given, "hf", model_type, None, architecture(config.to_dict()), given, model_type=model_type)


def _name(value: Any, what: str) -> str:
    """``value`` when it is a plain name (it may become a directory of the run), else a one-line ConfigError."""
    return check_name(value, what, ConfigError)


def architecture(raw: dict[str, Any], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Hugging Face config's shape in posbench's model keys (recorded with the run); an extended model's
    context is the length it was extended to (``ntk`` keeps the original in ``max_position_embeddings``)."""
    heads = int(raw.get("num_attention_heads", 1) or 1)
    hidden = int(raw.get("hidden_size", 0) or 0)
    found = {"n_layers": raw.get("num_hidden_layers"), "n_heads": heads, "d_ff": raw.get("intermediate_size"),
             "max_seq_len": (meta or {}).get("length") or raw.get("max_position_embeddings"),
             "norm_eps": raw.get("rms_norm_eps")}
    if hidden and hidden % heads == 0 and (hidden // heads) % 2 == 0:
        found["d_model"] = hidden
    return {k: v for k, v in found.items() if v is not None}
