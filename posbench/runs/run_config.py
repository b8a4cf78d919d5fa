"""A run's configuration as config.json and result.json record it (``RunConfig``), read and written without
importing torch: ``compare`` reads records alone. How a configuration is resolved from the flags is
``posbench.runs.config``'s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from posbench import setting_facts
from posbench.errors import ConfigError
from posbench.model.config import current_names
from posbench.options import RECORDED_SECTIONS
from posbench.runs.init import InitSource
from posbench.train.config import TrainConfig


@dataclass
class RunConfig:
    """Everything needed to reproduce a run (``config.json`` and ``result.json`` record it)."""

    task: str
    encoding: str | None                    # a name of the task's encoding registry; None: the --init model's own
    preset: str
    task_version: int = 1                   # the task's ``version`` (records written before versions existed: 1)
    label: str = ""                         # the run's name in tables and directories (encoding, llama+tape, ...)
    seed: int = 0
    device: str = "auto"
    init: str | None = None                 # what --init named
    source: InitSource | None = None        # what it resolved to
    model: dict[str, Any] = field(default_factory=dict)
    encoding_options: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    task_options: dict[str, Any] = field(default_factory=dict)
    logs: list[str] = field(default_factory=list)      # experiment loggers (--log)

    def __post_init__(self):
        self.label = self.label or self.encoding or (self.source.label if self.source else "") or self.task

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["source"] = self.source.to_dict() if self.source is not None else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, earlier_values: bool = False) -> RunConfig:
        """A recorded config (of any version). ``earlier_values``: fill in the settings added since at the values it
        ran with, to run it again (``--resume``); compare reads records as written."""
        missing = {"task", "preset"} - set(data)
        if missing:
            raise ConfigError(f"run config lacks {', '.join(sorted(missing))}")
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        for key in ("model", "model_config"):           # a setting recorded under an older name: its current one
            if isinstance(values.get(key), dict):
                values[key] = current_names(values[key])
        if isinstance(values.get("source"), dict):
            values["source"] = InitSource.from_dict(values["source"])
        values.setdefault("encoding", None)
        if not earlier_values or "task_version" not in values:         # a resume checks one written as it is
            values["task_version"] = values.get("task_version") or 1  # written before tasks had versions: 1
        if earlier_values:
            with_earlier_values(values)
        return cls(**values)

    def section(self, name: str) -> dict[str, Any]:
        return getattr(self, RECORDED_SECTIONS[name])

    @cached_property
    def training(self) -> TrainConfig:
        """The ``train`` section as one typed ``TrainConfig``, built once (what the runner and trainer take)."""
        return TrainConfig(**self.train)


def with_earlier_values(values: dict[str, Any]) -> None:
    """Fill in a recorded section's settings added since, at their earlier values (``Added.before``), not today's
    defaults; a section the record lacks stays empty."""
    for section, earlier in setting_facts.earlier_values(values.get("encoding"), values.get("task")).items():
        key = RECORDED_SECTIONS[section]
        recorded = values.get(key)
        if isinstance(recorded, dict) and recorded:     # a new dict, the record's own keys first, in their order
            values[key] = {**recorded, **{name: value for name, value in earlier.items() if name not in recorded}}
