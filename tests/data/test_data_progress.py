"""Progress: one switch for the libraries' bars and posbench's data bars (the CLI's --quiet), and the data bars'
output itself (captured): throughput and ETA, plain lines off a terminal."""

import io
import json

import pytest
from rich.console import Console

from posbench.data import producer, progress, token_cache
from posbench.data.progress import DataBar, library_progress
from posbench.data.sources import open_source
from posbench.data.tokenizer import ByteTokenizer


@pytest.fixture(autouse=True)
def restore():
    library_progress(True)          # as a fresh process has it, whatever an earlier test here left (a CLI -q run)
    yield
    library_progress(True)


def test_library_progress_switches_every_library():
    import datasets
    import huggingface_hub.utils as hub_utils
    import transformers

    library_progress(False)
    assert not datasets.is_progress_bar_enabled()
    assert hub_utils.are_progress_bars_disabled()
    assert not transformers.utils.logging.is_progress_bar_enabled()
    assert not progress.progress_enabled()
    library_progress(True)
    assert datasets.is_progress_bar_enabled() and not hub_utils.are_progress_bars_disabled()
    assert transformers.utils.logging.is_progress_bar_enabled() and progress.progress_enabled()
    # a library imported (or re-configured) later follows the switch through apply_to, as posbench's import
    # sites do
    library_progress(False)
    datasets.enable_progress_bars()
    progress.apply_to(datasets)
    assert not datasets.is_progress_bar_enabled()


def test_a_data_bar_prints_throughput_and_eta_off_a_terminal():
    buf = io.StringIO()
    bar = DataBar("tokenize demo train", 1000, "tok", every=0.0, console=Console(file=buf, width=200))
    for done in (100, 400):
        bar.update(done)
    bar.close()
    lines = buf.getvalue().strip().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("tokenize demo train: 100/1k tok (10.0%), ")
    for line in lines:
        assert " tok/s, ETA " in line and line.endswith("]")
    assert "(40.0%)" in lines[1] and "(40.0%)" in lines[2]
    quiet = io.StringIO()
    off = DataBar("x", 10, console=Console(file=quiet), enabled=False, every=0.0)
    off.update(5)
    off.close()
    assert quiet.getvalue() == ""


def test_tokenising_shows_its_progress_unless_quiet(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("POSBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(token_cache, "_OPEN", {})
    monkeypatch.setattr(producer, "BATCH_CHARS", 20_000)
    monkeypatch.setattr(progress, "QUIET_BELOW", 0.0)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i} " * 300}) + "\n" for i in range(200)))
    src = open_source(str(corpus))
    cache = token_cache.open_cache(src, "train", ByteTokenizer(), 300_000)
    cache.wait_complete()
    cache._thread.join()
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"tokenize {corpus} train: 300k/300k tok (100.0%), ")
    assert "tok/s, ETA 0:00" in last
    library_progress(False)
    monkeypatch.setattr(token_cache, "_OPEN", {})
    again = token_cache.open_cache(src, "train", ByteTokenizer(), 200_000)
    again.wait_complete()
    again._thread.join()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("quiet", [False, True])
def test_the_cli_quiet_flag_is_the_one_switch(tmp_path, capsys, quiet):
    """``posbench run --quiet`` hides the libraries' download bars and posbench's data bars; without it they show."""
    import datasets

    from posbench.cli import main

    library_progress(not quiet)                      # start from the opposite setting
    datasets.disable_progress_bars() if not quiet else datasets.enable_progress_bars()
    args = ["run", "--task", "perplexity", "--encoding", "nope", "--preset", "tiny", "--steps", "1",
            "--out", str(tmp_path), "--dry-run"] + (["--quiet"] if quiet else [])
    assert main(args) == 0
    assert progress.progress_enabled() is (not quiet)
    assert datasets.is_progress_bar_enabled() is (not quiet)
