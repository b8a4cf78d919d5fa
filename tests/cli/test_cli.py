"""The command line: help, ls, one-line errors with exit code 2, and an end-to-end tiny run + compare."""

import json

import pytest

from posbench import catalog
from posbench.cli import main
from posbench.tasks.presets import presets_of


def run_cli(capsys, *args):
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["ls", "--help"], ["compare", "--help"]])
def test_help_at_every_level_has_examples(capsys, args):
    code, out, _ = run_cli(capsys, *args)
    assert code == 0 and "Examples" in out and "posbench" in out


def test_ls_lists_encodings_tasks_presets(capsys):
    code, out, _ = run_cli(capsys, "ls")
    assert code == 0
    for word in ("encodings", "tasks", "presets", "rope", "tape", "arithmetic", "built-in", "tiny", "paper"):
        assert word in out
    code, out, _ = run_cli(capsys, "ls", "tasks")
    assert code == 0 and "arithmetic" in out and "rope" not in out


@pytest.mark.parametrize("width", [80, 1000])     # 1000: wide enough for the whole table
def test_ls_presets_is_readable_at_80_columns_and_shows_the_expected_time(capsys, monkeypatch, width):
    from posbench.tasks import TASKS

    small = presets_of(TASKS["arithmetic"])["small"]
    monkeypatch.setitem(small, "expected", {"seconds": 300, "hardware": "2-core CPU", "how": "measured"})
    monkeypatch.delitem(presets_of(TASKS["passkey"])["tiny"], "expected", raising=False)     # shown as "-"
    # 'ls presets' reads the catalog (no torch): the same changes there
    monkeypatch.setitem(catalog.TASKS["arithmetic"]["presets"]["small"], "expected",
                        {"seconds": 300, "hardware": "2-core CPU", "how": "measured"})
    monkeypatch.delitem(catalog.TASKS["passkey"]["presets"]["tiny"], "expected", raising=False)
    monkeypatch.setenv("COLUMNS", str(width))
    code, out, _ = run_cli(capsys, "ls", "presets")
    assert code == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= width
    assert "5 min on 2-core CPU (measured)" in out
    words = set(out.replace("│", " ").replace(",", " ").split())
    for name in TASKS:
        assert name in words
        for preset in presets_of(TASKS[name]):
            # every preset is one line of its table (not a row spread over many lines)
            row = [line for line in lines if line.startswith("│") and line.split("│")[1 if width == 80 else 2]
                   .strip().rstrip("*") == preset and (width == 80 or line.split("│")[1].strip() == name)]
            assert row, (name, preset)
    if width == 80:       # one compact table per task; a preset without an expected time shows "-"
        assert "  tiny: expected -; task options: mode=grid" in out
    else:                 # a wide terminal gets the one full table
        assert sum(1 for line in lines if line.startswith("┏")) == 1


def test_every_listing_fits_80_columns_with_every_name_whole(capsys, monkeypatch):
    from posbench.encodings import ENCODINGS
    from posbench.tasks import TASKS

    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_cli(capsys, "ls")
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 80
    words = set(out.replace("│", " ").replace(":", " ").split())
    assert set(ENCODINGS) <= words and set(TASKS) <= words
    assert "…" not in out                                     # nothing cut


