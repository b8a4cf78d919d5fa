"""compare's walk holds no state between compares (issue 50, item 8): what one compare reads once (the ``--init``
records in its ``reading``; the per-example scores, the lines to say in the ``Comparison`` it builds), not in
module caches that someone must remember to clear."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from posbench import report
from posbench.report.comparison import Comparison
from tests.report.test_compare import make_run

REPORT = Path(report.__file__).parent


def test_each_compare_reads_the_tree_afresh(tmp_path):
    base = make_run(tmp_path, "pretrain", "rope", 0, {"val_ppl": 5.0}, hib={"val_ppl": False})
    make_run(tmp_path, "perplexity", "rope", 0, {"ppl_1x": 6.0}, init=str(base), hib={"ppl_1x": False})
    perplexity = next(t for t in report.collect(tmp_path).tables if t.task == "perplexity")
    assert perplexity.rows[0].seed == "0/0"
    record = json.loads((base / "result.json").read_text())
    record["config"]["seed"] = 3                                  # the pretraining run, rewritten in place
    (base / "result.json").write_text(json.dumps(record))
    perplexity = next(t for t in report.collect(tmp_path).tables if t.task == "perplexity")
    assert perplexity.rows[0].seed == "0/3"


def test_a_reading_reads_each_init_record_once(tmp_path):
    """compare reads each --init record once, with the runs' facts: the runs started from one run share its record,
    and the next reading reads it afresh."""
    from posbench.report.reading import facts_of
    from posbench.runs.store import scan_runs

    base = make_run(tmp_path / "pre", "pretrain", "rope", 0, {"val_ppl": 5.0})
    make_run(tmp_path / "runs", "perplexity", "rope", 0, {"ppl_1x": 6.0}, init=str(base))
    make_run(tmp_path / "runs", "perplexity", "rope", 1, {"ppl_1x": 6.5}, init=str(base))
    reading = facts_of(*scan_runs(tmp_path / "runs"))
    first, second = (reading[run].parent for run in reading.runs)
    assert first is not None and first.seed == 0 and second is first
    assert sorted(reading[run].seed for run in reading.runs) == ["0/0", "1/0"]
    again = facts_of(*scan_runs(tmp_path / "runs"))
    assert again[again.runs[0]].parent is not first


def test_no_report_module_keeps_state_at_module_level():
    """No module of posbench/report assigns an empty dict, list or set at its top level (a cache), nor defines a
    ``forget`` function to clear one."""
    offenders = []
    for path in sorted(REPORT.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            empty = (isinstance(value, (ast.Dict, ast.List, ast.Set)) and not getattr(value, "keys", None)
                     and not getattr(value, "elts", None)) or \
                    (isinstance(value, ast.Call) and getattr(value.func, "id", None) in ("dict", "list", "set")
                     and not value.args)
            if empty or (isinstance(node, ast.FunctionDef) and node.name.startswith("forget")):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []
