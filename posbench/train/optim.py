"""AdamW with warmup and linear decay."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from posbench.train.config import TrainConfig


def make_optimizer(params: nn.Module | Sequence[nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not on norms, gains and other vectors). Fused (one kernel for
    all parameters) when every parameter is a plain CUDA tensor."""
    if isinstance(params, nn.Module):
        params = list(params.parameters())
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = {"fused": True} if fusable(params) else {}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, **fused)


def fusable(params: Sequence[Tensor]) -> bool:
    if not params or not all(p.is_cuda for p in params):
        return False
    try:
        from torch.distributed.tensor import DTensor  # torch.distributed.tensor: ~1 s, CUDA parameters only
    except ImportError:  # pragma: no cover
        return True
    return not any(isinstance(p, DTensor) for p in params)     # FSDP shards keep the default (foreach)


def lr_lambda(cfg: TrainConfig) -> Callable[[int], float]:
    warmup, total, floor = cfg.warmup(), max(cfg.steps, 1), cfg.min_lr_ratio

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        remaining = max(total - warmup, 1)
        return floor + (1.0 - floor) * max(0.0, (total - step) / remaining)
    return factor


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
