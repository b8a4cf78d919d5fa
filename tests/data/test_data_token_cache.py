"""The on-disk token cache: the same tokens as the in-memory path, reused by the next run, resumed exactly
after a kill, shared between processes; and the block-local training order over a cache that is still
filling, which is a pure function of (seed, example index) however fast the producer runs."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from data_standins import documents
from posbench.data import producer, token_cache
from posbench.data.chunks import BlockOrder, CachedChunks
from posbench.data.lm import corpus_tokens, token_stream, uses_token_cache
from posbench.data.sources import open_source
from posbench.data.tokenizer import BPETokenizer, ByteTokenizer
from posbench.errors import EnvironmentFault, UserError
from posbench.files import json_object

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("POSBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(token_cache, "_OPEN", {})
    return tmp_path / "cache"


def _corpus(root: Path, n_files=3, docs=60, mean_words=120, seed=0) -> Path:
    d = root / "corpus"
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        rows = documents(docs, seed * 100 + i, mean_words=mean_words)
        (d / f"part-{i:03d}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in rows))
    (d / "validation.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in documents(20, 99)))
    return d


def _fresh(cache):
    """Forget this process's cache objects (as a new process would)."""
    token_cache._OPEN.clear()


@pytest.mark.parametrize("kind", ["byte", "bpe"])
@pytest.mark.parametrize("budget", [50_001, None, 10**9])
def test_cache_holds_exactly_the_in_memory_tokens(tmp_path, kind, budget):
    src = open_source(str(_corpus(tmp_path)))
    tok = ByteTokenizer() if kind == "byte" else BPETokenizer.train(src.documents("train"), vocab_size=600)
    ref = token_stream(src, "train", tok, budget)
    cache = token_cache.open_cache(src, "train", tok, budget)
    total = cache.wait_complete()
    assert total == len(ref.tokens) and np.array_equal(cache.tokens, ref.tokens)
    info = cache.describe()
    assert (info["documents"], info["characters"], info["truncated"]) == (ref.documents, ref.characters, ref.truncated)
    assert cache.dtype == np.uint16 and (cache.directory / "tokens.bin").stat().st_size == 2 * total


def test_the_next_run_reuses_the_cache(tmp_path, monkeypatch):
    src = open_source(str(_corpus(tmp_path)))
    first = token_cache.open_cache(src, "train", ByteTokenizer(), 100_000)
    first.wait_complete()
    _fresh(first)

    def no_reading(*a, **k):
        raise AssertionError("a complete cache is not read again")

    monkeypatch.setattr(type(src), "reader", no_reading)
    again = token_cache.open_cache(open_source(str(tmp_path / "corpus")), "train", ByteTokenizer(), 100_000)
    assert again is not first and again.finished and again.directory == first.directory
    assert np.array_equal(again.tokens, first.tokens)
    # another budget or tokenizer is another cache
    other = token_cache.open_cache(src, "train", ByteTokenizer(), 100_001)
    assert other.directory != first.directory


def test_corpus_tokens_keeps_small_budgets_and_the_builtin_corpus_in_memory(tmp_path):
    from posbench.data.lm import TokenStream

    local = open_source(str(_corpus(tmp_path)))
    assert not uses_token_cache(open_source("stdlib"), None)
    assert not uses_token_cache(open_source("stdlib"), 10**10)
    assert not uses_token_cache(local, 1 << 24) and uses_token_cache(local, (1 << 24) + 1)
    assert isinstance(corpus_tokens(local, "validation", ByteTokenizer(), 4096), TokenStream)


PRODUCER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {repo!r})
    from posbench.data import token_cache
    from posbench.data.sources import open_source
    from posbench.data.tokenizer import ByteTokenizer
    from posbench.data import producer
    producer.BATCH_CHARS = 3000
    pause_after, encoded, encode = {pause_after!r}, [0], producer._encode

    def encode_then_pause(tokenizer, texts):     # pause_after > 0: stop for good past that many characters,
        encoded[0] += sum(map(len, texts))       # so that a kill always lands mid-way (no race with the end)
        if pause_after and encoded[0] > pause_after:
            time.sleep(3600)
        return encode(tokenizer, texts)

    producer._encode = encode_then_pause
    cache = token_cache.open_cache(open_source({corpus!r}), "train", ByteTokenizer(), None)
    cache.wait_complete()
    print("DONE", cache.total, flush=True)
