"""SCROLLS read as a stream that stops at the budget: the names ``--data`` accepts, duplicate references, the
document cut that changes no prompt, and the small preset's memory on a generated multi-GB archive."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from data_standins import MEASURE, write_scrolls_zip
from posbench.runs.config import resolve_run_config
from posbench.data import DataError, hub
from posbench.tasks.scrolls import data as sd
from posbench.tasks.scrolls.task import Scrolls

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parents[1] / "fixtures" / "scrolls"


def _zip_fixtures(root: Path) -> Path:
    """The fixtures in the hub's layout: ``root/<dataset>.zip`` with ``<dataset>/<split>.jsonl``."""
    root.mkdir(parents=True, exist_ok=True)
    for folder in FIXTURES.iterdir():
        with zipfile.ZipFile(root / f"{folder.name}.zip", "w") as z:
            for f in folder.iterdir():
                z.write(f, f"{folder.name}/{f.name}")
    return root


def test_the_names_the_loader_accepts(tmp_path, monkeypatch):
    for name in (None, "", "tau/scrolls", "scrolls", "hf://datasets/tau/scrolls", "tau/scrolls/"):
        assert sd.resolve_data(name).kind == "hub"
    assert sd.resolve_data(FIXTURES) == sd.ScrollsData("local", FIXTURES)
    with pytest.raises(DataError, match="neither a directory nor tau/scrolls"):
        sd.resolve_data(tmp_path / "missing")
    assert sd.resolve_data("tau/scrolls").url("qasper", "validation") == \
        "zip://qasper/validation.jsonl::hf://datasets/tau/scrolls/qasper.zip"


@pytest.mark.parametrize("data", ["tau/scrolls", "scrolls", "zips"])
def test_the_task_runs_with_tau_scrolls_and_with_the_hubs_archives(data, tmp_path, monkeypatch):
    """``--data tau/scrolls`` (offline here: the hub root is a local copy of the repository's archives) and a
    local directory of archives give the very examples of the fixtures' folders."""
    zips = _zip_fixtures(tmp_path / "hub" / "tau" / "scrolls")
    monkeypatch.setattr(hub, "HUB_ROOT", str(tmp_path / "hub"))
    arg = str(zips) if data == "zips" else data
    cfg = resolve_run_config("scrolls", "rope", "tiny", sets=[f"task.data={arg}", "task.datasets=qasper,gov_report"])
    task = Scrolls(cfg)
    task.validate()                                          # accepted: not "not a directory"
    for dataset in ("qasper", "gov_report"):
        for split in ("train", "validation"):
            got = task._load(dataset, split)
            want = sd.load_split(dataset, split, FIXTURES)[: len(got)]
            assert [(e.id, e.input, e.outputs) for e in got] == [(e.id, e.input, e.outputs) for e in want]
    assert task.data_info()["source"] == ({"kind": "hub", "name": "tau/scrolls"} if data != "zips"
                                          else {"kind": "local", "root": str(zips.resolve())})


def test_an_offline_hub_or_a_missing_archive_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    cfg = resolve_run_config("scrolls", "rope", "tiny", sets=["task.data=tau/scrolls", "task.datasets=qasper"])
    with pytest.raises(DataError, match="offline.*--data DIR"):
        Scrolls(cfg).validate()
    _zip_fixtures(tmp_path / "z")
    cfg = resolve_run_config("scrolls", "rope", "tiny", sets=[f"task.data={tmp_path / 'z'}", "task.datasets=quality"])
    with pytest.raises(DataError, match=r"has no quality/ folder \(nor quality.zip\)"):
        Scrolls(cfg).validate()


