"""The protocol differences between posbench and the arithmetic release, each run on the release's own code (issue
57, item 3): RoPE with the release's own cos/sin table, Abacus in training mode (its random offset and the range it
is drawn from), the ``crammed_adadepthrecurrent`` class that the "TAPE" run (``add_adayarn``) used, end to end, and
both public commits, 84c16ad ("update", the one with the launch script) and 55f877d ("version 0.1").

The release is github:zhuconv/arithmetic, read from its git mirror when the tests run (tests/release_source.py;
skipped when the mirror is absent, and the run then says so in one line: tests/conftest.py). The two commits differ
in ``cramming/architectures/{attention,components,embeddings,crammed_adadepthrecurrent}.py``
(``git diff 84c16ad 55f877d --stat``); ``crammed_depthrecurrent.py`` is the same text at both, but it imports the
three files that differ, so every check here runs at both commits.

Sizes, weight maps and helpers are tests/model/test_release_backbone.py's (width 32, 4 heads of 8, 2 layers in the block,
12 tokens, batch 3), imported from there.

Tolerances.
- RoPE's table: the release builds it in float32, posbench in float64 and rounds it to float32. Their entries differ
  by at most (3 P + 2) 2^-24 at positions up to P: the release's inverse frequency w_f = 1 / 10000^(2f/D) is
  within 2 float32 ulps of the exact value (2^-23 relative; checked here, measured at most 1.2 ulps), its angle
  t w_f is rounded once more (2^-24 relative), so with t <= P and w_f <= 1 the angle is off by at most 3 P 2^-24
  radians; cos and sin have slope at most 1; the release's float32 cos/sin and posbench's rounding to float32 add at
  most one float32 ulp each at |value| <= 1 (2^-24). At 64 positions (the launches' ``max_length``) that is 1.1e-5
  (measured 2.9e-7). The rotated q and k then differ element-wise by at most that times |x| + |rotate_half(x)|
  (float64 arithmetic on both sides, so the table is the only difference). The model's logits with the release's
  own table: within 1e-6, tests/model/test_release_backbone.py's bound (measured 1.7e-8); that one is a margin over a
  measurement, not derived: the logits pass the table's error through the softmaxes and norms of every layer.
- Equal code paths in float64: 1e-10 (the logits are O(1); measured at most 1.2e-15). Float32 (FIRE, training
  mode): 1e-5 (measured at most 8e-7). Abacus's embedding rows: bitwise (the same table lookup).
- "Catches a patched release": each check is run again on the release with one thing changed (in memory: a
  monkeypatched function, or a file's text changed and loaded as its own module) and must then fail: RoPE's table
  shifted by 1e-3; Abacus's offset one larger, or drawn from one fewer value; 84c16ad's GLU shifted by 1e-3; the
  TAPE attention keeping its rotated q and k. FIRE's training check fails on 84c16ad's own code, and the ada
  class's failing ``forward`` passes with its one faulty call mended.
"""

from __future__ import annotations

import re
import tomllib
import types
from pathlib import Path

import pytest
import torch

from posbench.encodings import ENCODINGS
from posbench.encodings.abacus import covering_offset
from posbench.encodings.base import rope_cos_sin, rotate_half

from encoding_helpers import one_thread  # noqa: F401 (a fixture)
from encoding_helpers import TASK_CONTEXT
from release_source import cramming_stubs, require
import tests.model.test_release_backbone as backbone
from tests.model.test_release_backbone import (B, D, DIFFERENT, EXACT, FLOAT32, HD, HEADS, LAYERS, OWN_TABLE, S, Settings, gap,
                                   glu, per_head, posbench_model, tokens)

pytestmark = pytest.mark.usefixtures("one_thread")

OWNER, NAME = "zhuconv", "arithmetic"
HEAD, UPDATE = "55f877d", "84c16ad"
COMMITS = (HEAD, UPDATE)
ARCH = "cramming/architectures"
#: the depth-recurrent yaml files' ``embedding.max_abacus_len`` (line 40 of both, at both commits): the launches
#: pass none, so the release draws Abacus's offset from 0..100
RELEASE_MAX_ABACUS_LEN = 100
#: the launches' ``arch.attention.max_length`` (84c16ad:shells/addition_ff.sh lines 117, 145, 230)
LAUNCH_MAX_LENGTH = 64
STUBS = cramming_stubs(torch.nn.Module, types.SimpleNamespace(create=Settings.of))
PROTOCOLS = Path(__file__).resolve().parents[2] / "studies" / "protocols"


@pytest.fixture(scope="module")
def release():
    return require(OWNER, NAME, HEAD, UPDATE)


def load(release, commit: str, name: str, **kwargs) -> types.ModuleType:
    """``cramming/architectures/<name>.py`` at ``commit``. Executing crammed_depthrecurrent.py sets
    ``torch._dynamo.config.suppress_errors = True`` (its line 5), a process-wide setting: restored at once."""
    before = torch._dynamo.config.suppress_errors
    try:
        return release.load(commit, f"{ARCH}/{name}.py", stubs=STUBS, **kwargs)
    finally:
        torch._dynamo.config.suppress_errors = before


class FixedRandom:
    """Stands in for the ``random`` module of the release's embeddings.py: ``randint`` returns ``k`` (the offset
    posbench drew, handed to the release) and records the range it was asked for."""

    def __init__(self, k: int):
        self.k, self.calls = k, []

    def randint(self, low: int, high: int) -> int:
        self.calls.append((low, high))
        return self.k


