"""Results as a pandas DataFrame, for your own plots and statistics::

    from posbench.results import frame
    df = frame("results")                                   # one row per finished run and metric
    ppl = df[(df.task == "perplexity") & (df.metric == "ppl_8x")]
    ppl.groupby("encoding")["value"].agg(["mean", "std", "count"])   # the mean over seeds, as compare shows it
    df.pivot_table(index="encoding", columns="train.lr", values="value")

Columns: ``run_id``, ``task``, ``encoding`` (the row name ``compare`` uses), ``seed``, ``preset``, ``init``
(the ``--init`` a run started from, or None), ``metric``, ``value``, ``stderr``, ``n``, ``higher_is_better``,
``primary`` (the task's headline metric), ``train_s``, ``finished`` (a UTC datetime), ``path``; then every
setting of the run as ``model.*``, ``encoding.*``, ``train.*`` and ``task.*`` columns (lists as text:
``"1,2,4,8"``). Model and encoding settings are the values the built model used, as its export and its
checkpoint record them (``model.d_ff`` 128 where the configuration said 0, "4 x d_model"; TAPE's
``encoding.position_size`` 8 where it said 0, "4 x heads"). Numeric columns are numbers (``stderr`` a float
column, NaN where a metric has none, or a value that is not a number: ``compare --format tidy`` says which).
Runs of any schema version are read (``posbench.runs.record``); unreadable ones are left out (``compare`` lists
them).

Where an encoding breaks, as frames of the same runs (each row with ``run_id``, ``task``, ``encoding``, ``seed``,
``path``):

* ``positions_frame(path)``: the loss by token position of every perplexity evaluation (``protocol``, ``length``,
  ``factor``, ``train_length``, ``position_start``, ``position_end``, ``position``: the bucket's centre on a log
  axis, ``tokens``, ``nll``: its mean loss in nats); ``df.groupby(["encoding", "length", "position"])["nll"].mean()``
  is the curve compare draws;
* ``probe_frame(path)``: the held-out loss at each length over training (``step``, ``factor``, ``nll``), for runs
  trained with ``train.probe_every``;
* ``attention_frame(path)``: what ``posbench analyze`` recorded (``factor``, ``length``, ``pass``, ``layer``,
  ``head``, ``mean_distance``, ``entropy``, ``first_token``, ``beyond_train``, ``rigidity``).

``load_run(run_dir)`` gives a run's trained model and held-out text (``posbench.runs.loaded``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from posbench.cells import cell, resolved
from posbench.report.attention import attention_rows
from posbench.report.by_position import position_rows, probe_rows
from posbench.evaluation.metrics import METRICS
from posbench.runs.store import scan_runs

FIXED_COLUMNS = ["run_id", "task", "encoding", "seed", "preset", "init", "metric", "value", "stderr", "n",
                 "higher_is_better", "primary", "train_s", "finished", "path"]


def frame(path: Path | str):
    """Every finished run under ``path`` (a results tree, or one run directory) as a tidy DataFrame: one row per
    run and metric, its settings as columns."""
    runs, _ = scan_runs(Path(path))
    return frame_of(runs)


def load_run(run_dir: Path | str, device: str = "cpu"):
    """A finished run's model, held-out tokens and record (``posbench.runs.loaded.load_run``)."""
    from posbench.runs.loaded import load_run as load     # torch: only where a model is built

    return load(run_dir, device)


def positions_frame(path: Path | str):
    """The loss by position of every run under ``path`` (see the module docstring)."""
    return _rows_frame(path, position_rows)


def probe_frame(path: Path | str):
    """The length probe's held-out losses over training of every run under ``path``."""
    return _rows_frame(path, probe_rows)


def attention_frame(path: Path | str):
    """What ``posbench analyze`` recorded for every run under ``path``, one row per length, layer and head."""
    return _rows_frame(path, attention_rows)


def _rows_frame(path: Path | str, rows_of):
    runs, _ = scan_runs(Path(path))
    rows = [{"run_id": run.run_id, "task": run.task, "encoding": run.encoding, "seed": run.seed, "path": str(run.path),
             **row} for run in runs for row in rows_of(run)]
    return pd.DataFrame(rows)


def frame_of(runs: list[Any]):
    """``frame`` of run records already read (``posbench.runs.store.scan_runs``)."""
    rows = [row for run in runs for row in run_rows(run)]
    columns = FIXED_COLUMNS + sorted({k for row in rows for k in row} - set(FIXED_COLUMNS))
    df = pd.DataFrame(rows, columns=columns)
    for name in df.columns:
        if name in ("value", "stderr", "train_s"):
            df[name] = pd.to_numeric(df[name], errors="coerce").astype("float64")
        elif name in ("seed", "n"):
            df[name] = pd.to_numeric(df[name], errors="coerce").astype("Int64")
        elif numeric(df[name]):
            df[name] = pd.to_numeric(df[name])
    df["finished"] = pd.to_datetime(df["finished"], utc=True, errors="coerce", format="ISO8601")
    return df


def numeric(column) -> bool:
    """Every value that is there is a number (not a bool): the column can be a numeric one."""
    present = [v for v in column if v is not None and v == v]
    return bool(present) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present)


def run_rows(run: Any) -> list[dict[str, Any]]:
    """The rows of one run record: its identity and settings, once per metric."""
    settings = {f"{section}.{key}": cell(value) for section, values in resolved(run).items()
                for key, value in values.items()}
    base = {"run_id": run.run_id, "task": run.task, "encoding": run.encoding, "seed": run.seed,
            "preset": run.preset, "init": run.init_given, "primary": run.primary_metric,
            "train_s": run.timings.train_s, "finished": run.finished, "path": str(run.path), **settings}
    return [{**base, "metric": name, "value": metric.value, "stderr": metric.stderr, "n": metric.n,
             "higher_is_better": METRICS.higher_is_better(str(run.task), name, metric.higher_is_better)}
            for name, metric in run.metrics.items()]
