"""The task contract: what a task provides so that one runner can train and evaluate any model on it.

Write a task as one ``Task`` subclass with a ``name``; defining the class registers it in ``TASKS``
(third-party packages may also use the entry-point group ``posbench.tasks``). Every module in
``posbench/tasks/`` is imported by ``posbench.tasks``, so a built-in task needs no other edit. Its presets are
data: ``presets.toml`` beside a task folder's ``task.py``, or ``<module>.toml`` beside a one-file task.

The runner (``posbench.runs.runner``) calls, in this order::

    task = TaskClass(run_config)         # task.opts: the resolved ``task.*`` options; task.source: the --init
    task.validate()                      # raise ConfigError (one line) for what the options alone cannot say
    model, init_record = TaskClass.model_source.build(task, device)   # posbench.tasks.model_source
    for phase in task.phases():          # usually one: train on task.train_stream()
        train, then phase.evaluate(...)  # each phase checkpointed and resumable; its outcome saved
    evaluation = task.evaluate(model, device, reporter, phases)   # under no_grad and autocast -> Evaluation
    task.finish(model, run_dir)          # anything saved beside the result (an extended model)

Class attributes:

- ``OPTIONS`` (the ``task`` section: ``{key: Option(default, help, limit)}``, see ``posbench.options``; shown
  by ``posbench ls tasks NAME``). An option named like a generic CLI flag (``data``, ``datasets``,
  ``tokenizer``) is also set by that flag.
- ``version`` (1 until a change makes the task's numbers differ from earlier runs'; recorded in ``result.json``,
  and ``compare`` never pools runs of two versions).
- ``default_preset``, and the presets themselves: the TOML file beside the module (``presets.toml`` beside a task
  folder's ``task.py``, ``<module>.toml`` beside a one-file task) or the ``presets`` dict: one table per preset
  (``tiny`` runs in seconds on a CPU, ``small`` in minutes on a 2-core CPU, ``gpu`` in minutes on one GPU,
  ``paper`` is the paper's recipe). Reading and choosing them is ``posbench.tasks.presets``' job (its docstring
  has the format).

Where the model comes from is not the task's job: ``model_source`` names it (``posbench.tasks.model_source``: a
fresh model or an ``--init`` one, the default; ``OWN`` for one that builds its own models; extend's
pretrained Llama with a method), and that layer chooses the encoding (or method) ``--encoding`` names, takes what
an ``--init`` model sets and builds the model.

Configuration hooks (class methods, called while the configuration is built): ``adjust`` (settings derived from
others, e.g. passkey's ``train_length`` is the model's ``max_seq_len``), ``encoding_context`` (encoding options only
the task can give, e.g. the token ids of the digits, filled into every encoding that names them in its
``task_context``) and ``label_for`` (the run's name in tables and directories).

A probe (optional): ``probe(model, device) -> {name: value}``, a quick measure of the in-distribution metric that
the trainer runs every ``train.probe_every`` steps (the arithmetic task's accuracy on the operand lengths seen in
training); its history is what ``posbench.report.plateau`` judges a run's plateau by.

Training data: ``train_stream()`` returns an object with ``next_batch(batch_size) -> posbench.data.batch.Batch``
and a ``state_dict()`` / ``load_state_dict()`` pair (plain JSON) that captures the stream position, so
``--resume`` continues with exactly the batches an uninterrupted run would have seen. Prefer ``IndexedStream``
(example g is a pure function of (seed, g), whatever the batch sizes): under torchrun each process then skips to
its own slice of every step's batch. ``SeededStream`` (batch k is a pure function of (seed, k)) also works
with several processes, but each of them builds every batch and keeps its rows. The loss mask is the batch's
``targets``: ``IGNORE_INDEX`` wherever no loss is taken (the loss is ``posbench.data.batch.masked_cross_entropy``,
the trainer's, for every task).

``posbench bench`` is not a task: it is a measurement the same runner runs (``posbench.bench``). What the runner
asks of both, with its defaults, is ``Runnable``: the base of ``Task`` and of bench's ``Bench``.

Metrics: each metric the task records is declared once in the metric registry,
``posbench.evaluation.metrics.register_metric(task, name, better="higher" | "lower", description=...)`` (a family
``ppl_{n}x`` too), at the import of the task's module: compare's direction and pooling of seeds come from there,
and the runner records the declared direction. ``example_scores`` (below) rebuilds those declared
``per_example=True``.

Evaluation returns ``Evaluation(metrics={name: Metric(value, stderr, n)}, primary=name,
grids={name: Grid(metric, axes=[Axis(name, values), ...], values, stderr, n, meta)}, predictions=iterable of
dicts)``. Grids with two axes are drawn as heatmaps by ``posbench compare --plots`` (``meta["train_max"] =
{axis_name: max_trained_value}`` marks the training region), grids with one axis as curves.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from posbench.model import ModelConfig
from posbench.options import Configurable
from posbench.registry import Registry
from posbench.tasks.model_source import FRESH, ModelSource
from posbench.train.config import TrainConfig

TASKS: Registry = Registry("task")
#: members of the Task before model_source took them over (a subclass that still defines one is refused)
MOVED_TO_MODEL_SOURCE = ("needs_model", "build_model", "choose_encoding", "take_init", "encodings")
#: members of the Task before posbench.tasks.presets took them over: a task gives ``presets`` (or its TOML file)
MOVED_TO_PRESETS = ("preset", "preset_table", "preset_file")


@dataclass
class Phase:
    """One stretch of training, checkpointed under ``checkpoint/<name>/`` (``checkpoint/`` for the phase named
    ``train``) and resumable. ``stream()`` builds its training batches when it starts. ``evaluate(model, device,
    reporter) -> dict`` (JSON) runs right after it; that outcome is saved, so a resumed run skips the phase.
    ``from_start``: the phase starts from the weights the run began with (SCROLLS fine-tunes every data set
    anew). ``seed``: torch's generator is seeded with it when the phase starts (so a phase trains alike whether
    the phases before it ran in this process or were skipped on resume). ``probe(model, device) -> {name:
    value}``: a quick in-distribution metric, measured every ``train.probe_every`` steps of the phase."""

    name: str
    stream: Callable[[], Any]
    train: TrainConfig
    from_start: bool = False
    seed: int | None = None
    evaluate: Callable[..., dict[str, Any]] | None = None
    probe: Callable[..., dict[str, float]] | None = None


class Runnable(Configurable):
    """What the runner asks of the class it runs, with the defaults: a ``Task``, or ``posbench bench``'s ``Bench``."""

    kind: ClassVar[str] = "task"
    option_label: ClassVar[str | None] = "task."
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: the version of what the task computes (data, recipe, metric): raise it when a change makes its numbers
    #: differ from those of earlier runs; ``result.json`` records it and ``compare`` never pools two versions
    version: ClassVar[int] = 1
    presets: ClassVar[dict[str, dict[str, Any]]] = {}      # a plugin may give them here instead of a TOML file
    default_preset: ClassVar[str] = "small"
    #: where the run's model comes from, and how ``--encoding`` and ``--init`` choose it (posbench.tasks.model_source)
    model_source: ClassVar[ModelSource] = FRESH
    #: the module whose ``example_scores(record, predictions)`` gives ``example_scores`` (None: none): a module
    #: without torch, so that ``compare --against`` pairs a built-in task's runs without importing its class
    example_scorer: ClassVar[str | None] = None
    #: the settings ``adjust`` sets from another (``{"model.max_seq_len": "task.train_length"}``): a flag or
    #: ``--set`` giving one a value that ``adjust`` then changes is refused, naming the other
    follows: ClassVar[dict[str, str]] = {}

    def __init__(self, config):
        """``config``: the run's ``posbench.runs.run_config.RunConfig``; ``source``: what its ``--init`` resolved to
        (a ``posbench.runs.init.InitSource``), or None."""
        self.config = config
        self.opts: dict[str, Any] = dict(config.task_options)
        self.source = config.source
        self.run_dir: Path | None = None         # set by the runner on the process that writes the run

    # ---- configuration (class methods: called while the configuration is built) ----------------------------
    @classmethod
    def adjust(cls, sections: dict[str, dict[str, Any]], source: Any) -> None:
        """Settings that follow from others (after flags and ``--set``); default: none."""

    @classmethod
    def encoding_context(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Encoding options only this task can give, for the task options ``options`` (the ``task`` section,
        adjusted): an encoding that names a key in its ``task_context`` gets this value, and a task that gives
        none of them refuses the encoding before anything runs. Default: none. The arithmetic task gives
        ``{"digit_ids": [...]}`` (its tokens for 0-9, which Abacus embeddings need)."""
        return {}

    @classmethod
    def label_for(cls, encoding: str | None, source: Any, options: dict[str, Any]) -> str:
        return encoding or (source.label if source is not None else cls.name)

    # ---- hooks ------------------------------------------------------------------------------------------
    def validate(self) -> None:
        """Check what the options' own ranges cannot (combinations, data); raise a one-line ``UserError``."""

    def phases(self) -> list[Phase]:
        """Training, in phases; default: none."""
        return []

    def evaluate(self, model: nn.Module, device: torch.device, reporter: Any, phases: dict[str, dict[str, Any]]):
        """Evaluate the trained model (in eval mode; a ``Task``'s under ``torch.no_grad`` and autocast) ->
        ``Evaluation``; ``phases`` holds each phase's saved outcome."""
        raise NotImplementedError

    def finish(self, model: nn.Module, run_dir: Path) -> dict[str, Any]:
        """Save anything beside the result (after evaluation); returns facts for the record's ``model``."""
        return {}

    def data_info(self) -> dict[str, Any]:
        """``{"source": ..., "hash": ...}`` plus anything that identifies the data exactly."""
        return {"source": "synthetic", "hash": config_hash(self.opts)}

    def seeds(self) -> dict[str, int]:
        """Seeds beyond the global one (recorded in result.json), e.g. ``{"data": s, "eval": 42}``."""
        return {"data": self.config.seed}

    @classmethod
    def example_scores(cls, record: Any, predictions: list[dict[str, Any]]):
        """The per-example values behind the metrics of a finished run (its record and ``predictions.jsonl``
        rows) as a ``posbench.stats.ExampleScores``, so that ``compare --against`` pairs two encodings example
        by example; None (no ``example_scorer``, the default): the metrics are paired across seeds only."""
        if cls.example_scorer is None:
            return None
        return importlib.import_module(cls.example_scorer).example_scores(record, predictions)


class Task(Runnable):
    """Base class: subclass it, set ``name``, ``description``, ``OPTIONS``; implement the hooks."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        moved = [name for name in MOVED_TO_MODEL_SOURCE if name in cls.__dict__]
        if moved:                      # a task written for the Task before model_source: never ignore it in silence
            raise TypeError(f"task '{cls.__dict__.get('name', cls.__qualname__)}' defines {', '.join(moved)}: where "
                            f"the model comes from is now the task's model_source (posbench.tasks.model_source: "
                            f"OWN for a task that builds its own models, or a ModelSource subclass)")
        moved = [name for name in MOVED_TO_PRESETS if name in cls.__dict__]
        if moved:
            raise TypeError(f"task '{cls.__dict__.get('name', cls.__qualname__)}' defines {', '.join(moved)}: a task "
                            f"gives its presets as the class's presets dict or the TOML file beside its module "
                            f"(posbench.tasks.presets reads them)")
        TASKS.add_subclass(cls)

    def vocab_size(self) -> int:
        raise NotImplementedError

    def model_config(self):
        """The ``ModelConfig`` of a fresh model: the ``model`` section plus vocab, encoding and its options."""
        return ModelConfig(vocab_size=self.vocab_size(), encoding=self.config.encoding,
                           encoding_options=dict(self.config.encoding_options), **self.config.model)

    def train_stream(self) -> Any:
        """The training batches (see the module docstring)."""
        raise NotImplementedError

    def phases(self) -> list[Phase]:
        """Training, in phases; default: one phase on ``train_stream()`` (none when ``train.steps`` is 0)."""
        train = self.config.training
        return [Phase("train", self.train_stream, train, probe=self.probe)] if train.steps > 0 else []

    probe: Callable[[nn.Module, torch.device], dict[str, float]] | None = None
    """Optional: a method ``probe(model, device) -> {name: value}``, a quick measure of the in-distribution metric
    (the arithmetic task: exact-match accuracy on operand lengths seen in training), run during training every
    ``train.probe_every`` steps (recorded as ``training.probe_history``). Each value is a percentage where higher
    is better: ``posbench.report.plateau``'s probe rule (1 point, 99%) and the probe figures (0-100) read it so."""


class IndexedStream:
    """A resumable stream whose g-th example is a pure function of (seed, g), whatever the batch sizes.

    Subclasses implement ``make_examples(start, count) -> Batch`` (examples ``start .. start + count - 1``);
    the state is the number of examples drawn. ``skip(n)`` passes over n examples: several processes read
    disjoint slices of the same stream with it (``posbench.train.distributed.RankBatches``).
    """

    def __init__(self, seed: int):
        self.seed = int(seed)
        self.index = 0

    def make_examples(self, start: int, count: int):
        raise NotImplementedError

    def next_batch(self, batch_size: int):
        batch = self.make_examples(self.index, batch_size)
        self.index += batch_size
        return batch

    def skip(self, count: int) -> None:
        self.index += count

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "examples": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed, self.index = int(state["seed"]), int(state["examples"])


class SeededStream:
    """A resumable stream whose k-th batch is a pure function of (seed, k).

    Subclasses implement ``make_batch(rng, batch_size, index) -> Batch`` with ``rng`` a NumPy Generator
    seeded from (seed, index); the state is just the number of batches drawn.
    """

    def __init__(self, seed: int):
        self.seed = int(seed)
        self.index = 0

    def make_batch(self, rng: np.random.Generator, batch_size: int, index: int):
        raise NotImplementedError

    def next_batch(self, batch_size: int):
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, self.index]))
        batch = self.make_batch(rng, batch_size, self.index)
        self.index += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed, self.index = int(state["seed"]), int(state["index"])


def config_hash(obj: Any) -> str:
    """A short stable hash of a JSON-able object (data identity for synthetic tasks)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]