def hand_offset(monkeypatch, theirs, k: int) -> None:
    """Make the release model ``theirs`` draw offset ``k``: its Abacus's (and its rotary state's, where it has one)
    ``random``, in the namespace their ``forward`` reads. (That namespace, not whatever module of the name is loaded
    last: a test module's own ``load`` executes the file again, and a model built from files loaded earlier keeps
    the classes it was built from.)"""
    fixed = FixedRandom(k)
    for module in (theirs.encoder.embedding.pos_embedding, getattr(theirs.encoder, "rotary_emb", None)):
        if module is not None:
            monkeypatch.setitem(type(module).forward.__globals__, "random", fixed)


# RoPE with the release's own table ----------------------------------------------------------------------------------

def table_tolerance(last_position: int) -> float:
    """(3 P + 2) 2^-24: the module docstring's bound on the float32 table's error at positions up to P."""
    return (3 * last_position + 2) * 2.0 ** -24


def rope_table_gap(emb, length: int) -> float:
    """The largest difference between the release's Rotary table (built as its attention builds it, for
    ``length`` positions) and posbench's RoPE table."""
    rotary = emb.Rotary(HD, seq_dim=0)
    cos, sin = rotary.get_cos_sin_cache(torch.zeros(length, 1, 1, HD))
    ours_cos, ours_sin = rope_cos_sin(torch.arange(length)[None], HD, 10000.0)
    return max(gap(cos[:length, 0, 0].double(), ours_cos[0].double()),
               gap(sin[:length, 0, 0].double(), ours_sin[0].double()))


def rotated_excess(emb, length: int, seed: int = 0) -> float:
    """The release's Rotary applied to float64 q and k ([S B heads D], its own table) against posbench's RoPE
    encoding (``init_state`` then ``rotate``): the largest element-wise difference over the bound
    ``table_tolerance * (|x| + |rotate_half(x)|)``. At most 1 when the check holds."""
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(length, B, HEADS, HD, generator=g, dtype=torch.float64) for _ in range(2))
    theirs = emb.Rotary(HD, seq_dim=0)(q, k)
    pe = ENCODINGS["rope"](1, HEADS, HD, D, length)
    state = pe.init_state(torch.arange(length)[None].expand(B, length), torch.zeros(B, length, dtype=torch.long),
                          None)
    ours = pe.rotate(0, q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), state)
    excess = 0.0
    for x, a, b in zip((q, k), theirs, ours):
        bound = table_tolerance(length - 1) * (x.abs() + rotate_half(x).abs()) + 1e-15
        excess = max(excess, ((a - b.permute(2, 0, 1, 3)).abs() / bound).max().item())
    return excess


@pytest.mark.parametrize("length", [S, LAUNCH_MAX_LENGTH])
@pytest.mark.parametrize("commit", COMMITS)
def test_the_releases_own_rope_table_is_posbenchs_to_float32_rounding(release, commit, length):
    """The release's RoPE attention (``rotary_embedding=true``: ``Rotary(self.hidden_per_head, seq_dim=0)``) with
    its own cos/sin table, computed in float32: its inverse frequencies within 2 float32 ulps of 10000^(-2f/D), its
    table within (3 P + 2) 2^-24 of posbench's, and not posbench's table itself (some entry differs)."""
    emb = load(release, commit, "embeddings")
    cfg = Settings.of(backbone.release_arch("rope", 1)["attention"])
    attention = load(release, commit, "attention").get_attention_mechanism(0, D, cfg, torch.nn.Identity)
    assert type(attention).__name__ == "SeqFirstSelfAttention" and type(attention.rotary_emb) is emb.Rotary
    inv_freq = emb.Rotary(HD, seq_dim=0).inv_freq
    assert inv_freq.dtype == torch.float32
    exact = 10000.0 ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)
    assert (inv_freq.double() / exact - 1).abs().max().item() <= 2.0 ** -23
    measured = rope_table_gap(emb, length)
    assert 0 < measured <= table_tolerance(length - 1), (measured, table_tolerance(length - 1))


@pytest.mark.parametrize("commit", COMMITS)
def test_the_releases_rope_rotates_q_and_k_as_posbenchs_rope(release, commit):
    """q and k rotated by the release's Rotary with its own table, against posbench's RoPE encoding, float64
    arithmetic: element-wise within the table's bound times |x| + |rotate_half(x)| (measured 2.4% of it)."""
    assert rotated_excess(load(release, commit, "embeddings"), LAUNCH_MAX_LENGTH) <= 1.0


@pytest.mark.parametrize("commit", COMMITS)
def test_the_release_with_its_own_rope_table_gives_posbenchs_logits(release, commit):
    """The whole depth-recurrent RoPE backbone (2 recurrences, float64), the release computing its own table:
    every logit within 1e-6 of posbench's (tests/model/test_release_backbone.py's bound, measured 1.7e-8 at 55f877d)."""
    model, theirs = built(release, commit, "rope", 2)
    x = tokens("rope")
    with torch.no_grad():
        assert gap(model(x), backbone.release_logits(theirs, x, 2)) <= OWN_TABLE


