"""The GPU call (benchmarks/gpu/run.sh) end to end on this CPU with a tiny model (issues 23 and 35): it first checks
that posbench imports and stops naming what is missing, runs its phases within its budget, writes every bench cell
to $OUT the moment it finishes (a kill -9 at a random moment keeps them all), and a compiled bench of all 13
encodings in one process records every one as compiled (a fresh compiler per cell; a hit recompile limit is an
error, never a silent eager run)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch

from posbench.encodings import ENCODINGS
from posbench.bench import speed
from posbench.runs import runner
from posbench.runs.config import resolve_run_config
from posbench.bench import Bench

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu" / "run.sh"


def script_env(tmp_path: Path, pythonpath: str = "", **extra: str) -> dict[str, str]:
    return {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "SIZE": "tiny",
            "DEVICE": "cpu", "PYTHON": sys.executable, "PYTHONPATH": pythonpath,
            "WHEELS": str(tmp_path / "no-wheels"), **extra}     # a checkout's .whl/ holds the GPU python's wheels


def run_call(tmp_path: Path, pythonpath: str = "", **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT)], env=script_env(tmp_path, pythonpath, **extra), capture_output=True,
                          text=True, timeout=400)


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow                                      # the whole call: its ten phases on a tiny model
@pytest.mark.skipif(sys.platform == "win32", reason="bash scripts")
def test_the_gpu_call_runs_end_to_end_on_the_cpu(tmp_path):
    done = run_call(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["arithmetic.tar", "cells.jsonl", "env.txt", "run.log",
                                                     "tests.log"]  # at most 8 files come back
    env = (out / "env.txt").read_text()
    assert "every module imports" in env and "torch.compile smoke test on cpu: ok" in env
    found = jsonl(out / "cells.jsonl")
    some = ["alibi", "cope", "rope", "tape"]             # tiny mode: RoPE and three, in each of the three benches
    by_bench = {}
    for cell in found:
        by_bench.setdefault((cell["mode"], cell["length"]), []).append(cell["encoding"])
    assert {k: sorted(v) for k, v in by_bench.items()} == {("train", 16): some, ("train", 24): ["alibi", "alibi", "rope", "rope"],
                                                            ("train", 32): some, ("decode", 16): some}
    assert all(c["status"] == "ok" for c in found)
    # in the order benchmarks/gpu/encoding_order.py gives them (TAPE first, CoPE with DAPE last), RoPE beside each
    assert [e for e in by_bench[("train", 16)] if e != "rope"] == ["tape", "alibi", "cope"]
    log = (out / "run.log").read_text()
    for phase in ("arithmetic gpu-rope", "tests first", "arithmetic gpu-tape", "tests others", "bench train-1024",
                  "bench sdpa-mid", "bench eager-mid", "bench memory-8k", "bench decode", "arithmetic paper-rope"):
        assert f"{phase}: exit 0" in log, log
    # each arithmetic run's small files, none of its checkpoints or predictions: the time of every logged step
    with tarfile.open(out / "arithmetic.tar") as tar:
        names = tar.getnames()
        runs = {}
        for name in names:
            runs.setdefault(str(Path(name).parent), set()).add(Path(name).name)
        assert len(runs) == 3 and all(files == {"result.json", "config.json", "train_log.csv"} for files in runs.values())
        results = [json.load(tar.extractfile(n)) for n in names if n.endswith("result.json")]
        logs = [tar.extractfile(n).read().decode() for n in names if n.endswith("train_log.csv")]
    assert sorted(r["encoding"] for r in results) == ["rope", "rope", "tape"]
    assert all(r["status"] == "complete" and r["timings"]["eval_s"] >= 0 for r in results)
    assert all(len(text.splitlines()) > 2 and "tokens_per_s" in text.splitlines()[0] for text in logs)
    tests = (out / "tests.log").read_text()
    assert "test_gpu_first.py" in tests and "test_gpu.py" in tests and "skipped" in tests   # no CUDA here


def test_the_phases_fit_the_calls_budget():
    text = SCRIPT.read_text()
    assert "BUDGET=${BUDGET:-560}" in text                       # the 10 minutes a command may take, less 40 s
    limits = [int(n) for n in re.findall(r"^(?:tests|bench|arithmetic) \S+ (\d+) ", text, re.M)]
    # every phase but the last (the paper-size arithmetic run, if time is left) fits with the environment's ~40 s
    assert len(limits) == 10 and sum(limits[:-1]) <= 560 - 40       # (41 and 42 s on the H200, 2026-11-28)


@pytest.mark.skipif(sys.platform == "win32", reason="bash scripts")
def test_the_call_stays_within_its_budget_and_says_what_it_skipped(tmp_path):
    """The call's budget alone: a Python that does nothing and succeeds (the environment phase passes at once; the
    end-to-end test runs the real one), and a budget less than any phase needs: every phase skipped, saying so."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)
    done = run_call(tmp_path, BUDGET="14", PYTHON=str(python))
    assert done.returncode == 0, done.stdout + done.stderr
    log = (tmp_path / "out" / "run.log").read_text()
    assert log.count(": skipped, ") == 10 and "done in" in log


