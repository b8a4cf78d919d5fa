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
from posbench.evaluation.metrics import register_metric
from posbench.evaluation.outcome import Axis, Evaluation, Grid, Metric
from posbench.evaluation.perplexity import PROTOCOLS, SCORING
from posbench.evaluation.perplexity import evaluate as evaluate_ppl
from posbench.options import Each, Fractions, OneOf, Option, at_least
from posbench.tasks.corpus_task import CorpusTask


register_metric("perplexity", "ppl_{n}x", better="lower",
                description="held-out perplexity in non-overlapping chunks of n x the training length")
register_metric("perplexity", "ppl_sliding_{n}x", better="lower",
                description="held-out perplexity in sliding windows of n x the training length")


class Perplexity(CorpusTask):
    name = "perplexity"
    description = "perplexity vs evaluation length (1-8x the training length), chunked and sliding-window"
    OPTIONS = {
        **CorpusTask.OPTIONS,
        "length_factors": Option([1, 2, 4, 8], "evaluation lengths as multiples of the training length "
                                 "(fractions too: 1,1.5,2)", Fractions(at_least(1))),
        "protocols": Option(["chunks", "sliding"], "chunks (non-overlapping) and/or sliding (windows every `stride` "
                            "tokens)", Each(OneOf(PROTOCOLS))),
        "stride": Option(0, "sliding-window stride in tokens (0: half of each evaluation length)", at_least(0)),
        "score": Option("new", "sliding windows: new (each token once) or window (every window whole, LongLoRA)",
                        OneOf(SCORING)),
        "init_steps": Option(0, "training steps when starting from --init (0: evaluate the checkpoint as is)",
                             at_least(0)),
    }

    follows = {"train.steps": "task.init_steps"}         # with --init: a checkpoint is evaluated as is

    @classmethod
    def adjust(cls, sections, source) -> None:
        """A checkpoint (``--init``) is evaluated as is unless ``task.init_steps`` asks for training."""
        if source is not None:
            sections["train"]["steps"] = int(sections["task"]["init_steps"])

    def validate(self) -> None:
        super().validate()
        self.check_heldout_length()

    @classmethod
    def encoding_context(cls, options: dict[str, Any]) -> dict[str, Any]:
        """The longest evaluation as a multiple of the training length (RandPE's span covers it)."""
        return {"eval_length_factor": float(max(options["length_factors"]))}

    def factors(self) -> list[float]:
        return sorted(set(self.opts["length_factors"]))

    def stride_for(self, length: int) -> int:
        stride = self.opts["stride"] or length // 2
        if stride >= length:
            raise ConfigError(f"task.stride {stride} must be smaller than every evaluation length ({length})")
        return stride

    def evaluate(self, model, device, reporter: Any, phases: dict) -> Evaluation:
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
            for factor, length in zip(self.factors(), lengths):
                stride = self.stride_for(length) if protocol == "sliding" else None
                res = evaluate_ppl(model, tokens, length, protocol, stride=stride, score=self.opts["score"],
                                   batch_size=self.opts["eval_batch_size"], device=device,
                                   start_token=self.start_token)
                key = f"ppl_{factor:g}x" if protocol == "chunks" else f"ppl_sliding_{factor:g}x"
                metrics[key] = Metric(res.perplexity, None, res.tokens_scored)
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
        longest = f"{self.factors()[-1]:g}"
        primary = f"ppl_{longest}x" if first == "chunks" else f"ppl_sliding_{longest}x"
        return Evaluation(metrics=metrics, primary=primary, grids=grids,
                          info={"table_columns": list(metrics),
                                "train_length": self.train_length, "lengths": lengths, "protocols": protocols,
                                "score": self.opts["score"], "results": details,
                                "evaluated_checkpoint": "init" if self.source and not self.config.training.steps
                                else "trained in this run"})