@pytest.mark.parametrize("commit", COMMITS)
def test_the_rope_checks_catch_a_table_off_by_1e_3(release, commit, monkeypatch):
    """The guard: the release's Rotary with 1e-3 added to its cos table (its ``_get_cos_sin`` monkeypatched)
    fails the table check (measured 1.0e-3 against 1.1e-5), the rotation check (88 times its bound) and the logits
    check (1.1e-3 against 1e-6)."""
    emb = load(release, commit, "embeddings")
    own = emb.Rotary._get_cos_sin

    def shifted(self):
        cos, sin = own(self)
        return cos + 1e-3, sin

    monkeypatch.setattr(emb.Rotary, "_get_cos_sin", shifted)
    assert rope_table_gap(emb, LAUNCH_MAX_LENGTH) > table_tolerance(LAUNCH_MAX_LENGTH - 1)
    assert rotated_excess(emb, LAUNCH_MAX_LENGTH) > 1.0
    model, theirs = built(release, commit, "rope", 2)
    for layer in theirs.encoder.recurrent_block.layers:          # the class the model was built from
        rotary = type(layer.attn.rotary_emb)
        assert rotary.__name__ == "Rotary"
        if rotary._get_cos_sin is not shifted:
            monkeypatch.setattr(rotary, "_get_cos_sin", shifted)
    x = tokens("rope")
    with torch.no_grad():
        assert gap(model(x), backbone.release_logits(theirs, x, 2)) > OWN_TABLE


# Abacus in training mode ----------------------------------------------------------------------------------------------

def abacus_pair(emb):
    """posbench's Abacus (the release's digits 4-13, its range max_k = 100) and the release's, in training mode,
    reading one table (random N(0, 1) rows: a row read in the wrong place shows)."""
    ours = ENCODINGS["abacus"](LAYERS, HEADS, HD, D, 16, digit_ids=TASK_CONTEXT["digit_ids"],
                               max_k=RELEASE_MAX_ABACUS_LEN).train()
    theirs = emb.Abacus(D, max_seq_length=128, max_k=RELEASE_MAX_ABACUS_LEN).train()
    with torch.no_grad():
        ours.table.weight.normal_(generator=torch.Generator().manual_seed(7))
        theirs.embedding.weight.zero_()
        theirs.embedding.weight[: ours.rows].copy_(ours.table.weight)
    return ours, theirs


def abacus_training_gap(emb, monkeypatch, seeds=range(6)) -> tuple[float, list[int]]:
    """posbench's Abacus draws its offset k (torch's generator, seeded); the release gets the same k through its
    ``random.randint``; the largest difference between the two embeddings of the same tokens, and the k drawn."""
    ours, theirs = abacus_pair(emb)
    drawn: list[int] = []
    own_draw = ours.draw_offset

    def recorded(batch, device):
        k = own_draw(batch, device)
        drawn.append(int(k[0, 0]))
        return k

    monkeypatch.setattr(ours, "draw_offset", recorded)
    largest = 0.0
    for seed in seeds:
        x = tokens("abacus", seed=seed)
        torch.manual_seed(seed)
        rows = ours.init_state(torch.arange(S)[None].expand(B, S), x, None)
        fixed = FixedRandom(drawn[-1])
        monkeypatch.setattr(emb, "random", fixed)
        with torch.no_grad():
            largest = max(largest, gap(ours.embed(torch.zeros(B, S, D), rows), theirs(x)))
        assert fixed.calls == [(0, RELEASE_MAX_ABACUS_LEN)]                 # one draw per batch, as posbench's
    return largest, drawn


@pytest.mark.parametrize("commit", COMMITS)
def test_abacus_in_training_mode_equals_the_release_at_the_same_offset(release, commit, monkeypatch):
    """Training mode: with the offset k posbench draws handed to the release (its ``random.randint(0, self.max_k)``,
    84c16ad:embeddings.py:728, 55f877d:877), both add k to every digit's place and read the same rows: the
    embeddings are bitwise equal, over six batches whose k are not all 0."""
    assert release.line_of(commit, f"{ARCH}/embeddings.py", "k = random.randint(0, self.max_k)") \
        == {UPDATE: 728, HEAD: 877}[commit]
    largest, drawn = abacus_training_gap(load(release, commit, "embeddings"), monkeypatch)
    assert largest == 0.0
    assert len(set(drawn)) > 1 and max(drawn) > 0


def release_draw_range(emb) -> tuple[int, int]:
    """The range the release's Abacus (built by its EmbeddingComponent from the yaml files' settings) asks
    ``random.randint`` for, in training mode."""
    theirs = emb.Abacus(D, max_seq_length=128, max_k=RELEASE_MAX_ABACUS_LEN).train()
    fixed = FixedRandom(0)
    saved = emb.random
    emb.random = fixed
    try:
        theirs(tokens("abacus"))
    finally:
        emb.random = saved
    (drawn,) = fixed.calls
    return drawn


def posbench_offsets(max_k: int, draws: int = 3000) -> set[int]:
    """Every offset posbench's Abacus drew in ``draws`` training batches (torch's generator, seeded)."""
    pe = ENCODINGS["abacus"](LAYERS, HEADS, HD, D, 16, digit_ids=TASK_CONTEXT["digit_ids"], max_k=max_k)
    torch.manual_seed(0)
    return {int(pe.draw_offset(1, torch.device("cpu"))) for _ in range(draws)}


