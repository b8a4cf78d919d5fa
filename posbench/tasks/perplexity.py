"""Perplexity against evaluation length: does the encoding hold up beyond the training length?

A checkpoint (``--init RUN_DIR``, evaluated as is unless ``task.init_steps`` > 0) or a fresh model trained
exactly as ``pretrain`` trains it is evaluated on the held-out split at ``length_factors`` x the training
length (default 1, 2, 4, 8), under each protocol of ``protocols``:

* ``chunks``: non-overlapping windows (the paper's pre-training evaluation; ``ppl_<k>x``);
* ``sliding``: windows of the evaluation length every ``stride`` tokens, each token scored once with the
  context its window gives it (the LongLoRA / Hugging Face protocol; ``ppl_sliding_<k>x``). ``task.score
  =window`` scores every window entirely instead, as LongLoRA's script does.

Tokens are counted exactly (``posbench.evaluation.perplexity``); the counts are in ``result["evaluation"]``.
``compare --plots`` draws perplexity against length, one curve per encoding and protocol.
"""

from __future__ import annotations

from typing import Any

from posbench.errors import ConfigError
from posbench.data.errors import DataError
from posbench.evaluation.perplexity import PROTOCOLS, SCORING
from posbench.evaluation.perplexity import evaluate as evaluate_ppl
from posbench.results import Axis, Evaluation, Grid, Metric
from posbench.tasks._lm_common import CorpusTask
from posbench.tasks.base import DEV_CPU, H100
from posbench.tasks.pretrain import (GPU_MODEL, GPU_TASK, GPU_TRAIN, PAPER_EXPECTED, PAPER_MODEL, PAPER_TRAIN,
                                     Pretrain)


