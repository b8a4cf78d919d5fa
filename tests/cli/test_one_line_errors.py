"""Every failure a user can meet is one line starting ``error:`` with exit code 2 (bad input) or 1 (the machine:
disk full, a file size limit), never a traceback, and nothing is left behind that ``--resume`` or ``compare``
would trust: ``--out`` that is a file or a name too long, a full disk while writing a checkpoint or a
result, ``compare`` into a path that is a file, a seed out of NumPy's range, a second ``--resume`` of a run in
use, a bad tokenizer or a logger that cannot start (nothing written), messages that print brackets as they are.

Disk full is simulated without root: ``posbench.files.open`` patched to refuse with ENOSPC (the result), and
a real file size limit (``RLIMIT_FSIZE``, SIGXFSZ ignored, so the kernel refuses the write with EFBIG) while
the checkpoint is written through safetensors' own writer.
"""

from __future__ import annotations

import errno
import json
import math
import resource
import signal
from pathlib import Path

import pytest

import posbench.runs.runner
from posbench.cli import main
from posbench.runs.code import CodeState

TINY = ["run", "-e", "rope", "-t", "arithmetic", "-p", "tiny", "-q", "--steps", "4", "--set", "task.eval_samples=4"]


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("config.json")) if root.exists() else []


# ---- --out --------------------------------------------------------------------------------------------------

def test_out_that_is_a_file_is_one_line(tmp_path, capsys):
    target = tmp_path / "afile"
    target.write_text("mine\n")
    code, _, err = cli(capsys, *TINY, "--out", target)
    assert code == 2 and "is not a directory" in one_error_line(err)
    assert target.read_text() == "mine\n"
    code, _, err = cli(capsys, *TINY, "--out", target / "below")
    assert code == 2 and "Not a directory" in one_error_line(err)


def test_out_with_a_name_too_long_is_one_line(tmp_path, capsys):
    code, _, err = cli(capsys, *TINY, "--out", tmp_path / ("x" * 300))
    assert code == 2 and "File name too long" in one_error_line(err)


# ---- a full disk -------------------------------------------------------------------------------------------

def test_disk_full_while_writing_the_result_is_one_line_and_resume_finishes(tmp_path, capsys, monkeypatch):
    import builtins

    import posbench.files

    def refusing_open(file, mode="r", *args, **kwargs):
        handle = builtins.open(file, mode, *args, **kwargs)
        if "w" in mode and Path(file).name.startswith(".result.json."):
            handle.close()
            raise OSError(errno.ENOSPC, "No space left on device", str(file))
        return handle

    monkeypatch.setattr(posbench.files, "open", refusing_open, raising=False)
    out = tmp_path / "out"
    code, _, err = cli(capsys, *TINY, "--out", out)
    line = one_error_line(err)
    assert code == 1 and "disk full" in line and "result.json" in line
    (run,) = run_dirs(out)
    assert not (run / "result.json").exists() and not list(run.glob(".result.json.*"))
    monkeypatch.undo()
    code, _, err = cli(capsys, "run", "--resume", run, "-q")       # the space is back: the run finishes
    assert code == 0, err
    assert json.loads((run / "result.json").read_text())["training"]["steps"] == 4