@pytest.mark.parametrize("commit", COMMITS)
def test_the_offset_ranges_the_release_and_posbenchs_tape_as_run_cells_draw(release, commit):
    """The release: both depth-recurrent yaml files set ``max_abacus_len: 100`` (line 40), components.py passes it
    to Abacus as ``max_k`` (line 29), and the launches pass no other, so in training the release draws
    ``random.randint(0, 100)``: 0..100, both ends included (Python's randint). posbench: its rule (posbench/encodings/
    abacus.py) is the least offset the evaluation needs, the longest evaluated number's digits minus the training's;
    the protocols study's "TAPE as run" cells (studies/protocols/recurrent.toml, arithmetic ``small``: 5-digit
    operands, 10 at evaluation, so sums of 6 and 11 digits) resolve it to max_k = 5 and draw 0..5. The release's
    range is posbench's ``encoding.max_k=100``, which draws 0..100. A difference of protocol, stated here."""
    for yaml in ("crammed-depthrecurrent.yaml", "crammed-adadepthrecurrent.yaml"):
        text = release.show(commit, f"cramming/config/arch/{yaml}")
        assert re.findall(r"^  max_abacus_len: (\d+)$", text, flags=re.M) == [str(RELEASE_MAX_ABACUS_LEN)]
    assert release.line_of(commit, f"{ARCH}/components.py", "max_k=cfg_embedding.max_abacus_len") == 29
    assert release_draw_range(load(release, commit, "embeddings")) == (0, RELEASE_MAX_ABACUS_LEN)

    from posbench.runs.config import resolve_run_config

    study = tomllib.loads((PROTOCOLS / "recurrent.toml").read_text())
    config = resolve_run_config("arithmetic", "abacus", study["presets"][0], sets=study["set"])
    assert config.encoding_options["number_digits"] == [6, 11]
    assert config.encoding_options["max_k"] == covering_offset([6, 11]) == 5
    assert posbench_offsets(5) == set(range(6))
    assert posbench_offsets(RELEASE_MAX_ABACUS_LEN) == set(range(RELEASE_MAX_ABACUS_LEN + 1))


@pytest.mark.parametrize("commit", COMMITS)
def test_the_abacus_checks_catch_a_patched_offset(release, commit, monkeypatch):
    """The guards, on embeddings.py with one expression changed and loaded as its own module: an offset one larger
    (``output[output>0] += k + 1``) fails the equality (rows one place off: differences of order one), and a draw
    from one fewer value (``random.randint(0, self.max_k - 1)``) fails the range."""
    text = release.show(commit, f"{ARCH}/embeddings.py")
    add, draw = "output[output>0] += k", "random.randint(0, self.max_k)"
    assert text.count(add) == 1 and text.count(draw) == 1
    larger = load(release, commit, "embeddings", source=text.replace(add, add + " + 1"), tag="offset_plus_one")
    assert abacus_training_gap(larger, monkeypatch)[0] > DIFFERENT
    narrower = load(release, commit, "embeddings", source=text.replace(draw, "random.randint(0, self.max_k - 1)"),
                    tag="offset_range")
    assert release_draw_range(narrower) != (0, RELEASE_MAX_ABACUS_LEN)


def training_gaps(monkeypatch, model, theirs, release_call, seeds, shift: int = 0) -> list[tuple[int, float]]:
    """Training mode: for each seed posbench's model draws its Abacus offset k (torch's generator, seeded; recorded
    from its ``draw_offset``), the release is handed k + ``shift``; each k with the largest logit difference."""
    model.train()
    theirs.train()
    drawn: list[int] = []
    own_draw = model.encoding.draw_offset

    def recorded(batch, device):
        k = own_draw(batch, device)
        drawn.append(int(k[0, 0]))
        return k

    monkeypatch.setattr(model.encoding, "draw_offset", recorded)
    gaps = []
    for seed in seeds:
        x = tokens("abacus", seed=seed)
        torch.manual_seed(seed)
        with torch.no_grad():
            ours = model(x)
            hand_offset(monkeypatch, theirs, drawn[-1] + shift)
            gaps.append((drawn[-1], gap(ours, release_call(theirs, x))))
    return gaps


def tbptt_step(theirs, x):
    """The release's training step with ``maximal_recurrence=1``: ``model_call(n=0, k=1)``'s logits."""
    return theirs.model_call(x, n=0, k=1)[1]


@pytest.mark.parametrize("commit", COMMITS)
def test_the_abacus_backbone_in_training_mode_equals_the_release_at_the_same_offset(release, commit, monkeypatch):
    """The depth-recurrent Abacus backbone in training mode (float32, one recurrence as the launches: the release's
    TBPTT step is ``model_call(n=0, k=1)``, tests/model/test_release_backbone.py), the release handed posbench's offset:
    every logit within 1e-5 (measured 8e-7), for three batches whose offsets are not all 0. The guard: handed the
    offset plus one, the release is more than 0.1 away (measured 2.0)."""
    model, theirs = built(release, commit, "abacus", 1, dtype=torch.float32, state_std=0.0)
    gaps = training_gaps(monkeypatch, model, theirs, tbptt_step, range(3))
    assert all(g <= FLOAT32 for _, g in gaps), gaps
    assert max(k for k, _ in gaps) > 0
    model, theirs = built(release, commit, "abacus", 1, dtype=torch.float32, state_std=0.0)
    assert all(g > DIFFERENT for _, g in training_gaps(monkeypatch, model, theirs, tbptt_step, range(3), shift=1))


