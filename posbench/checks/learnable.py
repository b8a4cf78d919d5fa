"""Can each learned position parameter learn within a preset's budget? (``posbench check ENCODING``)

An encoding whose learned parameters start so small, or are scaled so little, that the whole training budget
cannot move the attention logits by a unit ranks the harness, not the encoding (T5's bias drawn from N(0, 0.02)
moved its near-minus-far bias by at most 0.4 logits in 300 steps). A *position parameter* is one learned unit of
the encoding: the parameters of one element of a per-layer list (T5's table of a layer, FIRE's MLP with its c and
L of a layer, DAPE's MLP of a layer, KERPLE's (r1, r2), TAPE's updates of a layer), or a parameter outside such a
list (CoPE's embeddings, Abacus's table). On a model of the preset's shape (its own options, the task's context)
and one sequence of random tokens at the training length, in evaluation mode, for each:

- **effect**: how much it shapes the attention now: the largest change, when it is set to zero, of any logit
  relative to its row's diagonal (``s[i, j] - s[i, i]`` for every layer, head, query i and visible key j: a
  change that moves a whole row alike changes no attention weight, so it does not count);
- **reach**: how far the budget can move that. Adam moves an element by about its learning rate per step at
  most, so over the budget by the summed learning rate S = the sum over steps of lr x schedule(step) (its
  parameter group's). Every parameter of the encoding is moved by S per element at once, each element in the
  direction that widens the logits' near-minus-far gap (the sign of its gradient; +1 where the gradient is zero,
  so a parameter behind a zero-initialised one still moves), and the reach of a position parameter is the
  largest change its own move makes (everything moved, against everything but it moved), measured as the
  effect is. For a bias table entry with a fixed scale this is up to 2 x S x the scale (the entry of the
  diagonal and the entry of a far key each move S x the scale, in opposite directions).

An encoding that adds to the token embeddings (its ``embed`` hook: Abacus) acts on the attention only through
the model's own normalised projections, which bound every logit at initialisation whatever the input; its units
are measured where they act instead: the largest change of what it adds to a token's embedding, in units of the
token embeddings' root mean square (the rule's one unit is then "as large as a token embedding").

A position parameter that only scales what it already does (a **gain**: a learned temperature, a per-head
multiplier of a fixed bias) cannot create a pattern, only make its own larger or smaller, so it is judged by its
**relative change**: where it first acts (the first layer whose logits it changes; the layers after that see it
through the hidden states), the change its move makes is, head by head, its contribution (what setting it to zero
takes away) times a number, and the relative change is the largest of those numbers (a gain g moved by S: S / |g|).
A unit that starts at zero contributes nothing to scale and is never a gain.

Before any of that, each trainable tensor's gradient is taken twice, of the visible logits weighed by fixed random
numbers (so that no change of a logit cancels): at the initial values and with every parameter moved as above (a
tensor behind a zero-initialised one, TAPE's ``x_proj`` behind its ``up_proj``, has a zero gradient at the first
only). A tensor whose gradient is exactly zero at both is cut off from training (``p.detach()``, ``p.data``,
``0 * p``): the optimizer can never move it, whatever its reach.

The rule: a position parameter **fails** when it is frozen but changes the attention, when the optimizer skips
one of its tensors, when a tensor's gradient is exactly zero at both points, when it is a gain whose relative
change is below ``MIN_RELATIVE`` = 0.1, or, when it is not a gain, when its reach is below ``MIN_REACH`` = 1
logit. One that is frozen and changes nothing (TAPE's last layer, whose state is discarded) passes as unused. A
parameter with no elements (a size-0 tensor) has nothing to learn: it is named in one line and not measured.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch import Tensor

import posbench.model.transformer as transformer
from posbench.checks.outcome import CheckFailed, Report
from posbench.encodings import ENCODINGS
from posbench.encodings.base import PositionalEncoding
from posbench.model import Transformer
from posbench.model.bias import ScoreBias
from posbench.runs.config import resolve_run_config
from posbench.tasks import TASKS
from posbench.train.optim import lr_lambda, make_optimizer

#: the least reach (logits) a learned position parameter must have within the budget
MIN_REACH = 1.0
#: the least relative change a gain must have within the budget (S / |g| for a gain g)
MIN_RELATIVE = 0.1
#: a gain's move must equal its contribution times a number to this fraction of the move's largest change
PARALLEL = 1e-3


def default_task(encoding_cls: Any) -> str:
    """The task a check's budget comes from: perplexity, or the first that gives what the encoding needs."""
    for name in ("perplexity", *TASKS):
        task = TASKS[name]
        context = task.encoding_context(task.defaults())
        if task.model_source.builds and all(key in context for key in encoding_cls.task_context):
            return name
    raise CheckFailed(f"no task gives {', '.join(encoding_cls.task_context)}, which the encoding needs")