def test_a_file_size_limit_while_writing_a_checkpoint_is_one_line_and_resume_finishes(tmp_path, capsys,
                                                                                     monkeypatch):
    """A real refusal by the kernel in the middle of safetensors' (Rust) write: exit code 1, one line, no
    temporary checkpoint left, and --resume (the limit lifted) finishes the run."""
    # the checkout's uncommitted changes (code.patch) are written before the weights and may pass the limit
    # themselves: this test is about the checkpoint, so the run sees a clean checkout
    monkeypatch.setattr(posbench.runs.runner, "capture", lambda repo=None: CodeState({"git_dirty": False}))
    out = tmp_path / "out"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)       # the write fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, hard))     # config.json fits, the weights do not
    try:
        code, _, err = cli(capsys, *TINY, "--out", out)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    line = one_error_line(err)
    assert code == 1 and "cannot write the checkpoint" in line and "file too large" in line
    (run,) = run_dirs(out)
    kept = (".lock", "code.patch")           # code.patch: a checkout with changes keeps them (posbench.runs.code)
    assert sorted(p.name for p in run.iterdir() if p.name not in kept) == ["config.json"]
    code, _, err = cli(capsys, "run", "--resume", run, "-q")
    assert code == 0, err
    assert sorted(p.name for p in run.iterdir() if p.name not in kept) == ["checkpoint", "config.json",
                                                                           "predictions.jsonl", "result.json"]


# ---- compare's outputs -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("finished")
    assert main([*TINY, "--out", str(out)]) == 0
    return out