# The depth-recurrent backbone at both commits (crammed_depthrecurrent.py, its imports differing) -------------------

def built(release, commit: str, encoding: str, recurrences: int, dtype=torch.float64, attention: dict | None = None,
          **settings):
    """tests/model/test_release_backbone.py's pair (posbench's model, the release's with posbench's weights) on the
    release's crammed_depthrecurrent.py at ``commit``; ``attention`` updates the release's attention settings."""
    recurrent = load(release, commit, "crammed_depthrecurrent")
    model = posbench_model(encoding, recurrences, **settings).to(dtype).eval()
    arch = backbone.release_arch(encoding, recurrences)
    arch["attention"].update(attention or {})
    torch.manual_seed(5)
    theirs = recurrent.ScriptableRecurrentLMBPTT(recurrent.crammedDepthRecurrentConfig(arch), equals_token=17)
    theirs = theirs.to(dtype).eval()
    backbone.copy_into_release(model, theirs)
    exact_score_scale(theirs)
    return model, theirs


def exact_score_scale(theirs) -> None:
    """The release's self-attention keeps 1/sqrt(head_dim) in a float32 buffer that ``.double()`` casts but does not
    recompute: set to the float64 value (tests/model/test_release_backbone.py's ``built``)."""
    for module in theirs.modules():
        if hasattr(module, "norm_factor"):
            module.norm_factor.fill_(module.hidden_per_head ** -0.5)


@pytest.mark.parametrize("encoding", backbone.ENCODINGS)
def test_the_backbone_equals_the_release_at_84c16ad(release, encoding):
    """tests/model/test_release_backbone.py's float64 check (2 recurrences; RoPE reading posbench's table) on 84c16ad's
    files: every logit within 1e-10."""
    model, theirs = built(release, UPDATE, encoding, 2)
    if encoding == "rope":
        backbone.use_posbench_rope_table(theirs, model, S)
    x = tokens(encoding)
    with torch.no_grad():
        ours, logits = model(x), backbone.release_logits(theirs, x, 2)
    assert logits.abs().max().item() > 0.1
    assert gap(ours, logits) <= EXACT, gap(ours, logits)


def test_the_84c16ad_backbone_check_catches_a_glu_off_by_1e_3(release, monkeypatch):
    """The guard: 84c16ad's GLU (components.py: every FFN and the head) monkeypatched to add 1e-3 to its output: the
    logits of each encoding move more than 1e-6 from posbench's (measured 0.028 to 0.049), so the 1e-10 check above
    fails."""
    for encoding in backbone.ENCODINGS:
        model, theirs = built(release, UPDATE, encoding, 2)
        glu_class = type(theirs.encoder.recurrent_block.layers[0].ffn.nonlin)
        assert glu_class.__name__ == "GLU"
        own = glu_class.forward
        monkeypatch.setattr(glu_class, "forward", lambda self, inputs, own=own: own(self, inputs) + 1e-3)
        if encoding == "rope":
            backbone.use_posbench_rope_table(theirs, model, S)
        x = tokens(encoding)
        with torch.no_grad():
            assert gap(model(x), backbone.release_logits(theirs, x, 2)) > 1e-6
        monkeypatch.undo()


def fire_training_gap(release, commit: str, max_length: int) -> float:
    """The largest difference between posbench's FIRE backbone and the release's in training mode (float32, one
    recurrence: ``model_call(n=0, k=1)``, torch's generator seeded), the release's FIRE at ``attention.max_length``;
    checks first that the two agree in evaluation (positions 0..N-1 on both sides) within 1e-5."""
    model, theirs = built(release, commit, "fire", 1, dtype=torch.float32, state_std=0.0,
                          attention={"max_length": max_length})
    x = tokens("fire")
    with torch.no_grad():
        assert gap(model(x), backbone.release_logits(theirs, x, 1)) <= FLOAT32
        model.train()
        theirs.train()
        torch.manual_seed(0)
        return gap(model(x), theirs.model_call(x, n=0, k=1)[1])


@pytest.mark.parametrize("commit", COMMITS)
def test_fire_in_training_mode_at_the_launches_max_length(release, commit):
    """FIRE in training mode, on a 12-token sequence. With ``attention.max_length=0`` (the yaml files' default) the
    release's FIRE takes positions 0..N-1 at both commits, as posbench's: every logit within 1e-5. With the launches'
    ``max_length=64`` the commits differ (embeddings.py's FIRE.forward): at 84c16ad it takes a sorted random draw of N
    of the positions 0..63 (line 661), and its logits are more than 1e-3 from posbench's, which trains on 0..N-1 (a
    difference of protocol, on sequences shorter than 64 tokens; from 64 on, both take 0..N-1); at 55f877d it builds
    the bias of all 64 positions 0..63 (line 810), which does not fit the 12 x 12 scores: training fails. (The
    84c16ad case is the equality check failing on the code that differs.)"""
    line = {UPDATE: ("torch.sort(torch.randperm(max_length, dtype=torch.float", 661),
            HEAD: ("positions = torch.arange(max_length, dtype=torch.float", 810)}[commit]
    assert release.line_of(commit, f"{ARCH}/embeddings.py", line[0]) == line[1]
    assert fire_training_gap(release, commit, 0) <= FLOAT32
    if commit == UPDATE:
        assert fire_training_gap(release, commit, LAUNCH_MAX_LENGTH) > 1e-3
    else:
        with pytest.raises(RuntimeError, match="must match the size"):
            fire_training_gap(release, commit, LAUNCH_MAX_LENGTH)