@pytest.mark.parametrize("args,expected", [
    (["run", "-e", "ropee", "-t", "arithmetic"], "unknown encoding 'ropee'. Did you mean 'rope'?"),
    (["run", "-e", "rope,nosuch", "-t", "arithmetic"], "unknown encoding 'nosuch'"),
    (["run", "-e", "rope", "-t", "arithmetc"], "unknown task 'arithmetc'. Did you mean 'arithmetic'?"),
    (["run", "-e", "rope"], "--task is required"),
    (["run", "-e", "rope", "-t", "arithmetic", "--preset", "huge"], "has no preset 'huge'"),
    (["run", "-e", "rope", "-t", "arithmetic", "--set", "lrr=1"], "Did you mean 'train.lr'?"),
    (["run", "-e", "rope", "-t", "arithmetic", "--set", "model.width=1"], "unknown key 'width'"),
    (["run", "-e", "rope", "-t", "arithmetic", "--set", "lr=fast"], "train.lr='fast': expected a number"),
    (["run", "-e", "rope", "-t", "arithmetic", "--set", "steps=1.5"], "expected an integer"),
    (["run", "-e", "rope", "-t", "arithmetic", "--set", "compile=maybe"], "expected true, false or auto"),
    (["run", "-e", "rope", "-t", "arithmetic", "--set", "lr"], "--set expects key=value"),
    (["run", "-e", "rope", "-t", "arithmetic", "--set", "encoding.nope=1"], "unknown key 'nope'"),
    (["run", "-e", "rope", "-t", "arithmetic", "--set", "batch_size=0"], "batch_size"),
    (["run", "-e", "rope", "-t", "arithmetic", "--set", "n_heads=3"], "heads"),
    (["run", "-e", "rope", "-t", "arithmetic", "--data", "x.txt"], "No such option: --data"),
    (["run", "-e", "rope", "-t", "arithmetic", "--steps", "many"], "train.steps='many': expected an integer"),
    (["run", "-e", "rope", "-t", "arithmetic", "--bogus"], "No such option: --bogus"),
    (["compare", "results", "--bogus"], "No such option: --bogus"),
    (["run", "-e", "rope", "-t", "arithmetic", "--device", "tpu"], "unknown device 'tpu'"),
    (["run", "-e", "rope", "-t", "arithmetic", "--seed", "1,x"], "expected integers separated by commas"),
    (["run", "-e", "rope", "-t", "arithmetic", "--seed", "1,1"], "a seed is repeated"),
    (["run", "-e", "rope", "-t", "arithmetic", "--seed", "1", "--seeds", "2"], "give --seed or --seeds"),
    (["run", "-e", "rope", "-t", "arithmetic", "--seeds", "0"], "--seeds must be between 1 and 1000"),
    (["run", "-e", "rope", "-t", "arithmetic", "--seeds", "10000000000"], "--seeds must be between 1 and 1000"),
    (["run", "--resume", "/nonexistent/run"], "does not exist"),
    (["run", "--init", "/nonexistent/run", "-t", "arithmetic"], "no such run or model directory"),
    (["compare", "/nonexistent/results"], "does not exist"),
    (["compare", "."], None),                       # filled in below: a tree with no runs
    (["compare", "/tmp", "--format", "xml"], "unknown format 'xml'"),
    (["ls", "models"], "unknown listing 'models'"),
    (["frobnicate"], "No such command 'frobnicate'"),
])
def test_bad_input_gives_one_line_and_exit_code_2(capsys, tmp_path, args, expected):
    if args == ["compare", "."]:
        args, expected = ["compare", str(tmp_path)], "no finished runs"
    code, out, err = run_cli(capsys, *args)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in err + out


def test_resume_refuses_other_flags_and_finished_runs(capsys, tmp_path):
    code, _, err = run_cli(capsys, "run", "--resume", str(tmp_path), "--steps", "3")
    assert code == 2 and "--resume continues a run" in err
    done = tmp_path / "arithmetic" / "rope" / "x"
    done.mkdir(parents=True)
    (done / "config.json").write_text("{}")
    (done / "result.json").write_text("{}")
    code, _, err = run_cli(capsys, "run", "--resume", str(done))
    assert code == 2 and "already finished" in err


def test_non_finite_loss_is_one_line_and_exit_code_1(capsys, tmp_path, monkeypatch):
    import torch

    from posbench.train.trainer import Trainer

    def nan_loss(model, batch):
        logits = model(batch.tokens)
        return logits.sum() * float("nan"), batch.n_targets

    real = Trainer.__init__                                      # every task trains on the trainer's own loss
    monkeypatch.setattr(Trainer, "__init__", lambda self, *a, **k: real(self, *a, **{**k, "loss_fn": nan_loss}))
    code, _, err = run_cli(capsys, "run", "-e", "rope", "-t", "arithmetic", "-p", "tiny", "-q", "--out",
                           str(tmp_path))
    assert code == 1 and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert "non-finite loss" in line and "step 1" in line
    assert torch.isfinite(torch.tensor(1.0))


def test_end_to_end_two_encodings_then_compare(capsys, tmp_path):
    out_dir = tmp_path / "results"
    code, out, err = run_cli(capsys, "run", "--encoding", "rope,tape", "--task", "arithmetic", "--preset", "tiny",
                             "--seed", "1", "--out", str(out_dir), "--set", "task.eval_samples=4")
    assert code == 0, err
    assert "arithmetic / rope" in out and "arithmetic / tape" in out and "posbench compare" in out
    runs = sorted(out_dir.glob("arithmetic/*/*/result.json"))
    assert [p.parent.parent.name for p in runs] == ["rope", "tape"]
    first = json.loads(runs[0].read_text())
    second = json.loads(runs[1].read_text())
    # everything but the encoding is equal
    for key in ("model", "train", "task_options", "seed", "preset"):
        assert first["config"][key] == second["config"][key]
    assert first["data"]["hash"] == second["data"]["hash"]
    assert first["config"]["task_options"]["eval_samples"] == 4
    for path in runs:
        run = path.parent
        assert (run / "checkpoint" / "model.safetensors").is_file()
        assert (run / "checkpoint" / "train_state.json").is_file()
        assert len((run / "predictions.jsonl").read_text().splitlines()) == 9 * 4
    code, out, err = run_cli(capsys, "compare", str(out_dir), "--plots", str(tmp_path / "figs"))
    assert code == 0, err
    assert "rope" in out and "tape" in out and "accuracy" in out
    assert (tmp_path / "figs" / "arithmetic_accuracy.png").is_file()
    code, out, _ = run_cli(capsys, "compare", str(out_dir), "--format", "json", "--task", "arithmetic")
    assert code == 0 and {r["encoding"] for r in json.loads(out)["tables"][0]["rows"]} == {"rope", "tape"}