def test_the_budget_stops_reading_and_references_stay_complete(tmp_path):
    rows = [("a", "x1"), ("a", "x2"), ("b", "y"), ("c", "z"), ("a", "x3"), ("d", "w")]
    for split in ("train", "validation"):
        path = tmp_path / "qmsum" / f"{split}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"id": i, "pid": f"{i}{o}", "input": f"q {i}?\n\ndoc {i}", "output": o})
                                + "\n" for i, o in rows))
    train = sd.load_split("qmsum", "train", tmp_path, limit=2)
    assert [(e.id, e.outputs) for e in train] == [("a", ["x1", "x2"]), ("b", ["y"])]      # stopped after b
    val = sd.load_split("qmsum", "validation", tmp_path, limit=2)
    assert [(e.id, e.outputs) for e in val] == [("a", ["x1", "x2", "x3"]), ("b", ["y"])]  # every reference of a
    assert [e.id for e in sd.load_split("qmsum", "validation", tmp_path)] == ["a", "b", "c", "d"]


@pytest.mark.parametrize("side", ["end", "start"])
def test_cutting_documents_on_load_changes_no_prompt(tmp_path, side):
    long_doc = " ".join(f"w{i}" for i in range(3000))
    path = tmp_path / "qasper" / "validation.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"id": "q", "pid": "q0", "input": f"Which word?\n\n{long_doc}", "output": "w1"}) + "\n" +
                    json.dumps({"id": "s", "pid": "s0", "input": "Short?\n\ntiny doc", "output": "tiny"}) + "\n")
    cfg = resolve_run_config("scrolls", "rope", "tiny", sets=[f"task.data={tmp_path}", "task.datasets=qasper",
                                                              f"task.truncation_side={side}",
                                                              "task.max_input_tokens=300"])
    task = Scrolls(cfg)
    task.gen_limits = {"qasper": 8}
    full = sd.load_split("qasper", "validation", tmp_path)
    cut = task._load("qasper", "validation")
    assert len(cut[0].text) == 300 * 16 < len(full[0].text) and cut[1].text == full[1].text
    for a, b in zip(full, cut):
        assert task.encode_prompt("qasper", a) == task.encode_prompt("qasper", b)     # ids and truncated flag
    assert sd.split_digest(cut) == sd.split_digest(full)
    assert cut[0].extra["input_chars"] == len(full[0].input)


MEMORY = MEASURE + textwrap.dedent("""
    from posbench.runs.config import resolve_run_config

    from posbench.tasks.scrolls.task import Scrolls

    cfg = resolve_run_config("scrolls", "rope", "small", sets=[f"task.data={sys.argv[1]}",
                                                               "task.datasets=narrative_qa"])
    task = Scrolls(cfg)
    task.validate()
    t0 = time.perf_counter()
    train = task._load("narrative_qa", "train")
    prompts = [task.encode_prompt("narrative_qa", ex)[0] for ex in train]      # what fine-tuning keeps
    val = task._load("narrative_qa", "validation")
    print("RESULT " + json.dumps({"n_train": len(train), "n_val": len(val), "seconds": time.perf_counter() - t0,
                                  "prompt_tokens": max(len(p) for p in prompts),
                                  "limits": [task.opts["max_train_examples"], task.opts["max_eval_examples"]],
                                  "peak_rss_mb": peak_mb(),
                                  "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
""")


@pytest.mark.slow
def test_small_preset_memory_on_a_multi_gigabyte_archive(tmp_path):
    archive = write_scrolls_zip(tmp_path / "scrolls" / "narrative_qa.zip", "narrative_qa", rows=2400,
                                doc_bytes=1 << 20)
    with zipfile.ZipFile(archive) as z:
        member = z.getinfo("narrative_qa/train.jsonl")
    assert member.file_size > 2.5e9 and archive.stat().st_size < 0.01 * member.file_size   # 2.9 GB in ~20 MB
    env = {**os.environ, "POSBENCH_REPO": str(REPO), "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", MEMORY, str(archive.parent)], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))[len("RESULT "):])
    print(r)
    assert r["limits"] == [2000, 50] and (r["n_train"], r["n_val"]) == (2000, 50)
    assert r["prompt_tokens"] == 512
    assert r["peak_rss_mb"] < 2048, r
    shutil.rmtree(archive.parent)