# crammed_adadepthrecurrent: the "TAPE" run's class, end to end ------------------------------------------------------

def ada_arch(recurrences: int) -> dict:
    """cramming/config/arch/crammed-adadepthrecurrent.yaml as ``add_adayarn`` overrides it (84c16ad:shells/
    addition_ff.sh:206-232: ``attention.type=self-attention``, ``rotary_embedding=adape``, ``max_length=64``,
    ``pos_embedding=abacus``), at tests/model/test_release_backbone.py's toy size, ``state_init=zero`` (posbench's evaluation
    state). ``mask_before_equals`` (True in the launch) changes which positions the loss reads, not the logits:
    left False, so that the random tokens need no '='."""
    arch = backbone.release_arch("abacus", recurrences)
    arch["attention"].update(type="self-attention", rotary_embedding="adape", max_length=LAUNCH_MAX_LENGTH)
    return arch


#: the ada class's parameters that only the position state reads (AdaPE's projections, the rotary frequencies):
#: its hidden states never read that state (tests/tasks/test_release_arithmetic.py), so they are left as drawn
POSITION_ONLY = re.compile(r"(ffn_with_pe\.pe\.(x_proj|up_proj|down_proj)\.weight|encoder\.rotary_emb\.inv_freq)$")


def copy_into_ada(model, theirs) -> dict[str, str]:
    """posbench's weights into the release's ScriptableAdaRecurrentLMBPTT: tests/model/test_release_backbone.py's map for
    the self-attention class (in_proj per head), the FFN inside ``ffn_with_pe``, the TransposedAdapter the identity.
    Every parameter is written once except the position-only ones; returns the map."""
    writes: dict[int, tuple[torch.nn.Parameter, torch.Tensor, str]] = {}

    def put(target, value, what):
        assert id(target) not in writes
        writes[id(target)] = (target, value, what)

    def norm(target, source, what):
        put(target.weight, source.weight, f"{what}.weight")
        put(target.bias, source.bias, f"{what}.bias")

    enc = theirs.encoder
    put(enc.embedding.word_embedding.weight, model.embed.weight, "embed.weight")
    norm(enc.embedding.norm, model.embed_norm, "embed_norm")
    table = model.encoding.table.weight
    rest = enc.embedding.pos_embedding.embedding.weight[table.shape[0]:]
    put(enc.embedding.pos_embedding.embedding.weight, torch.cat((table, rest.to(table.dtype))), "encoding.table.weight")
    for i, (layer, ours) in enumerate(zip(enc.recurrent_block.layers, model.blocks)):
        assert type(layer.attn).__name__ == "SeqFirstSelfAdaAttention"
        put(layer.attn.in_proj_weight, per_head(ours.attn.qkv.weight), f"per_head(blocks.{i}.attn.qkv.weight)")
        put(layer.attn.out_proj.weight, ours.attn.out.weight, f"blocks.{i}.attn.out.weight")
        norm(layer.residual1.norm, ours.attn_norm, f"blocks.{i}.attn_norm")
        norm(layer.residual2.norm, ours.mlp_norm, f"blocks.{i}.mlp_norm")
        ffn = layer.ffn_with_pe.ffn
        put(ffn.dense_in.weight, glu(ours.mlp), f"cat(blocks.{i}.mlp.up, blocks.{i}.mlp.gate)")
        put(ffn.dense_out.weight, ours.mlp.down.weight, f"blocks.{i}.mlp.down.weight")
    put(enc.head.dense_in.weight, glu(model.head), "cat(head.up, head.gate)")
    put(enc.head.dense_out.weight, model.head.down.weight, "head.down.weight")
    norm(enc.final_norm, model.norm, "norm")
    put(theirs.adapter.weight, torch.eye(D), "identity")
    put(theirs.decoder.weight, model.lm_head.weight, "lm_head.weight")

    names = {id(p): n for n, p in theirs.named_parameters()}
    left = {names[key] for key in set(names) - set(writes)}
    assert left and all(POSITION_ONLY.search(n) for n in left), sorted(left)
    assert not any(POSITION_ONLY.search(names[key]) for key in writes)
    with torch.no_grad():
        for target, value, _ in writes.values():
            assert target.shape == value.shape, (names[id(target)], target.shape, value.shape)
            target.copy_(value)
    return {names[key]: what for key, (_, _, what) in writes.items()}


def built_ada(release, commit: str, recurrences: int, dtype=torch.float64, ada=None, **settings):
    """posbench's "TAPE as run" (Abacus on the depth-recurrent backbone) and the release's ada class with its
    weights; ``ada``: the class's module (default: the file at ``commit``)."""
    ada = ada or load(release, commit, "crammed_adadepthrecurrent")
    model = posbench_model("abacus", recurrences, **settings).to(dtype).eval()
    torch.manual_seed(5)
    theirs = ada.ScriptableAdaRecurrentLMBPTT(ada.crammedAdaDepthRecurrentConfig(ada_arch(recurrences)),
                                              equals_token=17).to(dtype).eval()
    mapping = copy_into_ada(model, theirs)
    exact_score_scale(theirs)
    return model, theirs, mapping


def ada_logits(theirs, x, recurrences):
    """Every position's logits ``[B, S, V]`` from the class's ``model_call(n=0, k=recurrences)``: all passes with
    gradients (its passes without them fail, see below)."""
    return theirs.model_call(x, n=0, k=recurrences)[1]


