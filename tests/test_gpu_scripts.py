"""The GPU scripts (benchmarks/gpu/run.sh) end to end on this CPU with a tiny model (issue 23, items 2 and 5): each
part first checks that posbench imports and stops naming what is missing, every bench's cells reach $OUT, and a
compiled bench of all 13 encodings in one process records every one as compiled (a fresh compiler per cell; a
hit recompile limit is an error, never a silent eager run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posbench.encodings import ENCODINGS
from posbench.tasks.bench import speed
from posbench.runs import runner
from posbench.runs.config import resolve_run_config
from posbench.tasks.bench import Bench

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu" / "run.sh"


def run_part(tmp_path: Path, *part: str, pythonpath: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "SIZE": "tiny",
           "DEVICE": "cpu", "PYTHON": sys.executable, "PYTHONPATH": pythonpath}
    return subprocess.run(["bash", str(SCRIPT), *part], env=env, capture_output=True, text=True, timeout=400)


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["evaluation"]["bench"]["cells"]


@pytest.mark.skipif(sys.platform == "win32", reason="bash scripts")
def test_the_gpu_scripts_run_end_to_end_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    for part in ("train", "compiled", "tests"):
        done = run_part(tmp_path, part)
        assert done.returncode == 0, done.stdout + done.stderr
    assert "every module imports" in (out / "env.txt").read_text()
    some = ["alibi", "cope", "rope", "tape"]          # tiny mode: RoPE and three; the compiled training bench: all
    for name, expected in (("train-short", some), ("train-long", some), ("compiled-short", sorted(ENCODINGS)),
                           ("decode", some), ("decode-compiled", some)):
        found = cells(out / f"bench-{name}.json")
        assert sorted(c["encoding"] for c in found) == expected and all(c["status"] == "ok" for c in found), name
    for name in ("compiled-short", "decode-compiled"):         # in one process, each one compiled
        found = cells(out / f"bench-{name}.json")
        assert all(c["compiled"] is True and c["graphs"] >= 1 and c["graph_breaks"] == 0 for c in found), found
    assert all(c["compiled"] is None for c in cells(out / "bench-train-short.json"))
    assert "skipped" in (out / "pytest-gpu.log").read_text()        # no CUDA here: every GPU test skips
    assert len(list(out.iterdir())) <= 8 + 2                        # what one call brings back, per part <= 8


def test_a_part_stops_at_once_naming_what_does_not_import(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "pydantic_core.py").write_text("raise ImportError('pydantic-core 9.9 is not the one pydantic pins')\n")
    done = run_part(tmp_path, "train", pythonpath=str(broken))
    assert done.returncode == 1
    env = (tmp_path / "out" / "env.txt").read_text()
    assert "MISSING pydantic_core: ImportError: pydantic-core 9.9" in env
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir())     # no bench started


def test_each_cell_is_written_when_it_finishes(tmp_path, monkeypatch):
    """A run stopped during its third cell keeps the two it finished, in its directory's cells.jsonl."""
    real = Bench.prepare

    def prepare(self, cell, device, precision):
        if cell.encoding == "nope":
            raise KeyboardInterrupt
        return real(self, cell, device, precision)

    monkeypatch.setattr(Bench, "prepare", prepare)
    config = resolve_run_config("bench", None, "small", sets=[
        "task.lengths=16", "task.batch=1", "task.warmup=0", "task.steps=1", "train.threads=1",
        "task.encodings=alibi,nope", "train.compile=true", "task.compile_backend=eager"])
    with pytest.raises(KeyboardInterrupt):
        runner.execute(config, tmp_path, command=["posbench", "bench"])
    (kept,) = tmp_path.glob("bench/train/*/cells.jsonl")
    finished = [json.loads(line) for line in kept.read_text().splitlines()]
    assert [c["encoding"] for c in finished] == ["rope", "alibi"] and all(c["compiled"] for c in finished)


def test_a_hit_recompile_limit_is_an_error_not_an_eager_fallback():
    def scaled(x, factor):
        return x * factor

    with torch._dynamo.config.patch(recompile_limit=1), speed.strict_compilation():
        speed.fresh_compiler()
        compiled = torch.compile(scaled, backend="eager")
        compiled(torch.ones(2), 2)
        with pytest.raises(Exception, match="recompile_limit|cache_size_limit"):
            compiled(torch.ones(2), 3)               # a new int: a second entry, past the limit of 1
