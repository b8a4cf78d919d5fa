"""Where a run's model comes from: the one layer that chooses and builds it, so that a ``Task`` says only what its
data is, how a batch is made and how a model is evaluated.

A task names its source in ``Task.model_source`` (an instance of one of these classes):

- ``FRESH`` (the default): a fresh ``Transformer`` of ``--encoding``, or the model ``--init`` names (a posbench
  run, a ``posbench export``, a pretrained Hugging Face model behind posbench's model interface);
- ``OWN``: the task builds its models itself and the run has none (``bench``, which times a model per cell);
- the ``extend`` task's ``ExtendedLlama`` (``posbench.tasks.extend.source``): a pretrained Llama with an extension
  method, which ``--encoding`` (``--method``) names.

The configuration calls ``encodings()``, ``choose_encoding`` and ``take_init`` while it is built
(``posbench.runs.config``); the runner calls ``build`` once the task exists (``posbench.runs.runner``).
"""

from __future__ import annotations

from typing import Any

from posbench.encodings import ENCODINGS
from posbench.errors import ConfigError
from posbench.tasks.build_model import build_model


class ModelSource:
    """A fresh model or an ``--init`` model (``FRESH``); subclasses change what differs."""

    #: False: the run has no model of its own (the task builds its models: ``OWN``)
    builds: bool = True

    def encodings(self):
        """The registry ``--encoding`` names."""
        return ENCODINGS

    def choose_encoding(self, encoding: str | None, source: Any) -> str | None:
        """The run's encoding: ``--encoding``, or the ``--init`` run's; None for a pretrained model (its own)."""
        if source is None:
            if encoding is None:
                raise ConfigError("--encoding is required (or --init RUN_DIR to take it from another run)")
            return encoding
        if source.is_posbench:
            if encoding is not None and encoding != source.encoding:
                raise ConfigError(f"--init run {source.given} uses encoding '{source.encoding}', not '{encoding}'")
            return source.encoding
        if encoding is not None:
            raise ConfigError(f"--init {source.given} is a pretrained {source.label} model with its own positional "
                              f"encoding; leave --encoding out")
        return None

    def take_init(self, sections: dict[str, dict[str, Any]], source: Any, task_options: dict[str, Any]) -> None:
        """What the ``--init`` model sets: its architecture, its encoding options, its tokenizer
        (``task_options``: the task's declarations, for the tokenizer's default)."""
        take_architecture(sections, source)
        recorded = source.model.get("encoding_options") or {}
        sections["encoding"].update({k: v for k, v in recorded.items() if k in sections["encoding"]})
        if "tokenizer" in sections["task"]:        # the init model's tokenizer; a preset's is for fresh runs
            sections["task"]["tokenizer"] = task_options["tokenizer"].default

    def build(self, task: Any, device: Any) -> tuple[Any, dict[str, Any] | None]:
        """``(model, init record)`` for ``task``'s configuration (a resumed run's own checkpoint is loaded over
        it when its training resumes)."""
        return build_model(task)


def take_architecture(sections: dict[str, dict[str, Any]], source: Any) -> None:
    """The ``--init`` model's architecture over the ``model`` section (recorded with the run)."""
    for key in sections["model"]:
        if key in source.model:
            sections["model"][key] = source.model[key]


class OwnModels(ModelSource):
    """The task builds its models itself; the run has none and names no encoding (bench: its cells do)."""

    builds = False

    def choose_encoding(self, encoding: str | None, source: Any) -> str | None:
        return None

    def build(self, task: Any, device: Any) -> tuple[None, None]:
        return None, None


FRESH = ModelSource()
OWN = OwnModels()