""")


def _spawn_producer(corpus: Path, cache: Path, pause_after: int = 0) -> subprocess.Popen:
    env = {**os.environ, "POSBENCH_CACHE": str(cache), "PYTHONPATH": str(REPO)}
    script = PRODUCER.format(repo=str(REPO), corpus=str(corpus), pause_after=pause_after)
    return subprocess.Popen([sys.executable, "-c", script], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _cache_dir_of(cache_root: Path) -> Path:
    deadline = time.monotonic() + 300                      # the child imports torch and datasets first
    while time.monotonic() < deadline:
        found = list(cache_root.glob("tokens/*/train-*"))
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError("no cache directory appeared in 300 s")


@pytest.mark.slow  # a tokenising process, killed
def test_a_killed_tokenisation_resumes_exactly(tmp_path, cache_dir):
    corpus = _corpus(tmp_path, n_files=4, docs=150, mean_words=200)
    src = open_source(str(corpus))
    reference = token_stream(src, "train", ByteTokenizer(), None)
    proc = _spawn_producer(corpus, cache_dir, pause_after=150_000)   # it stops past 150k characters
    directory = _cache_dir_of(cache_dir)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:                     # let it commit a few batches, then kill -9 it
        progress = json_object(directory / "progress.json")
        if progress and progress["tokens"] > 100_000:
            break
        time.sleep(0.01)
    assert progress and progress["tokens"] > 100_000, "the producer committed nothing in 300 s"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (directory / "complete.json").exists(), "the producer finished before it could be killed"
    committed = json_object(directory / "progress.json")["tokens"]
    assert 0 < committed < len(reference.tokens)
    with open(directory / "tokens.bin", "ab") as f:       # a torn write past the last commit
        f.write(b"\xff" * 1001)
    cache = token_cache.open_cache(src, "train", ByteTokenizer(), None)
    assert cache.directory == directory
    assert cache.wait_complete() == len(reference.tokens)
    assert np.array_equal(cache.tokens, reference.tokens)
    assert cache.describe()["documents"] == reference.documents


@pytest.mark.slow  # two processes
def test_a_second_process_waits_for_the_producer(tmp_path, cache_dir):
    corpus = _corpus(tmp_path, n_files=3, docs=150, mean_words=200)
    src = open_source(str(corpus))
    proc = _spawn_producer(corpus, cache_dir)
    directory = _cache_dir_of(cache_dir)
    deadline = time.monotonic() + 300                      # its first commit: from then on it holds the lock
    while not (directory / "progress.json").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (directory / "progress.json").exists(), "the producer committed nothing in 300 s"
    cache = token_cache.open_cache(src, "train", ByteTokenizer(), None)
    assert cache._thread is None or (directory / "complete.json").exists()     # the child holds the lock
    total = cache.wait_complete()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert f"DONE {total}" in out
    assert np.array_equal(cache.tokens, token_stream(src, "train", ByteTokenizer(), None).tokens)


@pytest.mark.slow  # a second process, waited for
def test_a_stuck_producer_in_another_process_is_one_line_not_a_wait_forever(tmp_path, cache_dir, monkeypatch):
    corpus = _corpus(tmp_path, n_files=4, docs=150, mean_words=200)
    proc = _spawn_producer(corpus, cache_dir, pause_after=150_000)   # commits some batches, then hangs holding the lock
    try:
        directory = _cache_dir_of(cache_dir)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            progress = json_object(directory / "progress.json")
            if progress and progress["tokens"] > 100_000:
                break
            time.sleep(0.01)
        assert progress and progress["tokens"] > 100_000, "the producer committed nothing in 300 s"
        monkeypatch.setenv("POSBENCH_CACHE_STALL", "2")
        cache = token_cache.open_cache(open_source(str(corpus)), "train", ByteTokenizer(), None)
        assert cache._thread is None                        # the child holds the lock: this process only reads
        started = time.monotonic()
        with pytest.raises(EnvironmentFault) as info:
            cache.wait_complete()
        assert 2 <= time.monotonic() - started < 60
        message = str(info.value)
        assert "\n" not in message and "has not grown for 2 s" in message and "POSBENCH_CACHE_STALL" in message
        assert info.value.exit_code == 1
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_stall_limit_is_one_line(monkeypatch, value):
    monkeypatch.setenv("POSBENCH_CACHE_STALL", value)
    with pytest.raises(UserError, match="POSBENCH_CACHE_STALL"):
        token_cache.stall_seconds()


# ---- the training order -------------------------------------------------------------------------------------

def test_block_order_is_a_permutation_per_block_and_epoch():
    order = BlockOrder(length=16, block_tokens=160)            # 10 windows per block
    n = 35                                                   # 3 full blocks and one of 5
    for epoch in range(2):
        seen = [order.window(3, epoch * n + g, n) for g in range(n)]
        assert sorted(seen) == list(range(n))
        assert all(b * 10 <= w < b * 10 + 10 for b in range(3) for w in seen[b * 10:(b + 1) * 10])
        assert sorted(seen[30:]) == [30, 31, 32, 33, 34]
    first = [order.window(3, g, n) for g in range(n)]
    assert first != [order.window(3, n + g, n) for g in range(n)]            # a fresh order each epoch
    assert first != [order.window(4, g, n) for g in range(n)]                # and per seed
    assert [order.window(3, g) for g in range(30)] == first[:30]             # growing == final, full blocks
    assert order.needed_tokens(0) == 10 * 16 + 1 and order.needed_tokens(10) == 20 * 16 + 1


def test_examples_read_while_the_cache_grows_equal_those_of_the_complete_cache(tmp_path, monkeypatch):
    from posbench.tasks.corpus_task import CachedChunkStream

    import threading

    monkeypatch.setattr(producer, "BATCH_CHARS", 3000)
    src = open_source(str(_corpus(tmp_path, n_files=4, docs=150, mean_words=200)))
    length, block = 64, 64 * 50
    gate, encoded, encode = threading.Event(), [0], producer._encode

    def encode_then_wait(tokenizer, texts):       # the producer holds past 20 blocks until the first batch is read,
        encoded[0] += sum(map(len, texts))        # so the batch is always read from a growing cache
        if encoded[0] > 20 * block:
            gate.wait(300)
        return encode(tokenizer, texts)

    monkeypatch.setattr(producer, "_encode", encode_then_wait)
    cache = token_cache.open_cache(src, "train", ByteTokenizer(), None)
    stream = CachedChunkStream(7, CachedChunks(cache, length, block_tokens=block))
    early = stream.next_batch(32)
    assert cache.finished is False
    gate.set()
    assert early.tokens.shape == (32, length)
    cache.wait_complete()
    n = (cache.total - 1) // length
    total = n + 50                                          # into the second epoch
    later = [stream.next_batch(32) for _ in range((total - 32) // 32)]
    grown = torch.cat([early.tokens] + [b.tokens for b in later])
    _fresh(cache)
    done = token_cache.open_cache(src, "train", ByteTokenizer(), None)
    assert done.finished
    complete = CachedChunkStream(7, CachedChunks(done, length, block_tokens=block))
    again = complete.next_batch(len(grown))
    assert torch.equal(again.tokens, grown)
    assert torch.equal(again.targets[:, :-1], again.tokens[:, 1:])
    # example g is the window the order names, inputs and next-token targets
    tokens = done.tokens
    for g in (0, 5, n - 1, n + 3):
        w = complete.chunks.order.window(7, g, n)
        assert torch.equal(again.tokens[g], torch.from_numpy(tokens[w * length:(w + 1) * length]))
    # resume (the state is the example count) and rank slices (skip) see exactly the same examples
    resumed = CachedChunkStream(0, CachedChunks(done, length, block_tokens=block))
    resumed.load_state_dict({"seed": 7, "examples": 64})
    assert torch.equal(resumed.next_batch(32).tokens, grown[64:96])
    r0 = CachedChunkStream(7, CachedChunks(done, length, block_tokens=block))
    r1 = CachedChunkStream(7, CachedChunks(done, length, block_tokens=block))
    r1.skip(16)
    assert torch.equal(torch.cat([r0.next_batch(16).tokens, r1.next_batch(16).tokens]), grown[:32])


def test_resume_through_the_runner_is_exact_on_the_cached_path(tmp_path, monkeypatch):
    """pretrain on a local corpus through the token cache (forced: the in-memory limit set to 0, blocks of 20
    windows): a run killed at step 3 and resumed from its step-2 checkpoint -- with its token cache deleted,
    so tokenising starts over -- ends with the weights of an uninterrupted run."""
    from posbench.runs import runner
    from posbench.runs.config import resolve_run_config
    from posbench.data import chunks, lm
    from posbench.train import StopTraining

    monkeypatch.setattr(lm, "IN_MEMORY_MAX_TOKENS", 0)
    monkeypatch.setattr(chunks, "BLOCK_TOKENS", 64 * 20)
    corpus = _corpus(tmp_path, n_files=2, docs=40, mean_words=150)
    sets = ["steps=6", "checkpoint_every=2", "task.eval_tokens=2048"]
    cfg = lambda: resolve_run_config("pretrain", "rope", "tiny", sets=[f"task.data={corpus}", *sets])  # noqa: E731
    whole = runner.execute(cfg(), tmp_path / "a").record.to_dict()
    assert whole["data"]["train"]["cache"] and whole["data"]["train"]["complete"]

    def kill(step, model, loss):
        if step == 3:
            raise StopTraining

    token_cache._OPEN.clear()
    with pytest.raises(StopTraining):
        runner.execute(cfg(), tmp_path / "b", callbacks=(kill,))
    import shutil

    shutil.rmtree(os.environ["POSBENCH_CACHE"])
    token_cache._OPEN.clear()
    killed = next((tmp_path / "b" / "pretrain" / "rope").iterdir())
    resumed = runner.resume(killed).record.to_dict()
    assert resumed["training"]["resumed_from"] == [2]
    assert resumed["model"]["checkpoint_sha256"] == whole["model"]["checkpoint_sha256"]
    assert resumed["metrics"]["val_ppl"]["value"] == whole["metrics"]["val_ppl"]["value"]


def test_the_last_progress_line_is_out_before_a_consumer_goes_on(tmp_path, cache_dir, monkeypatch):
    """The producer closes its bar (the final line: tokens, throughput) before it tells the consumers that the
    cache is complete, so a process that exits right after ``wait_complete`` has printed it."""
    from posbench.data.progress import DataBar, library_progress

    library_progress(True)
    closed = []
    real_close = DataBar.close

    def close(self, message=None):
        closed.append(self.description)
        real_close(self, message)

    monkeypatch.setattr(DataBar, "close", close)
    cache = token_cache.open_cache(open_source(str(_corpus(tmp_path))), "train", ByteTokenizer(), None)
    cache.wait_complete()
    assert closed, "wait_complete returned before the producer's bar was closed"