class Perplexity(CorpusTask):
    name = "perplexity"
    description = "perplexity vs evaluation length (1-8x the training length), chunked and sliding-window"
    options = {**CorpusTask.options, "length_factors": [1, 2, 4, 8], "protocols": ["chunks", "sliding"],
               "stride": 0, "score": "new", "init_steps": 0}
    option_help = {**CorpusTask.option_help,
                   "length_factors": "evaluation lengths as multiples of the training length",
                   "protocols": "chunks (non-overlapping) and/or sliding (windows every `stride` tokens)",
                   "stride": "sliding-window stride in tokens (0: half of each evaluation length)",
                   "score": "sliding windows: new (each token once) or window (every window whole, LongLoRA)",
                   "init_steps": "training steps when starting from --init (0: evaluate the checkpoint as is)"}
    presets = {
        "tiny": {**Pretrain.presets["tiny"], "task": {**Pretrain.presets["tiny"]["task"],
                                                      "length_factors": [1, 2, 4]},
                 "expected": {"seconds": 6, "hardware": DEV_CPU, "how": "measured",
                              "note": "from scratch; 3 s with --init (evaluation only); Python start-up included"}},
        "small": {**Pretrain.presets["small"], "task": {**Pretrain.presets["small"]["task"], "eval_tokens": 32768},
                  "expected": {"seconds": 42, "hardware": DEV_CPU, "how": "measured",
                               "note": "with --init a small pretrain run (36-42 s, README); from scratch add the "
                                       "pretrain small training (~230 s)"}},
        # the pretrain gpu recipe, then perplexity at 1-8x its 512 tokens over the whole held-out split
        # (372k bytes; forward passes only: seconds). ESTIMATED as pretrain's gpu preset plus ~20 s.
        "gpu": {"model": dict(GPU_MODEL), "train": dict(GPU_TRAIN),
                "task": {**GPU_TASK, "length_factors": [1, 2, 4, 8]},
                "expected": {"seconds": 290, "hardware": H100, "how": "estimated",
                             "note": "from scratch, TAPE eager (see tasks/pretrain.py); ~20 s with --init"}},
        "paper": {"model": dict(PAPER_MODEL), "train": dict(PAPER_TRAIN),
                  "task": {"data": "allenai/c4:en", "tokenizer": "bpe:32000", "eval_tokens": 4_000_000,
                           "eval_batch_size": 8, "length_factors": [1, 2, 4, 6]},
                  "expected": {**PAPER_EXPECTED, "seconds": 18600,
                               "note": "from scratch: the pretrain paper time plus ~10 min of evaluation (T5 and "
                                       "FIRE longer at 6x); with --init only the evaluation"}},
    }

    def validate(self) -> None:
        super().validate()
        bad = [p for p in self.opts["protocols"] if p not in PROTOCOLS]
        if bad or not self.opts["protocols"]:
            raise ConfigError(f"task.protocols: unknown {', '.join(bad) or '(empty)'}; valid: {', '.join(PROTOCOLS)}")
        if any(f < 1 for f in self.opts["length_factors"]) or not self.opts["length_factors"]:
            raise ConfigError(f"task.length_factors must be positive integers, got {self.opts['length_factors']}")
        if self.opts["score"] not in SCORING:
            raise ConfigError(f"task.score must be one of {', '.join(SCORING)}, got {self.opts['score']!r}")
        if self.opts["stride"] < 0:
            raise ConfigError(f"task.stride must be >= 0, got {self.opts['stride']}")
        available = len(self.eval_tokens().tokens)
        if max(self.lengths()) > available:
            raise DataError(f"the held-out text has {available} tokens, fewer than the longest evaluation length "
                            f"{max(self.lengths())}; raise task.eval_tokens or lower task.length_factors")
        if self.config.init is not None:
            # a checkpoint is evaluated as is unless asked otherwise (see the module docstring)
            self.config.train["steps"] = int(self.opts["init_steps"])

    def lengths(self) -> list[int]:
        return [int(f) * self.train_length for f in sorted(set(self.opts["length_factors"]))]

    def stride_for(self, length: int) -> int:
        stride = self.opts["stride"] or length // 2
        if stride >= length:
            raise ConfigError(f"task.stride {stride} must be smaller than every evaluation length ({length})")
        return stride

    def evaluate(self, model, device, reporter: Any) -> Evaluation:
        tokens = self.eval_tokens().tokens
        lengths = self.lengths()
        protocols = [p for p in PROTOCOLS if p in self.opts["protocols"]]
        bar = reporter.task("eval", total=len(lengths) * len(protocols), unit="length") if reporter else None
        metrics: dict[str, Metric] = {}
        grids: dict[str, Grid] = {}
        details = []
        done = 0
        for protocol in protocols:
            values = []
            for length in lengths:
                stride = self.stride_for(length) if protocol == "sliding" else None
                res = evaluate_ppl(model, tokens, length, protocol, stride=stride, score=self.opts["score"],
                                   batch_size=self.opts["eval_batch_size"], device=device)
                factor = length // self.train_length
                key = f"ppl_{factor}x" if protocol == "chunks" else f"ppl_sliding_{factor}x"
                metrics[key] = Metric(res.perplexity, None, res.tokens_scored, higher_is_better=False)
                values.append(res.perplexity)
                details.append(res.to_dict())
                done += 1
                if bar:
                    bar.update(done, length=length, ppl=res.perplexity)
            grids[f"ppl_{protocol}"] = Grid(metric="perplexity", axes=[Axis("length", lengths)], values=values,
                                            n=[d["tokens_scored"] for d in details[-len(lengths):]],
                                            higher_is_better=False,
                                            meta={"train_max": {"length": self.train_length}, "protocol": protocol})
        if bar:
            bar.close()
        first = protocols[0]
        longest = lengths[-1] // self.train_length
        primary = f"ppl_{longest}x" if first == "chunks" else f"ppl_sliding_{longest}x"
        return Evaluation(metrics=metrics, primary=primary, grids=grids,
                          info={"table_columns": list(metrics),
                                "train_length": self.train_length, "lengths": lengths, "protocols": protocols,
                                "score": self.opts["score"], "results": details,
                                "evaluated_checkpoint": "init" if self.config.init and not self.config.train["steps"]
                                else "trained in this run"})
