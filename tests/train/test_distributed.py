"""Several processes on a CPU with gloo, started as torchrun starts them: DDP and FSDP2 reach the loss curve of
one process with the same global batch, rank 0 alone writes, a checkpoint resumes at another world size, and
sharded evaluation gives the single-process metrics; a frozen rank ends the job in one line.

One two-process session (``two_ranks``, spawned once for the module) runs every job; the tests check its
outputs against single-process runs made here.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from distributed_helpers import KillAt, evaluate_fixed_model, spawn
from posbench.runs import runner
from posbench.train import distributed
from posbench.runs.config import resolve_run_config
from posbench.train import StopTraining

from encoding_helpers import one_thread  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]
# global batch 16 = one process: 2 micro-batches of 8; two processes: 1 micro-batch of 8 each
COMMON = ["steps=8", "batch_size=16", "grad_accum=2", "lr=3e-3", "warmup_steps=0", "log_every=3",
          "task.eval_samples=4"]
CHECKPOINTED = COMMON + ["checkpoint_every=4"]
NO_OFFSET = ["encoding.random_offset=false"]       # TAPE's random shift per forward pass: off, to compare
# two processes vs one: the same examples and the same gradient up to the order of float32 sums (all-reduce vs
# accumulation, the loss summed over ranks). Measured over 8 steps: losses within 9e-8 relative, DDP weights
# bitwise equal, FSDP weights within 4e-8 (its reduce-scatter averages in another order); allowed: 1e-6
LOSS_RTOL, WEIGHT_ATOL = 1e-6, 1e-6


# tiny models gain nothing from threads; torch.distributed's rendezvous on a free port of 127.0.0.1: one worker runs
# these and tests/data/test_data_cache_ranks.py's, in turn
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.xdist_group("torch-distributed")]


def only_run(root: Path, encoding: str = "rope") -> Path:
    runs = list((root / "arithmetic" / encoding).iterdir())
    assert len(runs) == 1, runs
    return runs[0]


def result(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


def weights(run_dir: Path) -> dict:
    return load_file(str(run_dir / "checkpoint" / "model.safetensors"))


def single(encoding: str, sets: list[str], out: Path, **kw):
    return runner.execute(resolve_run_config("arithmetic", encoding, "tiny", sets=sets), out, **kw)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    base = tmp_path_factory.mktemp("ranks")
    torch.set_num_threads(1)
    for name, sets in (("k1", CHECKPOINTED), ("k1f", CHECKPOINTED + ["parallel=fsdp"])):
        with pytest.raises(StopTraining):         # one process killed at step 6: checkpoint at step 4
            single("rope", sets, base / name, callbacks=(KillAt(6),))
    plan = [
        {"kind": "run", "name": "ddp", "encoding": "rope", "sets": COMMON, "out": str(base / "ddp")},
        {"kind": "run", "name": "tape", "encoding": "tape", "sets": COMMON + NO_OFFSET, "out": str(base / "tape")},
        {"kind": "run", "name": "fsdp", "encoding": "rope", "sets": COMMON + ["parallel=fsdp"],
         "out": str(base / "fsdp")},
        {"kind": "run", "name": "killed", "encoding": "rope", "sets": CHECKPOINTED, "out": str(base / "k2"),
         "kill_at": 6},
        {"kind": "run", "name": "killed_fsdp", "encoding": "rope", "sets": CHECKPOINTED + ["parallel=fsdp"],
         "out": str(base / "k2f"), "kill_at": 6},
        {"kind": "resume", "name": "resumed", "run_dir": str(only_run(base / "k1"))},
        {"kind": "resume", "name": "resumed_fsdp", "run_dir": str(only_run(base / "k1f"))},
        {"kind": "evaluate", "name": "eval", "encoding": "rope", "sets": ["task.eval_samples=6"]},
        {"kind": "ddp_probe", "name": "probe"},
    ]
    spawn(2, plan, base)
    return base


def outputs(base: Path, name: str) -> list[dict]:
    return [json.loads((base / f"{name}.rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    base = tmp_path_factory.mktemp("one")
    torch.set_num_threads(1)
    return {"rope": single("rope", COMMON, base / "rope").run_dir,
            "tape": single("tape", COMMON + NO_OFFSET, base / "tape").run_dir}


def assert_same_training(many: Path, one: Path) -> None:
    a, b = result(many)["training"], result(one)["training"]
    steps_a, losses_a = np.array(a["loss_history"]).T
    steps_b, losses_b = np.array(b["loss_history"]).T
    assert list(steps_a) == list(steps_b) == list(range(1, 9))
    np.testing.assert_allclose(losses_a, losses_b, rtol=LOSS_RTOL)
    assert (a["tokens"], a["target_tokens"]) == (b["tokens"], b["target_tokens"])   # the same examples
    wa, wb = weights(many), weights(one)
    assert wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=0, atol=WEIGHT_ATOL)


@pytest.mark.slow  # two_ranks: two processes, nine runs
def test_two_processes_reach_the_loss_curve_of_one_and_write_one_result(two_ranks, one_rank):
    run_dir = only_run(two_ranks / "ddp")                      # exactly one run directory, one result
    ranks = outputs(two_ranks, "ddp")
    assert [r["main"] for r in ranks] == [True, False] and ranks[0]["run_dir"] == ranks[1]["run_dir"] == str(run_dir)
    assert sorted(p.name for p in run_dir.iterdir() if p.name != "code.patch") == [   # a changed checkout's patch
        "checkpoint", "config.json", "predictions.jsonl", "result.json"]
    assert not list(run_dir.parent.parent.parent.glob("**/*.tmp"))
    parallel = result(run_dir)["training"]["parallel"]
    assert parallel == {"mode": "ddp", "backend": "gloo", "world_size": 2, "global_batch": 16,
                        "micro_batch_per_rank": 8, "grad_accum_per_rank": 1, "data_sharding": "examples"}
    assert_same_training(run_dir, one_rank["rope"])
    assert result(run_dir)["metrics"] == result(one_rank["rope"])["metrics"]
    assert (run_dir / "predictions.jsonl").read_text() == (one_rank["rope"] / "predictions.jsonl").read_text()


@pytest.mark.slow  # two_ranks
def test_tape_trains_under_ddp_without_searching_for_unused_parameters(two_ranks, one_rank):
    assert_same_training(only_run(two_ranks / "tape", "tape"), one_rank["tape"])
    probe = outputs(two_ranks, "probe")[0]
    # DDP is built without find_unused_parameters and registers no hook for TAPE's last layer (frozen)
    assert probe["find_unused_parameters"] is False
    assert probe["unregistered"] and all(n.startswith("encoding.layers.1.") for n in probe["unregistered"])
    # the same model with those parameters left trainable fails on DDP's second step: the freeze is what works
    assert "finished reduction in the prior iteration" in probe["unfrozen"]


@pytest.mark.slow  # two_ranks
def test_fsdp2_on_cpu_with_gloo_matches_one_process(two_ranks, one_rank):
    run_dir = only_run(two_ranks / "fsdp")
    assert result(run_dir)["training"]["parallel"]["mode"] == "fsdp"
    assert_same_training(run_dir, one_rank["rope"])


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
@pytest.mark.slow  # two_ranks
def test_resume_at_another_world_size(two_ranks, one_rank, mode):
    # the checkpoints hold full, name-keyed weights and optimizer state: two processes killed at step 6 ->
    # resumed by one; one process killed at 6 -> resumed by two (under FSDP: sharded from the full state)
    suffix = "f" if mode == "fsdp" else ""
    killed = only_run(two_ranks / f"k2{suffix}")
    assert not (killed / "result.json").exists()
    assert json.loads((killed / "checkpoint" / "train_state.json").read_text())["step"] == 4
    done = runner.resume(killed)
    resumed_by_two = only_run(two_ranks / f"k1{suffix}")
    for run_dir, world in ((killed, 1), (resumed_by_two, 2)):
        training = result(run_dir)["training"]
        assert training["resumed_from"] == [4] and training["steps"] == 8
        assert training["parallel"]["world_size"] == world
        assert training["parallel"]["mode"] == (mode if world == 2 else "none")
        assert_same_training(run_dir, one_rank["rope"])
    assert done.record.to_dict()["metrics"] == result(one_rank["rope"])["metrics"]


@pytest.mark.slow  # two_ranks
def test_sharded_evaluation_equals_one_process(two_ranks):
    mine = evaluate_fixed_model({"encoding": "rope", "sets": ["task.eval_samples=6"]})
    for theirs in outputs(two_ranks, "eval"):               # every rank gathers the whole result
        assert theirs["metrics"] == mine["metrics"] and theirs["grid"] == mine["grid"]
        assert theirs["predictions"] == mine["predictions"]
        assert theirs["nll"] == mine["nll"] and theirs["scored"] == mine["scored"]   # bitwise: same batches


@pytest.mark.slow  # torchrun: two fresh processes
def test_torchrun_command_line(tmp_path):
    """``python -m torch.distributed.run --nproc_per_node 2 -m posbench run ...``: one result, printed once."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "posbench",
           "run", "-e", "rope", "-t", "arithmetic", "-p", "tiny", "--device", "cpu", "-o", str(out), "-q",
           "--steps", "4", "--set", "batch_size=8"]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("arithmetic / rope") == 1, proc.stdout
    run_dir = only_run(out)
    assert result(run_dir)["training"]["parallel"]["world_size"] == 2
    assert result(run_dir)["command"][:2] == ["posbench", "run"]


