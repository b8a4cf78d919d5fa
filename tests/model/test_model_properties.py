"""Properties every encoding must have inside the model: causality, long inputs, batching, one position
signal, and (for relative encodings) invariance to a shift of all positions.

Models are tiny (d_model 32, 4 heads, 1-2 layers, max_seq_len 16) with init_std 0.2 so positional effects are
large next to float32 rounding; TAPE's zero-initialised updates are perturbed (see ``encoding_helpers``).
Tolerances: 1e-5 absolute and relative on logits of order 1 (float32, a few layers).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posbench.encodings import PositionalEncoding

from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from encoding_helpers import BUILTIN, VOCAB, assert_close, digit_rich, seeded, tiny, tokens

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("encoding", BUILTIN)
def test_causal_a_later_token_never_changes_an_earlier_logit(encoding, training):
    model = tiny(encoding).train(training)
    x = tokens(2, 12)
    for changed in (11, 6, 1):
        y = x.clone()
        y[:, changed] = (y[:, changed] + 7) % VOCAB
        a, b = seeded(model, x), seeded(model, y)   # the same random positions in train mode
        torch.testing.assert_close(a[:, :changed], b[:, :changed], **TOL)
        assert (a[:, changed] - b[:, changed]).abs().max() > 1e-3  # and the change is visible where it is


@pytest.mark.parametrize("encoding", BUILTIN)
def test_runs_at_four_times_the_training_length(encoding):
    model = tiny(encoding)
    n = 4 * model.config.max_seq_len
    for training in (True, False):
        model.train(training)
        logits = model(tokens(2, n))
        assert logits.shape == (2, n, VOCAB)
        assert torch.isfinite(logits).all(), (encoding, training)
    model.train()
    model(tokens(2, n)).logsumexp(-1).mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("encoding", BUILTIN)
def test_a_batch_equals_its_rows_one_by_one(encoding):
    model = tiny(encoding).eval()
    x = tokens(3, 10)
    with torch.no_grad():
        batch = model(x)
        for i in range(3):
            torch.testing.assert_close(batch[i:i + 1], model(x[i:i + 1]), **TOL)


#: no position signal (NoPE), or one read from the tokens alone (Abacus: each digit's place in its number)
POSITION_FREE = ("nope", "abacus", "cope")     # abacus: the tokens; cope: q and k


@pytest.mark.parametrize("encoding", BUILTIN)
def test_per_row_positions_in_a_batch(encoding):
    """positions [B, N]: each row is computed at its own positions (eval; within FIRE's L). Row 1's positions
    are spaced by 2, so its distances differ from row 0's and a mix-up cannot hide behind shift invariance.
    NoPE and CoPE read no position index (CoPE counts its positions from q and k), so positions change nothing."""
    model = tiny(encoding).eval()
    x = tokens(2, 8)
    positions = torch.stack((torch.arange(8), torch.arange(3, 19, 2)))
    with torch.no_grad():
        both = model(x, positions=positions)
        for i in range(2):
            torch.testing.assert_close(both[i:i + 1], model(x[i:i + 1], positions=positions[i]), **TOL)
            other = model(x[i:i + 1], positions=positions[1 - i])
            if encoding in POSITION_FREE:          # their signal (if any) does not come from the positions
                torch.testing.assert_close(both[i:i + 1], other, **TOL)
            else:
                assert (both[i:i + 1] - other).abs().max() > 1e-3


# ---- exactly one position signal ---------------------------------------------------------------------
SIGNAL_HOOKS = ("embed", "rotate", "bias")


def overridden_signal_hooks(cls) -> list[str]:
    return [h for h in SIGNAL_HOOKS if getattr(cls, h) is not getattr(PositionalEncoding, h)]


def last_logits_under_permutations(model, n: int = 9, trials: int = 4) -> list[torch.Tensor]:
    """Last-token logits when the tokens before the last are shuffled (the last token stays). For an encoding
    that reads digits (Abacus), two thirds of the tokens are digits, so the shuffles move numbers' digits."""
    x = tokens(1, n, seed=3)
    if model.encoding.task_context:
        x = digit_rich(1, n, seed=3)
    out = []
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(trials):
            perm = torch.cat((torch.randperm(n - 1, generator=gen), torch.tensor([n - 1])))
            out.append(model(x[:, perm])[0, -1])
    return out


def test_nope_is_order_blind_in_one_layer():
    """One NoPE layer: the last token attends a set of earlier tokens, so their order cannot matter."""
    model = tiny("nope", layers=1).eval()
    first, *rest = last_logits_under_permutations(model)
    for other in rest:
        torch.testing.assert_close(first, other, **TOL)


@pytest.mark.parametrize("encoding", [e for e in BUILTIN if e != "nope"])
def test_every_other_encoding_carries_a_position_signal(encoding):
    model = tiny(encoding, layers=1).eval()
    first, *rest = last_logits_under_permutations(model)
    assert max((first - other).abs().max().item() for other in rest) > 1e-3


def test_fresh_tape_carries_a_position_signal_too():
    model = tiny("tape", layers=1, perturb=False).eval()
    first, *rest = last_logits_under_permutations(model)
    assert max((first - other).abs().max().item() for other in rest) > 1e-3


@pytest.mark.parametrize("encoding", BUILTIN)
def test_exactly_one_signal_hook(encoding, monkeypatch):
    """Each encoding overrides exactly one of embed / rotate / bias (NoPE none), and
    resetting that one hook to the base class's no-op makes a one-layer model order-blind: there is no second
    signal (DAPE's base bias is inside its bias)."""
    from posbench.encodings import ENCODINGS

    hooks = overridden_signal_hooks(ENCODINGS[encoding])
    assert len(hooks) == (0 if encoding == "nope" else 1), hooks
    model = tiny(encoding, layers=1).eval()
    for hook in hooks:
        monkeypatch.setattr(model.encoding, hook, getattr(PositionalEncoding, hook).__get__(model.encoding))
    first, *rest = last_logits_under_permutations(model)
    for other in rest:
        torch.testing.assert_close(first, other, **TOL)


def test_model_files_name_no_encoding():
    """No file of posbench/model/ knows anything of any one encoding (the config's default name aside)."""
    import posbench.model as model_package

    files = sorted(Path(model_package.__file__).parent.glob("*.py"))
    assert {f.name for f in files} >= {"transformer.py", "attention.py", "bias.py", "generate.py"}
    lines = [line for f in files for line in f.read_text(encoding="utf-8").splitlines()
             if not line.strip().startswith("encoding: str =")]
    for name in BUILTIN:
        assert not [line for line in lines if f'"{name}"' in line or f"'{name}'" in line], name
    assert not [line for line in lines if "encoding ==" in line or "isinstance(self.encoding" in line]


# ---- shift invariance ---------------------------------------------------------------------------------
RELATIVE = ["rope", "xpos", "alibi", "t5", "tape", "fire", "kerple", "sandwich", "cope", "dape"]


@pytest.mark.parametrize("shift", [1, 37, 300])
@pytest.mark.parametrize("encoding", RELATIVE)
def test_relative_encodings_ignore_a_shift_of_all_positions(encoding, shift):
    options = {"init_l": 512.0} if encoding == "fire" else {}     # FIRE: positions up to 312 stay below L
    model = tiny(encoding, encoding_options=options).eval()
    x = tokens(2, 12)
    with torch.no_grad():
        base = model(x, positions=torch.arange(12))
        shifted = model(x, positions=torch.arange(shift, shift + 12))
    # float32 end to end, tables computed in float64: 1e-5 relative to the largest logit
    assert_close(shifted, base)


def test_fire_is_not_shift_invariant_beyond_its_threshold():
    """FIRE's normaliser psi(max(i, L)) stops being constant once positions pass L."""
    model = tiny("fire", encoding_options={"init_l": 8.0}).eval()
    x = tokens(1, 12)
    with torch.no_grad():
        base = model(x, positions=torch.arange(12))
        shifted = model(x, positions=torch.arange(100, 112))
    assert (base - shifted).abs().max() > 1e-3


def test_randpe_is_rope_at_eval_and_random_in_training():
    rope, randpe = tiny("rope"), tiny("randpe")
    randpe.load_state_dict(rope.state_dict())
    x = tokens(2, 12)
    with torch.no_grad():
        torch.testing.assert_close(randpe.eval()(x), rope.eval()(x), rtol=0, atol=0)
        a, b = seeded(randpe.train(), x, seed=1), seeded(randpe.train(), x, seed=2)
    assert (a - b).abs().max() > 1e-3
    positions = seeded(randpe.encoding.sample_positions, torch.arange(12).expand(2, 12), seed=3)
    assert positions.shape == (2, 12)
    assert (positions.diff(dim=-1) > 0).all()                       # ordered, distinct
    assert positions.max() < 2 * randpe.config.max_seq_len          # from the 2 x L range
    long = torch.arange(40).expand(1, 40)                           # N > 2L: positions 0..N-1
    assert torch.equal(randpe.encoding.sample_positions(long), long)


@pytest.mark.parametrize("per_layer", [False, True])
def test_randpe_training_is_rope_at_one_sorted_draw(per_layer):
    """per_layer=False: one draw for the whole forward pass, so a training step equals RoPE evaluated at the
    drawn positions; per_layer=True (the reference) draws again in every later layer, so it does not."""
    rope = tiny("rope", layers=3)
    randpe = tiny("randpe", layers=3, encoding_options={"per_layer": per_layer})
    randpe.load_state_dict(rope.state_dict())
    x = tokens(2, 12)
    with torch.no_grad():
        logits = seeded(randpe.train(), x, seed=7)
        drawn = seeded(randpe.encoding.sample_positions, torch.arange(12).expand(2, 12), seed=7)
        at_draw = rope.eval()(x, positions=drawn)
    if per_layer:
        assert (logits - at_draw).abs().max() > 1e-3
    else:
        torch.testing.assert_close(logits, at_draw, **TOL)


def test_a_bias_shared_by_every_row_is_computed_once(monkeypatch):
    """Default positions are the same in every row: attention sees positions [1, N] and the bias is
    broadcast over the batch; per-row positions give a per-row bias. With a cache, a per-row query and the
    shared cached keys still pair row by row."""
    import posbench.model.transformer as model_module

    model = tiny("alibi").eval()
    seen = []
    plain_attend = model_module.attend

    def spy(q, k, v, bias, backend, q_pos, k_pos, contextual, aligned=False, key_mask=None):
        seen.append((tuple(q_pos.shape), tuple(k_pos.shape), tuple(bias.materialise(q.shape[1], q_pos,
                                                                                      k_pos).shape)))
        return plain_attend(q, k, v, bias, backend, q_pos=q_pos, k_pos=k_pos, contextual=contextual, aligned=aligned,
                            key_mask=key_mask)

    monkeypatch.setattr(model_module, "attend", spy)
    with torch.no_grad():
        model(tokens(3, 10))
        assert seen == [((1, 10), (1, 10), (1, 4, 10, 10))] * 2
        seen.clear()
        model(tokens(3, 10), positions=torch.arange(10).repeat(3, 1))   # per-row positions: per-row bias
        assert seen == [((3, 10), (3, 10), (3, 4, 10, 10))] * 2
