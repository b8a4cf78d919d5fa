"""The encoding contract, checked on a tiny model (2 layers, d_model 32, 4 heads, training length 16, float32 on the
CPU, one thread), through the public API only: ``ModelConfig``, ``Transformer``, ``model(tokens, cache=...)``.

Weights are drawn with std 0.2 (not 0.02) and an encoding parameter that starts at zero (TAPE's updates, CoPE's
embeddings) is given values of order 0.3, so that a positional effect is large next to float32 rounding and a
check cannot pass by a zero. Tolerance: ``|a - b| <= 1e-5 (|b| + max(1, max |b|))`` for logits, 1e-4 for
gradients (float32, a few layers). An encoding whose options only a task can give (Abacus's ``digit_ids``) gets
them from the first task that gives them, and that task's vocabulary.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from posbench.checks.learnable import check_learnable
from posbench.checks.options import check_options
from posbench.checks.outcome import CheckFailed, Report
from posbench.encodings import ENCODINGS
from posbench.model import ModelConfig, Transformer
from posbench.model.attention import FLEX_AVAILABLE
from posbench.runs.config import resolve_run_config
from posbench.tasks import TASKS
from posbench.tasks.presets import presets_of

SHAPE = dict(d_model=32, n_layers=2, n_heads=4, max_seq_len=16, init_std=0.2)
#: the arithmetic releases' depth-recurrent class (docs/encodings.md, "Backbones"), at two recurrences of the blocks
RECURRENT = dict(norm="layer", norm_position="post", mlp="geglu", embedding_norm=True, head_mlp=True, recurrences=2,
                 input_injection=True, state_std=0.02, init_scheme="deepnorm")
VOCAB = 50
BATCH, LENGTH, PREFIX = 2, 12, 5
PADS = 4            # the padding check's pads


def check_encoding(name: str, *, compiled: bool = True, task: str | None = None, preset: str | None = None,
                   sets: tuple[str, ...] = ()) -> Report:
    """Every check of the encoding contract on encoding ``name`` (``compiled=False``: all but the one-graph
    check, which traces two training steps with dynamo: about a second on a CPU), then whether each learned
    position parameter can learn within ``task``'s ``preset`` budget (``posbench.checks.learnable``), that run
    configuration changed by ``sets`` (``--set``: the encoding's options, the budget, the model's shape)."""
    cls = ENCODINGS.get(name)
    report = Report(f"encoding '{name}'")
    context, vocab = task_context(cls)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        check_options(report, cls, lambda options: build(name, {**context, **options}, vocab, "eager"))
        model = None

        def builds() -> str:
            nonlocal model
            model = build(name, context, vocab, "eager")
            return trains(model, vocab)
        if not report.run("builds, and every trainable parameter reaches the loss", builds):
            return report
        x = tokens(vocab)
        report.run("a later token never changes an earlier logit", lambda: causal(model, x, vocab))
        report.run("the attention backends agree", lambda: backends_agree(name, model, context, vocab, x))
        report.run("a KV cache equals recomputation", lambda: cache_equals_recomputation(model, x))
        report.run("a padded batch gives each row what it gets alone", lambda: padded_rows_alone(model, x))
        report.run("on the depth-recurrent backbone it trains, stays causal and decodes as it recomputes",
                   lambda: recurrent_backbone(name, context, vocab, x))
        report.run("a saved state dict rebuilds the same model", lambda: state_dict_round_trip(name, model, context,
                                                                                                vocab, x))
        if compiled:
            report.run("one compiled graph for all layers", lambda: one_graph(model, x))
        report.guard("learned parameters measured within the budget", lambda: check_learnable(report, name, task,
                                                                                               preset, sets))
    finally:
        torch.set_num_threads(before)
    return report


# ---- the model ------------------------------------------------------------------------------------------------

def task_context(cls: Any) -> tuple[dict[str, Any], int]:
    """The options only a task can give, from the first task that gives them all, and that task's vocabulary."""
    if not cls.task_context:
        return {}, VOCAB
    for name in TASKS:
        task = TASKS[name]
        context = task.encoding_context(task.defaults())
        if task.model_source.builds and all(key in context for key in cls.task_context):
            config = resolve_run_config(name, cls.name, "tiny" if "tiny" in presets_of(task) else None)
            vocab = max(task(config).vocab_size(), VOCAB)
            return {key: context[key] for key in cls.task_context}, vocab
    raise CheckFailed(f"no task gives {', '.join(cls.task_context)}, which the encoding needs")


def build(name: str, options: dict[str, Any], vocab: int, attention: str, seed: int = 0,
          backbone: dict[str, Any] | None = None):
    """The tiny model (``backbone``: model settings over the default decoder's, as ``RECURRENT``)."""
    torch.manual_seed(seed)
    options = {**ENCODINGS.get(name).deterministic_options, **options}
    model = Transformer(ModelConfig(vocab_size=vocab, encoding=name, encoding_options=dict(options),
                                    attention=attention, **SHAPE, **(backbone or {})))
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.encoding.parameters():
            if p.requires_grad and p.numel() and not p.any():        # zero-initialised: give it a value
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    return model