def test_batch_plan():
    class Skippable:
        def skip(self, n):
            pass
    plan = distributed.plan_batches(512, 2, 1, Skippable())
    assert (plan.micro_batch, plan.grad_accum, plan.sharding) == (256, 2, "none")
    plan = distributed.plan_batches(512, 2, 2, Skippable())      # 256 per rank: one micro-batch of 256
    assert (plan.micro_batch, plan.grad_accum, plan.sharding) == (256, 1, "examples")
    plan = distributed.plan_batches(512, 8, 2, Skippable())      # the device holds 64: 4 x 64 per rank
    assert (plan.micro_batch, plan.grad_accum) == (64, 4)
    plan = distributed.plan_batches(48, 1, 8, Skippable())       # 6 per rank
    assert (plan.micro_batch, plan.grad_accum) == (6, 1)
    plan = distributed.plan_batches(64, 2, 4, object())          # rows of every micro-batch
    assert (plan.micro_batch, plan.grad_accum, plan.sharding) == (8, 2, "rows")
    from posbench.errors import ConfigError
    with pytest.raises(ConfigError, match="does not split over 3"):
        distributed.plan_batches(64, 1, 3, Skippable())
    with pytest.raises(ConfigError, match="multiple of 3"):
        distributed.plan_batches(64, 2, 3, object())


