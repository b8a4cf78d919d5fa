"""A ``posbench bench`` run as the paper's efficiency table: encodings as rows; per sequence length the time
(ms per step or per token), the time relative to RoPE, the model FLOPs utilisation and the peak memory; a
cell that ran out of memory reads ``OOM``.

The run's record (``results/bench/<mode>/<run-id>/result.json``) carries ``task: "bench"`` and, in
``evaluation.bench``: ``device_name``, ``peak_tflops``, ``timer``, ``unit`` and ``cells``, one per (encoding,
length) with ``status`` (ok, oom, error), ``ms``, ``x_rope``, ``mfu`` (a fraction), ``peak_gib``,
``tokens_per_s`` and ``params``; in a compiled run also ``compiled`` (whether the cell ran compiled), ``graphs``
and ``graph_breaks``: a cell that did not run compiled is named in the table's notes.
"""

from __future__ import annotations

from typing import Any

from posbench.report.structure import Cell, Row, TaskTable, num
from posbench.report.best import mark_best
from posbench.report.tables import run_id
from posbench.runs.record import RunRecord

# (key in a bench cell, column suffix, header, higher is better, scale)
QUANTITIES = (("ms", "ms", "ms", False, 1.0), ("x_rope", "x_rope", "×RoPE", False, 1.0),
              ("mfu", "mfu", "MFU %", True, 100.0), ("peak_gib", "peak_gib", "GiB", False, 1.0))
STATUS_NOTE = {"oom": "OOM", "error": "error"}


def bench_cells(run: RunRecord) -> list[dict[str, Any]]:
    return [c for c in (run.bench or {}).get("cells") or [] if isinstance(c, dict)]


def bench_setting(run: RunRecord, key: str) -> Any:
    return run.config.task_options.get(key)


def bench_lengths(run: RunRecord) -> list[int]:
    lengths = list(bench_setting(run, "lengths") or [])
    for cell in bench_cells(run):
        if cell.get("length") not in lengths:
            lengths = [*lengths, cell.get("length")]
    return [int(x) for x in lengths if isinstance(x, (int, float))]


def bench_encodings(run: RunRecord) -> list[str]:
    encodings = list(bench_setting(run, "encodings") or [])
    for cell in bench_cells(run):
        if cell.get("encoding") not in encodings:
            encodings.append(cell.get("encoding"))
    return [str(e) for e in encodings]


def bench_title(run: RunRecord) -> str:
    bench = run.bench or {}
    parts = [f"bench {bench_setting(run, 'mode') or '?'}", str(bench.get("device_name") or "unknown device"),
             f"{run.preset} model"]
    batch = bench_setting(run, "batch")
    if isinstance(batch, list):            # one per length
        batch = batch[0] if len(set(batch)) == 1 else ",".join(str(b) for b in batch)
    if batch is not None:
        parts.append(f"batch {batch}")
    precision = run.precision or bench_setting(run, "precision")
    if precision:
        parts.append(str(precision))
    if run.config.train.get("compile") is True or bench_setting(run, "compile") is True:
        parts.append("compiled")
    return ", ".join(parts) + f" ({bench.get('unit', 'ms')}; {run_id(run)})"


def bench_table(run: RunRecord) -> TaskTable:
    lengths, encodings = bench_lengths(run), bench_encodings(run)
    title = bench_title(run)
    measured = bench_cells(run)
    by_key = {(str(c.get("encoding")), c.get("length")): c for c in measured}
    columns, labels, hib = [], {}, {}
    for length in lengths:
        for key, suffix, head, higher, _ in QUANTITIES:
            name = f"{length}:{suffix}"
            columns.append(name)
            labels[name] = f"{length} {head}"
            hib[name] = higher
    rows = []
    for enc in encodings:
        cells = {}
        for length in lengths:
            src = by_key.get((enc, length), {})
            status = str(src.get("status", "missing"))
            for key, suffix, _, _, scale in QUANTITIES:
                value = num(src.get(key)) if status == "ok" else None
                note = None
                if status != "ok":
                    note = STATUS_NOTE.get(status, "-") if key == "ms" else "-"
                cells[f"{length}:{suffix}"] = Cell(None if value is None else value * scale, note=note)
        rows.append(Row(enc, enc, run_id(run), str(run.path), None, cells, None, [run]))
    mark_best(rows, [c for c in columns if not c.endswith(":x_rope")], hib)
    errors = [f"{c.get('encoding')} at {c.get('length')}: {c.get('error')}" for c in measured
              if c.get("status") == "error" and c.get("error")]
    bench = run.bench or {}
    notes = [f"MFU against a peak of {bench['peak_tflops']:g} TFLOP/s ({bench.get('peak_source', 'unknown source')})"
             if num(bench.get("peak_tflops")) else "MFU: no peak FLOP/s known for this device",
             f"timer: {bench.get('timer', '?')}"]
    notes += [f"error: {e}" for e in errors]
    not_compiled = [f"{c.get('encoding')} at {c.get('length')} ({c.get('graphs')} graphs, {c.get('graph_breaks')} "
                    f"breaks)" for c in measured if c.get("compiled") is False]
    if not_compiled:
        notes.append("NOT compiled: " + ", ".join(not_compiled))
    return TaskTable("bench", None, columns, hib, rows, [run], title=title, grouped=False, notes=notes,
                     kind="bench", labels=labels)
