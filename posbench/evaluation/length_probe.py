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

from posbench.evaluation.perplexity import evaluate as evaluate_ppl
from posbench.evaluation.probe_names import NAME, PREFIX, factor_of, is_length_loss, probe_name

__all__ = ["NAME", "PREFIX", "factor_of", "heldout_losses", "is_length_loss", "probe_name"]


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
