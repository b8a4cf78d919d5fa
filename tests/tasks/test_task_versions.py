"""Each task has a version; a run records it (``config.task_version`` in ``result.json``), a record written before
versions existed reads as version 1, and ``compare`` never pools runs of two versions of a task: each version's
runs get rows of their own, and one line under the table says which versions there are."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from posbench import report
from posbench.cli import main
from posbench.runs.config import RunConfig, resolve_run_config
from posbench.runs.store import load_record
from posbench.tasks import TASKS

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference-runs" / "perplexity-3seeds"


def test_the_configuration_carries_the_task_version():
    config = resolve_run_config("arithmetic", "rope", "tiny")
    assert config.task_version == TASKS["arithmetic"].version == 1
    assert config.to_dict()["task_version"] == 1
    assert RunConfig.from_dict({"task": "arithmetic", "preset": "tiny", "encoding": "rope"}).task_version == 1


def tree_with_versions(tmp_path: Path, versions: dict[int, int | None]) -> Path:
    """The reference perplexity runs (3 seeds of rope and alibi, written before versions existed), with rope's
    seed s recorded as ``versions[s]`` (None: left without a version)."""
    root = tmp_path / "runs"
    shutil.copytree(REFERENCE, root)
    for path in sorted((root / "perplexity" / "rope").glob("*/result.json")):
        data = json.loads(path.read_text())
        assert "task_version" not in data["config"]                 # written before versions existed
        version = versions.get(data["config"]["seed"])
        if version is not None:
            data["config"]["task_version"] = version
            path.write_text(json.dumps(data))
    return root


def test_a_record_without_a_version_pools_with_one_of_version_1(tmp_path):
    root = tree_with_versions(tmp_path, {0: 1})                  # seed 0 says version 1, seeds 1 and 2 nothing
    table = report.collect(root).tables[0]
    assert [(r.label, r.cells["ppl_8x"].seeds) for r in table.rows] == [("alibi", 3), ("rope", 3)]
    assert not any("version" in note for note in table.notes)
    assert {load_record(p).config.task_version for p in root.rglob("result.json")} == {1}


def test_compare_never_pools_two_versions_of_a_task(tmp_path, capsys):
    root = tree_with_versions(tmp_path, {2: 2})                  # rope's seed 2 made by version 2 of the task
    table = report.collect(root).tables[0]
    rows = sorted((r.label, r.cells["ppl_8x"].seeds) for r in table.rows)
    assert rows == [("alibi [task_version=1]", 3), ("rope [task_version=1]", 2), ("rope [task_version=2]", 1)]
    line = "task 'perplexity' has runs of version 1 (5 runs) and version 2 (1 run): runs of different versions " \
           "are never pooled"
    assert line in table.notes
    assert main(["compare", str(root)]) == 0
    assert line in " ".join(capsys.readouterr().out.split())
    models = report.collect_models(root).tables[0]
    assert line in models.notes
