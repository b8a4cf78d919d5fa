"""The task contract: what a task provides so that ``posbench run`` can train and evaluate any encoding on it.

Write a task as one ``Task`` subclass with a ``name``; defining the class registers it in ``TASKS``
(third-party packages may also use the entry-point group ``posbench.tasks``). Every module in
``posbench/tasks/`` is imported by ``posbench.tasks``, so a built-in task needs no other edit.

The run flow (``posbench.runner.execute``) calls, in this order::

    task = TaskClass(run_config)         # task.opts (= run_config.task_options): the resolved `task.*` options
    task.validate()                      # raise ConfigError (one line) for bad option combinations
    model = Transformer(task.model_config())   # vocab from task.vocab_size(); --init weights loaded after
    stream = task.train_stream()         # TrainStream: next_batch(b) -> Batch, state_dict(), load_state_dict()
    engine.train(model, stream, TrainConfig(**run_config.train), loss_fn=task.loss, ...)
    evaluation = task.evaluate(model, device, reporter)     # -> results.Evaluation
    # result.json gets evaluation.metrics / .grids / .primary, task.data_info(), task.seeds();
    # predictions.jsonl gets evaluation.predictions

Class attributes:

- ``options``: the task's own keys with typed defaults (the ``task`` section; ``--set task.KEY=V``). A key
  named like a generic CLI flag (``data``, ``datasets``, see ``config.TASK_FLAGS``) is also set by that flag
  (``posbench run --task pretrain --data PATH`` sets ``task.data``); a flag the task lacks is a one-line error.
- ``option_help``: one line per option, shown by ``posbench ls tasks``.
- ``presets``: ``{"tiny": {...}, "small": {...}, "gpu": {...}, "paper": {...}}``; each preset is
  ``{"model": {...}, "train": {...}, "task": {...}}`` overriding the built-in defaults of those sections
  (``ModelConfig``, ``engine.TrainConfig``, ``options``). ``tiny`` must run in seconds on a CPU (tests),
  ``small`` in minutes on a 2-core CPU (the default), ``gpu`` in at most 10 minutes per encoding on one
  H100 (the paper's recipe scaled down so that its comparison still shows), ``paper`` is the paper's recipe.
  A preset may also carry ``"expected": {"seconds": S, "hardware": "...", "how": "measured" | "estimated",
  "note": "..."}``: the wall time of one run of one encoding (training and evaluation) on that hardware,
  shown by ``posbench ls presets``; it is not a configuration section.
- ``default_preset``: ``"small"``.

Training data: ``train_stream()`` returns an object with ``next_batch(batch_size) -> engine.Batch`` and a
``state_dict()`` / ``load_state_dict()`` pair (plain JSON) that captures the stream position, so ``--resume``
continues with exactly the batches an uninterrupted run would have seen. Prefer ``IndexedStream`` (example g
is a pure function of (seed, g), whatever the batch sizes): under torchrun each process then skips to its own
slice of every step's batch. ``SeededStream`` (batch k is a pure function of (seed, k)) also works with
several processes, but each of them builds every batch and keeps its rows.
The loss mask is the batch's ``targets``: ``engine.IGNORE_INDEX`` wherever no loss is taken. Override
``loss(model, batch) -> (loss_sum, n_tokens)`` only for something other than masked token cross-entropy.
A task that only evaluates (starting from ``--init RUN_DIR``) sets ``train.steps`` to 0 in its presets.

Starting from another run (``--init RUN_DIR``): the runner reads that run's ``checkpoint/model_config.json``,
takes its architecture and encoding (``--encoding`` may be left out; if given it must match), loads its
weights, and records the init run and the weights' hash. ``init_model_config(model_cfg)`` lets a task adapt
the loaded config (e.g. nothing, or a new ``max_seq_len``) before the model is built. A task that needs an
init run says so in ``validate()`` (``if self.config.init is None: raise ConfigError(...)``).

Evaluation returns ``results.Evaluation(metrics={name: Metric(value, stderr, n, higher_is_better)},
primary=name, grids={name: Grid(metric, axes=[Axis(name, values), ...], values, stderr, n, meta)},
predictions=iterable of dicts)``. Grids with two axes are drawn as heatmaps by ``posbench compare
--plots`` (one shared colour scale; ``meta["train_max"] = {axis_name: max_trained_value}`` marks the
training region), grids with one axis as curves.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from posbench.errors import ConfigError
from posbench.registry import Registry

if TYPE_CHECKING:
    from posbench.config import RunConfig

TASKS: Registry = Registry("task", entry_point_group="posbench.tasks")
PRESET_NAMES = ("tiny", "small", "gpu", "paper")
# the hardware the presets' "expected" times refer to
DEV_CPU = "2-core x86-64 CPU (Intel Xeon, shared), torch 2.13.0+cpu"
H100 = "1x NVIDIA H100 80GB"


class Task:
    """Base class: subclass it, set ``name``, ``description``, ``options``, ``presets``; implement the hooks."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    options: ClassVar[dict[str, Any]] = {}
    option_help: ClassVar[dict[str, str]] = {}
    presets: ClassVar[dict[str, dict[str, dict[str, Any]]]] = {}
    default_preset: ClassVar[str] = "small"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        TASKS.add_subclass(cls)

    def __init__(self, config: RunConfig):
        self.config = config
        self.opts: dict[str, Any] = dict(config.task_options)

    # ---- hooks ------------------------------------------------------------------------------------------
    def validate(self) -> None:
        """Check option combinations; raise ``ConfigError`` with one line."""

    def vocab_size(self) -> int:
        raise NotImplementedError

    def model_config(self):
        """The ``ModelConfig`` to build: the ``model`` section plus vocab, encoding and its options."""
        from posbench.model import ModelConfig

        return ModelConfig(vocab_size=self.vocab_size(), encoding=self.config.encoding,
                           encoding_options=dict(self.config.encoding_options), **self.config.model)

    def init_model_config(self, model_config: dict[str, Any]) -> dict[str, Any]:
        """Adapt the ``--init`` run's model config (a dict) before building; default: unchanged."""
        return model_config

    def train_stream(self) -> Any:
        """The training batches (see the module docstring). Eval-only tasks may return ``EmptyStream()``."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch) -> tuple[Tensor, int]:
        from posbench.engine import masked_cross_entropy

        return masked_cross_entropy(model, batch)

    def evaluate(self, model: nn.Module, device: torch.device, reporter: Any):
        """Evaluate the trained model (already in eval mode, under ``torch.no_grad``) -> ``Evaluation``."""
        raise NotImplementedError

    def data_info(self) -> dict[str, Any]:
        """``{"source": ..., "hash": ...}`` plus anything that identifies the data exactly."""
        return {"source": "synthetic", "hash": config_hash(self.opts)}

    def seeds(self) -> dict[str, int]:
        """Seeds beyond the global one (recorded in result.json), e.g. ``{"data": s, "eval": 42}``."""
        return {"data": self.config.seed}

    @classmethod
    def example_scores(cls, result: dict[str, Any], predictions: list[dict[str, Any]]):
        """The per-example values behind the metrics of a finished run (``result.json`` and its
        ``predictions.jsonl`` rows) as a ``posbench.stats.ExampleScores``, so that ``compare --against``
        pairs two encodings example by example; None (the default): the metrics are paired across seeds only."""
        return None

    # ---- descriptions (posbench ls) ----------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str) -> dict[str, dict[str, Any]]:
        if name not in cls.presets:
            valid = ", ".join(cls.presets) or "none"
            raise ConfigError(f"task '{cls.name}' has no preset '{name}'; presets: {valid}")
        return cls.presets[name]


class IndexedStream:
    """A resumable stream whose g-th example is a pure function of (seed, g), whatever the batch sizes.

    Subclasses implement ``make_examples(start, count) -> Batch`` (examples ``start .. start + count - 1``);
    the state is the number of examples drawn. ``skip(n)`` passes over n examples: several processes read
    disjoint slices of the same stream with it (``posbench.distributed.RankBatches``).
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


class EmptyStream:
    """For evaluation-only tasks (``train.steps = 0``)."""

    def next_batch(self, batch_size: int):
        raise RuntimeError("this task has no training data; set train.steps=0")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def config_hash(obj: Any) -> str:
    """A short stable hash of a JSON-able object (data identity for synthetic tasks)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]
