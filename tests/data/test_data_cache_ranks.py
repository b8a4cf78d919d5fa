"""Two torchrun-style processes (gloo) pretraining through one token cache: one process tokenises, the other
waits on the cache's files, and each reads its own slice of every step's batch -- the run matches a single
process (losses within the float32 tolerance of tests/train/test_distributed.py, the same data hash)."""

import json
import os
from pathlib import Path

import pytest
import torch

from data_standins import documents
from distributed_helpers import free_port
from posbench.runs import runner
from posbench.runs.config import resolve_run_config
from posbench.data import chunks, lm, token_cache

SETS = ["steps=6", "batch_size=8", "grad_accum=1", "lr=3e-3", "warmup_steps=0", "log_every=2",
        "task.eval_tokens=2048"]
LOSS_RTOL = 1e-6

# torch.distributed's rendezvous on a free port of 127.0.0.1: one worker runs these and tests/train/test_distributed.py's
pytestmark = pytest.mark.xdist_group("torch-distributed")


def _force_cache():
    lm.IN_MEMORY_MAX_TOKENS = 0                 # the cached path for this small corpus
    chunks.BLOCK_TOKENS = 64 * 24               # several blocks


def _config(corpus: str):
    return resolve_run_config("pretrain", "rope", "tiny", sets=[f"task.data={corpus}", *SETS])


def worker(rank: int, world: int, port: int, corpus: str, out: str, cache: str, result: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), POSBENCH_CACHE=cache)
    torch.set_num_threads(1)
    from posbench.train import distributed

    _force_cache()
    try:
        outcome = runner.execute(_config(corpus), out)
        if outcome.main:
            Path(result).write_text(json.dumps(outcome.record.to_dict()))
    finally:
        distributed.shutdown()


@pytest.mark.slow
def test_two_ranks_share_one_cache_and_match_one_process(tmp_path, monkeypatch):
    import torch.multiprocessing as mp

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(2):
        (corpus / f"part-{i}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                                        for t in documents(60, i, mean_words=150)))
    monkeypatch.setattr(lm, "IN_MEMORY_MAX_TOKENS", 0)
    monkeypatch.setattr(chunks, "BLOCK_TOKENS", 64 * 24)
    monkeypatch.setenv("POSBENCH_CACHE", str(tmp_path / "cache1"))
    monkeypatch.setattr(token_cache, "_OPEN", {})
    torch.set_num_threads(1)
    one = runner.execute(_config(str(corpus)), tmp_path / "one").record.to_dict()
    assert one["data"]["train"]["cache"]
    mp.start_processes(worker, args=(2, free_port(), str(corpus), str(tmp_path / "two"), str(tmp_path / "cache2"),
                                     str(tmp_path / "two.json")), nprocs=2, start_method="spawn")
    two = json.loads((tmp_path / "two.json").read_text())
    assert two["training"]["parallel"]["world_size"] == 2 and two["training"]["parallel"]["data_sharding"] == "examples"
    assert two["data"]["hash"] == one["data"]["hash"] and two["data"]["train"]["tokens"] == one["data"]["train"]["tokens"]
    losses_one = [l for _, l in one["training"]["loss_history"]]
    losses_two = [l for _, l in two["training"]["loss_history"]]
    assert losses_two == pytest.approx(losses_one, rel=LOSS_RTOL)
    caches = list((tmp_path / "cache2").glob("tokens/*/train-*/complete.json"))
    assert len(caches) == 1                                      # one cache, written once, read by both ranks