def summed_lr(train: Any) -> float:
    """Sum over the budget's steps of the learning rate times its schedule (warmup, then the decay)."""
    factor = lr_lambda(train)
    return train.lr * sum(factor(step) for step in range(train.steps))


def check_learnable(report: Report, name: str, task: str | None = None, preset: str | None = None,
                    sets: tuple[str, ...] = ()) -> None:
    """One check per learned parameter of encoding ``name`` (see the module docstring), within the budget of
    ``task``'s ``preset`` (default: perplexity, or the first task that gives what the encoding needs; the task's
    default preset), with ``sets`` (``--set``) applied to that run configuration as ``posbench run`` applies them."""
    cls = ENCODINGS.get(name)
    task = task or default_task(cls)
    config = resolve_run_config(task, name, preset, sets=list(sets))
    train = config.training
    shape = TASKS[task](config).model_config()          # the preset's model, as the task builds it
    shape.attention = "eager"
    shape.encoding_options = {**shape.encoding_options, **cls.deterministic_options}
    torch.manual_seed(0)
    model = Transformer(shape).eval()
    params = dict(model.encoding.named_parameters())
    empty = [f"{n} {list(p.shape)}" for n, p in params.items() if not p.numel()]
    if empty:                   # a size-0 tensor: nothing to move, nothing to measure
        report.run("parameters with no elements", lambda: f"{', '.join(empty)}: nothing to learn, not measured")
    params = {n: p for n, p in params.items() if p.numel()}
    if not params:              # nothing learned, nothing to check
        return
    length = model.config.max_seq_len
    tokens = torch.randint(0, shape.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    groups = {id(p): group for group in make_optimizer(model, train).param_groups for p in group["params"]}
    budget = f"{task} preset '{config.preset}'{' with ' + ', '.join(sets) if sets else ''}: {train.steps} steps"
    factor = summed_lr(train) / train.lr if train.lr else 0.0
    trainable = {n: p for n, p in params.items() if p.requires_grad}
    moved = moved_parameters(params, gradients(model, trainable, tokens),
                             {n: factor * groups[id(p)]["lr"] for n, p in trainable.items() if id(p) in groups})
    at_start = gradients(model, trainable, tokens, weighed=True)
    with replaced(params, moved):
        after_move = gradients(model, trainable, tokens, weighed=True)
    cut_off = {n for n in trainable if all(g is None or not g.any() for g in (at_start[n], after_move[n]))}
    on_embeddings = type(model.encoding).embed is not PositionalEncoding.embed
    measure = partial(added_to_embeddings if on_embeddings else logits_of, model, tokens)
    change = largest_embedding_change if on_embeddings else largest_change
    unit_name = "token-embedding RMS" if on_embeddings else "logits"
    with torch.no_grad():
        base = measure()
        with replaced(params, moved):
            all_moved = measure()
        for unit, names in position_parameters(params).items():
            zeros = {n: torch.zeros_like(params[n]) for n in names}
            with replaced(params, zeros):
                effect = change(measure(), base)
            with replaced(params, {**moved, **{n: params[n].detach() for n in names}}):
                unmoved = measure()
            reach = change(all_moved, unmoved)
            step = max((moved[n] - params[n]).abs().max().item() for n in names)
            relative = None
            if step > 0:                # moved at all (not frozen, not skipped): is it a gain?
                with replaced(params, {**moved, **zeros}):
                    relative = gain_change(all_moved, unmoved, measure(), per_head=not on_embeddings)
            frozen = all(not params[n].requires_grad for n in names)
            skipped = [n for n in names if params[n].requires_grad and id(params[n]) not in groups]
            dead = [n for n in names if n in cut_off]
            report.run(f"learns {unit} within the {budget}",
                       lambda e=effect, r=reach, s=step, f=frozen, k=skipped, d=dead, g=relative:
                       verdict(e, r, s, f, k, unit_name, cut_off=d, relative=g))


def position_parameters(params: dict[str, Tensor]) -> dict[str, list[str]]:
    """The encoding's learned units: parameter names grouped by the element of a per-layer list they belong to
    (``layers.0.mlp.0.weight`` -> ``layers.0``), a parameter outside any list alone (``pos_emb``)."""
    units: dict[str, list[str]] = {}
    for name in params:
        parts = name.split(".")
        index = next((i for i, part in enumerate(parts) if part.isdigit()), None)
        unit = ".".join(parts[:index + 1]) if index is not None else parts[0]
        units.setdefault(unit, []).append(name)
    return units


def verdict(effect: float, reach: float, step: float, frozen: bool, skipped: list[str], unit: str = "logits",
            cut_off: list[str] = (), relative: float | None = None) -> str:
    """The line of one position parameter (see the module docstring): its measurements when it passes, else
    ``CheckFailed`` saying which rule it breaks and what would mend it. ``cut_off``: its tensors whose gradient is
    exactly zero at both points; ``relative``: its relative change when it is a gain, None when it is not."""
    detail = f"effect {effect:.3g} {unit}, reach {reach:.3g} (every element moved {step:.3g})"
    if relative is not None:
        detail = f"a gain: relative change {relative:.3g}, " + detail
    if frozen:
        if max(effect, reach) > 0:
            raise CheckFailed(f"frozen (requires_grad=False) but it changes the attention: {detail}")
        return "unused: frozen, and it changes no attention weight"
    if skipped:
        raise CheckFailed(f"the optimizer skips {', '.join(skipped)}: {detail}")
    if cut_off:
        raise CheckFailed(f"the gradient of {', '.join(cut_off)} is exactly zero, at the initial values and with "
                          f"every parameter moved: training never moves it (is it detached, read through .data, or "
                          f"multiplied by zero?): {detail}")
    if relative is not None:
        if not relative >= MIN_RELATIVE:
            raise CheckFailed(f"a gain the budget can change by at most {relative:.3g} of itself (< {MIN_RELATIVE:g}):"
                              f" {detail}; learn it as a fixed factor times a gain that starts at 1, or learn its "
                              f"logarithm")
        return detail
    if not reach >= MIN_REACH:
        raise CheckFailed(f"the budget can move its effect by at most {reach:.3g} {unit} (< {MIN_REACH:g}): "
                          f"{detail}; initialise or scale it as its authors release it")
    return detail


def gradients(model, trainable: dict[str, Tensor], tokens: Tensor, weighed: bool = False) -> dict[str, Tensor | None]:
    """The gradient for each trainable parameter (None: none reaches it) of the logits' near-minus-far gap, or
    (``weighed``) of the visible logits weighed by fixed random numbers: zero there only for a parameter that
    the logits do not depend on (one the near-minus-far gap ignores, a per-head constant bias, is not)."""
    if not trainable:
        return {}
    with torch.enable_grad():
        logits = recorded_logits(model, tokens)
        if weighed:
            generator = torch.Generator().manual_seed(0)
            total = torch.stack([(s * torch.randn(s.shape, generator=generator).tril()).sum() for s in logits]).sum()
        else:
            total = torch.stack([near_minus_far(s) for s in logits]).sum()
        grads = torch.autograd.grad(total, list(trainable.values()), allow_unused=True) if total.requires_grad \
            else [None] * len(trainable)
    return dict(zip(trainable, grads))


def moved_parameters(params: dict[str, Tensor], grads: dict[str, Tensor | None],
                     steps: dict[str, float]) -> dict[str, Tensor]:
    """Every parameter moved by its summed step size per element, in the direction that widens the near-minus-far
    gap of the logits (the sign of its gradient ``grads``; +1 where the gradient is zero)."""
    direction = {n: (torch.ones_like(params[n]) if g is None else torch.where(g == 0, 1.0, g.sign()))
                 for n, g in grads.items()}
    return {n: (p + steps[n] * direction[n]).detach() if n in steps and n in direction else p.detach().clone()
            for n, p in params.items()}         # what training cannot move (frozen, skipped) stays


def gain_change(moved: list[Tensor], unmoved: list[Tensor], zeroed: list[Tensor], per_head: bool) -> float | None:
    """The relative change of a unit that is a gain, None when it is not. Everything else moved in all three
    measurements; the unit moved (``moved``), at its initial values (``unmoved``), at zero (``zeroed``). Where it
    first acts (the first layer whose measurement it changes), its move ``moved - unmoved`` must equal its
    contribution ``unmoved - zeroed`` times a number in each head (``per_head``; else in the whole tensor), to
    ``PARALLEL`` of the move's largest change; the relative change is the largest such number."""
    for m, u, z in zip(moved, unmoved, zeroed):
        if per_head:                    # [B, H, N, N] logits -> per head, visible keys, relative to the diagonal
            n = m.shape[-1]
            visible = torch.ones(n, n, dtype=torch.bool, device=m.device).tril()
            m, u, z = (relative_to_diagonal(x.double()).masked_fill(~visible, 0).transpose(0, 1)
                       for x in (m, u, z))
        else:
            m, u, z = (x.double()[None] for x in (m, u, z))
        rounding = 1e-6 * max(float(u.abs().max()), 1.0)       # float32 rounding of what was measured
        move, contribution = (m - u).flatten(1), (u - z).flatten(1)
        if not move.any() and not contribution.any():
            continue                    # a layer before the one it acts in
        tolerance = PARALLEL * float(move.abs().max()) + rounding
        ratios = []
        for d, c in zip(move, contribution):
            if float(c.abs().max()) <= rounding:
                if float(d.abs().max()) > tolerance:
                    return None         # its move makes something where it contributes nothing
                continue
            ratio = float((d * c).sum() / (c * c).sum())
            if float((d - ratio * c).abs().max()) > tolerance:
                return None
            ratios.append(abs(ratio))
        return max(ratios) if ratios else None
    return None


def near_minus_far(scores: Tensor) -> Tensor:
    """The mean over the later half of the queries of (logit of the query's own key - logit of the first key)."""
    n = scores.shape[-1]
    rows = torch.arange(n // 2, n, device=scores.device)
    return (scores[..., rows, rows] - scores[..., rows, 0]).mean()


def largest_change(a: list[Tensor], b: list[Tensor]) -> float:
    """The largest |difference| of any visible logit relative to its row's diagonal (``s[i, j] - s[i, i]``, keys
    up to the query: what softmax sees)."""
    worst = 0.0
    for x, y in zip(a, b):
        n = x.shape[-1]
        visible = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        diff = (relative_to_diagonal(x) - relative_to_diagonal(y)).abs().masked_fill(~visible, 0)
        worst = max(worst, float(diff.max()))
    return worst


def relative_to_diagonal(scores: Tensor) -> Tensor:
    return scores - scores.diagonal(dim1=-2, dim2=-1)[..., None]


def largest_embedding_change(a: list[Tensor], b: list[Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def added_to_embeddings(model, tokens: Tensor) -> list[Tensor]:
    """What the encoding adds to the token embeddings, in units of their root mean square."""
    x = model.embed(tokens)
    positions = torch.arange(tokens.shape[1])
    added = model.encoding.embed(x, model.encoding.init_state(positions, tokens, None)) - x
    return [added / x.pow(2).mean().sqrt()]


def logits_of(model, tokens: Tensor) -> list[Tensor]:
    with torch.no_grad():
        return [s.detach() for s in recorded_logits(model, tokens)]


def recorded_logits(model, tokens: Tensor) -> list[Tensor]:
    """The attention logits of every layer, ``[B, H, N, N]`` float32 (q . k / sqrt(D) plus the encoding's bias)."""
    original, recorded = transformer.attend, []

    def recording(q, k, v, bias=None, backend_name="auto", **kw):
        scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.shape[-1])
        if isinstance(bias, ScoreBias):
            bias = bias.materialise(q.shape[1], kw["q_pos"], kw["k_pos"])
        recorded.append(scores if bias is None else scores + bias.float())
        return original(q, k, v, bias, backend_name, **kw)

    transformer.attend = recording
    try:
        model(tokens)
    finally:
        transformer.attend = original
    return recorded


@contextmanager
def replaced(params: dict[str, Tensor], values: dict[str, Tensor]) -> Iterator[None]:
    """The parameters ``values`` names hold those values inside the block, their own after it."""
    saved = {n: params[n].detach().clone() for n in values}
    try:
        with torch.no_grad():
            for n, v in values.items():
                params[n].copy_(v)
        yield
    finally:
        with torch.no_grad():
            for n, v in saved.items():
                params[n].copy_(v)
