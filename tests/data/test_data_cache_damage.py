"""A token cache is never read unless its files match their checksums: flipped ids in a complete cache, a
truncated ``tokens.bin`` (complete or not), edited state files all stop the run with one line (exit code 1)
and are never trained on; a truncated file is never padded with zeros; the final commit and the completion
are one step, so a kill there cannot make the cache refill and grow a second copy; and the record's data hash
is the hash of the tokens trained on."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from data_standins import documents
from posbench.cli import main
from posbench.data import producer, token_cache
from posbench.data.errors import DataError
from posbench.data.lm import token_stream
from posbench.data.sources import open_source
from posbench.data.tokenizer import ByteTokenizer


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("POSBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(token_cache, "_OPEN", {})
    return tmp_path / "cache"


def corpus(root: Path, n_files=3, docs=60) -> Path:
    d = root / "corpus"
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        rows = documents(docs, i, mean_words=120)
        (d / f"part-{i:03d}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in rows))
    (d / "validation.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in documents(20, 99)))
    return d


def complete_cache(tmp_path, budget=None):
    src = open_source(str(corpus(tmp_path)))
    cache = token_cache.open_cache(src, "train", ByteTokenizer(), budget)
    cache.wait_complete()
    token_cache._OPEN.clear()                       # the next open is another process's
    return src, cache.directory


def reopen(src, budget=None):
    token_cache._OPEN.clear()
    cache = token_cache.open_cache(src, "train", ByteTokenizer(), budget)
    return cache.wait_complete(), cache


def damaged(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and "is damaged" in message and "delete that directory" in message
    assert getattr(excinfo.value, "exit_code", 2) == 1
    return message


def test_flipped_ids_in_a_complete_cache_are_refused(tmp_path):
    src, directory = complete_cache(tmp_path)
    data = bytearray((directory / "tokens.bin").read_bytes())
    data[1000:1010] = bytes(x ^ 0x5A for x in data[1000:1010])
    (directory / "tokens.bin").write_bytes(bytes(data))
    with pytest.raises(DataError) as excinfo:
        reopen(src)
    assert "tokens.bin does not match its checksum" in damaged(excinfo)


def test_a_truncated_tokens_file_in_a_complete_cache_is_refused(tmp_path):
    """main: 'mmap length is greater than file size', a traceback."""
    src, directory = complete_cache(tmp_path)
    size = (directory / "tokens.bin").stat().st_size
    with open(directory / "tokens.bin", "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(DataError) as excinfo:
        reopen(src)
    assert "tokens.bin holds" in damaged(excinfo)


def test_an_edited_completion_record_is_refused(tmp_path):
    src, directory = complete_cache(tmp_path)
    final = json.loads((directory / "complete.json").read_text())
    final["tokens"] -= 100                         # consistent JSON, a shorter cache than was made
    (directory / "complete.json").write_text(json.dumps(final))
    with pytest.raises(DataError) as excinfo:
        reopen(src)
    assert "complete.json" in damaged(excinfo)


def unfinished_cache(tmp_path, monkeypatch):
    """A cache whose producer stopped after a few commits (as a kill would leave it)."""
    monkeypatch.setattr(producer, "BATCH_CHARS", 3000)
    encode, batches = producer._encode, [0]

    def encode_then_die(tokenizer, texts):
        batches[0] += 1
        if batches[0] > 5:
            raise KeyboardInterrupt
        return encode(tokenizer, texts)

    monkeypatch.setattr(producer, "_encode", encode_then_die)
    src = open_source(str(corpus(tmp_path)))
    with pytest.raises(DataError):
        token_cache.open_cache(src, "train", ByteTokenizer(), None).wait_complete()
    monkeypatch.setattr(producer, "_encode", encode)
    token_cache._OPEN.clear()
    (directory,) = list((tmp_path / "cache" / "tokens").glob("*/train-*"))
    assert not (directory / "complete.json").exists()
    return src, directory


def test_a_truncated_tokens_file_of_an_unfinished_cache_is_refused_not_padded(tmp_path, monkeypatch):
    """main padded it with zero ids (os.truncate extends) and trained on them."""
    src, directory = unfinished_cache(tmp_path, monkeypatch)
    committed = json.loads((directory / "progress.json").read_text())["tokens"]
    assert committed > 0
    with open(directory / "tokens.bin", "r+b") as f:
        f.truncate(committed)                          # half of the committed uint16 bytes
    with pytest.raises(DataError) as excinfo:
        reopen(src)
    assert "fewer than the" in damaged(excinfo)
    assert (directory / "tokens.bin").stat().st_size == committed          # nothing appended, nothing padded


def test_flipped_committed_ids_of_an_unfinished_cache_are_refused(tmp_path, monkeypatch):
    src, directory = unfinished_cache(tmp_path, monkeypatch)
    data = bytearray((directory / "tokens.bin").read_bytes())
    data[10] ^= 0xFF
    (directory / "tokens.bin").write_bytes(bytes(data))
    with pytest.raises(DataError) as excinfo:
        reopen(src)
    assert "does not match its checksum" in damaged(excinfo)


def test_an_unfinished_cache_resumes_to_the_same_tokens(tmp_path, monkeypatch):
    src, _ = unfinished_cache(tmp_path, monkeypatch)
    total, cache = reopen(src)
    reference = token_stream(src, "train", ByteTokenizer(), None)
    assert total == len(reference.tokens) and np.array_equal(cache.tokens, reference.tokens)


@pytest.mark.parametrize("budget", [None, 50_001])
def test_a_kill_at_the_completion_does_not_refill_the_cache(tmp_path, monkeypatch, budget):
    """The producer dies as it writes its completion (main: after the last progress.json, before
    complete.json); the next open finishes the same cache instead of reading the corpus again after it."""
    monkeypatch.setattr(producer, "BATCH_CHARS", 3000)
    name = "write_state" if hasattr(token_cache, "write_state") else "_atomic_json"     # main's name
    real = getattr(token_cache, name)

    def dies_at_completion(path, data):
        if Path(path).name == "complete.json":
            raise KeyboardInterrupt
        return real(path, data)

    monkeypatch.setattr(token_cache, name, dies_at_completion)
    src = open_source(str(corpus(tmp_path)))
    with pytest.raises(DataError):
        token_cache.open_cache(src, "train", ByteTokenizer(), budget).wait_complete()
    monkeypatch.setattr(token_cache, name, real)
    total, cache = reopen(src, budget)
    reference = token_stream(src, "train", ByteTokenizer(), budget)
    assert total == len(reference.tokens) and np.array_equal(cache.tokens, reference.tokens)
    assert (cache.directory / "tokens.bin").stat().st_size == 2 * total


def pretrain(tmp_path, monkeypatch, capsys, data: Path) -> tuple[int, str, dict | None]:
    from posbench.data import chunks, lm

    monkeypatch.setattr(lm, "IN_MEMORY_MAX_TOKENS", 0)             # through the token cache
    monkeypatch.setattr(chunks, "BLOCK_TOKENS", 64 * 20)
    token_cache._OPEN.clear()
    out = tmp_path / "out"
    code = main(["run", "-e", "rope", "-t", "pretrain", "-p", "tiny", "-q", "--data", str(data), "--steps", "3",
                 "--set", "task.eval_tokens=2048", "-o", str(out)])
    err = capsys.readouterr().err
    results = sorted(out.rglob("result.json"), key=lambda p: p.stat().st_mtime)
    return code, err, json.loads(results[-1].read_text()) if code == 0 else None


def test_a_run_on_a_damaged_cache_stops_in_one_line_and_the_data_hash_is_the_tokens(tmp_path, monkeypatch, capsys):
    """main trained on the flipped ids and recorded the same data hash (a hash of the documents)."""
    data = corpus(tmp_path)
    code, err, record = pretrain(tmp_path, monkeypatch, capsys, data)
    assert code == 0, err
    train = record["data"]["train"]
    tokens = (Path(train["cache"]) / "tokens.bin").read_bytes()
    assert record["data"]["hash"] == train["tokens_sha256"] == hashlib.sha256(tokens).hexdigest()
    # the same tokens read in memory have the same hash
    memory = token_stream(open_source(str(data)), "train", ByteTokenizer(), train["budget"])
    assert memory.tokens_sha256 == hashlib.sha256(memory.tokens.astype("<u2").tobytes()).hexdigest()
    assert memory.tokens_sha256 == record["data"]["hash"]
    path = Path(train["cache"]) / "tokens.bin"
    flipped = bytearray(tokens)
    flipped[500] ^= 0x11
    path.write_bytes(bytes(flipped))
    code, err, _ = pretrain(tmp_path, monkeypatch, capsys, data)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: token cache") and "is damaged" in lines[0]


def test_state_files_carry_checksums_of_their_own_bytes(tmp_path):
    from posbench.data.cache_files import read_state, write_state

    write_state(tmp_path / "s.json", {"tokens": 5, "sha256": "ab"})
    assert read_state(tmp_path / "s.json") == {"tokens": 5, "sha256": "ab"}
    assert read_state(tmp_path / "missing.json") is None
    text = (tmp_path / "s.json").read_text()
    for bad in (text.replace('"tokens": 5', '"tokens": 6'), text[:-3], "[]", '{"tokens": 5}'):
        (tmp_path / "s.json").write_text(bad)
        with pytest.raises(DataError, match="s.json"):
            read_state(tmp_path / "s.json")


def test_a_relative_data_directory_is_read(tmp_path, monkeypatch):
    """main: ``--data corpus`` (relative) raised ValueError ('is not in the subpath of') when it was read."""
    corpus(tmp_path)
    monkeypatch.chdir(tmp_path)
    relative = open_source("corpus")
    assert list(relative.documents("train")) == list(open_source(str(tmp_path / "corpus")).documents("train"))


def test_a_full_disk_while_tokenising_is_one_line_with_exit_code_1(tmp_path, monkeypatch):
    import builtins
    import errno

    from posbench.errors import UserError

    class Full:
        def __init__(self, handle):
            self.handle = handle

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device", self.handle.name)

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    monkeypatch.setattr(producer, "open", lambda *a, **k: Full(builtins.open(*a, **k)), raising=False)
    src = open_source(str(corpus(tmp_path)))
    with pytest.raises(UserError) as excinfo:
        token_cache.open_cache(src, "train", ByteTokenizer(), None).wait_complete()
    message = str(excinfo.value)
    assert excinfo.value.exit_code == 1 and "\n" not in message and "disk full" in message