#: the phases before the benches, which the end-to-end test runs: the kill test goes straight to the benches
BEFORE_BENCHES = "gpu-rope first gpu-tape others"


@pytest.mark.slow                                      # the call's environment phase, then its benches
@pytest.mark.skipif(sys.platform == "win32", reason="bash scripts")
def test_a_kill_at_a_random_moment_keeps_every_finished_cell(tmp_path):
    """kill -9 of the whole call at a random moment once the benches have begun: every cell a bench had finished
    (its own run directory's cells.jsonl, written just after the append) is in $OUT/cells.jsonl, every line whole.
    The phases before the benches are skipped (SKIP, as a second call would): the end-to-end test runs them."""
    delay = random.Random().uniform(0.0, 4.0)
    proc = subprocess.Popen(["bash", str(SCRIPT)], env=script_env(tmp_path, SKIP=BEFORE_BENCHES),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    cells = tmp_path / "out" / "cells.jsonl"
    try:
        deadline = time.monotonic() + 300
        while not cells.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(delay)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    kept = jsonl(cells)                                          # every line parses: none half-written
    key = lambda c: (c["run"], c["encoding"], c["length"])      # noqa: E731
    finished = [c for path in (tmp_path / "work").rglob("cells.jsonl") for c in jsonl(path)]
    assert finished, "no bench had finished a cell"
    for path in (tmp_path / "work").rglob("cells.jsonl"):
        run = path.parent.name
        for cell in jsonl(path):
            assert (run, cell["encoding"], cell["length"]) in {key(c) for c in kept}, (delay, cell)
    log = (tmp_path / "out" / "run.log").read_text()
    assert all(f"{phase}: skipped (SKIP)" in log for phase in ("arithmetic gpu-rope", "tests first",
                                                                "arithmetic gpu-tape", "tests others")), log


def test_the_call_stops_at_once_naming_what_does_not_import(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "pydantic_core.py").write_text("raise ImportError('pydantic-core 9.9 is not the one pydantic pins')\n")
    done = run_call(tmp_path, pythonpath=str(broken))
    assert done.returncode == 1
    env = (tmp_path / "out" / "env.txt").read_text()
    assert "MISSING pydantic_core: ImportError: pydantic-core 9.9" in env
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir())     # no bench started


def test_each_cell_is_written_when_it_finishes(tmp_path, monkeypatch):
    """A run stopped in its second length keeps the cells of the first, in its directory's cells.jsonl and in the
    --cells-to file (on a CPU a length's cells finish together: they are timed in turns)."""
    real = Bench.prepare

    def prepare(self, cell, device, precision):
        if cell.encoding == "nope" and cell.length == 32:
            raise KeyboardInterrupt
        return real(self, cell, device, precision)

    monkeypatch.setattr(Bench, "prepare", prepare)
    config = resolve_run_config("bench", None, "small", sets=[
        "task.lengths=16,32", "task.batch=1", "task.warmup=0", "task.steps=1", "train.threads=1",
        "task.encodings=alibi,nope", "train.compile=true", "task.compile_backend=eager",
        f"task.cells_to={tmp_path / 'out.jsonl'}"])
    with pytest.raises(KeyboardInterrupt):
        runner.execute(config, tmp_path, command=["posbench", "bench"])
    (kept,) = tmp_path.glob("bench/train/*/cells.jsonl")
    for path in (kept, tmp_path / "out.jsonl"):
        finished = [json.loads(line) for line in path.read_text().splitlines()]
        assert [(c["encoding"], c["length"]) for c in finished] == [("rope", 16), ("alibi", 16), ("nope", 16)]
        assert all(c["compiled"] for c in finished)


