"""Run posbench in several CPU processes joined with gloo, as torchrun would, from a test.

``spawn(world, plan, tmp)`` starts ``world`` processes with torchrun's environment variables (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT); each runs ``worker``, which joins the process group through
posbench's own ``distributed.setup`` (inside ``runner.execute``) and performs the plan's jobs in order.
Each job writes what the test checks as JSON under ``tmp`` (``<name>.rank<r>.json``).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(world: int, plan: list[dict[str, Any]], tmp: Path) -> None:
    import torch.multiprocessing as mp

    mp.start_processes(worker, args=(world, free_port(), plan, str(tmp)), nprocs=world, start_method="spawn")


class KillAt:
    """A callback that stops training at ``step`` as a kill would (no checkpoint)."""

    def __init__(self, step: int):
        self.step = step

    def __call__(self, step, model, loss):
        from posbench.train import StopTraining

        if step == self.step:
            raise StopTraining


def worker(rank: int, world: int, port: int, plan: list[dict[str, Any]], tmp: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch

    torch.set_num_threads(1)
    from posbench.train import distributed

    try:
        for job in plan:
            out = JOBS[job["kind"]](job)
            if out is not None:
                Path(tmp, f"{job['name']}.rank{rank}.json").write_text(json.dumps(out))
    finally:
        distributed.shutdown()


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """``runner.execute`` of an arithmetic config; ``kill_at`` stops it like a kill."""
    from posbench.runs import runner
    from posbench.train import distributed
    from posbench.runs.config import resolve_run_config
    from posbench.train import StopTraining

    config = resolve_run_config(job.get("task", "arithmetic"), job["encoding"], "tiny", sets=job["sets"])
    callbacks = (KillAt(job["kill_at"]),) if job.get("kill_at") else ()
    try:
        outcome = runner.execute(config, job["out"], callbacks=callbacks)
    except StopTraining:
        return {"killed": True, "rank": distributed.current().rank}
    return {"main": outcome.main, "run_dir": str(outcome.run_dir), "rank": distributed.current().rank}


def resume_job(job: dict[str, Any]) -> dict[str, Any]:
    from posbench.runs import runner

    outcome = runner.resume(job["run_dir"])
    return {"main": outcome.main, "run_dir": str(outcome.run_dir)}


def evaluate_job(job: dict[str, Any]) -> dict[str, Any]:
    """``evaluate_fixed_model`` with the work split across the processes."""
    import torch

    from posbench.train import distributed

    distributed.setup(torch.device("cpu"))
    return evaluate_fixed_model(job)


def evaluate_fixed_model(job: dict[str, Any]) -> dict[str, Any]:
    """A fixed (untrained, seeded) model evaluated by the arithmetic task and by perplexity."""
    import torch

    from posbench.runs.config import resolve_run_config
    from posbench.train.seeds import seed_everything
    from posbench.evaluation.perplexity import evaluate as evaluate_ppl
    from posbench.model import Transformer
    from posbench.reporters import NullReporter
    from posbench.tasks import TASKS

    cfg = resolve_run_config("arithmetic", job["encoding"], "tiny", sets=job["sets"])
    task = TASKS["arithmetic"](cfg)
    seed_everything(3)
    model = Transformer(task.model_config()).eval()
    with torch.no_grad():
        ev = task.evaluate(model, torch.device("cpu"), NullReporter(), {})
        tokens = torch.randint(0, 18, (1000,), generator=torch.Generator().manual_seed(0))
        ppl = evaluate_ppl(model, tokens, 16, "sliding", stride=8, batch_size=3)
    return {"metrics": {k: m.to_dict() for k, m in ev.metrics.items()},
            "predictions": [p["prediction"] for p in ev.predictions],
            "grid": ev.grids["accuracy"].values, "nll": ppl.nll_sum, "scored": ppl.tokens_scored}


def ddp_probe_job(job: dict[str, Any]) -> dict[str, Any]:
    """What DDP registered for TAPE, and what happens when TAPE's unused parameters are not frozen."""
    import torch

    from posbench.train import distributed
    from posbench.train.seeds import seed_everything
    from posbench.model import ModelConfig, Transformer

    distributed.setup(torch.device("cpu"))
    cfg = dict(vocab_size=18, d_model=32, n_layers=2, n_heads=2, max_seq_len=16, encoding="tape",
               encoding_options={"random_offset": False})
    seed_everything(0)
    model = Transformer(ModelConfig(**cfg))
    replica = distributed.wrap(model, torch.device("cpu"), "ddp")
    registered = {n for n, p in model.named_parameters() if any(p is q for q in replica.parameters())}
    report = {"find_unused_parameters": replica.module.find_unused_parameters,
              "unregistered": sorted({n for n, _ in model.named_parameters()} - registered)}
    tokens = torch.randint(0, 18, (2, 12), generator=torch.Generator().manual_seed(1))
    seed_everything(0)
    unfrozen = Transformer(ModelConfig(**cfg))
    for p in unfrozen.parameters():
        p.requires_grad_(True)                       # as if init_weights() had not frozen them
    ddp = distributed.wrap(unfrozen, torch.device("cpu"), "ddp").module
    try:
        for _ in range(2):
            ddp(tokens).float().logsumexp(-1).mean().backward()
        report["unfrozen"] = "trained"
    except RuntimeError as exc:
        report["unfrozen"] = str(exc).splitlines()[0]
    return report


JOBS = {"run": run_job, "resume": resume_job, "evaluate": evaluate_job, "ddp_probe": ddp_probe_job}
