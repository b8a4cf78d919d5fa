"""``posbench bench``: a run like any other (the one runner, the one record), the engine's own training step
timed, the FLOP count and MFU by hand, ratios to RoPE, out-of-memory cells, decoding, and one-line errors.
Timings themselves are not asserted (speed targets live in the benchmark)."""

from __future__ import annotations

import json

import pytest
import torch

from posbench.cli import main
from posbench.errors import ConfigError
from posbench.bench import measure, speed
from posbench.model import ModelConfig, Transformer
from posbench.runs import runner
from posbench.runs.config import resolve_run_config
from posbench.runs.store import load_record

from encoding_helpers import one_thread  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["task.lengths=16", "task.batch=2", "task.warmup=1", "task.steps=2", "train.threads=1"]


def bench(tmp_path, *sets, size="small"):
    config = resolve_run_config("bench", None, size, sets=[*TINY, *sets])
    outcome = runner.execute(config, tmp_path, command=["posbench", "bench"])
    return outcome.run_dir, outcome.record


def test_a_run_writes_the_efficiency_record(tmp_path):
    config = resolve_run_config("bench", None, "small", sets=[*TINY, "task.encodings=tape,alibi"])
    assert config.task_options["encodings"] == ["rope", "tape", "alibi"]   # RoPE always measured, first
    run_dir, record = bench(tmp_path, "task.encodings=tape,alibi")
    assert run_dir.parent == tmp_path / "bench" / "train"
    assert json.loads((run_dir / "result.json").read_text()) == record.to_dict() == load_record(run_dir).to_dict()
    assert record.task == "bench" and record.encoding == "train" and record.metrics == {}
    info = record.bench
    assert info["timer"] == "perf_counter" and info["unit"] == "ms/step" and info["peak_tflops"] is None
    cells = {c["encoding"]: c for c in info["cells"]}
    assert set(cells) == {"rope", "tape", "alibi"}
    for cell in cells.values():
        assert cell["status"] == "ok" and len(cell["ms_all"]) == 2 and cell["ms"] > 0
        assert cell["ms"] == pytest.approx(sorted(cell["ms_all"])[0] / 2 + sorted(cell["ms_all"])[1] / 2)
        assert cell["tokens_per_s"] == pytest.approx(2 * 16 / (cell["ms"] / 1000))
        assert cell["x_rope"] == pytest.approx(cell["ms"] / cells["rope"]["ms"])
        assert cell["mfu"] is None and cell["peak_gib"] is None          # no peak known for a CPU
    assert cells["rope"]["x_rope"] == 1.0
    assert cells["tape"]["params"] > cells["rope"]["params"]


def test_the_timed_step_is_the_engines_own(tmp_path, monkeypatch):
    """Train mode times ``Trainer.step``: every warm-up and timed step of every cell is one call of it."""
    from posbench.train.trainer import Trainer

    calls = []
    real = Trainer.step
    monkeypatch.setattr(Trainer, "step", lambda self, step: calls.append(step) or real(self, step))
    bench(tmp_path, "task.encodings=alibi")
    assert len(calls) == 2 * (1 + 2) and sorted(calls) == [0, 0, 1, 1, 2, 2]


def test_flop_count_by_hand():
    """PaLM's count: 6 N + 12 L d S per trained token, N without the input embedding table."""
    model = Transformer(ModelConfig(vocab_size=100, d_model=32, n_layers=3, n_heads=4, d_ff=64, encoding="rope"))
    per_layer = 4 * 32 * 32 + 3 * 32 * 64 + 2 * 32                    # q, k, v, o; gate, up, down; two norms
    n = 3 * per_layer + 32 + 100 * 32                                  # + final norm + output head
    assert speed.matmul_parameters(model) == n
    assert speed.flops_per_token(model, 128, "train") == 6 * n + 12 * 3 * 32 * 128
    assert speed.flops_per_token(model, 128, "forward") == (6 * n + 12 * 3 * 32 * 128) / 3


def test_mfu_with_a_given_peak(tmp_path):
    _, record = bench(tmp_path, "task.encodings=rope", "task.peak_tflops=0.5")
    cell = record.bench["cells"][0]
    assert record.bench["peak_source"] == "given with --peak-tflops"
    assert cell["mfu"] == pytest.approx(cell["flops_per_token"] * cell["tokens_per_s"] / 0.5e12)