def test_seeds_run_every_encoding_under_every_seed_and_compare_pools_them(capsys, tmp_path):
    out_dir = tmp_path / "results"
    code, out, err = run_cli(capsys, "run", "-e", "rope,nope", "-t", "arithmetic", "-p", "tiny", "--seeds", "2",
                             "--out", str(out_dir), "--set", "steps=3", "--set", "task.eval_samples=2")
    assert code == 0, err
    order = [line.split(":")[0] for line in out.splitlines() if line.startswith("arithmetic / ")]
    assert order == ["arithmetic / rope", "arithmetic / nope"] * 2           # seed 0 of both, then seed 1
    runs = [json.loads(p.read_text()) for p in sorted(out_dir.glob("arithmetic/*/*/result.json"))]
    assert sorted((r["encoding"], r["config"]["seed"]) for r in runs) == [("nope", 0), ("nope", 1), ("rope", 0),
                                                                          ("rope", 1)]
    code, out, err = run_cli(capsys, "compare", str(out_dir), "--format", "json")
    rows = json.loads(out)["tables"][0]["rows"]
    assert code == 0 and sorted((r["encoding"], r["seeds"]) for r in rows) == [("nope", 2), ("rope", 2)]


def test_resume_flag_finishes_a_killed_run(capsys, tmp_path):
    from posbench.runs import runner
    from posbench.runs.config import resolve_run_config
    from posbench.train import StopTraining

    cfg = resolve_run_config("arithmetic", "rope", "tiny", sets=["steps=6", "checkpoint_every=2"])

    def kill(step, model, loss):
        if step == 3:
            raise StopTraining

    with pytest.raises(StopTraining):
        runner.execute(cfg, tmp_path, callbacks=(kill,))
    run_dir = next((tmp_path / "arithmetic" / "rope").iterdir())
    for command in ("run", "extend"):                      # --dry-run: the stored config, nothing run or written
        code, out, err = run_cli(capsys, command, "--resume", str(run_dir), "--dry-run")
        assert code == 0, err
        assert [c["encoding"] for c in json.loads(out)] == ["rope"] and "has finished" not in err
        assert not (run_dir / "result.json").exists()
    state = next(run_dir.rglob("train_state.json"))        # the killed process trained for 1,000 s, say
    saved = json.loads(state.read_text())
    state.write_text(json.dumps({**saved, "train_s": 1000.0}))
    code, out, err = run_cli(capsys, "run", "--resume", str(run_dir), "-q")
    assert code == 0, err
    result = json.loads((run_dir / "result.json").read_text())
    assert result["training"]["steps"] == 6 and result["training"]["resumed_from"] == [2]
    timings = result["timings"]                            # the run's time holds the earlier process's training
    # each of the three is rounded to the millisecond on its own: the sum of two roundings may exceed the third's
    assert timings["train_s"] >= 1000.0 and timings["total_s"] >= timings["train_s"] + timings["eval_s"] - 2e-3
    code, out, err = run_cli(capsys, "run", "--resume", str(run_dir), "--dry-run")
    assert code == 0 and "has finished: --resume would refuse it" in err


def test_init_from_another_run(capsys, tmp_path):
    code, _, err = run_cli(capsys, "run", "-e", "nope", "-t", "arithmetic", "-p", "tiny", "-q", "--out",
                           str(tmp_path), "--set", "steps=2")
    assert code == 0, err
    base = next((tmp_path / "arithmetic" / "nope").iterdir())
    code, _, err = run_cli(capsys, "run", "-e", "rope", "-t", "arithmetic", "-p", "tiny", "--init", str(base))
    assert code == 2 and "uses encoding 'nope'" in err
    code, out, err = run_cli(capsys, "run", "-t", "arithmetic", "-p", "tiny", "-q", "--init", str(base),
                             "--out", str(tmp_path / "b"), "--set", "steps=2")
    assert code == 0, err
    result = json.loads(next((tmp_path / "b").glob("arithmetic/nope/*/result.json")).read_text())
    assert result["init"]["run"] == str(base) and result["init"]["checkpoint_sha256"]
