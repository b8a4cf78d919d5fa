"""``compare --by-model``: one row per evaluated model, the metrics of every task as columns.

A run that starts from another run (``--init``, recorded as ``result["init"]["run"]``) evaluates that run's
model, so it goes to that run's row; a run that starts from nothing is a model of its own, and so is a run that
makes a new model from the one it started from (its label differs from that model's: ``extend --method tape``
on a ``llama`` is ``llama+tape``, a row of its own keyed by the base model and the method). The row is named
after the model's run: its ``label`` when it records one (an extended pretrained model, e.g.
``llama+lora``), else its encoding; a model with no readable run of its own (a pretrained model's directory)
takes the label its evaluation runs recorded (``init.label``). Columns are ``task:metric``. A model's own run
(pretrain, extend) defines the model, so its settings differ from row to row by nature and share columns.
Evaluation runs of one task with different evaluation settings are never pooled: each set of settings gets
columns of its own, marked ``#1``, ``#2`` and explained under the table; runs of one task and settings for one
model are averaged. The model's own settings (``model.*``: its size, recorded by every run that evaluates it)
identify the row and never split the columns: two models of different sizes evaluated alike share columns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posbench.report import grouping
from posbench.report.reading import Reading
from posbench.report.structure import Row, TaskTable
from posbench.report.best import RULE, mark_best
from posbench.report.tables import incomplete_note, metric_cell, metric_columns, run_id
from posbench.runs.record import RunRecord


def _where(path: Any) -> str:
    p = Path(str(path))
    return str(p.resolve()) if p.exists() else str(p)


def makes_model(run: RunRecord) -> bool:
    """The run's model is its own: it started from nothing, or it made a new model (an extension) from the one it
    started from, which its label tells apart from that model's."""
    if not run.init_given:
        return True
    started_from = (run.init or {}).get("label")
    return bool(started_from) and str(run.config.label or run.encoding) != str(started_from)


def model_of(reading: Reading, run: RunRecord) -> tuple[str, RunRecord | None]:
    """(the model's identity, the model's own run when readable)."""
    if makes_model(run):
        return _where(run.path), run
    return _where(run.init_given), reading[run].parent


def model_label(model_run: RunRecord | None, identity: str, evaluations: list[RunRecord] = ()) -> str:
    if model_run is None:
        recorded = [(r.init or {}).get("label") for r in evaluations]
        return next((str(label) for label in recorded if label), None) or Path(identity).name or identity
    return str(model_run.config.label or model_run.encoding)


def _task_variants(reading: Reading, runs: list[RunRecord]) -> dict[str, list[str]]:
    """task -> its distinct evaluation settings fingerprints (``RunFacts.evaluation``: all but the encoding, the
    model it evaluates and that model's own settings, ``model.*``, which identify the row, never the columns), in
    first-seen order."""
    out: dict[str, list[str]] = {}
    for run in runs:
        fps = out.setdefault(str(run.task), [])
        fp = reading[run].evaluation
        if fp not in fps:
            fps.append(fp)
    return out


def models_table(reading: Reading, runs: list[RunRecord]) -> TaskTable:
    runs = [r for r in runs if r.bench is None]
    evaluations = [r for r in runs if not makes_model(r)]
    variants = _task_variants(reading, evaluations)
    models: dict[str, dict[str, Any]] = {}
    for run in runs:
        identity, own = model_of(reading, run)
        entry = models.setdefault(identity, {"run": own, "by_column": {}})
        entry["run"] = entry["run"] or own
        fps = variants.get(str(run.task), []) if not makes_model(run) else []
        prefix = str(run.task) + (f"#{fps.index(reading[run].evaluation) + 1}"
                                  if len(fps) > 1 else "")
        entry["by_column"].setdefault(prefix, []).append(run)
    # tasks whose runs are themselves models (pretrain) first, then the others by name
    own_tasks = {str(m["run"].task) for m in models.values() if m["run"] is not None}
    prefixes = sorted({p for m in models.values() for p in m["by_column"]},
                      key=lambda p: (p.split("#")[0] not in own_tasks, p))
    labels = {identity: model_label(m["run"], identity, [r for rs in m["by_column"].values() for r in rs])
              for identity, m in models.items()}
    repeated = {lab for lab in labels.values() if list(labels.values()).count(lab) > 1}
    columns, hib = [], {}
    for prefix in prefixes:
        task_runs = [r for m in models.values() for r in m["by_column"].get(prefix, [])]
        names, task_hib, _ = metric_columns(task_runs)
        for name in names:
            columns.append(f"{prefix}:{name}")
            hib[f"{prefix}:{name}"] = task_hib[name]
    rows = []
    for identity, m in models.items():
        label = labels[identity]
        if label in repeated:
            seed = reading[m["run"]].seed if m["run"] is not None else None
            label = f"{label} (seed {seed}, {run_id(m['run']) if m['run'] else Path(identity).name})"
        cells = {}
        for column in columns:
            prefix, name = column.rsplit(":", 1)
            cells[column] = metric_cell(m["by_column"].get(prefix, []), name)
        all_runs = [r for rs in m["by_column"].values() for r in rs]
        encoding = str(m["run"].encoding) if m["run"] is not None else label
        seed = reading[m["run"]].seed if m["run"] is not None else None
        rows.append(Row(label, encoding, run_id(m["run"]) if m["run"] else identity, identity, seed, cells, None,
                        all_runs))
    tested = mark_best(rows, columns, hib)
    rows.sort(key=lambda r: r.label)
    notes = ["one row per model: runs that evaluate another run's model (--init) are in that run's row, an "
             "extension (extend) is a model of its own; a row's runs of one task are averaged"]
    for task, fps in variants.items():
        if len(fps) > 1:
            firsts = [next(r for r in evaluations if str(r.task) == task and reading[r].evaluation == fp) for fp in fps]
            apart, _ = grouping.distinguishing([(run, reading[run]) for run in firsts])
            for i, a in enumerate(apart):
                shown = [f"{k}={grouping.show(v)}" for k, v in a.items()
                         if not k.startswith(("encoding.", "model.")) and k != "init"]
                notes.append(f"{task}#{i + 1}: {', '.join(shown)}")
    if tested:
        notes.append(RULE)
    marked = incomplete_note(runs, list(dict.fromkeys(c.rsplit(":", 1)[1] for c in columns)))
    notes += [marked] if marked else []
    for task in sorted({str(r.task) for r in runs}):
        line = grouping.versions_note(task, [r for r in runs if str(r.task) == task])
        notes += [line] if line else []
    return TaskTable("models", None, columns, hib, rows, runs, title="models (every task's metrics)",
                     grouped=True, notes=notes, kind="models", row_header="model")