@pytest.mark.parametrize("recurrences", [1, 2])
@pytest.mark.parametrize("commit", COMMITS)
def test_the_ada_class_end_to_end_equals_posbenchs_tape_as_run(release, commit, recurrences):
    """``ScriptableAdaRecurrentLMBPTT`` (crammed_adadepthrecurrent.py) as ``add_adayarn`` builds it: Abacus,
    ``SeqFirstSelfAdaAttention`` (its rotation computed and discarded), AdaPE after each FFN, a position state
    from AdaRotary (55f877d) or YaRNRotary (84c16ad, whatever the flag). Against posbench's Abacus on the
    depth-recurrent backbone (the protocols study's "TAPE as run"), float64, evaluation: every logit within 1e-10."""
    model, theirs, _ = built_ada(release, commit, recurrences)
    assert type(theirs.encoder.rotary_emb).__name__ == {HEAD: "AdaRotary", UPDATE: "YaRNRotary"}[commit]
    x = tokens("abacus")
    with torch.no_grad():
        ours, logits = model(x), ada_logits(theirs, x, recurrences)
    assert logits.abs().max().item() > 0.1
    assert gap(ours, logits) <= EXACT, gap(ours, logits)


@pytest.mark.parametrize("commit", COMMITS)
def test_the_ada_class_generates_posbenchs_tokens(release, commit):
    """The class's evaluation path, ``_generate`` (greedy, ``quick=True``, one recurrence: as eval_arithmetic.py
    calls it), against posbench's greedy ``generate`` (KV cache): the same 6 new tokens for every prompt."""
    model, theirs, _ = built_ada(release, commit, 1)
    prompts = tokens("abacus")[:, :8]
    with torch.no_grad():
        ours = model.generate(prompts, max_new_tokens=6)
        generated = theirs._generate(prompts, token_limit=6, steps_at_generation_time=1, greedy=True, quick=True)
    assert torch.equal(ours, generated.reshape(6, B).T)


@pytest.mark.parametrize("commit", COMMITS)
def test_the_ada_class_in_training_mode_equals_posbench_at_the_same_offset(release, commit, monkeypatch):
    """Training mode, float32, one recurrence (the TBPTT step ``model_call(n=0, k=1)``): posbench's Abacus offset
    handed to the release (its Abacus and its rotary state draw from the same ``random.randint``; the state's draw
    reaches no logit); every logit within 1e-5 (measured 7e-7). The guard: handed the offset plus one, more than 0.1
    away (measured 2.0)."""
    model, theirs, _ = built_ada(release, commit, 1, dtype=torch.float32, state_std=0.0)
    gaps = training_gaps(monkeypatch, model, theirs, tbptt_step, range(2))
    assert all(g <= FLOAT32 for _, g in gaps), gaps
    assert max(k for k, _ in gaps) > 0
    model, theirs, _ = built_ada(release, commit, 1, dtype=torch.float32, state_std=0.0)
    assert all(g > DIFFERENT for _, g in training_gaps(monkeypatch, model, theirs, tbptt_step, range(2), shift=1))


@pytest.mark.parametrize("commit", COMMITS)
def test_the_ada_class_cannot_run_its_own_evaluation_forward(release, commit):
    """Why the tests call ``model_call(n=0, k=...)`` and ``_generate``: the class's ``forward`` out of training calls
    ``model_call(n=maximal_recurrence_in_eval, k=0)``, whose passes without gradients call the block without the
    position state (``self.recurrent_block(hidden_states, injected_state, self.attention_mask)``, 84c16ad line 257,
    55f877d line 267), and fail. The release's evaluation goes through ``_generate`` instead. With that one call
    given the state (the file's text changed, loaded as its own module), ``forward`` runs and its last-position
    logits are posbench's within 1e-10: the failure is that call's alone."""
    line = "self.recurrent_block(hidden_states, injected_state, self.attention_mask).clone()"
    assert release.line_of(commit, f"{ARCH}/crammed_adadepthrecurrent.py", line) == {UPDATE: 257, HEAD: 267}[commit]
    _, theirs, _ = built_ada(release, commit, 1)
    x = tokens("abacus")
    with torch.no_grad(), pytest.raises(RuntimeError):
        theirs(x)
    text = release.show(commit, f"{ARCH}/crammed_adadepthrecurrent.py")
    given = "self.recurrent_block(hidden_states, position_states, injected_state, self.attention_mask)[0].clone()"
    fixed = load(release, commit, "crammed_adadepthrecurrent", source=text.replace(line, given), tag="state_given")
    for recurrences in (1, 2):
        model, theirs, _ = built_ada(release, commit, recurrences, ada=fixed)
        with torch.no_grad():
            assert gap(model(x)[:, -1], theirs(x)["logits"]) <= EXACT


