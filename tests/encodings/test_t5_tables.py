"""studies/protocols/t5_tables.py, the study tool that reads what T5's tables learned against the draw they started
from: the start it rebuilds is the run's own (a run whose learning rate is 1e-9 ends where it started, to the
printed 3 decimals; a wrong seed or model would differ by the init's spread, 0.18 to 4 logits here), each init's
scale and spread are as its release draws them, and a run it cannot read is one line, exit code 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from posbench.cli import main as posbench

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "studies" / "protocols"))
import t5_tables  # noqa: E402  (a script of studies/protocols/, not a package)


def run(tmp_path: Path, *sets: str) -> Path:
    out = tmp_path / "out"
    before = set(out.glob("arithmetic/*/*")) if out.exists() else set()
    args = ["run", "-e", "t5", "-t", "arithmetic", "-p", "tiny", "--steps", "3", "--seed", "4", "--out", str(out)]
    assert posbench([*args, *[a for s in sets for a in ("--set", s)]]) == 0
    (made,) = set(out.glob("arithmetic/*/*")) - before
    return made


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_start_is_the_runs_own_init_and_each_release_reads_as_drawn(tmp_path, capsys):
    still = run(tmp_path, "train.lr=1e-9")                              # T5's own init (the default)
    moving = run(tmp_path, "train.lr=0.1")
    scaled = run(tmp_path, "train.lr=1e-9", "encoding.table_init=x-transformers")
    capsys.readouterr()
    assert t5_tables.main([str(still), str(moving), str(scaled)]) == 0
    header, _, *rows = capsys.readouterr().out.strip().splitlines()
    assert cells(header)[-1] == "moved: mean / max"
    (_, init, scale, sd, start, trained, moved), second, third = (cells(r) for r in rows)
    # d_model 32: N(0, 32^-1/2) = 0.177, unscaled; 2 layers x 64 buckets x 2 heads = 256 draws (5 standard errors)
    assert (init, scale) == ("t5", "1") and abs(float(sd) - 32 ** -0.5) < 5 * 32 ** -0.5 / (2 * 255) ** 0.5
    assert moved == "0.000 / 0.000" and start == trained                # lr 1e-9: nothing moved
    assert float(second[-1].split(" / ")[1]) > 0.01 and second[4] == start        # same seed, same start; it moved
    # x-transformers: N(0, 1) x sqrt(head dim 16) = 4 logits
    assert (third[1], third[2]) == ("x-transformers", "4") and abs(float(third[3]) - 4.0) < 5 * 4 / (2 * 255) ** 0.5
    assert third[-1] == "0.000 / 0.000"


def test_a_run_recorded_before_table_init_existed_is_read_as_the_init_it_had(tmp_path, capsys):
    """Its records lack table_init; it drew x-transformers' table (the option's earlier value), which the rebuilt
    start must be, not T5's own (today's default): nothing moved, and a 4-logit spread."""
    import json

    old = run(tmp_path, "train.lr=1e-9", "encoding.table_init=x-transformers")
    for path, keys in ((old / "config.json", ("config", "encoding_options")),
                       (old / "checkpoint" / "model_config.json", ("encoding_options",))):
        data = json.loads(path.read_text())
        section = data
        for key in keys:
            section = section[key]
        del section["table_init"]
        path.write_text(json.dumps(data))
    capsys.readouterr()
    assert t5_tables.main([str(old)]) == 0
    row = cells(capsys.readouterr().out.strip().splitlines()[-1])
    assert row[1:3] == ["x-transformers", "4"] and row[-1] == "0.000 / 0.000", row


@pytest.mark.parametrize("encoding", ["rope", None])
def test_a_run_it_cannot_read_is_one_line(tmp_path, capsys, encoding):
    target = tmp_path
    if encoding:
        assert posbench(["run", "-e", encoding, "-t", "arithmetic", "-p", "tiny", "--steps", "2",
                         "--out", str(tmp_path / "out")]) == 0
        (target,) = (tmp_path / "out").glob("arithmetic/*/*")
    capsys.readouterr()
    assert t5_tables.main([str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {target}: not a finished T5 run")