def tokens(vocab: int, batch: int = BATCH, length: int = LENGTH, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def seeded(model, *args, seed: int = 0, **kwargs) -> torch.Tensor:
    """A forward pass with torch's generator reset, so that random positions repeat (RandPE, TAPE's offset)."""
    torch.manual_seed(seed)
    return model(*args, **kwargs)


def close(actual: torch.Tensor, expected: torch.Tensor, rel: float = 1e-5) -> float:
    """The largest difference, or ``CheckFailed`` beyond ``rel (|e| + max(1, max |e|))``."""
    if actual.shape == expected.shape and not expected.numel():     # a parameter with no elements: its gradient
        return 0.0
    scale = max(1.0, expected.abs().max().item())
    diff = (actual - expected).abs()
    if not torch.isfinite(actual).all() or (diff > rel * (expected.abs() + scale)).any():
        raise CheckFailed(f"max |difference| {diff.max().item():.2e} (tolerance {rel:g} relative)")
    return diff.max().item()


# ---- the checks -------------------------------------------------------------------------------------------------

def trains(model, vocab: int) -> str:
    model.train()
    logits = seeded(model, tokens(vocab))
    if logits.shape != (BATCH, LENGTH, vocab) or not torch.isfinite(logits).all():
        raise CheckFailed(f"logits of shape {tuple(logits.shape)} (expected {(BATCH, LENGTH, vocab)}), or not finite")
    logits.logsumexp(-1).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    if missing:
        raise CheckFailed(f"no gradient reaches {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''} "
                          f"(freeze a parameter that can never reach the loss in init_weights())")
    count = sum(p.numel() for p in model.encoding.parameters())
    frozen = sum(p.numel() for p in model.encoding.parameters() if not p.requires_grad)
    model.zero_grad(set_to_none=True)
    model.eval()
    return f"{count} encoding parameters" + (f", {frozen} of them frozen" if frozen else "")


def causal(model, x: torch.Tensor, vocab: int) -> str:
    for training in (False, True):
        model.train(training)
        for changed in (LENGTH - 1, LENGTH // 2):
            y = x.clone()
            y[:, changed] = (y[:, changed] + 7) % vocab
            with torch.no_grad():
                a, b = seeded(model, x), seeded(model, y)
            try:
                close(a[:, :changed], b[:, :changed])
            except CheckFailed as exc:
                raise CheckFailed(f"changing token {changed} ({'training' if training else 'eval'}) changed an "
                                  f"earlier logit: {exc}") from None
    model.eval()
    return "eval and training"


def backends_agree(name: str, model, context: dict[str, Any], vocab: int, x: torch.Tensor) -> str:
    """Eager against SDPA (logits, and every gradient of one training step) and, where the encoding can run on
    it, FlexAttention (logits; it has no CPU backward)."""
    reference = model
    worst = 0.0
    tried = ["eager"]
    backends = ["sdpa"] + (["flex"] if FLEX_AVAILABLE and not model.encoding.bias_from_qk else [])
    for backend in backends:
        other = build(name, context, vocab, backend)
        other.load_state_dict(reference.state_dict())
        for m in (reference, other):
            m.eval()
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                worst = max(worst, close(other(x), reference(x)))
            except CheckFailed as exc:
                raise CheckFailed(f"{backend} against eager, logits: {exc}") from None
        if backend != "flex":                         # one training step's gradients too
            grads = []
            for m in (reference, other):
                m.train()
                m.zero_grad(set_to_none=True)
                seeded(m, x).logsumexp(-1).mean().backward()
                grads.append({n: p.grad for n, p in m.named_parameters() if p.grad is not None})
                m.eval()
            if grads[0].keys() != grads[1].keys():
                raise CheckFailed(f"{backend} against eager: gradients reach different parameters")
            for key, grad in grads[0].items():
                try:
                    close(grads[1][key], grad, rel=1e-4)
                except CheckFailed as exc:
                    raise CheckFailed(f"{backend} against eager, gradient of {key}: {exc}") from None
            reference.zero_grad(set_to_none=True)
        tried.append(backend)
    return f"{', '.join(tried)}: max |difference| {worst:.1e}"


def recurrent_backbone(name: str, context: dict[str, Any], vocab: int, x: torch.Tensor) -> str:
    """The encoding on the depth-recurrent backbone (``RECURRENT``): every trainable parameter reaches the loss, no
    later token changes an earlier logit, and cached decoding equals recomputation through both passes."""
    passes = 1 if ENCODINGS.get(name).one_pass else RECURRENT["recurrences"]       # TAPE: one pass only
    model = build(name, context, vocab, "eager", backbone={**RECURRENT, "recurrences": passes})
    trains(model, vocab)
    causal(model, x, vocab)
    return f"{passes} recurrence(s); cache: {cache_equals_recomputation(model, x)}"


def cache_equals_recomputation(model, x: torch.Tensor) -> str:
    """The prefix in one pass, then one token at a time through a KV cache, against the whole sequence: the
    growing cache (``new_cache``) and the static one of compiled decoding (``new_static_cache``, larger than
    needed, so that its empty slots are there to be ignored)."""
    model.eval()
    worst = 0.0
    with torch.no_grad():
        full = model(x)
        for kind, cache in (("cache", model.new_cache()), ("static cache", model.new_static_cache(LENGTH + 4, "cpu"))):
            steps = [model(x[:, :PREFIX], cache=cache)]
            steps += [model(x[:, t:t + 1], cache=cache) for t in range(PREFIX, LENGTH)]
            try:
                worst = max(worst, close(torch.cat(steps, dim=1), full))
            except CheckFailed as exc:
                raise CheckFailed(f"{kind}: a {PREFIX}-token prefix, then {LENGTH - PREFIX} tokens one by one: "
                                  f"{exc}") from None
    return f"growing and static: max |difference| {worst:.1e}"


def padded_rows_alone(model, x: torch.Tensor) -> str:
    """Row 1 shortened by ``PADS`` tokens and padded, on the left and on the right, with two fillers (the tokens
    that stood there; its first real token repeated, so that an encoding that reads token ids would join the pads
    to it): the real tokens' logits equal the row's alone (and row 0's, unpadded, too). Then the left-padded
    batch as a prompt in a growing and in a static cache, followed by one-token steps: each row's logits equal
    its own, recomputed alone."""
    model.eval()
    n = x.shape[1]
    real = n - PADS
    short = x[1:, PADS:]
    worst = 0.0
    with torch.no_grad():
        alone = [model(x[:1]), model(short)]
        for side in ("left", "right"):
            for filler in (x[1, :PADS], short[0, :1].expand(PADS)):
                padded = x.clone()
                padded[1] = torch.cat((filler, short[0])) if side == "left" else torch.cat((short[0], filler))
                mask = torch.ones_like(padded)
                mask[1, slice(None, PADS) if side == "left" else slice(real, None)] = 0
                logits = model(padded, attention_mask=mask)
                rows = logits[1, PADS:] if side == "left" else logits[1, :real]
                try:
                    worst = max(worst, close(logits[0], alone[0][0]), close(rows, alone[1][0]))
                except CheckFailed as exc:
                    raise CheckFailed(f"{side}-padded by {PADS} tokens: {exc}") from None
        prompt, steps = x[:, :PREFIX + PADS], x[:, PREFIX + PADS:]
        mask = torch.ones_like(prompt)
        mask[1, :PADS] = 0
        for kind, cache in (("cache", model.new_cache()), ("static cache", model.new_static_cache(n + 4, "cpu"))):
            parts = [model(prompt, cache=cache, attention_mask=mask)]
            parts += [model(steps[:, t:t + 1], cache=cache) for t in range(steps.shape[1])]
            logits = torch.cat(parts, dim=1)
            try:
                worst = max(worst, close(logits[0], alone[0][0]), close(logits[1, PADS:], alone[1][0]))
            except CheckFailed as exc:
                raise CheckFailed(f"{kind}: a left-padded prompt, then one token at a time: {exc}") from None
    return f"left and right padding, growing and static cache: max |difference| {worst:.1e}"


def state_dict_round_trip(name: str, model, context: dict[str, Any], vocab: int, x: torch.Tensor) -> str:
    twin = build(name, context, vocab, "eager", seed=7)
    twin.load_state_dict(model.state_dict())
    twin.eval()
    with torch.no_grad():
        if not torch.equal(twin(x), model.eval()(x)):
            raise CheckFailed("a model of another seed, given this model's state dict, computes other logits (a "
                              "tensor the encoding needs is neither a parameter nor a persistent buffer, nor rebuilt "
                              "from the options)")
    return "bitwise"


def one_graph(model, x: torch.Tensor) -> str:
    """``torch.compile(fullgraph=True)`` traces a training step as one graph (a graph break fails), counted by
    dynamo's ``CompileCounter`` (no code generation)."""
    from torch._dynamo.testing import CompileCounter  # torch._dynamo: ~1.5 s, only the one-graph check

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    model.train()
    try:
        for step in range(2):
            seeded(compiled, x, seed=step).logsumexp(-1).mean().backward()
    except Exception as exc:  # noqa: BLE001  (dynamo's own message says what broke the graph)
        raise CheckFailed(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
        torch._dynamo.reset()
    if counter.frame_count != 1:
        raise CheckFailed(f"{counter.frame_count} graphs for two training steps (one expected: a hook recompiles "
                          f"per layer or per step)")
    return "1 graph, 2 training steps"
