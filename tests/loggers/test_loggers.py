"""Experiment loggers fed directly (no engine): CSV rows and resume, TensorBoard events read back, W&B offline
history read back from its transaction log, one-line errors."""

import csv
import json
import struct
import time
import zlib
from pathlib import Path

import pytest

from posbench.errors import UserError
from posbench.loggers import LOGGERS, LoggerError, make_loggers, validate
from posbench.loggers.base import ExperimentLogger

CONFIG = {"task": "passkey", "label": "rope", "seed": 0, "train": {"lr": 0.003, "steps": 6},
          "task_options": {"depths": [0.0, 0.5]}}


def steps(n, start=1, shift=0.0):
    """Log steps as the engine sends them: tokens_per_s on the last of each flush only."""
    for s in range(start, n + 1):
        scalars = {"loss": 3.0 / s + shift, "lr": 1e-3 * s, "grad_norm": 0.5 + s / 100}
        if s % 2 == 0:
            scalars["tokens_per_s"] = 1000.0 * s
        yield s, scalars


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ---- names ---------------------------------------------------------------------------------------------------

def test_names_are_validated_in_one_line():
    assert {"csv", "tensorboard", "wandb"} <= set(LOGGERS)
    assert validate(["csv", "CSV", "csv"]) == ["csv"]
    with pytest.raises(UserError) as err:
        validate(["csv", "tensorbord"])
    message = str(err.value)
    assert "\n" not in message and "tensorbord" in message and "Did you mean 'tensorboard'" in message
    assert "Valid: csv, tensorboard, wandb" in message


def test_a_missing_package_names_the_extra(monkeypatch):
    class Needy(ExperimentLogger):
        name = "needy-test"
        requires = ("posbench_no_such_module",)
        extra = "needy"

    try:
        with pytest.raises(LoggerError, match=r"^--log needy-test needs the posbench_no_such_module package: "
                                              r"pip install 'posbench\[needy\]'$"):
            validate(["needy-test"])
    finally:
        LOGGERS.remove("needy-test")


def test_a_logger_that_fails_to_start_closes_the_others(tmp_path, monkeypatch):
    closed = []

    class Broken(ExperimentLogger):
        name = "broken-test"

        def __init__(self, *args):
            raise LoggerError("cannot start")

    monkeypatch.setattr("posbench.loggers.csv_logger.CsvLogger.close", lambda self: closed.append(self.name))
    try:
        with pytest.raises(LoggerError, match="cannot start"):
            make_loggers(["csv", "broken-test"], tmp_path, CONFIG)
    finally:
        LOGGERS.remove("broken-test")
    assert closed == ["csv"]


# ---- csv -----------------------------------------------------------------------------------------------------

def test_csv_writes_one_row_per_log_step_and_the_final_metrics(tmp_path):
    (logger,) = make_loggers(["csv"], tmp_path, CONFIG)
    logged = list(steps(6))
    for s, scalars in logged:
        logger.log_step(s, scalars)
    logger.log_step(7, {"loss": 0.1, "lr": 0.0, "grad_norm": None, "eval_acc": 0.25})   # an extra scalar
    logger.finish({"accuracy": 97.5, "accuracy_beyond": None, "acc_2x": 12.0})
    rows = read_csv(tmp_path / "train_log.csv")
    with open(tmp_path / "train_log.csv") as f:
        assert f.readline().strip() == "phase,step,loss,lr,grad_norm,tokens_per_s,eval_acc"
    assert [int(r["step"]) for r in rows] == list(range(1, 8))
    for row, (s, scalars) in zip(rows, logged):
        assert row["phase"] == "train"
        for name in ("loss", "lr", "grad_norm", "tokens_per_s"):
            assert (float(row[name]) == scalars[name]) if name in scalars else row[name] == ""   # exact
        assert row["eval_acc"] == ""
    assert rows[-1]["eval_acc"] == "0.25" and rows[-1]["grad_norm"] == ""
    final = read_csv(tmp_path / "final_metrics.csv")
    assert final == [{"metric": "accuracy", "value": "97.5"}, {"metric": "accuracy_beyond", "value": ""},
                     {"metric": "acc_2x", "value": "12.0"}]


def test_csv_resume_drops_the_rows_after_the_checkpoint(tmp_path):
    first = make_loggers(["csv"], tmp_path, CONFIG)[0]
    for s, scalars in steps(8):                    # killed after logging step 8; last checkpoint at step 5
        first.log_step(s, scalars)
    first.close()
    again = make_loggers(["csv"], tmp_path, CONFIG)[0]
    for s, scalars in steps(10, start=6, shift=1.0):
        again.log_step(s, scalars)
    again.finish({})
    rows = read_csv(tmp_path / "train_log.csv")
    assert [int(r["step"]) for r in rows] == list(range(1, 11))            # each step once
    assert [float(r["loss"]) for r in rows] == [3.0 / s for s in range(1, 6)] + [3.0 / s + 1 for s in range(6, 11)]


