"""The model a task trains and evaluates: a fresh ``Transformer``, a posbench model from ``--init`` (a run or a
``posbench export``), or a pretrained Hugging Face model behind posbench's model interface.

Only the last enters ``posbench.hf``: a run that starts from nothing, or from a posbench run, never imports it.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from posbench.errors import ConfigError
from posbench.files import sha256_file
from posbench.model import ModelConfig, Transformer
from posbench.model.config import current_names
from posbench.train.checkpoint import load_weights


def build_model(task: Any) -> tuple[nn.Module, dict[str, Any] | None]:
    """``(model, init record)`` for ``task``'s configuration (a resumed run's own checkpoint is loaded over
    it when its training resumes)."""
    config, source = task.config, task.source
    if source is None:
        return Transformer(task.model_config()), None
    if not source.is_posbench:
        from posbench.hf.adapter import load_pretrained  # transformers: only a Hugging Face --init needs it

        return load_pretrained(source, config, task.vocab_size())
    model_dict = {k: v for k, v in current_names(source.model).items() if k in ModelConfig.__dataclass_fields__}
    model_dict.update({k: v for k, v in config.model.items() if k in model_dict})
    model_dict["encoding_options"] = dict(config.encoding_options)
    model_cfg = ModelConfig(**model_dict)
    if model_cfg.vocab_size != task.vocab_size():
        raise ConfigError(f"--init {source.given} has vocabulary {model_cfg.vocab_size}, task '{config.task}' needs "
                          f"{task.vocab_size()}")
    model = Transformer(model_cfg)
    record: dict[str, Any] = {"run": source.given, "kind": source.kind, "label": source.label}
    if source.kind == "export":
        from posbench.hf.export import read_export  # transformers: only an export's --init needs it

        exported = read_export(source.model_dir)
        fitted(lambda: model.load_state_dict(exported.state_dict), source, model_dict)
        record["checkpoint_sha256"] = exported.meta.get("source", {}).get("checkpoint_sha256")
        return model, record
    weights = source.weights
    fitted(lambda: load_weights(model, weights), source, model_dict)
    record["checkpoint_sha256"] = sha256_file(weights) if weights.is_file() else None
    return model, record


def fitted(load: Any, source: Any, model: dict[str, Any]) -> None:
    """``load()`` the ``--init`` weights; weights of other shapes than the settings build (``--d-model`` against
    the init model's) are one line naming the settings that differ from the init model's."""
    try:
        load()
    except RuntimeError as exc:
        if "size mismatch" not in str(exc):
            raise
        own = current_names(source.model)
        differ = [f"model.{key}={value!r} (its {own[key]!r})" for key, value in model.items()
                  if key in own and own[key] != value and key != "encoding_options"]
        settings = f" ({', '.join(differ)})" if differ else ""
        raise ConfigError(f"--init {source.given}: its weights do not fit the model these settings build{settings}; "
                          f"leave the model's shape to it") from None