@pytest.mark.parametrize("name, peak", [("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0),
                                        ("NVIDIA H200", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0),
                                        ("Some Future GPU", None)])
def test_device_peaks_are_recognised(name, peak, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    found, source = speed.device_peak(torch.device("cuda"), None)
    assert found == peak
    assert ("dense bf16" in source) if peak else ("--peak-tflops" in source)
    assert speed.device_peak(torch.device("cpu"), None)[0] is None


def test_an_out_of_memory_cell_is_reported_and_the_run_goes_on(tmp_path, monkeypatch):
    real = speed.train_step

    def train_step(model, *args):
        step = real(model, *args)
        if model.config.encoding != "fire":
            return step

        def explode():
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB")
        return explode

    monkeypatch.setattr(speed, "train_step", train_step)
    _, record = bench(tmp_path, "task.encodings=fire,nope")
    cells = {c["encoding"]: c for c in record.bench["cells"]}
    assert cells["fire"]["status"] == "oom" and cells["fire"]["ms"] is None and "out of memory" in cells["fire"]["error"]
    assert cells["nope"]["status"] == "ok" and cells["rope"]["status"] == "ok"


def test_decode_and_forward_modes(tmp_path):
    for mode in ("decode", "forward"):
        run_dir, record = bench(tmp_path, "task.encodings=tape", f"task.mode={mode}", "task.new_tokens=3")
        assert run_dir.parent.name == mode
        assert record.bench["unit"] == ("ms/token" if mode == "decode" else "ms/step")
        cells = record.bench["cells"]
        assert [c["status"] for c in cells] == ["ok", "ok"] and all(c["ms"] > 0 for c in cells)
        if mode == "decode":
            assert all(c["tokens_per_s"] == pytest.approx(2 / (c["ms"] / 1000)) for c in cells)


def test_cli_prints_the_table_and_writes_the_result(tmp_path, capsys):
    code = main(["bench", "-e", "alibi", "--lengths", "16", "--batch", "2", "--timed-steps", "1", "--warmup", "0",
                 "--threads", "1", "--out", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0
    assert "alibi" in out and "rope" in out and "x RoPE" in out
    assert len(list((tmp_path / "bench" / "train").glob("*/result.json"))) == 1


@pytest.mark.parametrize("args, message", [
    (["--mode", "sideways"], "task.mode='sideways' is out of range: it must be one of train, forward, decode"),
    (["--size", "huge"], "task 'bench' has no preset 'huge'; presets: small, paper"),
    (["--lengths", "16,32", "--batch", "1,2,3"], "bench: 3 batch sizes for 2 lengths; give one, or one per length"),
    (["--lengths", "16,32", "--set", "task.batch=1,2,3"], "bench: 3 batch sizes for 2 lengths"),
    (["--timed-stepz", "3"], "No such option: --timed-stepz (Possible options: --steps, --timed-steps)"),
    (["--steps", "3"], "bench: --steps is train.steps, which bench does not use (it times steps, it trains to no "
                       "step count); the timed steps per cell are --timed-steps N"),
    (["--warmup"], "Got unexpected extra argument(s) (1)"),     # --warmup --timed-steps 1 --warmup 0: its value, 0
    (["extra"], "Got unexpected extra argument(s) (extra)"),
    (["--lengths", "sixteen"], "task.lengths='sixteen': expected an integer"),
    (["--lengths", "0"], "task.lengths=[0] is out of range: it must be a list of at least 1 item, each >= 1"),
    (["-e", "ropee"], "unknown encoding 'ropee'. Did you mean 'rope'?"),
    (["--device", "cuda:7"], "device 'cuda:7'"),
])
def test_bad_input_is_one_line_and_exit_code_2(args, message, tmp_path, capsys):
    code = main(["bench", *args, "--timed-steps", "1", "--warmup", "0", "--out", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert not (tmp_path / "bench").exists()


def test_batch_defaults_follow_the_lengths():
    def batch(*sets):
        return resolve_run_config("bench", None, "paper", sets=list(sets)).task_options["batch"]

    assert batch() == [16, 1]
    assert batch("task.lengths=2048") == [16]
    assert batch("task.lengths=512,1024,2048", "task.batch=4") == [4, 4, 4]
    assert batch("task.lengths=512,1024,2048") == [16, 16, 16]
    with pytest.raises(ConfigError, match="task.steps=0 is out of range"):
        batch("task.steps=0")


def test_one_cell_at_a_time_frees_its_model_before_the_next(monkeypatch):
    """The GPU path times one cell alone, so its peak memory is its own: the previous cell's model (weights,
    optimizer state) must be gone when the next one is built."""
    import gc
    import weakref

    import posbench.model
    from posbench.bench import Bench
    from posbench.bench.measure import Cell

    built = []
    real = posbench.model.Transformer

    def build(cfg):
        gc.collect()
        alive = [name for name, ref in built if ref() is not None]
        assert not alive, f"{alive} still alive while building {cfg.encoding}"
        model = real(cfg)
        built.append((cfg.encoding, weakref.ref(model)))
        return model

    monkeypatch.setattr(measure, "Transformer", build)    # the name the bench module holds
    task = Bench(resolve_run_config("bench", None, "small", sets=[*TINY, "task.encodings=tape,alibi"]))
    cells = [Cell(e, 16, 2) for e in task.opts["encodings"]]
    ticks = []
    for cell in cells:
        task.time_alone(cell, torch.device("cpu"), "fp32", lambda: ticks.append(1))
    assert len(ticks) == 3 * (1 + 2) and [len(c.ms_all) for c in cells] == [2, 2, 2]
    assert [e for e, _ in built] == ["rope", "tape", "alibi"]


@pytest.mark.parametrize("mode", ["train", "decode"])
def test_no_cell_keeps_an_earlier_cells_weights(tmp_path, monkeypatch, mode):
    """Through the runner, in bf16 as on a GPU: when the models of a later length are built, no weight of an
    earlier cell's model is alive, a failed cell's (out of memory after a step) included. It failed while the
    runner evaluated the bench inside its autocast: torch keeps every weight autocast casts (the bf16 copy, whose
    autograd graph holds the fp32 weight and its gradient) until the outermost autocast exits, so every cell's
    weights outlived it (the Transformer object itself died) and, on a GPU, sat in every later cell's peak_gib."""
    import gc
    import weakref

    import posbench.model

    built, leaks = [], []
    real_model = posbench.model.Transformer

    def build(cfg):                                  # (an assertion here would be caught: the cell would fail)
        gc.collect()
        leaks.extend(f"{enc} at {length}, alive while {cfg.encoding} at {cfg.max_seq_len} was built"
                     for length, enc, refs in built
                     if length != cfg.max_seq_len and any(ref() is not None for ref in refs))
        model = real_model(cfg)
        built.append((cfg.max_seq_len, cfg.encoding, [weakref.ref(p) for p in model.parameters()]))
        return model

    name = "train_step" if mode == "train" else "decode_step"
    real_step = getattr(speed, name)

    def step_of(model, *args):
        step = real_step(model, *args)
        if model.config.encoding != "nope":
            return step

        def explode():
            step()                                   # the weights are cast, then the cell runs out of memory
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB")
        return explode

    monkeypatch.setattr(measure, "Transformer", build)    # the name the bench module holds
    monkeypatch.setattr(speed, name, step_of)
    _, record = bench(tmp_path, "task.encodings=nope,alibi", "task.lengths=16,24", "task.batch=2", f"task.mode={mode}",
                      "task.new_tokens=2", "train.precision=bf16")
    assert leaks == []
    assert [(c["encoding"], c["length"], c["status"]) for c in record.bench["cells"]] == [
        ("rope", 16, "ok"), ("nope", 16, "oom"), ("alibi", 16, "ok"),
        ("rope", 24, "ok"), ("nope", 24, "oom"), ("alibi", 24, "ok")]
    assert [(length, enc) for length, enc, _ in built] == [(16, "rope"), (16, "nope"), (16, "alibi"),
                                                           (24, "rope"), (24, "nope"), (24, "alibi")]


def test_bench_refuses_a_surrounding_autocast():
    """Each step enters autocast itself; inside a surrounding one every cell's weights would live until it ends
    (the runner enters autocast around a Task's evaluation only, and bench is no Task)."""
    from posbench.bench import Bench
    from posbench.reporters import NullReporter
    from posbench.tasks import TASKS, Task

    task = Bench(resolve_run_config("bench", None, "small", sets=[*TINY, "task.encodings=nope"]))
    assert not isinstance(task, Task) and "bench" not in TASKS
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(RuntimeError, match="inside autocast"):
        task.evaluate(None, torch.device("cpu"), NullReporter(), {})


def test_bench_is_a_command_not_a_task(tmp_path, capsys):
    """``posbench bench`` runs through the runner, but bench is no task: ``ls tasks`` leaves it out, ``run -t bench``
    is one line naming the command (exit 2), and its presets are still listed."""
    assert main(["ls", "tasks"]) == 0
    assert "bench" not in capsys.readouterr().out.split()
    assert main(["run", "-t", "bench", "--out", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: bench is not a task") and "posbench bench" in err and "\n" not in err
    assert main(["ls", "presets", "bench"]) == 0
    out = capsys.readouterr().out
    assert "presets of task bench" in out and "paper" in out