def test_assign_balances_and_covers_every_item():
    parts = distributed.assign(list(range(10)), 3, cost=lambda x: x)
    assert sorted(i for p in parts for i in p) == list(range(10))
    loads = [sum(p) for p in parts]
    assert max(loads) <= sum(loads) / 3 + 9          # largest first: at most the mean plus one item
    assert [len(p) for p in distributed.assign(list(range(10)), 3)] == [4, 3, 3]


FROZEN_RANK = """
import os, signal, sys
rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=port, POSBENCH_DIST_TIMEOUT="5")
import time
import torch
torch.set_num_threads(1)
import posbench.runs.runner, posbench.tasks.arithmetic            # the slow imports, before the ranks meet
from posbench.train import trainer
open(f"{out}.ready{rank}", "w").close()                           # both ready: joining the group takes seconds,
while not os.path.exists(f"{out}.ready{1 - rank}"):              # not the import time of a loaded machine
    time.sleep(0.05)
step = trainer.Trainer.step
def step_then_freeze(self, i):
    if rank == 1 and i == 2:                      # rank 1 stops dead before its third step (as SIGSTOP does)
        os.kill(os.getpid(), signal.SIGSTOP)
    return step(self, i)
trainer.Trainer.step = step_then_freeze
from posbench.cli import main
sys.exit(main(["run", "-e", "rope", "-t", "arithmetic", "-p", "tiny", "--device", "cpu", "-o", out, "-q",
               "--steps", "6", "--set", "batch_size=8"]))
"""


@pytest.mark.slow  # two ranks, one waits for its timeout
def test_a_frozen_rank_ends_the_job_in_one_line_naming_it(tmp_path):
    """Rank 1 is SIGSTOPped mid-training; rank 0's next collective times out (POSBENCH_DIST_TIMEOUT=5 s) and
    it stops with one line naming rank 1 and exit code 1 (on main it waited torch's 30 minutes)."""
    from distributed_helpers import free_port

    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, "-c", FROZEN_RANK, str(r), port, str(tmp_path / "out")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        _, err = ranks[0].communicate(timeout=240)
    finally:
        ranks[1].kill()                           # SIGKILL ends a stopped process too
        ranks[1].communicate()
        ranks[0].kill()
    lines = err.strip().splitlines()
    assert ranks[0].returncode == 1 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith("error: rank 1 of 2 stopped answering") and "POSBENCH_DIST_TIMEOUT" in lines[0]
