"""Shared helpers for the encoding / model / backend tests: tiny models and a forward pass run by hand."""

from __future__ import annotations

import random

import pytest
import torch

from posbench.model import ModelConfig, Transformer


@pytest.fixture
def one_thread():
    """Run a test on one thread. Tiny models gain nothing from two, and two threads spin-wait for each other
    whenever another process holds a core: on a loaded 2-core machine a 10-token generation took 3 s with two
    threads and 0.01 s with one. Test modules use it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def fresh_dynamo():
    """Forget every compiled graph before and after a test (compile tests count the graphs they make)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def builtin_encodings() -> list[str]:
    """Every encoding the package's own folder holds (a file dropped into ``posbench/encodings/`` included): the
    contract tests run on each, so a new one needs no edit here."""
    from posbench.encodings import ENCODINGS

    return sorted(name for name in ENCODINGS if ENCODINGS.origin(name) == "built-in")


BUILTIN = builtin_encodings()
#: encodings whose bias is computed from q and k (``bias_from_qk``): a tensor, never on flex or flash_attn
CONTEXTUAL = ["cope", "dape"]
VOCAB = 50
#: what a task would give an encoding that declares these options ``from_task``: for the random tokens
#: of ``tokens()``, ten ids of the vocabulary are the digits 0-9 (a fifth of the tokens, so runs of digits occur)
TASK_CONTEXT = {"digit_ids": [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}


def task_context(encoding: str) -> dict:
    """The options only a task can give, for ``encoding`` (Abacus: ``digit_ids``), as ``TASK_CONTEXT`` has them."""
    from posbench.encodings import ENCODINGS

    return {key: TASK_CONTEXT[key] for key in ENCODINGS[encoding].task_context}


def has_bias(encoding: str) -> bool:
    """Whether the encoding adds a logit bias (overrides the ``bias`` hook)."""
    from posbench.encodings import ENCODINGS, PositionalEncoding

    return ENCODINGS[encoding].bias is not PositionalEncoding.bias


def score_bias_of(pe, layer: int):
    """An element-wise bias encoding's ``ScoreBias`` for ``layer`` (its ``bias`` hook reads neither the state, the
    queries, the keys nor the positions: it returns a function of them)."""
    return pe.bias(layer, None, None, None, None, None)


def bias_tensor(pe, layer: int, q_pos: torch.Tensor, k_pos: torch.Tensor, state=None) -> torch.Tensor:
    """An element-wise bias encoding's bias at these positions, as the tensor ``[B or 1, H, Nq, Nk]`` that eager
    attention adds (its ``ScoreBias``, materialised)."""
    return pe.bias(layer, state, None, None, q_pos, k_pos).materialise(pe.n_heads, q_pos, k_pos)


def tiny(encoding: str, *, layers: int = 2, d_model: int = 32, heads: int = 4, max_seq_len: int = 16,
         init_std: float = 0.2, seed: int = 0, perturb: bool = True, **config) -> Transformer:
    """A tiny model. ``init_std`` 0.2 (not 0.02) makes positional effects large compared with float32 noise,
    so that a test of "this changes the logits" cannot pass by rounding. TAPE's zero-initialised updates and
    CoPE's zero-initialised position embeddings are perturbed unless ``perturb=False`` (a zero update cannot show
    a caching or causality bug). Built with the encoding's ``deterministic_options`` (RandPE at 0..N-1 in
    evaluation) unless ``encoding_options`` says otherwise. An encoding that needs options from its task (Abacus's ``digit_ids``) gets
    ``task_context(encoding)``."""
    from posbench.encodings import ENCODINGS

    torch.manual_seed(seed)
    config["encoding_options"] = {**task_context(encoding), **ENCODINGS[encoding].deterministic_options,
                                  **config.get("encoding_options", {})}
    model = Transformer(ModelConfig(vocab_size=VOCAB, d_model=d_model, n_layers=layers, n_heads=heads,
                                    max_seq_len=max_seq_len, encoding=encoding, init_std=init_std, **config))
    if perturb and encoding == "tape":
        perturb_tape(model, seed=seed)
    if perturb and encoding == "cope":
        perturb_cope(model, seed=seed)
    return model


def perturb_tape(model: Transformer, std: float = 0.3, seed: int = 0) -> None:
    """Give every TAPE parameter (gate, x_proj, up_proj, down_proj) a non-zero value of order ``std``."""
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.encoding.layers.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * std)


def perturb_cope(model: Transformer, std: float = 0.3, seed: int = 0) -> None:
    """Give CoPE's position embeddings (zero at init, as in the paper's code) values of order ``std``."""
    generator = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        pos_emb = model.encoding.pos_emb
        pos_emb.copy_(torch.randn(pos_emb.shape, generator=generator) * std)


def tokens(batch: int, n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))


def digit_rich(batch: int, n: int, seed: int = 1, share: float = 2 / 3) -> torch.Tensor:
    """Random tokens of which about ``share`` are digits (``TASK_CONTEXT["digit_ids"]``): numbers of several
    digits, for tests of encodings that read digits (Abacus). The last token of every row is a digit."""
    g = torch.Generator().manual_seed(seed)
    digits = torch.tensor(TASK_CONTEXT["digit_ids"])
    x = torch.randint(0, VOCAB, (batch, n), generator=g)
    is_digit = torch.rand(batch, n, generator=g) < share
    is_digit[:, -1] = True
    return torch.where(is_digit, digits[torch.randint(0, 10, (batch, n), generator=g)], x)


def seeded(fn, *args, seed: int = 0, **kwargs):
    """Call ``fn`` with torch's and Python's RNG reset, so random positions (RandPE, TAPE offset) repeat."""
    torch.manual_seed(seed)
    random.seed(seed)
    return fn(*args, **kwargs)


def run_layers(model: Transformer, toks: torch.Tensor, positions: torch.Tensor | None = None):
    """The model's forward pass step by step: returns (logits, [state after each layer])."""
    b, n = toks.shape
    if positions is None:
        positions = torch.arange(n)
    positions = positions.expand(b, n) if positions.dim() == 1 else positions
    pe = model.encoding
    state = pe.init_state(positions, toks, None)
    x = pe.embed(model.embed(toks), state)
    states = []
    for block in model.blocks:
        x, state = block(x, state, positions, pe)
        states.append(state)
    return model.lm_head(model.norm(x)), states


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rel: float = 1e-5, msg: str | None = None) -> None:
    """Float32 comparison scaled to the data: |a - e| <= rel * |e| + rel * max(1, max|e|). Rounding error in
    a sum grows with the largest term, so entries near zero get the tolerance of the largest entry."""
    scale = max(1.0, expected.abs().max().item())
    torch.testing.assert_close(actual, expected, rtol=rel, atol=rel * scale, msg=msg)
