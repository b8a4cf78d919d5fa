"""compare marks the ranked value of a row whose runs had not stopped improving when training ended, by the plateau
rule (posbench.report.plateau: the probe's when a run has one, else the training loss's), and says so under the
table; a row whose runs had stopped is not marked."""

import json
import shutil
from pathlib import Path

from posbench.cli import main
from posbench.report.plateau import still_improving

RUNS = Path(__file__).resolve().parents[2] / "docs" / "studies" / "arithmetic" / "8k" / "runs"


def rising(history):
    """The probe climbing by 4 points a reading to the end (never at the 99% ceiling)."""
    return [[step, {"accuracy_id": 10.0 + 4.0 * i}] for i, (step, _) in enumerate(history)]


def test_the_rule_reads_the_probe_then_the_loss():
    flat_loss = [[10 * i, 1.0] for i in range(40)]
    falling_loss = [[10 * i, 2.0 - 0.04 * i] for i in range(40)]
    assert still_improving({"loss_history": falling_loss})
    assert not still_improving({"loss_history": flat_loss})
    probes = [[100 * i, {"accuracy_id": 100.0}] for i in range(20)]
    assert not still_improving({"loss_history": falling_loss, "probe_history": probes})   # the probe decides
    assert still_improving({"loss_history": flat_loss, "probe_history": rising(probes)})
    assert not still_improving({"loss_history": falling_loss[:5]})                         # too few to say
    assert not still_improving({})


def test_compare_marks_a_row_still_improving_where_it_ranks_it(tmp_path, capsys):
    for cell in ("arithmetic-rope-small-s0", "arithmetic-rope-small-s1", "arithmetic-nope-small-s0"):
        shutil.copytree(RUNS / cell, tmp_path / cell)
    path = tmp_path / "arithmetic-rope-small-s1" / "result.json"
    record = json.loads(path.read_text())
    record["training"]["probe_history"] = rising(record["training"]["probe_history"])
    path.write_text(json.dumps(record))
    code = main(["compare", str(tmp_path), "--format", "markdown"])
    out = capsys.readouterr().out
    assert code == 0
    rope = next(line for line in out.splitlines() if line.startswith("| rope"))
    nope = next(line for line in out.splitlines() if line.startswith("| nope"))
    assert "(1 of 2 seeds still improving)" in rope.split("|")[2]        # the ranked (primary) column
    assert "still improving" not in nope
    assert "still improving: 1 row(s)" in out
