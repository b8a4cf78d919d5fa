"""``--data DIR`` of the scrolls task (issue 48, item 12): with ``task.datasets=all`` (the default) a folder that
holds some of the seven data sets runs those, one line naming the others, and the record says which were not there
(it stopped at the first missing folder: ``tests/fixtures/scrolls has no summ_screen_fd/ folder``); a data set
named in ``task.datasets`` must be there; a folder with none of them is one error. The tiny preset's note says
it was timed with ``--data tests/fixtures/scrolls``."""

from __future__ import annotations

from pathlib import Path

import pytest

from posbench.cli import main
from posbench.data.errors import DataError
from posbench.runs.config import resolve_run_config
from posbench.tasks import TASKS

FIXTURES = Path(__file__).parents[1] / "fixtures" / "scrolls"
PRESENT = ["gov_report", "qasper", "contract_nli"]          # the fixture's folders, in the official order
ABSENT = ["summ_screen_fd", "qmsum", "narrative_qa", "quality"]


def task(data: Path, *sets: str):
    config = resolve_run_config("scrolls", "rope", "tiny", sets=[f"task.data={data}", *sets])
    return TASKS["scrolls"](config)


def test_all_runs_the_data_sets_the_folder_holds_and_names_the_others(capsys):
    scrolls = task(FIXTURES)
    scrolls.validate()
    assert scrolls.datasets == PRESENT and scrolls.missing == ABSENT
    assert [phase.name for phase in scrolls.phases()] == PRESENT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"note: {FIXTURES} holds 3 of the 7 SCROLLS data sets: running "
                                                   f"gov_report, qasper, contract_nli; not there: "
                                                   f"summ_screen_fd, qmsum, narrative_qa, quality")
    info = scrolls.data_info()
    assert info["datasets"] == PRESENT and info["datasets_missing"] == ABSENT


def test_a_folder_that_holds_all_seven_says_nothing(tmp_path, capsys):
    for name in [*PRESENT, *ABSENT]:
        (tmp_path / name).symlink_to(FIXTURES / PRESENT[0], target_is_directory=True)
    scrolls = task(tmp_path)
    scrolls.validate()
    assert scrolls.missing == [] and len(scrolls.datasets) == 7
    assert capsys.readouterr().err == "" and "datasets_missing" not in scrolls.data_info()


def test_a_data_set_named_must_be_there():
    scrolls = task(FIXTURES, "task.datasets=qasper,qmsum")
    with pytest.raises(DataError, match="has no qmsum/ folder"):
        scrolls.validate()
    named = task(FIXTURES, "task.datasets=qasper")
    named.validate()
    assert named.datasets == ["qasper"] and named.missing == []


def test_a_folder_with_none_of_them_is_one_error(tmp_path, capsys):
    assert main(["run", "-t", "scrolls", "-p", "tiny", "-e", "rope", "--data", str(tmp_path), "-o",
                 str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path} holds none of the SCROLLS data sets") and err.count("\n") == 1


def test_the_tiny_presets_note_says_how_it_was_timed():
    from posbench.tasks.presets import presets_of

    note = presets_of(TASKS["scrolls"])["tiny"]["expected"]["note"]
    assert "with --data tests/fixtures/scrolls" in note and "without --data" in note
