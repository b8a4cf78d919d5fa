"""Extrapolation over training: held-out loss at every evaluation length, measured while the model trains.

A language-model task's probe (``train.probe_every``) scores the same fixed sample, the first
``task.probe_tokens`` tokens of the held-out split, in non-overlapping windows of each evaluation length (1x,
2x, ... the training length), and records the mean negative log-likelihood (nats per token) of each as
``nll_<k>x`` in ``training.probe_history``. The text is the same at every length: only the context the windows
give each token differs, so the gap between ``nll_8x`` and ``nll_1x`` at a step is what eight times the context
costs the model at that point of its training. The probe runs in eval mode under ``no_grad`` with torch's random
state forked (``posbench.train.trainer``): a run trains bitwise alike with it or without it.

These values are losses (lower is better), not the percentages an arithmetic probe records, so the plateau rule
(``posbench.report.plateau``) judges such runs on their training loss, as it does runs without a probe.
"""

from __future__ import annotations

import re

from posbench.evaluation.perplexity import evaluate as evaluate_ppl

PREFIX = "nll_"
NAME = re.compile(r"nll_([0-9]+(?:\.[0-9]+)?)x")


def probe_name(factor: float) -> str:
    """``nll_2x`` for 2 (``nll_1.5x`` for 1.5)."""
    return f"{PREFIX}{factor:g}x"


def is_length_loss(name: str) -> bool:
    """Whether a probe value is one of this probe's losses (not a percentage)."""
    return NAME.fullmatch(name) is not None


def factor_of(name: str) -> float:
    """The length factor of a probe value's name (``nll_4x`` -> 4.0)."""
    found = NAME.fullmatch(name)
    if found is None:
        raise ValueError(f"'{name}' is not a held-out loss of the length probe")
    return float(found.group(1))


def heldout_losses(model, tokens, lengths: dict[float, int], *, device, batch_size: int,
                   start_token: int | None) -> dict[str, float]:
    """``{nll_<k>x: mean NLL}`` of ``tokens`` in chunks of each length (``{factor k: length in tokens}``), scored
    by this process alone."""
    out = {}
    for factor, length in lengths.items():
        res = evaluate_ppl(model, tokens, length, "chunks", batch_size=batch_size, device=device,
                           start_token=start_token, local=True)
        out[probe_name(factor)] = res.mean_nll
    return out
