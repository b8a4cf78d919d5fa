"""The experiment-logger contract, its registry and its one-line errors.

A logger is made on rank 0 only (the caller guarantees it: under torchrun the other ranks make none) with the
run directory, the run id and the resolved configuration, which it records as hyperparameters. Then:

* ``log_step(step, scalars, phase="train")`` at every log step: ``step`` (1-based optimizer step within the
  phase), ``scalars`` (``loss``, ``lr``, ``grad_norm``, ``tokens_per_s`` and any extra names; ``None`` values
  are left out), ``phase`` (the training phase's name, for tasks that train in several phases whose steps
  each start at 1);
* ``finish(metrics)`` once at the end with the final metrics (name -> value, the ``result.json`` metrics'
  values; ``None`` values are left out); it closes the logger. ``close()`` alone (after an error) keeps
  what was logged.

A resumed run (same run directory and run id, continuing from a checkpoint at step ``s``) logs steps
``s + 1, ...`` again: each logger drops what it had recorded for those steps (see each one's docstring).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from posbench.errors import UserError
from posbench.registry import Registry

LOGGERS: Registry = Registry("logger", "posbench.loggers")


class LoggerError(UserError):
    """A logger that cannot start (a missing package, a refused login); ``str()`` is one line."""


class ExperimentLogger:
    """Subclass with a ``name`` to add a logger (``--log NAME``); ``requires`` names the modules it imports and
    ``extra`` the ``posbench[extra]`` that installs them."""

    name: str = ""
    requires: tuple[str, ...] = ()
    extra: str | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        LOGGERS.add_subclass(cls)

    def __init__(self, run_dir: str | Path, run_id: str, config: Mapping[str, Any]):
        self.run_dir, self.run_id, self.config = Path(run_dir), run_id, dict(config)

    def log_step(self, step: int, scalars: Mapping[str, float | None], *, phase: str = "train") -> None:
        raise NotImplementedError

    def finish(self, metrics: Mapping[str, float | None]) -> None:
        self.close()

    def close(self) -> None:
        pass

    def __enter__(self) -> ExperimentLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @classmethod
    def check_available(cls) -> None:
        missing = [m for m in cls.requires if importlib.util.find_spec(m) is None]
        if missing:
            raise LoggerError(f"--log {cls.name} needs the {', '.join(missing)} package: "
                              f"pip install 'posbench[{cls.extra or cls.name}]'")


def validate(names: Iterable[str]) -> list[str]:
    """The distinct logger names, in order; an unknown name or a missing package is a one-line error."""
    out: list[str] = []
    for name in names:
        cls = LOGGERS.get(str(name).strip().lower())
        cls.check_available()
        if cls.name not in out:
            out.append(cls.name)
    return out


def config_dict(config: Any) -> dict[str, Any]:
    """A JSON-able dict of a run configuration (a ``RunConfig``, a dataclass, a mapping or None)."""
    if config is None:
        return {}
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    elif dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    return json.loads(json.dumps(dict(config), default=str))


def present(values: Mapping[str, Any]) -> dict[str, float]:
    """The entries whose value is a number (``None`` and the rest left out)."""
    return {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def safe_id(run_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", run_id)[:64]
