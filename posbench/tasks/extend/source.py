"""The extend task's model: a pretrained Hugging Face Llama (the run's ``--init``, ``posbench extend --model``)
with the extension method ``--encoding`` names (``--method``: tape, lora, longlora, theta, ...), built by
``posbench.hf.adapter`` at the new length."""

from __future__ import annotations

from typing import Any

from posbench.errors import ConfigError
from posbench.hf.methods import METHODS
from posbench.tasks.model_source import ModelSource, take_architecture


class ExtendedLlama(ModelSource):
    def encodings(self):
        """The extension methods take the encodings' place."""
        return METHODS

    def choose_encoding(self, encoding: str | None, source: Any) -> str:
        if source is None or source.kind == "run" or (source.kind == "export" and source.model_type != "llama"):
            raise ConfigError("extend needs a pretrained Hugging Face Llama: --model DIR (a local directory in the "
                              "save_pretrained layout, or a RoPE run's 'posbench export') or a hub name")
        if encoding is None:
            raise ConfigError("extend needs --method (tape, lora, longlora, theta, ...; 'posbench ls encodings')")
        return encoding

    def take_init(self, sections: dict[str, dict[str, Any]], source: Any, task_options: dict[str, Any]) -> None:
        take_architecture(sections, source)            # the Llama's; its method's options are the run's own

    def build(self, task: Any, device: Any) -> tuple[Any, dict[str, Any]]:
        """The Llama with ``task.method`` at ``task.opts["length"]`` (the task keeps the method: its evaluation
        and saving use it too)."""
        from posbench.hf.adapter import extended_model  # transformers: only building the model needs it

        model = extended_model(task.source.model_dir, task.method, task.scale, task.opts["length"],
                               task.config.label, device)
        task.base_parameters = model.base_parameters
        return model, {"run": task.source.given, "kind": task.source.kind, "label": task.source.label}


EXTENDED_LLAMA = ExtendedLlama()
