"""``posbench sweep`` with the local executor, for real (tiny presets): --init chaining, a failing cell and the
cell that starts from it (blocked), the final table, reruns (complete cells skipped, failed ones only with
--retry-failed), and a killed cell resumed from its checkpoint in place."""

from __future__ import annotations

import json

import pytest

from posbench.cli import main
from posbench.runs import runner
from posbench.runs.config import resolve_run_config
from posbench.train import StopTraining

CHAIN = """
encodings = ["rope"]
tasks = ["pretrain", "perplexity"]
presets = "tiny"
set = ["train.log_every=5", "task.eval_tokens=1024"]

[variants]
ok = []
bad = ["lr=1e30"]                 # a non-finite gradient at step 2: the run stops with one error line

[task.perplexity]
init = "pretrain"
"""


def sweep(capsys, *args):
    code = main(["sweep", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def row(shown: str, cell: str) -> str:
    """The lines of one cell in the last table shown (the final table; the plan with --dry-run): its row and the
    lines under it, up to the next cell."""
    lines = shown.split("cells (paths under")[-1].splitlines()
    start = next(i for i, line in enumerate(lines) if f" {cell} " in line)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("│ ") and lines[i][2] != " "),
               len(lines))
    return "\n".join(lines[start:end])


def runs(out):
    return sorted(p.parent for p in out.rglob("result.json"))


@pytest.mark.slow  # sweeps of cells, each a fresh process
def test_chained_cells_a_failure_its_dependent_and_reruns(tmp_path, capsys):
    study = tmp_path / "chain.toml"
    study.write_text(CHAIN)
    out = tmp_path / "out"
    code, shown, err = sweep(capsys, study, "--out", out, "--jobs", "2")
    assert code == 1, err
    ok_pretrain = row(shown, "pretrain-rope-tiny-ok-s0")
    assert "done" in ok_pretrain and "val_ppl" in ok_pretrain
    failed = row(shown, "pretrain-rope-tiny-bad-s0")
    assert "failed" in failed and "error: non-finite" in failed          # the last line of its log
    assert "log: cells/pretrain-rope-tiny-bad-s0/cell.log" in failed
    log = (out / "cells" / "pretrain-rope-tiny-bad-s0" / "cell.log").read_text().strip().splitlines()
    assert log[-1].startswith("error: non-finite")
    assert "done" in row(shown, "perplexity-rope-tiny-ok-s0")
    blocked = row(shown, "perplexity-rope-tiny-bad-s0")
    assert "blocked" in blocked and "not started: pretrain-rope-tiny-bad-s0 failed" in blocked
    assert not (out / "cells" / "perplexity-rope-tiny-bad-s0").exists()
    assert f"posbench compare {out}" in shown
    # the perplexity cell started from the pretrain cell's run (--init), as posbench run records it
    pretrain_run, perplexity_run = (next((out / "cells" / cell).rglob("result.json")).parent
                                    for cell in ("pretrain-rope-tiny-ok-s0", "perplexity-rope-tiny-ok-s0"))
    record = json.loads((perplexity_run / "result.json").read_text())
    assert record["config"]["init"] == str(pretrain_run) and record["init"]["kind"] == "run"
    assert record["config"]["train"]["threads"] == 1                     # 2 cells at a time on 2 cores
    before = runs(out)
    assert main(["compare", str(out)]) == 0 and "pretrain" in capsys.readouterr().out

    # a rerun: nothing finished runs again, the failed cell stays failed, its dependent blocked
    code, shown, _ = sweep(capsys, study, "--out", out, "--jobs", "2")
    assert code == 1 and runs(out) == before
    assert "complete" in row(shown, "pretrain-rope-tiny-ok-s0") and "complete" in row(shown, "perplexity-rope-tiny-ok-s0")
    assert "failed" in row(shown, "pretrain-rope-tiny-bad-s0")
    bad_cell = out / "cells" / "pretrain-rope-tiny-bad-s0" / "cell.json"
    assert json.loads(bad_cell.read_text())["attempts"] == 1

    # --retry-failed runs it again (and it fails again, for the same reason)
    code, shown, _ = sweep(capsys, study, "--out", out, "--jobs", "2", "--retry-failed")
    assert code == 1 and json.loads(bad_cell.read_text())["attempts"] == 2
    assert "error: non-finite" in row(shown, "pretrain-rope-tiny-bad-s0") and runs(out) == before


@pytest.mark.slow  # a sweep of cells, each a fresh process
def test_a_killed_cell_is_resumed_in_place(tmp_path, capsys):
    study = tmp_path / "study.toml"
    study.write_text('encodings = ["rope"]\ntasks = ["arithmetic"]\npresets = ["tiny"]\n'
                     'set = ["steps=8", "checkpoint_every=4", "task.eval_samples=2"]\n')
    out = tmp_path / "out"
    cell = out / "cells" / "arithmetic-rope-tiny-s0"
    config = resolve_run_config("arithmetic", "rope", "tiny", seed=0,
                                sets=["steps=8", "checkpoint_every=4", "task.eval_samples=2"])

    def kill(step, model, loss):
        if step == 6:
            raise StopTraining

    with pytest.raises(StopTraining):                   # what a killed cell leaves: a run with a checkpoint
        runner.execute(config, cell, callbacks=(kill,))
    killed = next(cell.glob("arithmetic/rope/*"))
    code, shown, err = sweep(capsys, study, "--out", out, "--dry-run")
    assert code == 0 and "resume" in row(shown, "arithmetic-rope-tiny-s0")
    code, shown, err = sweep(capsys, study, "--out", out)
    assert code == 0, err
    assert "resumed" in row(shown, "arithmetic-rope-tiny-s0") and "resumed from step 4" in shown
    assert list(cell.glob("arithmetic/rope/*")) == [killed]               # in place, no second run
    record = json.loads((killed / "result.json").read_text())
    assert record["training"]["resumed_from"] == [4] and record["training"]["steps"] == 8
    assert (cell / "cell.log").read_text().count("# posbench sweep: resume arithmetic-rope-tiny-s0") == 1

    # the same folder with a changed study: refused before anything runs
    study.write_text(study.read_text().replace("steps=8", "steps=9"))
    code, _, err = sweep(capsys, study, "--out", out)
    assert code == 2 and err.startswith("error: ") and "with other settings" in err and len(err.splitlines()) == 1