def test_a_hit_recompile_limit_is_an_error_not_an_eager_fallback():
    def scaled(x, factor):
        return x * factor

    with torch._dynamo.config.patch(recompile_limit=1), speed.strict_compilation():
        speed.fresh_compiler()
        compiled = torch.compile(scaled, backend="eager")
        compiled(torch.ones(2), 2)
        with pytest.raises(Exception, match="recompile_limit|cache_size_limit"):
            compiled(torch.ones(2), 3)               # a new int: a second entry, past the limit of 1


@pytest.mark.slow                                      # 13 encodings compiled (test_compile.py: each alone)
def test_a_compiled_cpu_bench_times_every_encoding_in_turns_each_one_compiled(monkeypatch, tmp_path):
    """Compiled on a CPU, the encodings are timed one step of each in turn (a neighbour process slows all alike;
    one at a time, NoPE read 1.94x RoPE in one run and 0.79x in another), after each was compiled and warmed up on
    its own: all 13 in one process, every one compiled, none recompiled while timed (issue 35)."""
    calls: list[tuple[str, int]] = []
    real = Bench.prepare

    def prepare(self, cell, device, precision):
        step = real(self, cell, device, precision)

        def logged():
            calls.append((cell.encoding, len(calls)))
            return step()
        return logged if step is not None else None

    monkeypatch.setattr(Bench, "prepare", prepare)
    config = resolve_run_config("bench", None, "small", sets=[
        "task.lengths=16", "task.batch=1", "task.warmup=1", "task.steps=2", "train.threads=1",
        "train.compile=true", "task.compile_backend=eager"])
    outcome = runner.execute(config, tmp_path, command=["posbench", "bench"])
    found = outcome.record.evaluation["bench"]["cells"]
    names = [c["encoding"] for c in found]
    assert sorted(names) == sorted(ENCODINGS) and names[0] == "rope"
    assert all(c["compiled"] is True and c["graphs"] >= 1 and c["graph_breaks"] == 0 for c in found), found
    order = [name for name, _ in calls]
    assert order[:len(names)] == names                     # each warmed up (and compiled) in turn
    assert order[len(names):] == names * 2                 # then the timed steps: one of each, twice


def load_order():
    import importlib.util
    spec = importlib.util.spec_from_file_location("encoding_order", ROOT / "benchmarks" / "gpu" / "encoding_order.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_call_benches_every_registered_encoding_once_cope_and_dape_last():
    order = load_order().order
    names = order(ENCODINGS)
    assert sorted(names) == sorted(ENCODINGS) and len(names) == len(set(names))
    assert names[:2] == ["rope", "tape"] and names[-2:] == ["cope", "dape"]
    # an encoding registered since the list was written (a plugin) is benched before the two last; a listed name
    # no longer registered is dropped
    assert order(["dape", "rope", "cope", "zeta"]) == ["rope", "zeta", "cope", "dape"]


@pytest.mark.slow  # two fresh processes
def test_the_printed_order_is_what_the_script_passes_to_bench():
    printed = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "encoding_order.py")],
                             capture_output=True, text=True, timeout=120, cwd=ROOT, check=True).stdout.strip()
    assert printed.split(",") == load_order().order(ENCODINGS)
    only = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "encoding_order.py"), "--only",
                           "cope,alibi,nosuch,tape"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          check=True).stdout.strip()
    assert only == "tape,alibi,cope"