@pytest.mark.parametrize("commit", COMMITS)
def test_the_ada_check_catches_an_attention_that_keeps_its_rotation(release, commit, monkeypatch):
    """The guard: attention.py with the one call changed to keep the rotated q and k
    (``query_layer, key_layer = self.apply_rotary_emb(...)``, as tests/tasks/test_release_arithmetic.py patches it),
    loaded as its own module and used by the ada class: its logits are more than 1e-3 from posbench's Abacus
    (measured 0.48), and it generates other tokens (10 of the 18 differ), so the checks above fail on a release
    whose TAPE attention reads the position state."""
    discarded = "self.apply_rotary_emb(query_layer, key_layer, position_states)"
    text = release.show(commit, f"{ARCH}/attention.py")
    assert text.count(discarded) == 1
    rotated = load(release, commit, "attention", source=text.replace(discarded, "query_layer, key_layer = " + discarded),
                   tag="rotated")
    ada = load(release, commit, "crammed_adadepthrecurrent")
    monkeypatch.setattr(ada, "get_attention_mechanism", rotated.get_attention_mechanism)
    model, theirs, _ = built_ada(release, commit, 1, ada=ada)
    x = tokens("abacus")
    with torch.no_grad():
        assert gap(model(x), ada_logits(theirs, x, 1)) > 1e-3
        ours = model.generate(x[:, :8], max_new_tokens=6)
        generated = theirs._generate(x[:, :8], token_limit=6, steps_at_generation_time=1, greedy=True, quick=True)
    assert not torch.equal(ours, generated.reshape(6, B).T)


def test_the_ada_map_writes_every_parameter_but_the_position_only_ones(release):
    """The explicit map, for the record: the attention per head, the FFN inside ``ffn_with_pe``, AdaPE's three
    projections and the rotary frequencies left as drawn (nothing of them reaches a logit)."""
    _, theirs, mapping = built_ada(release, HEAD, 1)
    block = "encoder.recurrent_block.layers.0"
    assert mapping[f"{block}.attn.in_proj_weight"] == "per_head(blocks.0.attn.qkv.weight)"
    assert mapping[f"{block}.ffn_with_pe.ffn.dense_in.weight"] == "cat(blocks.0.mlp.up, blocks.0.mlp.gate)"
    assert mapping["encoder.embedding.pos_embedding.embedding.weight"] == "encoding.table.weight"
    left = sorted(n for n, _ in theirs.named_parameters() if n not in mapping)
    assert left == ["encoder.recurrent_block.layers.0.ffn_with_pe.pe.down_proj.weight",
                    "encoder.recurrent_block.layers.0.ffn_with_pe.pe.up_proj.weight",
                    "encoder.recurrent_block.layers.0.ffn_with_pe.pe.x_proj.weight",
                    "encoder.recurrent_block.layers.1.ffn_with_pe.pe.down_proj.weight",
                    "encoder.recurrent_block.layers.1.ffn_with_pe.pe.up_proj.weight",
                    "encoder.recurrent_block.layers.1.ffn_with_pe.pe.x_proj.weight",
                    "encoder.rotary_emb.inv_freq"]
    assert len(mapping) == 26                  # 3 embedding + the Abacus table + 2 x 8 per layer + 4 head + 2


# Without the release: one line -------------------------------------------------------------------------------------

def test_a_run_without_the_release_says_so_in_one_line(tmp_path):
    """With ``POSBENCH_RELEASES`` at an empty folder, pytest on two release test files skips every test and prints
    one line naming both files and how to fetch the release (tests/conftest.py's ``pytest_terminal_summary``)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    files = ["tests/tasks/test_release_arithmetic.py", "tests/model/test_release_backbone.py"]
    env = {**os.environ, "POSBENCH_RELEASES": str(tmp_path)}
    for inherited in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "POSBENCH_TEST_GROUPS"):
        env.pop(inherited, None)
    done = subprocess.run([sys.executable, "-m", "pytest", *files, "-n", "0", "-p", "no:randomly", "-q",
                           "-p", "no:cacheprovider"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("release tests skipped")]
    assert len(lines) == 1, done.stdout[-3000:]
    (line,) = lines
    assert all(f in line for f in files)
    assert "github:zhuconv/arithmetic" in line and "POSBENCH_RELEASES" in line
    assert " passed" not in done.stdout.splitlines()[-1]


def test_the_skip_line_names_each_file_once_and_ignores_other_skips():
    """``release_source.skipped_releases_line`` on skip reports as pytest keeps them (``longrepr`` a tuple; a list
    from a pytest-xdist worker): one line for any number of skips, each file named once, a mirror lacking a commit
    named as such; None when no release test skipped."""
    from release_source import skipped_releases_line

    def skip(nodeid, reason, as_list=False):
        longrepr = ["x.py", 1, f"Skipped: {reason}"] if as_list else ("x.py", 1, f"Skipped: {reason}")
        return types.SimpleNamespace(nodeid=nodeid, longrepr=longrepr)

    absent = "release zhuconv/arithmetic not fetched: no git mirror at /nowhere"
    reports = [skip("tests/test_release_a.py::t[1]", absent), skip("tests/test_release_a.py::t[2]", absent, True),
               skip("tests/test_release_b.py::u", "release VITA-Group/TAPE at /m lacks commit(s) abc1234"),
               skip("tests/model/test_gpu.py::g", "needs a CUDA device")]
    line = skipped_releases_line(reports)
    assert "\n" not in line and line.startswith("release tests skipped")
    assert "tests/test_release_a.py, tests/test_release_b.py (3 tests)" in line and "test_gpu" not in line
    assert "zhuconv/arithmetic not fetched" in line and "VITA-Group/TAPE lacks a commit" in line
    assert "github:VITA-Group/TAPE and github:zhuconv/arithmetic" in line
    assert skipped_releases_line(reports[-1:]) is None and skipped_releases_line([]) is None
