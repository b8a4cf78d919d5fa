"""KERPLE (Chi, Fan, Ramadge and Rudnicky, NeurIPS 2022, "KERPLE: Kernelized Relative Positional Embedding for
Length Extrapolation", arXiv 2205.09921): a logit bias from a conditionally positive definite kernel of the
distance, learned per head.

For query position i and key position j, with d = i - j >= 0 (the causal part; future keys are masked, and d is
clamped to 0 there so the bias stays finite), the paper's two variants of the kernelised bias (its power and
logarithmic kernels, the constant offset dropped since softmax ignores it) are

    log variant:    b_h(i, j) = -r1_h * log(1 + r2_h * d)        r1_h, r2_h > 0
    power variant:  b_h(i, j) = -r1_h * d ** r2_h                r1_h > 0, 0 < r2_h <= 2

(the ranges under which the kernels are conditionally positive definite). The paper leaves open how positivity is
kept, how the parameters start and whether layers share them; the released code (``chijames/KERPLE``,
``megatron/mpu/layers.py`` ``ParallelKerpleLog`` / ``ParallelKerplePower``, built once in
``megatron/model/gpt2_model.py`` and handed to every layer) decides, and so do we:

- positivity: before every forward pass the stored parameters are clamped in place to ``r >= eps`` (and the power
  exponent to ``r2 <= 2``), eps = 0.01: projected gradient descent, so a parameter that an optimizer step pushed
  out of range comes back to the boundary and keeps receiving gradients there. We project in ``init_state``
  (once per forward pass); the bias also reads the parameters through the same clamp, so a bias asked for
  between an optimizer step and the next forward pass never uses an out-of-range value (identical values once
  projected; the clamp's gradient is the identity inside the range).
- initialisation: uniform, ``U(0, 2)`` for the log kernel's r1 and the power kernel's exponent r2, ``U(0, 1)``
  for the log kernel's r2 and the power kernel's r1 (``get_parameter(2 | 1, 'uniform')``), then the clamp.
- sharing: one KERPLE module serves every layer, so all layers share r1 and r2 (``per_layer=False``, the
  default); ``per_layer=True`` gives each layer its own pair, like this harness's T5 and FIRE.
- the bias is added to the scaled logits (after 1 / sqrt(D)), as the released code adds it after its
  ``baddbmm(..., alpha=1 / norm_factor)``.

One class with a ``variant`` option rather than two names: the two kernels share parameters, initialisation,
projection and evaluation and differ in one line; the variant is recorded with the run's options, so
``compare`` keeps ``kerple`` and ``kerple [encoding.variant=power]`` apart. The default is the log kernel, the
paper's best.

Numerics: ``log1p`` for log(1 + x); the power is ``exp(r2 log d)`` for d > 0 and 0 at d = 0, written so that
neither branch of the selection has an infinite or NaN gradient (d ** r2 at d = 0 has log 0 in its gradient with
respect to r2). The bias depends on d only (``ScoreBias(relative=True)``): materialised for the CPU over
consecutive shared positions, it is evaluated once per distinct distance, not once per score (``posbench.model.bias``).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor, nn

from posbench.model.bias import ScoreBias
from posbench.encodings.base import PositionalEncoding
from posbench.options import OneOf, Option, OptionError, positive

VARIANTS = ("log", "power")
#: the power kernel's exponent stays at most 2 (conditionally positive definite), as the released code clamps it
MAX_POWER = 2.0


def kerple_bias(head: Tensor, q_pos: Tensor, k_pos: Tensor, r1: Tensor, r2: Tensor, *, variant: str) -> Tensor:
    """The element-wise KERPLE bias; ``r1``, ``r2`` are [H] (already in range)."""
    scale, shape = r1[head], r2[head]
    distance = torch.clamp(q_pos - k_pos, min=0).to(scale.dtype)
    if variant == "log":
        return -scale * torch.log1p(shape * distance)
    positive_distance = distance > 0
    safe = torch.where(positive_distance, distance, torch.ones_like(distance))
    power = torch.where(positive_distance, torch.exp(shape * torch.log(safe)), torch.zeros_like(distance))
    return -scale * power


class KernelParameters(nn.Module):
    """r1 and r2 of one layer (or of all, when shared): [H] each, so they are vectors (no weight decay)."""

    def __init__(self, n_heads: int, r1_scale: float, r2_scale: float):
        super().__init__()
        self.r1 = nn.Parameter(torch.rand(n_heads) * r1_scale)
        self.r2 = nn.Parameter(torch.rand(n_heads) * r2_scale)


class KERPLE(PositionalEncoding):
    name = "kerple"
    description = "kernelised relative bias: -r1 log(1 + r2 |i-j|) or -r1 |i-j|^r2, r1, r2 > 0 learned per head"
    OPTIONS = {
        "variant": Option("log", "the kernel: log, -r1 log(1 + r2 d), or power, -r1 d^r2", OneOf(VARIANTS)),
        "per_layer": Option(False, "one (r1, r2) per layer (default: one pair for every layer, as the released "
                                   "code)"),
        "eps": Option(0.01, "the least value of r1 and r2 (projected before every forward pass)", positive()),
    }

    @classmethod
    def check_options(cls, options):
        if options["variant"] == "power" and options["eps"] > MAX_POWER:
            raise OptionError(f"encoding 'kerple' option eps={options['eps']!r} is out of range: the power "
                              f"variant's exponent lies in [eps, {MAX_POWER:g}], so eps must be <= {MAX_POWER:g}")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        log = self.options["variant"] == "log"
        r1_scale, r2_scale = (2.0, 1.0) if log else (1.0, 2.0)      # the released code's uniform ranges
        count = self.n_layers if self.options["per_layer"] else 1
        self.kernels = nn.ModuleList(KernelParameters(self.n_heads, r1_scale, r2_scale) for _ in range(count))
        self.project()

    def bounds(self) -> tuple[tuple[float, float | None], tuple[float, float | None]]:
        """(low, high) of r1 and of r2."""
        eps = self.options["eps"]
        return (eps, None), (eps, MAX_POWER if self.options["variant"] == "power" else None)

    @torch.no_grad()
    def project(self) -> None:
        """Clamp the stored parameters into range in place (the released code's ``.data.clamp``)."""
        (lo1, hi1), (lo2, hi2) = self.bounds()
        for kernel in self.kernels:
            kernel.r1.clamp_(min=lo1, max=hi1)
            kernel.r2.clamp_(min=lo2, max=hi2)

    def init_state(self, positions: Tensor, tokens: Tensor, memory):
        self.project()
        return None

    def parameters_of(self, layer: int) -> tuple[Tensor, Tensor]:
        """Layer ``layer``'s (r1, r2), read through the range (a no-op on projected values, gradient 1 inside)."""
        kernel = self.kernels[layer if self.options["per_layer"] else 0]
        (lo1, hi1), (lo2, hi2) = self.bounds()
        return in_range(kernel.r1, lo1, hi1), in_range(kernel.r2, lo2, hi2)

    def bias(self, layer: int, state, q, k, q_pos, k_pos) -> ScoreBias:
        return ScoreBias(partial(kerple_bias, variant=self.options["variant"]), self.parameters_of(layer),
                         relative=True)


def in_range(r: Tensor, low: float, high: float | None) -> Tensor:
    """``r`` clamped to [low, high]; the backward saves only the mask (not ``r``), so the in-place projection of the
    next forward pass cannot invalidate a graph that still holds this one."""
    inside = r >= low
    clamped = torch.where(inside, r, torch.full_like(r, low))
    if high is None:
        return clamped
    return torch.where(r <= high, clamped, torch.full_like(r, high))
