"""The task contract, checked through the paths a user takes: ``resolve_run_config`` (``posbench run``'s
configuration, ``--set task.KEY=VALUE``), the task's training stream, the one runner and ``compare``'s reader.

The short run uses the task's ``tiny`` preset (else its default) with at most ``STEPS`` training steps, one
thread, into a temporary directory that is removed afterwards; ``sets`` (``--set``) and ``encoding`` (default
``rope``) let a task that needs data or an ``--init`` model get them.
"""

from __future__ import annotations

import json
import math
import tempfile
from typing import Any

import torch

from posbench import report
from posbench.checks.options import check_options
from posbench.checks.outcome import CheckFailed, Report
from posbench.evaluation.metrics import METRICS
from posbench.runs import runner
from posbench.runs.config import resolve_run_config
from posbench.tasks import TASKS
from posbench.tasks.presets import presets_of

STEPS = 2
BATCH = 4


def check_task(name: str, *, encoding: str = "rope", sets: tuple[str, ...] = ()) -> Report:
    """Every check of the task contract on task ``name``, with ``encoding`` and the extra ``sets``."""
    cls = TASKS.get(name)
    report = Report(f"task '{name}'")
    preset = "tiny" if "tiny" in presets_of(cls) else None
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        check_options(report, cls, lambda options: configure(name, encoding, preset, sets, options))
        report.run("a version, a whole number from 1", lambda: version(cls))
        report.run("every preset resolves", lambda: presets(cls, encoding, sets))
        if cls.model_source.builds:
            report.run("the training stream resumes from its saved state",
                       lambda: stream_resumes(cls, configure(name, encoding, preset, sets, {})))
        recorded: dict[str, Any] = {}
        if report.run(f"a short run ({STEPS} steps) is recorded and compare reads it",
                      lambda: short_run(configure(name, encoding, preset, sets, {}, steps=STEPS), recorded)):
            report.run("every metric it records is declared (register_metric)",
                       lambda: declared(name, recorded.get("metrics", [])))
    finally:
        torch.set_num_threads(before)
    return report


def configure(task: str, encoding: str, preset: str | None, sets: tuple[str, ...], options: dict[str, Any],
              steps: int | None = None):
    extra = [f"task.{key}={as_text(value)}" for key, value in options.items()]
    first = [f"train.steps={steps}"] if steps is not None else []
    return resolve_run_config(task, encoding, preset, sets=[*first, *sets, "train.threads=1", *extra])


def as_text(value: Any) -> str:
    """A value as ``--set`` takes it (a list comma-separated)."""
    return ",".join(str(v) for v in value) if isinstance(value, list) else str(value)


def version(cls: Any) -> str:
    if isinstance(cls.version, bool) or not isinstance(cls.version, int) or cls.version < 1:
        raise CheckFailed(f"version = {cls.version!r}")
    return f"version {cls.version}"


def presets(cls: Any, encoding: str, sets: tuple[str, ...]) -> str:
    table = presets_of(cls)
    for preset in table:
        resolve_run_config(cls.name, encoding, preset, sets=list(sets))
    if cls.default_preset not in table and table:
        raise CheckFailed(f"default_preset '{cls.default_preset}' is not one of its presets ({', '.join(table)})")
    return ", ".join(table) or "none (the defaults)"


def stream_resumes(cls: Any, config) -> str:
    """Two batches; the stream's state after the first, through JSON, into a fresh stream: its next batch is the
    second, token for token. Every token lies in the vocabulary and the targets match the tokens' shape."""
    task = cls(config)
    task.validate()
    vocab = task.vocab_size()
    stream = task.train_stream()
    first = stream.next_batch(BATCH)
    state = json.loads(json.dumps(stream.state_dict()))
    second = stream.next_batch(BATCH)
    again = task.train_stream()
    again.load_state_dict(state)
    resumed = again.next_batch(BATCH)
    for batch in (first, second):
        if batch.tokens.shape != batch.targets.shape:
            raise CheckFailed(f"tokens {tuple(batch.tokens.shape)} but targets {tuple(batch.targets.shape)}")
        if batch.tokens.min() < 0 or batch.tokens.max() >= vocab:
            raise CheckFailed(f"a token outside the vocabulary of {vocab}")
    if not (torch.equal(resumed.tokens, second.tokens) and torch.equal(resumed.targets, second.targets)):
        raise CheckFailed("the batch after load_state_dict differs from the batch the stream gave after that state")
    return f"batches of {tuple(first.tokens.shape)}"


def short_run(config, recorded: dict[str, Any]) -> str:
    """``recorded["metrics"]``: the names of the metrics the run recorded."""
    with tempfile.TemporaryDirectory(prefix="posbench-check-") as out:
        record = runner.execute(config, out).record
        if record.bench is not None:                  # a benchmark records measurements, not metrics
            return f"{len(record.bench['cells'])} cells measured"
        values = {k: m.value for k, m in record.metrics.items()}
        recorded["metrics"] = list(values)
        if not values:
            raise CheckFailed("the evaluation returned no metric")
        bad = [k for k, v in values.items() if v is not None and not math.isfinite(v)]
        if bad:
            raise CheckFailed(f"non-finite metrics: {', '.join(bad)}")
        tables = report.collect(out).tables
        if not any(t.task == config.task and t.rows for t in tables):
            raise CheckFailed("compare found no row for the run")
    primary = record.primary_metric or next(iter(values))
    return f"{primary} = {values[primary]:.4g}" if values[primary] is not None else primary


def declared(task: str, names: list[str]) -> str:
    """Every metric the run recorded has a declaration in the metric registry (its direction, its pooling)."""
    missing = [n for n in names if METRICS.find(task, n) is None]
    if missing:
        raise CheckFailed(f"no declaration for {', '.join(missing)}: declare each with "
                          f"posbench.evaluation.metrics.register_metric (docs/extending.md)")
    return f"{len(names)} metric(s)" if names else "none recorded"
