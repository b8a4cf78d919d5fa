"""The optimisation recipe of a run (the ``train`` section of its configuration)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from posbench import options as opts
from posbench.options import Added, OneOf, Switch, at_least, option, positive

PRECISIONS = ("auto", "fp32", "bf16")
PARALLEL_MODES = ("ddp", "fsdp")


@dataclass
class TrainConfig:
    """Defaults follow the TAPE paper's (HF Trainer) recipe: AdamW (0.9, 0.999, eps 1e-8), weight decay 0.01,
    linear warmup over ``warmup_ratio`` of the steps, linear decay to ``min_lr_ratio * lr``, gradient clipping
    at 1.0.

    ``batch_size`` is the global batch of one optimizer step and ``grad_accum`` splits it for one device;
    with several processes the per-process micro-batch and accumulation are derived from them
    (``distributed.plan_batches``). Every field is an option (``posbench.options.option``: default, help,
    range), checked when the config is built."""

    steps: int = option(1000, "optimizer steps", at_least(0))
    batch_size: int = option(64, "sequences per optimizer step (split into grad_accum micro-batches)", at_least(1))
    grad_accum: int = option(1, "micro-batches per optimizer step", at_least(1))
    lr: float = option(1e-4, "the peak learning rate", positive())
    warmup_ratio: float = option(0.02, "linear warmup over this share of the steps", opts.between(0, 1))
    warmup_steps: int = option(-1, "warmup steps; >= 0 overrides warmup_ratio", at_least(-1))
    min_lr_ratio: float = option(0.0, "the learning rate decays linearly to min_lr_ratio x lr", opts.between(0, 1))
    weight_decay: float = option(0.01, "AdamW's weight decay (matrices only)", at_least(0))
    beta1: float = option(0.9, "AdamW's beta1", opts.Bound(0, 1, high_strict=True))
    beta2: float = option(0.999, "AdamW's beta2", opts.Bound(0, 1, high_strict=True))
    eps: float = option(1e-8, "AdamW's epsilon", positive())
    grad_clip: float = option(1.0, "gradient-norm clipping (0: none)", at_least(0))
    checkpoint_every: int = option(0, "steps between checkpoints (0: only at the end)", at_least(0),
                                   changes_results=False)
    log_every: int = option(50, "steps between reads of the loss from the device (and plain progress lines)",
                            at_least(1), changes_results=False)
    probe_every: int = option(0, "steps between probes of the task's in-distribution metric during training (0: "
                              "none; a task without a probe ignores it)", at_least(0), changes_results=False,
                              added=Added(2, 0))
    precision: str = option("auto", "auto (bf16 autocast on CUDA, fp32 elsewhere), fp32 or bf16", OneOf(PRECISIONS))
    compile: Any = option("auto", "torch.compile: auto (on for CUDA, off elsewhere), true or false", Switch(),
                          changes_results=False)
    parallel: str = option("ddp", "several processes: ddp (replicas) or fsdp (FSDP2 shards)", OneOf(PARALLEL_MODES))
    threads: int = option(0, "CPU threads (0: the cores the process may run on, shared among torchrun's ranks)",
                          at_least(0), changes_results=False)
    checkpointing: bool = option(False, "recompute each block's activations in the backward pass (less memory)",
                                 added=Added(2, False))

    def __post_init__(self):
        opts.check_fields(self, "train")
        if self.batch_size % self.grad_accum:
            raise opts.OptionError(f"train.batch_size {self.batch_size} must be a multiple of train.grad_accum "
                                   f"{self.grad_accum}")

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return {f.name: f.default for f in dataclasses.fields(cls)}

    @property
    def micro_batch(self) -> int:
        return self.batch_size // self.grad_accum

    def warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps >= 0 else int(round(self.warmup_ratio * self.steps))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
