"""``--log wandb``: a Weights & Biases run (``pip install 'posbench[wandb]'``).

The run's id and name are posbench's run id, its config the resolved configuration, its group the task and its
tags the task and the run's label; files go under ``RUN_DIR/wandb/``. The project is ``$WANDB_PROJECT`` or
``posbench`` (entity: ``$WANDB_ENTITY`` or the account's default); ``WANDB_MODE=offline`` writes locally for a
later ``wandb sync``. Scalars are logged as ``<phase>/<name>`` against their own step axis ``<phase>/step``
(``define_metric``), since the steps of each training phase start at 1; the final metrics go to the run's
summary as ``final/<name>``. Console capture is off (posbench draws its own progress).

Resume: the run is reopened with ``resume="allow"`` under the same id. Online, steps at or before the last one
the run's summary holds for the phase are not logged again; offline, W&B cannot resume a run, so the steps
between the checkpoint and the kill appear twice in the offline history (with the same values on a CPU).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from posbench.loggers.base import ExperimentLogger, LoggerError, present, safe_id

PROJECT = "posbench"


class WandbLogger(ExperimentLogger):
    name = "wandb"
    requires = ("wandb",)
    extra = "wandb"

    def __init__(self, run_dir, run_id, config):
        super().__init__(run_dir, run_id, config)
        self.check_available()
        import wandb  # wandb: optional (posbench[wandb]), only --log wandb

        task, label = self.config.get("task"), self.config.get("label") or self.config.get("encoding")
        try:
            self.run = wandb.init(
                project=os.environ.get("WANDB_PROJECT") or PROJECT, id=safe_id(run_id), name=run_id,
                dir=str(self.run_dir), config=self.config, resume="allow",
                group=str(task) if task else None, tags=[str(t) for t in (task, label) if t],
                settings=wandb.Settings(console="off"))
        except Exception as exc:   # noqa: BLE001 - no login, no network, bad settings: one line
            message = " ".join(str(exc).split())[:300]
            raise LoggerError(f"--log wandb could not start a run ({type(exc).__name__}: {message}); run "
                              f"`wandb login`, or set WANDB_MODE=offline") from None
        self._phases: dict[str, float] = {}

    def _start_phase(self, phase: str) -> float:
        if phase not in self._phases:
            self.run.define_metric(f"{phase}/step")
            self.run.define_metric(f"{phase}/*", step_metric=f"{phase}/step")
            last = self.run.summary.get(f"{phase}/step") if self.run.resumed else None
            self._phases[phase] = float(last) if isinstance(last, (int, float)) else float("-inf")
        return self._phases[phase]

    def log_step(self, step: int, scalars: Mapping[str, float | None], *, phase: str = "train") -> None:
        if step <= self._start_phase(phase):
            return
        data = {f"{phase}/{k}": v for k, v in present(scalars).items()}
        data[f"{phase}/step"] = int(step)
        self.run.log(data)

    def finish(self, metrics: Mapping[str, float | None]) -> None:
        for name, value in present(metrics).items():
            self.run.summary[f"final/{name}"] = value
        self.close()

    def close(self) -> None:
        if getattr(self, "run", None) is not None:
            self.run.finish()
            self.run = None
