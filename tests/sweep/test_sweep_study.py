"""Study files: what they expand to (cells, ids, order, --init parents, expected times), every mistake as one line
(exit code 2), the dry run, and how the local executor shares out cores and GPUs. Nothing here trains."""

from __future__ import annotations

import pytest

from posbench.cli import main
from posbench.sweep.local import make_slots
from posbench.sweep.plan import expand, validate
from posbench.sweep.slurm import SlurmError, minutes, slurm_options
from posbench.sweep.study import StudyError, read_study
from posbench.tasks import TASKS
from posbench.tasks.presets import preset_of

CHAIN = """
encodings = ["rope", "alibi"]
tasks = ["pretrain", "perplexity"]
seeds = 2
presets = "tiny"
set = ["train.log_every=5"]

[variants]
base = []
"lr=1e-3" = ["lr=1e-3"]

[task.perplexity]
init = "pretrain"
set = ["task.eval_tokens=1024"]
"""


def study(tmp_path, text, name="study.toml"):
    path = tmp_path / name
    path.write_text(text)
    return read_study(path)


def test_a_study_expands_to_every_cell_seed_major_with_parents(tmp_path):
    cells = expand(study(tmp_path, CHAIN))
    # 2 tasks x 2 encodings x 2 variants x 2 seeds
    assert len(cells) == 16 and len({c.id for c in cells}) == 16
    assert [c.seed for c in cells] == [0] * 8 + [1] * 8                  # seed 0 of everything first
    ids = [c.id for c in cells]
    for cell in cells:
        if cell.task == "perplexity":
            assert cell.parent == f"pretrain-{cell.encoding}-tiny-{cell.variant}-s{cell.seed}"
            assert ids.index(cell.parent) < ids.index(cell.id)         # a parent is started first
            assert cell.sets == ("train.log_every=5", "task.eval_tokens=1024", *(("lr=1e-3",) if cell.variant
                                                                                    == "lr=1e-3" else ()))
        else:
            assert cell.parent is None
    first = cells[0]
    assert first.id == "pretrain-rope-tiny-base-s0"
    assert first.run_args() == ["run", "-e", "rope", "-t", "pretrain", "-p", "tiny", "--seed", "0", "--device",
                                "auto", "--set", "train.log_every=5"]
    # the expected time is the preset's own
    assert first.expected_s == preset_of(TASKS["pretrain"], "tiny")["expected"]["seconds"]
    validate(cells)


def test_an_encodings_own_settings_reach_its_cells_only(tmp_path):
    text = ('encodings = ["rope", "t5"]\ntasks = ["arithmetic"]\npresets = "tiny"\nset = ["train.log_every=5"]\n'
            '[variants]\nbase = []\nlong = ["train.steps=40"]\n'
            '[encoding.t5]\nset = ["encoding.table_init=x-transformers"]\n')
    cells = {c.id: c for c in expand(study(tmp_path, text))}
    # the encoding's settings come after the study's and the task's, before the variant's (which may override them)
    assert cells["arithmetic-t5-tiny-long-s0"].sets == ("train.log_every=5", "encoding.table_init=x-transformers",
                                                        "train.steps=40")
    assert cells["arithmetic-rope-tiny-long-s0"].sets == ("train.log_every=5", "train.steps=40")
    # a cell of another encoding is the same cell as in the study without the table (a rerun finds it finished)
    plain = {c.id: c for c in expand(study(tmp_path, text.split("[encoding.t5]")[0], "plain.toml"))}
    assert cells["arithmetic-rope-tiny-base-s0"].fingerprint() == plain["arithmetic-rope-tiny-base-s0"].fingerprint()
    assert cells["arithmetic-t5-tiny-base-s0"].fingerprint() != plain["arithmetic-t5-tiny-base-s0"].fingerprint()
    validate(list(cells.values()))


def test_defaults_one_seed_the_task_default_preset_and_no_variant(tmp_path):
    cells = expand(study(tmp_path, 'encodings = "rope,tape"\ntasks = ["arithmetic"]\n'))
    preset = TASKS["arithmetic"].default_preset
    assert [c.id for c in cells] == [f"arithmetic-rope-{preset}-s0", f"arithmetic-tape-{preset}-s0"]


def test_a_parent_of_another_preset_when_the_parent_task_has_only_one(tmp_path):
    text = ('encodings = ["rope"]\ntasks = ["pretrain", "passkey"]\n[task.pretrain]\npresets = ["small"]\n'
            '[task.passkey]\npresets = ["tiny"]\ninit = "pretrain"\n')
    cells = expand(study(tmp_path, text))
    assert [(c.id, c.parent) for c in cells] == [("pretrain-rope-small-s0", None),
                                                ("passkey-rope-tiny-s0", "pretrain-rope-small-s0")]


