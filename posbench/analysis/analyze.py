"""``posbench analyze``: what each head of a trained run attends to, at each evaluation length, on held-out text.

For each length (a multiple of the training length), the run's model reads consecutive windows of that many
held-out tokens from the start of its held-out text (the same text its perplexity evaluation read; with
``task.start_token`` each window begins with it, as in evaluation), up to ``tokens`` tokens a length, one window
at a time, and ``posbench.analysis.heads.HeadStats`` accumulates every attention call's statistics (each layer of
each pass of the blocks) in blocks of queries. The record, ``analysis.json`` in the run directory
(``ANALYSIS_VERSION``; docs/schema.md), holds per length the statistics of every layer and head.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from posbench.analysis.heads import BLOCK, HeadStats
from posbench.analysis.record import ANALYSIS_VERSION, STATS
from posbench.runs.loaded import LoadedRun, load_run
from posbench.runs.record import ResultError, posbench_info
from posbench.runs.store import now_iso
from posbench.train.device import pick_device

FACTORS = (1, 2, 4, 8)
TOKENS = 8192


def analyze(run_dir: Path | str, factors: list[float] | None = None, tokens: int = TOKENS, block: int = BLOCK,
            device: str = "cpu", progress: Any = None, command: list[str] | None = None) -> dict[str, Any]:
    """The analysis record of the module docstring for one run (written by ``write``)."""
    loaded = load_run(run_dir, pick_device(device))
    if loaded.tokens is None:
        raise ResultError(f"{run_dir}: a {loaded.record.task} run has no held-out text to analyse (analyze reads "
                          f"pretrain and perplexity runs)")
    factors = sorted(set(factors or default_factors(loaded)))
    lengths = [int(round(f * loaded.train_length)) for f in factors]
    if min(lengths) < 2:
        raise ResultError(f"--factors {min(factors):g}: a window of {min(lengths)} token(s) at the training length "
                          f"{loaded.train_length}; a window has at least 2")
    too_long = [length for length in lengths if length > len(loaded.tokens)]
    if too_long:
        raise ResultError(f"{run_dir}: its held-out text has {len(loaded.tokens)} tokens, fewer than one window of "
                          f"{too_long[0]}; choose smaller --factors")
    started = time.perf_counter()
    out = {"analysis_version": ANALYSIS_VERSION, "run_id": loaded.record.run_id, "task": loaded.record.task,
           "encoding": loaded.record.encoding, "seed": loaded.record.seed, "train_length": loaded.train_length,
           "tokens_per_length": tokens, "block": block, "created": now_iso(), "command": list(command or []),
           "posbench": posbench_info(), "lengths": []}
    for factor, length in zip(factors, lengths):
        out["lengths"].append(analyze_length(loaded, factor, length, tokens, block, progress))
    out["layers"] = layer_names(loaded.model)
    out["seconds"] = round(time.perf_counter() - started, 3)
    return out


def default_factors(loaded: LoadedRun) -> list[float]:
    """The run's own evaluation lengths (perplexity's ``length_factors``), else 1, 2, 4, 8."""
    given = loaded.task.opts.get("length_factors") if hasattr(loaded.task, "opts") else None
    return [float(f) for f in given] if given else list(FACTORS)


def analyze_length(loaded: LoadedRun, factor: float, length: int, tokens: int, block: int, progress: Any
                   ) -> dict[str, Any]:
    model = loaded.model
    attentions = [m for m in model.modules() if hasattr(m, "observer")]
    calls: list[HeadStats] = []
    count = [0]

    def observe(q, k, bias, q_pos, k_pos):
        if count[0] == len(calls):
            calls.append(HeadStats(q.shape[1], length, loaded.train_length, block))
        calls[count[0]].add(q, k, bias, q_pos, k_pos)
        count[0] += 1

    contexts = max(1, min(tokens, len(loaded.tokens)) // length)
    device = next(model.parameters()).device
    for module in attentions:
        module.observer = observe
    try:
        with torch.no_grad():
            for c in range(contexts):
                window = loaded.tokens[c * length: (c + 1) * length].to(device)
                if loaded.start_token is not None:
                    window = torch.cat((torch.tensor([loaded.start_token], device=device), window[:-1]))
                count[0] = 0
                model(window[None])
                if progress is not None:
                    progress(length, c + 1, contexts)
    finally:
        for module in attentions:
            module.observer = None
    summaries = [stats.summary() for stats in calls]
    return {"length": length, "factor": factor, "contexts": contexts, "edges": calls[0].edges if calls else [],
            "mass": [s["mass"] for s in summaries], **{name: [s[name] for s in summaries] for name in STATS}}


def layer_names(model: Any) -> list[dict[str, int]]:
    """The attention calls of one forward pass in order: ``{"pass": r, "layer": l}`` (the depth-recurrent
    backbone runs its blocks several times)."""
    cfg = model.config
    passes = cfg.eval_recurrences or cfg.recurrences
    return [{"pass": r, "layer": i} for r in range(passes) for i in range(cfg.n_layers)]
