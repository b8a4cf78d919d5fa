"""Nothing is written outside ``--out`` whatever a model directory, a run or a record says: every label, model
type, encoding or file name that posbench reads and could turn into a path is refused in one line unless it
is a plain name (``posbench.files.check_name``), and the run directory itself is checked
(``posbench.runs.store.new_run_dir``). One test per place a name comes from: a Hugging Face model directory's
``posbench_extend.json`` and ``config.json``, an extend run's saved model, a posbench run's checkpoint, an
export's ``posbench_export.json``, a hub model's config, a run's ``config.json`` on ``--resume``, a run's
recorded tokenizer, and the records ``compare --plots`` reads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from posbench.cli import main
from posbench.errors import ConfigError

HOSTILE = ["../../escaped", "/absolute/escaped", "..", "a/b", "", "x" * 101, "nul\0byte", ".hidden"]


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def files_outside(root: Path, inside: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file() and inside not in p.parents}


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from posbench.hf.tiny import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("hf") / "tiny-llama", max_positions=64, layers=1)


def hostile_copy(llama_dir: Path, where: Path, *, label=None, model_type=None) -> Path:
    model = where / "model"
    shutil.copytree(llama_dir, model)
    if label is not None:
        (model / "posbench_extend.json").write_text(json.dumps({"label": label}))
    if model_type is not None:
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    return model


def test_extend_refuses_a_label_that_leads_outside_out(llama_dir, tmp_path, capsys):
    """main wrote a whole run to <out>/../escaped+tape."""
    model = hostile_copy(llama_dir, tmp_path, label="../../escaped")
    before = files_outside(tmp_path, tmp_path / "out")
    code, _, err = cli(capsys, "extend", "--model", model, "--method", "tape", "--length", 128, "--data", "stdlib",
                       "--preset", "tiny", "-q", "-o", tmp_path / "out")
    assert code == 2 and "posbench_extend.json" in err and len(err.strip().splitlines()) == 1
    assert files_outside(tmp_path, tmp_path / "out") == before and not (tmp_path / "escaped+tape").exists()


def test_run_init_refuses_an_absolute_label(llama_dir, tmp_path, capsys):
    """main created config.json under the absolute path the label named."""
    target = tmp_path / "absolute"
    model = hostile_copy(llama_dir, tmp_path, label=str(target))
    code, _, err = cli(capsys, "run", "-t", "perplexity", "-p", "tiny", "--init", model, "-q", "-o", tmp_path / "out")
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert not target.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", HOSTILE)
def test_a_model_type_or_label_of_a_model_directory_must_be_a_plain_name(llama_dir, tmp_path, capsys, name):
    model = hostile_copy(llama_dir, tmp_path, model_type=name)
    code, _, err = cli(capsys, "run", "-t", "perplexity", "-p", "tiny", "--init", model, "--dry-run")
    assert code == 2 and "model_type in config.json" in err and len(err.strip().splitlines()) == 1
    shutil.rmtree(model)
    model = hostile_copy(llama_dir, tmp_path, label=name or "..")
    code, _, err = cli(capsys, "run", "-t", "perplexity", "-p", "tiny", "--init", model, "--dry-run")
    assert code == 2 and "posbench_extend.json" in err and len(err.strip().splitlines()) == 1


def test_an_extend_runs_model_label_must_be_a_plain_name(llama_dir, tmp_path):
    from posbench.runs.init import resolve_init

    run = tmp_path / "extend" / "llama+tape" / "run"
    hostile_copy(llama_dir, run / "checkpoint", label="../../../../escaped")
    (run / "config.json").write_text(json.dumps({"config": {"task": "extend", "preset": "tiny"}}))
    (run / "result.json").write_text("{}")
    with pytest.raises(ConfigError, match="checkpoint/model/posbench_extend.json's label"):
        resolve_init(str(run))


def test_a_posbench_runs_encoding_must_be_a_plain_name(tmp_path):
    from posbench.runs.init import resolve_init

    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"config": {"task": "pretrain", "preset": "tiny"}}))
    (run / "checkpoint" / "model_config.json").write_text(json.dumps({"encoding": "../../escaped",
                                                                       "vocab_size": 259}))
    with pytest.raises(ConfigError, match="the encoding in checkpoint/model_config.json"):
        resolve_init(str(run))


@pytest.mark.parametrize("field", ["encoding", "model_type"])
def test_an_exports_names_must_be_plain(tmp_path, field):
    from posbench.runs.init import resolve_init

    export = tmp_path / "export"
    export.mkdir()
    model_type, encoding = ("../../escaped", "rope") if field == "model_type" else ("posbench", "/abs/escaped")
    (export / "config.json").write_text(json.dumps({"model_type": model_type}))
    (export / "posbench_export.json").write_text(json.dumps({"model_config": {"encoding": encoding}}))
    with pytest.raises(ConfigError, match=f"the {field} in"):
        resolve_init(str(export))


def test_a_hub_models_type_must_be_a_plain_name(monkeypatch):
    from posbench.hf import loading
    from posbench.runs.init import resolve_init

    class Config:
        model_type = "../../escaped"

        def to_dict(self):
            return {"model_type": self.model_type}

    monkeypatch.setattr(loading, "load_config", lambda name: Config())
    with pytest.raises(ConfigError, match="the hub model's model_type"):
        resolve_init("someone/some-model")


@pytest.mark.parametrize("field", ["label", "task"])
def test_resume_refuses_a_config_whose_names_are_not_plain(tmp_path, capsys, field):
    from posbench.runs import runner
    from posbench.runs.config import resolve_run_config
    from posbench.train import StopTraining

    def kill(step, model, loss):
        raise StopTraining

    config = resolve_run_config("arithmetic", "rope", "tiny", sets=["steps=2", "checkpoint_every=1"])
    with pytest.raises(StopTraining):
        runner.execute(config, tmp_path / "out", callbacks=(kill,))
    (run,) = [p.parent for p in (tmp_path / "out").rglob("config.json")]
    stored = json.loads((run / "config.json").read_text())
    stored["config"][field] = str(tmp_path / "escaped")
    (run / "config.json").write_text(json.dumps(stored))
    code, _, err = cli(capsys, "run", "--resume", run, "-q")
    assert code == 2 and f"the run's {field}" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "escaped").exists() and not (run / "result.json").exists()


def test_a_runs_recorded_tokenizer_file_must_be_a_plain_name(tmp_path):
    """main loaded the tokenizer file the record named, wherever it was."""
    from posbench.data.errors import DataError
    from posbench.data.tokenizer import BPETokenizer, tokenizer_from_spec

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    BPETokenizer.train(["some text to learn from " * 50], vocab_size=300).save(elsewhere)
    run = tmp_path / "results" / "pretrain" / "rope" / "run"
    run.mkdir(parents=True)
    for spec in ({"kind": "bpe", "file": "../../../../elsewhere/tokenizer.json"},
                 {"kind": "hf", "dir": str(elsewhere), "name": "x"}):
        with pytest.raises(DataError, match="the recorded tokenizer"):
            tokenizer_from_spec(spec, run)


def test_new_run_dir_never_leaves_its_root(tmp_path):
    from posbench.runs.record import ResultError
    from posbench.runs.store import new_run_dir

    for task, label in (("arithmetic", str(tmp_path / "abs")), ("arithmetic", "../escaped"), ("..", "rope")):
        with pytest.raises(ResultError, match="does not use as a file or directory name"):
            new_run_dir(tmp_path / "out", task, label)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_compare_plots_stay_inside_their_directory_whatever_the_records_say(tmp_path, capsys):
    """(A guard: figure names were already made safe on main.)"""
    out = tmp_path / "out"
    assert main(["run", "-e", "rope", "-t", "arithmetic", "-p", "tiny", "-q", "--steps", "2", "-o", str(out)]) == 0
    (result,) = out.rglob("result.json")
    record = json.loads(result.read_text())
    record["task"], record["encoding"] = "../../../escaped", "/abs/escaped"
    result.write_text(json.dumps(record))
    code, _, err = cli(capsys, "compare", out, "--plots", tmp_path / "plots")
    assert code == 0, err
    assert files_outside(tmp_path, out) == files_outside(tmp_path / "plots", tmp_path / "none") != set()