def test_csv_phases_restart_their_steps_without_dropping_each_other(tmp_path):
    logger = make_loggers(["csv"], tmp_path, CONFIG)[0]
    for s, scalars in steps(4):
        logger.log_step(s, scalars, phase="pretrain")
    for s, scalars in steps(3):
        logger.log_step(s, scalars, phase="finetune")
    logger.close()
    again = make_loggers(["csv"], tmp_path, CONFIG)[0]          # resumed in the second phase at step 1
    for s, scalars in steps(3, start=2, shift=5.0):
        again.log_step(s, scalars, phase="finetune")
    again.close()
    rows = [(r["phase"], int(r["step"]), float(r["loss"])) for r in read_csv(tmp_path / "train_log.csv")]
    assert rows == ([("pretrain", s, 3.0 / s) for s in range(1, 5)] + [("finetune", 1, 3.0)]
                    + [("finetune", s, 3.0 / s + 5) for s in (2, 3)])


# ---- tensorboard ---------------------------------------------------------------------------------------------

def _scalars(path: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    out = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    for tag in acc.Tags()["tensors"]:          # newer writers store scalars as tensors
        import tensorboard.util.tensor_util as tu
        values = [(e.step, tu.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]
        if all(v.dtype.kind == "f" and v.size == 1 for _, v in values):
            out.setdefault(tag, [(s, float(v)) for s, v in values])
    return out


def test_tensorboard_events_hold_what_was_logged(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    logger = make_loggers(["tensorboard"], tmp_path, CONFIG)[0]
    logged = list(steps(6))
    for s, scalars in logged:
        logger.log_step(s, scalars)
    logger.finish({"accuracy": 97.5, "skipped": None})
    assert [p.name for p in (tmp_path / "tensorboard").iterdir() if p.is_dir()] == []    # one logdir
    got = _scalars(tmp_path / "tensorboard")
    for name in ("loss", "lr", "grad_norm"):
        assert [s for s, _ in got[f"train/{name}"]] == list(range(1, 7))
        assert [v for _, v in got[f"train/{name}"]] == pytest.approx([sc[name] for _, sc in logged], rel=1e-6)
    assert [s for s, _ in got["train/tokens_per_s"]] == [2, 4, 6]
    assert got["final/accuracy"] == [(6, 97.5)] and "final/skipped" not in got
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    text = [t for t in acc.Tags()["tensors"] if "config" in t]
    assert text, acc.Tags()
    config_text = acc.Tensors(text[0])[0].tensor_proto.string_val[0].decode()
    assert json.loads(config_text.strip("`\njson")) == CONFIG
    from tensorboard.plugins.hparams import plugin_data_pb2

    hparams = {}
    for tag, content in acc.PluginTagToContent("hparams").items():
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        if data.HasField("session_start_info"):
            hparams = {k: (v.number_value if v.HasField("number_value") else v.string_value)
                       for k, v in data.session_start_info.hparams.items()}
    # named as posbench.results.frame names its columns, lists as its text
    assert hparams["train.lr"] == 0.003 and hparams["task"] == "passkey" and hparams["encoding"] == "rope"
    assert hparams["task.depths"] == "0.0,0.5" and hparams["seed"] == 0
    assert not [k for k in hparams if k.startswith(("task_options", "encoding_options"))]


def test_tensorboard_resume_hides_the_steps_after_the_checkpoint(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    first = make_loggers(["tensorboard"], tmp_path, CONFIG)[0]
    for s, scalars in steps(8):
        first.log_step(s, scalars)
    first.close()
    again = make_loggers(["tensorboard"], tmp_path, CONFIG)[0]
    for s, scalars in steps(10, start=6, shift=1.0):
        again.log_step(s, scalars)
    again.finish({"accuracy": 1.0})
    loss = _scalars(tmp_path / "tensorboard")["train/loss"]
    assert [s for s, _ in loss] == list(range(1, 11))
    assert [v for _, v in loss] == pytest.approx([3.0 / s for s in range(1, 6)] + [3.0 / s + 1 for s in range(6, 11)],
                                                 rel=1e-6)


def test_tensorboard_phases_share_one_axis_and_a_resume_keeps_the_phases_before(tmp_path):
    """A task of two phases (each counting its steps from 1) killed in the second: phase a's steps 1-4 are steps
    1-4 of the run's axis and phase b's 1-3 are 5-7; the resumed run redoes b from its step 2 (axis 6) and
    TensorBoard shows a whole and b with the resumed values from 6 on."""
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    first = make_loggers(["tensorboard"], tmp_path, CONFIG)[0]
    for s in range(1, 5):
        first.log_step(s, {"loss": 10.0 + s}, phase="a")
    for s in range(1, 4):
        first.log_step(s, {"loss": 20.0 + s}, phase="b")
    first.close()
    again = make_loggers(["tensorboard"], tmp_path, CONFIG)[0]
    for s in range(2, 4):
        again.log_step(s, {"loss": 30.0 + s}, phase="b")
    again.finish({"score": 1.0})
    got = _scalars(tmp_path / "tensorboard")
    assert got["a/loss"] == [(1, 11.0), (2, 12.0), (3, 13.0), (4, 14.0)]
    assert got["b/loss"] == [(5, 21.0), (6, 32.0), (7, 33.0)]
    assert got["final/score"] == [(7, 1.0)]


# ---- wandb ---------------------------------------------------------------------------------------------------

def _wandb_records(path: Path):
    """The records of a ``.wandb`` transaction log, parsed with wandb's own protobuf schema. The file is a
    LevelDB-style log (7-byte header ``:W&B`` + magic + version, then 32 KiB blocks of records each with a
    CRC32, a length and a type: full, first, middle, last); wandb no longer ships a Python reader for it."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:                                  # block trailer padding
            pos += room
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        if (length == 0 and kind == 0) or pos + 7 + length > len(data):     # padding, or still being written
            break
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc
        pos += 7 + length
        pending += chunk
        if kind in (1, 4):                            # full, last
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_wandb_offline_run_holds_the_history_config_and_summary(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "20260101-000000-abcdef"
    run_dir.mkdir()
    logger = make_loggers(["wandb"], run_dir, CONFIG)[0]
    logged = list(steps(5))
    for s, scalars in logged:
        logger.log_step(s, scalars)
    logger.finish({"accuracy": 97.5, "skipped": None})
    files = list(run_dir.glob("wandb/offline-run-*-20260101-000000-abcdef/run-20260101-000000-abcdef.wandb"))
    assert len(files) == 1, list(run_dir.rglob("*"))
    # offline, wandb's service writes the log after finish() returns: wait for its exit record (60 s at most)
    deadline = time.monotonic() + 60
    while not any(r.WhichOneof("record_type") == "exit" for r in _wandb_records(files[0])):
        assert time.monotonic() < deadline, "the offline run's log was not completed in 60 s"
        time.sleep(0.1)
    history, summary, config = [], {}, {}
    for record in _wandb_records(files[0]):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            summary.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.summary.update})
        elif kind in ("config", "run"):
            updates = record.config.update if kind == "config" else record.run.config.update
            config.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in updates})
        if kind == "run":
            assert record.run.run_id == "20260101-000000-abcdef" and record.run.project == "posbench"
            assert record.run.run_group == "passkey" and list(record.run.tags) == ["passkey", "rope"]
    assert [h["train/step"] for h in history] == [1, 2, 3, 4, 5]
    for h, (_, scalars) in zip(history, logged):
        assert {k: h[f"train/{k}"] for k in scalars} == scalars
    assert summary["final/accuracy"] == 97.5 and "final/skipped" not in summary
    assert {k: config[k] for k in CONFIG} == CONFIG


def test_a_logged_run_holds_the_losses_of_its_record(tmp_path, capsys):
    """``posbench run --log tensorboard --log csv``: the event file and the CSV hold, for every step of the
    run's loss history, the loss the record holds (float32 in the event file), plus the learning rate the step
    used, the gradient norm and the final metrics; the loggers are part of the recorded configuration."""
    from posbench.cli import main

    code = main(["run", "-e", "rope", "-t", "arithmetic", "-p", "tiny", "--log", "tensorboard", "--log", "csv",
                 "-q", "-o", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    run = next((tmp_path / "arithmetic" / "rope").iterdir())
    record = json.loads((run / "result.json").read_text())
    assert record["config"]["logs"] == ["tensorboard", "csv"]
    history = {int(step): loss for step, loss in record["training"]["loss_history"]}
    assert len(history) == 30
    scalars = _scalars(run / "tensorboard")               # training and final metrics in one logdir
    events = dict(scalars["train/loss"])
    assert {k: v for k, v in scalars.items() if k.startswith("final/")} == \
        {f"final/{k}": [(30, pytest.approx(m["value"], rel=1e-6))] for k, m in record["metrics"].items()}
    assert set(events) == set(history)
    assert all(abs(events[s] - history[s]) <= 1e-6 * max(1.0, abs(history[s])) for s in history)
    rows = read_csv(run / "train_log.csv")
    assert {int(r["step"]): float(r["loss"]) for r in rows} == history              # full precision
    lrs = [float(r["lr"]) for r in rows]
    assert lrs[0] == pytest.approx(3e-3 / 3) and max(lrs) == pytest.approx(3e-3)   # warmup of 3 steps to 3e-3
    assert all(float(r["grad_norm"]) > 0 for r in rows)
    final = {r["metric"]: float(r["value"]) for r in read_csv(run / "final_metrics.csv")}
    assert final == {k: m["value"] for k, m in record["metrics"].items()}


def test_an_unknown_logger_is_refused_before_the_run_starts(tmp_path, capsys):
    from posbench.cli import main

    code = main(["run", "-e", "rope", "-t", "arithmetic", "-p", "tiny", "--log", "tensorbord", "-q", "-o",
                 str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "unknown logger 'tensorbord'. Did you mean 'tensorboard'?" in err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
