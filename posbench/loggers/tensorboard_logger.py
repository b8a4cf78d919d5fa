"""``--log tensorboard``: event files in ``RUN_DIR/tensorboard/`` through PyTorch's ``SummaryWriter`` (needs
the ``tensorboard`` package: ``pip install 'posbench[tensorboard]'``, which also gives the viewer,
``tensorboard --logdir results/``). Everything is in that one logdir, so ``tensorboard --logdir RUN_DIR/tensorboard``
shows the whole run:

* ``<phase>/<name>`` (``train/loss``, ``train/lr``, ``train/grad_norm``, ``train/tokens_per_s``, extras): one
  scalar per optimizer step of each training phase. The steps run on across phases (a task that trains in
  several phases, SCROLLS, starts each one after the last step of the one before; ``steps.json`` in the logdir
  keeps where each phase starts), so that one axis holds the whole run;
* ``config``: the resolved configuration as text, when the logger starts;
* at the end the settings as hyperparameters (HParams dashboard), named as ``posbench.results.frame`` names
  its columns (``task``, ``encoding``, ``seed``, ``preset``, ``init``, ``model.*``, ``encoding.*``, ``train.*``,
  ``task.*``), with the final metrics as its metrics, also written as scalars ``final/<name>`` at the last
  logged step.

Resume: the resumed run's writer opens a new event file with ``purge_step`` = the step it continues from, so
TensorBoard hides what the killed run logged from that step on (of every tag: the earlier phases lie before it
on the common axis) and shows the resumed run's values there instead.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from posbench.cells import PREFIXES, cell
from posbench.files import atomic_write_json, json_object
from posbench.loggers.base import ExperimentLogger, LoggerError, present

DIR = "tensorboard"
STEPS_FILE = "steps.json"


def frame_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """A run configuration (``RunConfig.to_dict()``) as the frame's columns: the run's identity (``encoding`` is
    the row name, its label) and every setting as ``section.key``, lists as text (``posbench.cells.cell``)."""
    out = {"task": config.get("task"), "encoding": config.get("label") or config.get("encoding"),
           "seed": config.get("seed"), "preset": config.get("preset"), "init": config.get("init")}
    for section, prefix in PREFIXES.items():
        for key, value in (config.get(section) or {}).items():
            out[f"{prefix}.{key}"] = cell(value)
    return {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in out.items()}


class TensorBoardLogger(ExperimentLogger):
    name = "tensorboard"
    requires = ("tensorboard",)
    extra = "tensorboard"

    def __init__(self, run_dir, run_id, config):
        super().__init__(run_dir, run_id, config)
        self.check_available()
        try:
            from torch.utils.tensorboard import SummaryWriter  # tensorboard: optional, only --log tensorboard
        except ImportError as exc:
            raise LoggerError(f"--log tensorboard cannot import torch.utils.tensorboard ({exc}); "
                              f"pip install 'posbench[tensorboard]'") from None
        self._writer_cls = SummaryWriter
        self.root = self.run_dir / DIR
        self.steps_file = self.root / STEPS_FILE
        kept = json_object(self.steps_file) or {}
        self.starts: dict[str, int] = dict(kept.get("starts") or {})
        self.resumed = bool(self.starts)
        self.writer = None
        self.last_step = int(kept.get("last") or 0)
        if not self.resumed:
            self._open(None).add_text("config", "```json\n" + json.dumps(self.config, indent=2, sort_keys=True)
                                      + "\n```")
            self.writer.flush()

    def _open(self, purge_step: int | None):
        if self.writer is None:
            self.writer = self._writer_cls(log_dir=str(self.root), purge_step=purge_step)
        return self.writer

    def _global_step(self, phase: str, step: int) -> int:
        """The phase's step on the run's axis (a new phase starts after the last step logged so far)."""
        if phase not in self.starts:
            self.starts[phase] = self.last_step
        return self.starts[phase] + int(step)

    def log_step(self, step: int, scalars: Mapping[str, float | None], *, phase: str = "train") -> None:
        at = self._global_step(phase, step)
        writer = self._open(at if self.resumed else None)
        for name, value in present(scalars).items():
            writer.add_scalar(f"{phase}/{name}", value, at)
        writer.flush()
        self.last_step = at
        atomic_write_json(self.steps_file, {"starts": self.starts, "last": self.last_step})

    def finish(self, metrics: Mapping[str, float | None]) -> None:
        from torch.utils.tensorboard.summary import hparams  # tensorboard: optional, as above

        writer = self._open(None)
        final = {f"final/{k}": v for k, v in present(metrics).items()}
        exp, ssi, sei = hparams(frame_settings(self.config), final)
        for summary in (exp, ssi, sei):
            writer.file_writer.add_summary(summary)
        for name, value in final.items():
            writer.add_scalar(name, value, self.last_step)
        self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