def test_compare_into_a_path_that_is_a_file_is_one_line(finished, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    for args in (["--plots", afile], ["--html", afile / "report.html"], ["--html", tmp_path]):
        code, _, err = cli(capsys, "compare", finished, *args)
        assert code == 2, (args, err)
        one_error_line(err)
    assert afile.read_text() == "mine\n"


# ---- seeds ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", ["99999999999999999999", str(2**32)])
def test_a_seed_beyond_numpys_range_is_refused_before_anything_is_written(tmp_path, capsys, seed):
    code, _, err = cli(capsys, *TINY, "--seed", seed, "--out", tmp_path / "out")
    assert code == 2 and "between 0 and 4294967295" in one_error_line(err)
    assert not (tmp_path / "out").exists()


def test_the_largest_seed_runs(tmp_path, capsys):
    code, _, err = cli(capsys, *TINY, "--seed", str(2**32 - 1), "--out", tmp_path / "out")
    assert code == 0, err


# ---- a run in use -----------------------------------------------------------------------------------------

def test_a_second_resume_of_a_run_in_use_is_refused_in_one_line(tmp_path, capsys):
    from posbench.runs import runner
    from posbench.runs.config import resolve_run_config
    from posbench.runs.store import RunLock
    from posbench.train import StopTraining

    def kill(step, model, loss):
        if step == 3:
            raise StopTraining

    config = resolve_run_config("arithmetic", "rope", "tiny", sets=["steps=4", "checkpoint_every=2",
                                                                     "task.eval_samples=4"])
    with pytest.raises(StopTraining):
        runner.execute(config, tmp_path / "out", callbacks=(kill,))
    (run,) = run_dirs(tmp_path / "out")
    held = RunLock(run)                     # another process resuming it (flock: per open file, so this counts)
    try:
        code, _, err = cli(capsys, "run", "--resume", run, "-q")
    finally:
        held.release()
    assert code == 2 and "is in use by process" in one_error_line(err)
    assert not (run / "result.json").exists()
    code, _, err = cli(capsys, "run", "--resume", run, "-q")             # once it has let go
    assert code == 0, err
    assert not (run / ".lock").exists()
    code, _, err = cli(capsys, "run", "--resume", run, "-q")
    assert code == 2 and "has already finished" in one_error_line(err)


def test_each_checkpoint_writer_has_its_own_temporary_directory(tmp_path, monkeypatch):
    """Another writer saves into the same checkpoint while this one is half-way through: with one fixed
    ``checkpoint.tmp`` the second wiped the first's files (main); with one per writer both complete."""
    import torch

    from posbench.train import checkpoint as ckpt

    model = torch.nn.Linear(3, 2)
    real, interleaved = ckpt.atomic_write_json, []

    def write_json(path, obj):
        if not interleaved:                     # mid-way through the first save, a second writer saves
            interleaved.append(True)
            ckpt.save_checkpoint(tmp_path / "checkpoint", model, {"step": 2})
        return real(path, obj)

    monkeypatch.setattr(ckpt, "atomic_write_json", write_json)
    ckpt.save_checkpoint(tmp_path / "checkpoint", model, {"step": 1})
    assert ckpt.load_train_state(tmp_path / "checkpoint")["step"] == 1      # the last swap wins, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


# ---- nothing left when a run cannot start -----------------------------------------------------------------

def test_a_bad_tokenizer_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = cli(capsys, "run", "-e", "rope", "-t", "pretrain", "-p", "tiny", "-q", "--tokenizer",
                       tmp_path / "no-such-tokenizer", "--out", out)
    assert code == 2 and "tokenizer" in one_error_line(err)
    assert run_dirs(out) == [] and not [p for p in out.rglob("*") if p.is_file()]


def test_a_logger_that_cannot_start_writes_nothing(tmp_path, capsys):
    """As ``--log wandb`` without a login: the run directory it made is gone, config.json with it."""
    from posbench.loggers import LOGGERS, ExperimentLogger, LoggerError

    class NoLogin(ExperimentLogger):
        name = "nologin-test"

        def __init__(self, *args):
            raise LoggerError("--log nologin-test could not start a run (no login)")

    out = tmp_path / "out"
    try:
        code, _, err = cli(capsys, *TINY, "--log", "nologin-test", "--out", out)
    finally:
        LOGGERS.remove("nologin-test")
    assert code == 2 and "no login" in one_error_line(err)
    assert run_dirs(out) == [] and not [p for p in out.rglob("*") if p.is_file()]


def test_brackets_in_a_message_print_as_they_are(capsys):
    from posbench.loggers import LOGGERS, ExperimentLogger

    class Needy(ExperimentLogger):
        name = "needy-cli-test"
        requires = ("posbench_no_such_module",)
        extra = "tensorboard"

    try:
        code, _, err = cli(capsys, *TINY, "--log", "needy-cli-test", "--dry-run")
    finally:
        LOGGERS.remove("needy-cli-test")
    assert code == 2 and one_error_line(err).endswith("pip install 'posbench[tensorboard]'")


def test_a_usage_error_with_brackets_prints_them(capsys):
    code, _, err = cli(capsys, "compare", "results", "--[bold]")
    assert code == 2 and "No such option: --[bold]" in one_error_line(err)
    code, _, err = cli(capsys, "run", "-t", "arithmetic", "--[bold]")          # a setting flag posbench reads
    assert code == 2 and "No such option: --[bold]" in one_error_line(err)


# ---- a diverged model --------------------------------------------------------------------------------------

def test_a_perplexity_beyond_floats_finishes_the_run(tmp_path):
    """A model whose held-out loss is about 10^4 nats (exp overflows float64): the run finishes, the record
    holds val_loss and val_ppl = inf (strict JSON 1e999), and compare shows inf (main raised OverflowError, and
    --resume raised it again)."""
    import torch

    from posbench.runs import runner
    from posbench.runs.config import resolve_run_config

    def blow_up(step, model, loss):
        if step == 4:
            with torch.no_grad():
                model.lm_head.weight.mul_(1e5)

    config = resolve_run_config("pretrain", "rope", "tiny", sets=["steps=4", "task.eval_tokens=1024"])
    outcome = runner.execute(config, tmp_path, callbacks=(blow_up,))
    record = outcome.record.to_dict()
    assert record["metrics"]["val_loss"]["value"] > 709.8
    assert record["metrics"]["val_ppl"]["value"] == math.inf and record["evaluation"]["perplexity"] == math.inf
    run_dir = next(tmp_path.rglob("result.json")).parent
    text = (run_dir / "result.json").read_text()
    assert '"value": 1e999' in text and "Infinity" not in text          # strict JSON, read back as inf
    assert json.loads(text)["metrics"]["val_ppl"]["value"] == math.inf
    from posbench.cli import main
    import contextlib
    import io

    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        assert main(["compare", str(tmp_path), "--format", "csv"]) == 0
    header, row = shown.getvalue().strip().splitlines()[:2]
    assert dict(zip(header.split(","), row.split(",")))["val_ppl"] == "inf"


# ---- compare reads what it can ------------------------------------------------------------------------------

def test_compare_skips_a_fifo_a_deep_nest_and_a_huge_number_and_shows_the_rest(finished, tmp_path, capsys):
    """A FIFO named result.json blocked main's compare forever (here a timer opens it after 20 s, so main's
    failure is a slow compare); a record nested 100,000 deep (RecursionError) and one whose n_predictions is
    1e400 (OverflowError) each stopped the whole compare; a metric of 1e400 (read as inf) is shown as inf,
    not a crash."""
    import os
    import shutil
    import threading
    import time

    tree = tmp_path / "tree"
    (good,) = [p.parent for p in finished.rglob("result.json")]
    record = json.loads((good / "result.json").read_text())
    bad = {"fifo": None, "deep": "[" * 100_000 + "]" * 100_000,
           "huge": json.dumps({**record, "n_predictions": "HUGE"}).replace('"HUGE"', "1e400"),
           "inf": json.dumps({**record, "metrics": {**record["metrics"], "accuracy": {
               **record["metrics"]["accuracy"], "value": "HUGE"}}}).replace('"HUGE"', "1e400")}
    shutil.copytree(good, tree / "arithmetic" / "rope" / "good")
    for name, text in bad.items():
        run = tree / "arithmetic" / "rope" / name
        shutil.copytree(good, run)
        (run / "result.json").unlink()
        if text is None:
            os.mkfifo(run / "result.json")
        else:
            (run / "result.json").write_text(text)
    fifo = tree / "arithmetic" / "rope" / "fifo" / "result.json"
    unblock = threading.Timer(20, lambda: os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                              if not done.is_set() else None)
    done = threading.Event()
    unblock.start()
    start = time.monotonic()
    try:
        code, out, err = cli(capsys, "compare", tree, "--by-run", "--format", "csv")
    finally:
        done.set()
        unblock.cancel()
    assert time.monotonic() - start < 15, "compare waited on the FIFO"
    assert code == 0, err
    skipped = {line.split(":")[0].strip().rsplit("/", 1)[-1] for line in err.splitlines()[1:]}
    assert skipped == {"fifo", "deep", "huge"}, err
    assert "not a regular file" in err and "nested too deep" in err and "OverflowError" in err
    import csv

    every = list(csv.DictReader(out.strip().splitlines()))
    rows = [row for row in every if row["task"] == "arithmetic"]        # not the by-length table's rows
    assert len(rows) == 2 and all(row["encoding"] == "rope" for row in rows) and len(every) == 4
    shown = sorted(row["accuracy"] for row in rows)
    assert shown[1] == "inf" and shown[0] != "inf"                  # 1e400 is shown as inf, not as no number


# ---- messages that say what is true ----------------------------------------------------------------------

def test_a_tokenizer_that_asks_to_run_its_own_code_is_refused_for_that_reason(tmp_path, monkeypatch):
    """main said 'offline and not in the local cache' (and transformers asked whether to run the code)."""
    from posbench.data.errors import DataError
    from posbench.data.tokenizer import HFTokenizer

    directory = tmp_path / "custom"
    directory.mkdir()
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"auto_map": {"AutoTokenizer": ["tok.MyTok", None]}, "tokenizer_class": "MyTok"}))
    (directory / "tok.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('code ran')\n")
    monkeypatch.setattr("builtins.input", lambda *a, **k: pytest.fail("asked whether to run the code"))
    with pytest.raises(DataError) as excinfo:
        HFTokenizer.load(str(directory))
    message = str(excinfo.value)
    assert "its own Python code" in message and "never runs" in message and "offline" not in message
    assert not (tmp_path / "ran").exists()