@pytest.mark.parametrize("text, words", [
    ('tasks = ["arithmetic"]\nencodingz = ["rope"]\n', ["unknown key 'encodingz'", "did you mean"]),
    ('tasks = ["arithmetic"]\nencoding = ["rope"]\n', ["'encoding' must be a table", "did you mean 'encodings'"]),
    ('encodings = ["rope"]\ntasks = ["arithmetic"]\n[encoding.t5]\nset = ["encoding.table_init=t5"]\n',
     ["[encoding.t5] is not one of the study's encodings (rope)"]),
    ('encodings = ["t5"]\ntasks = ["arithmetic"]\n[encoding.t5]\nsets = []\n', ["[encoding.t5]: unknown key 'sets'"]),
    ('encodings = ["t5"]\ntasks = ["arithmetic"]\n[encoding.t5]\nset = [1]\n', ["[encoding.t5] set"]),
    ('encodings = ["rope"]\n', ["'tasks' is required"]),
    ('encodings = ["rope"]\ntasks = ["pretrain"]\n[task.perplexity]\ninit = "pretrain"\n',
     ["[task.perplexity] is not one of the study's tasks"]),
    ('encodings = ["rope"]\ntasks = ["pretrain", "perplexity"]\n[task.perplexity]\ninit = "scrolls"\n',
     ["init = 'scrolls'", "another task of the study"]),
    ('encodings = ["rope"]\ntasks = ["pretrain", "perplexity"]\n[task.pretrain]\ninit = "perplexity"\n'
     '[task.perplexity]\ninit = "pretrain"\n', ["cycle"]),
    ('encodings = ["rope"]\ntasks = ["arithmetic"]\nseeds = 0\n', ["seeds = 0"]),
    ('encodings = ["rope"]\ntasks = ["arithmetic"]\nseeds = [1, 1]\n', ["a seed is repeated"]),
    ('encodings = ["rope", "rope"]\ntasks = ["arithmetic"]\n', ["rope given twice"]),
    ('encodings = ["rope"]\ntasks = ["arithmetic"]\n[variants]\n"a b" = []\n', ["variant name 'a b'"]),
    ('encodings = ["rope"]\ntasks = ["arithmetic"\n', ["not valid TOML"]),
    ('encodings = ["rope"]\ntasks = ["arithmetic"]\n[slurm]\npartitions = "gpu"\n', ["unknown key 'partitions'"]),
])
def test_study_mistakes_are_one_line(tmp_path, text, words):
    with pytest.raises(StudyError) as caught:
        study(tmp_path, text)
    message = str(caught.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("text, words", [
    ('encodings = ["rope", "ropee"]\ntasks = ["arithmetic"]\n', ["cell arithmetic-ropee-small-s0", "ropee"]),
    ('encodings = ["rope"]\ntasks = ["arithmetic"]\npresets = ["huge"]\n', ["no preset 'huge'"]),
    ('encodings = ["rope"]\ntasks = ["arithmetic"]\nset = ["train.stepz=3"]\n',
     ["cell arithmetic-rope-small-s0", "stepz"]),
    ('encodings = ["abacus"]\ntasks = ["pretrain"]\n', ["abacus"]),
    ('encodings = ["t5"]\ntasks = ["arithmetic"]\n[encoding.t5]\nset = ["encoding.table_init=t6"]\n',
     ["cell arithmetic-t5-small-s0", "table_init"]),
    ('encodings = ["rope", "alibi"]\ntasks = ["pretrain", "perplexity"]\n[task.pretrain]\nencodings = ["rope"]\n'
     '[task.perplexity]\ninit = "pretrain"\n', ["perplexity-alibi-small-s0 starts from task 'pretrain'",
                                               "no pretrain cell of encoding 'alibi'"]),
])
def test_names_and_settings_are_checked_before_anything_runs(tmp_path, capsys, text, words):
    path = tmp_path / "study.toml"
    path.write_text(text)
    code = main(["sweep", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    for word in words:
        assert word in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_dry_run_shows_the_plan_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "study.toml"
    path.write_text(CHAIN)
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    shown = capsys.readouterr().out
    assert "plan: 16 cells" in shown and "perplexity-alibi-tiny-lr=1e-3-s1" in shown
    assert "pretrain-alibi-tiny-lr=1e-3-s1" in shown.split("perplexity-alibi-tiny-lr=1e-3-s1")[1]  # its parent
    assert "new" in shown and "expected" in shown
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, words", [
    (["--executor", "pbs"], ["--executor 'pbs'"]),
    (["--jobs", "0"], ["--jobs must be >= 1"]),
    (["--partition", "gpu"], ["--partition: options of --executor slurm"]),
    (["--executor", "slurm", "--jobs", "2"], ["--jobs: an option of --executor local"]),
])
def test_executor_option_mistakes_are_one_line(tmp_path, capsys, args, words):
    path = tmp_path / "study.toml"
    path.write_text('encodings = ["rope"]\ntasks = ["arithmetic"]\npresets = ["tiny"]\n')
    code = main(["sweep", str(path), "--out", str(tmp_path / "out"), *args])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert all(word in lines[0] for word in words), lines[0]


def test_cpu_slots_share_out_the_cores_and_gpu_slots_the_devices():
    # two CPU cells on four cores: two cores and two threads each, disjoint
    slots = make_slots(2, [], 0, [0, 1, 2, 3])
    assert [(s.cpus, s.threads, s.gpus) for s in slots] == [([0, 1], 2, []), ([2, 3], 2, [])]
    # more cells than cores: one thread each, not pinned
    assert [(s.cpus, s.threads) for s in make_slots(3, [], 0, [0, 1])] == [(None, 1)] * 3
    # one cell per GPU by default; two GPUs per cell -> pairs; --jobs caps the number of slots
    assert [s.gpus for s in make_slots(None, ["0", "1", "2", "3"], 1, [0, 1, 2, 3])] == [["0"], ["1"], ["2"], ["3"]]
    assert [s.gpus for s in make_slots(None, ["0", "1", "2", "3"], 2, list(range(8)))] == [["0", "1"], ["2", "3"]]
    assert [s.cpus for s in make_slots(None, ["0", "1", "2", "3"], 2, list(range(8)))] == [[0, 1, 2, 3],
                                                                                        [4, 5, 6, 7]]
    assert len(make_slots(1, ["0", "1"], 1, [0, 1])) == 1


def test_slurm_options_from_the_study_and_the_command_line():
    options = slurm_options({"partition": "gpu", "time": "1:30:00", "gpus_per_cell": 2, "account": "lab",
                             "additional": {"exclusive": True}}, {"partition": "debug", "time": None})
    assert (options.partition, options.time, options.gpus_per_cell, options.account) == ("debug", 90, 2, "lab")
    assert options.additional == {"exclusive": True}
    assert minutes(45, "x") == 45 and minutes("2-00:00:00", "x") == 2880 and minutes("10:30", "x") == 11
    assert minutes("20", "x") == 20
    # SLURM's day forms: D-HH, D-HH:MM (the hours after the dash, not minutes), and no negative time
    assert minutes("2-5", "x") == 2 * 1440 + 300 and minutes("1-2:30", "x") == 1440 + 150
    assert minutes("0:0:59", "x") == 1
    for bad in ("-5", "5-", "1:2:3:4", "a", "0", "1--2", " ", "\u00b2"):          # a superscript two is no digit
        with pytest.raises(SlurmError):
            minutes(bad, "x")
    for bad in ({"time": "soon"}, {"gpus_per_cell": -1}, {"cpus_per_cell": 0}, {"partition": 3}):
        with pytest.raises(SlurmError):
            slurm_options(bad, {})


def test_a_cell_of_several_gpus_runs_under_torchrun_and_asks_slurm_for_them(tmp_path):
    from posbench.sweep.cell import command_for
    from posbench.sweep.slurm import SlurmOptions, job_parameters

    spec = {"id": "arithmetic-rope-tiny-s0", "args": ["run", "-e", "rope"], "python": "py", "gpus": 4,
            "expected_s": 600.0}
    action, argv = command_for(spec, tmp_path / "cell")
    assert action == "start"
    assert argv == ["py", "-P", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4", "-m",
                    "posbench", "run", "-e", "rope", "--out", str(tmp_path / "cell")]
    assert command_for({**spec, "gpus": 1}, tmp_path / "cell")[1][:5] == ["py", "-P", "-m", "posbench", "run"]
    params = job_parameters(SlurmOptions(partition="gpu", gpus_per_cell=4, cpus_per_cell=16, account="lab"), spec)
    assert params == {"job_name": "posbench:arithmetic-rope-tiny-s0", "time": 2 * 10 + 15, "nodes": 1,
                      "ntasks_per_node": 1, "cpus_per_task": 16, "stderr_to_stdout": True, "partition": "gpu",
                      "account": "lab", "gpus_per_node": 4}
    assert job_parameters(SlurmOptions(time=30), spec)["time"] == 30


def test_a_cell_whose_parent_has_no_finished_run_fails_with_that_reason(tmp_path):
    from posbench.sweep.cell import command_for

    spec = {"id": "perplexity-rope-tiny-s0", "args": ["run"], "init_from": str(tmp_path / "parent")}
    assert command_for(spec, tmp_path / "cell") == ("failed", "its parent cell parent has no finished run")


def test_the_study_file_in_the_docs_is_the_study_it_says(tmp_path):
    """docs/sweeps.md's example study: 48 cells (3 tasks x 3 encodings x 2 variants x 3 seeds, no ALiBi passkey)."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "sweeps.md").read_text()
    text = re.findall(r"```toml\n(.*?)```", page, re.S)[0]
    cells = expand(study(tmp_path, text))
    assert len(cells) == 48 and "48 cells" in page
    assert not [c for c in cells if c.task == "passkey" and c.encoding == "alibi"]
    assert {c.parent for c in cells if c.task == "passkey"} == {
        f"pretrain-{e}-small-{v}-s{s}" for e in ("rope", "t5") for v in ("base", "lr=3e-4") for s in range(3)}
    assert cells[0].id == "pretrain-rope-small-base-s0"
    assert all(("encoding.table_init=x-transformers" in c.sets) == (c.encoding == "t5") for c in cells)
    validate(cells)
