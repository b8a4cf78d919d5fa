"""Round five of the hostile user, on the command line:

1. bench refuses train.steps however it is given (``--steps``, ``--set train.steps=N``): it trains to no step count.
2. bench's ``-e A,B`` and ``--encodings A,B`` are two spellings of one setting (task.encodings): both together are
   refused (``-e`` was dropped in silence).
3. An encoding's option declared with ``Option(..., flag=NAME)`` is ``--NAME`` and ``--ENCODING-NAME``, as a task's.
4. ``run --resume DIR`` and ``extend --resume DIR`` continue in DIR: ``--out`` is refused with them (and extend's
   ``--preset`` and ``--seed``, as run's are).
5. The dry run of ``--resume`` shows the device the run would use, and refuses the device the run would refuse.
6. An empty ``--out`` or ``--resume`` (which would be the current directory) is refused.
"""

from __future__ import annotations

import json

import pytest

from cli_helpers import cli
from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from posbench.encodings import ENCODINGS, PositionalEncoding
from posbench.options import Option, at_least
from posbench.runs import runner
from posbench.runs.config import resolve_run_config
from posbench.train import StopTraining

pytestmark = pytest.mark.usefixtures("one_thread")


def one_error(capsys, *argv) -> str:
    code, _, err = cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    return lines[0]


def dry_run(capsys, *argv) -> dict:
    code, out, err = cli(capsys, *argv, "--dry-run")
    assert code == 0, err
    (config,) = json.loads(out)
    return config


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """A run directory of a run killed after its first step: ``--resume`` continues it."""
    def kill(step, model, loss):
        raise StopTraining

    root = tmp_path_factory.mktemp("results")
    with pytest.raises(StopTraining):
        runner.execute(resolve_run_config("arithmetic", "nope", "tiny", sets=["steps=2"]), root, callbacks=(kill,))
    return next((root / "arithmetic" / "nope").iterdir())


# ---- 1: bench refuses train.steps -------------------------------------------------------------------------------

def test_bench_refuses_train_steps_given_with_set(capsys):
    for item in ("train.steps=5", " train.steps = 5"):
        line = one_error(capsys, "bench", "--set", item, "--dry-run")
        assert line == (f"error: bench: --set {item.strip()} is train.steps, which bench does not use (it times "
                        f"steps, it trains to no step count); the timed steps per cell are --timed-steps N")
    assert dry_run(capsys, "bench", "--set", "task.steps=5")["task_options"]["steps"] == 5     # the timed steps


# ---- 2: -e and --encodings, one setting -------------------------------------------------------------------------

def test_bench_refuses_encoding_and_encodings_together(capsys):
    for given in (["-e", "rope,alibi", "--encodings", "tape"], ["--encodings", "tape", "-e", "rope,alibi"],
                  ["-e", "alibi", "--set", "task.encodings=tape"], ["--set", "encodings=tape", "-e", "alibi"]):
        assert "-e and --encodings are one setting" in one_error(capsys, "bench", "--dry-run", *given), given
    assert dry_run(capsys, "bench", "-e", "alibi")["task_options"]["encodings"] == ["rope", "alibi"]
    assert dry_run(capsys, "bench", "--encodings", "tape")["task_options"]["encodings"] == ["rope", "tape"]


# ---- 3: an encoding option's own flag name ----------------------------------------------------------------------

@pytest.fixture
def flagged():
    """A plugin encoding whose option ``some_key`` has the flag ``--alt-name``."""
    class Flagged(PositionalEncoding):
        name = "test-flagged"
        OPTIONS = {"some_key": Option(1, "a number", at_least(0), flag="alt-name")}

    try:
        yield Flagged.name
    finally:
        ENCODINGS.remove(Flagged.name)


@pytest.mark.parametrize("flag", ["--alt-name", "--test-flagged-alt-name"])
def test_an_encoding_options_flag_name_is_its_flag(capsys, flagged, flag):
    config = dry_run(capsys, "run", "-t", "arithmetic", "-p", "tiny", "-e", flagged, flag, "5")
    assert config["encoding_options"]["some_key"] == 5


def test_an_encoding_options_key_is_no_flag_where_it_has_its_own(capsys, flagged):
    line = one_error(capsys, "run", "-t", "arithmetic", "-p", "tiny", "-e", flagged, "--some-key", "5", "--dry-run")
    assert "No such option: --some-key" in line


# ---- 4: --resume continues in its own directory ------------------------------------------------------------------

def test_resume_refuses_out(capsys, killed_run, tmp_path):
    line = one_error(capsys, "run", "--resume", killed_run, "--out", tmp_path, "--dry-run")
    assert "--resume continues a run with its own config" in line
    for given in (["--out", tmp_path], ["--preset", "tiny"], ["--seed", "3"]):     # refused before it is read
        line = one_error(capsys, "extend", "--resume", tmp_path / "an-extend-run", *given, "--dry-run")
        assert "--resume continues a run with its own config" in line, given


# ---- 5: the dry run of --resume, the run's device ---------------------------------------------------------------

def test_resume_dry_run_shows_the_device_given(capsys, killed_run):
    assert dry_run(capsys, "run", "--resume", killed_run, "--device", "cpu")["device"] == "cpu"
    assert dry_run(capsys, "run", "--resume", killed_run)["device"] == "auto"          # the run's own


@pytest.mark.parametrize("command", ["run", "extend"])
def test_resume_dry_run_refuses_a_device_the_run_refuses(capsys, killed_run, command):
    line = one_error(capsys, command, "--resume", killed_run, "--device", "garbage", "--dry-run")
    assert "unknown device 'garbage'" in line


# ---- 6: an empty --out ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["run", "-t", "arithmetic", "-e", "rope", "-p", "tiny"], ["bench"]])
@pytest.mark.parametrize("out", [["--out", ""], ["-o", ""], ["--out="]])
def test_an_empty_out_is_refused(capsys, command, out):
    line = one_error(capsys, *command, *out, "--dry-run")
    assert "Invalid value for '--out' / '-o': empty text" in line
    dry_run(capsys, *command, *out, "--out", ".")               # the current directory, said so: the last counts


def test_an_empty_resume_is_refused_as_empty(capsys):
    line = one_error(capsys, "run", "--resume", "", "--dry-run")          # (not read as '.', the current directory)
    assert "Invalid value for '--resume': empty text" in line
