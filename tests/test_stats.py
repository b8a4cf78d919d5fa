"""posbench.stats against values computed independently: t tables and closed forms, hand-calculated
intervals and t-tests, and the bootstrap against the closed-form variance of a (stratified) paired mean."""

import math
from functools import partial
from statistics import NormalDist

import numpy as np
import pytest

from posbench import stats
from posbench.stats import ExampleScores, Recipe, mean_recipe, paired_difference, seed_interval


# ---- the t distribution ------------------------------------------------------------------------------------

@pytest.mark.parametrize("df,q975", [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (5, 2.5706),
                                     (10, 2.2281), (30, 2.0423), (100, 1.9840)])
def test_t_quantiles_match_the_printed_table(df, q975):
    assert stats.t_quantile(0.975, df) == pytest.approx(q975, abs=5e-5)     # tables give 4 decimals
    assert stats.t_quantile(0.025, df) == pytest.approx(-q975, abs=5e-5)


@pytest.mark.parametrize("t", [-7.5, -1.3, 0.0, 0.4, 2.0, 31.0])
def test_t_cdf_matches_the_closed_forms_of_one_and_two_degrees_of_freedom(t):
    assert stats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)       # Cauchy
    assert stats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    # three degrees of freedom: 1/2 + (atan(u) + u / (1 + u^2)) / pi with u = t / sqrt(3)
    u = t / math.sqrt(3)
    assert stats.t_cdf(t, 3) == pytest.approx(0.5 + (math.atan(u) + u / (1 + u * u)) / math.pi, abs=1e-12)


def test_large_degrees_of_freedom_become_the_normal():
    assert stats.t_quantile(0.975, math.inf) == pytest.approx(1.959964, abs=1e-6)
    assert stats.t_two_sided_p(1.959964, 5000) == pytest.approx(0.05, abs=1e-6)
    assert stats.t_quantile(0.975, 999) == pytest.approx(1.9623, abs=1e-4)       # still t just below


# ---- mean over seeds ---------------------------------------------------------------------------------------

def test_seed_interval_is_student_t_by_hand():
    # 40, 42, 47: mean 43, s = sqrt((9 + 1 + 16) / 2) = sqrt(13), half-width t(0.975, 2) * s / sqrt(3)
    interval = seed_interval([40.0, 42.0, 47.0])
    assert interval.mean == pytest.approx(43.0) and interval.n == 3
    assert interval.half_width == pytest.approx(4.302653 * math.sqrt(13) / math.sqrt(3), rel=1e-6)
    assert interval.half_width == pytest.approx(8.9567, abs=1e-4)
    one = seed_interval([40.0])
    assert one.mean == 40.0 and one.half_width is None and one.low is None
    assert seed_interval([None, float("nan")]) is None
    assert seed_interval([1.0, None, 3.0]).n == 2


# ---- paired differences ------------------------------------------------------------------------------------

def test_seeds_only_is_the_paired_t_test_by_hand():
    # differences 1, 2, 3: D = 2, se = 1 / sqrt(3), df = 2; t = 2 sqrt(3) = 3.4641;
    # two-sided p with 2 df: 1 - t / sqrt(2 + t^2) = 1 - 3.4641 / sqrt(14) = 0.074180
    d = paired_difference([10.0, 10.0, 10.0], [11.0, 12.0, 13.0])
    assert d.estimate == pytest.approx(2.0) and d.df == 2 and d.seeds == 3 and d.examples is None
    half = 4.302653 / math.sqrt(3)
    assert (d.low, d.high) == (pytest.approx(2 - half, rel=1e-6), pytest.approx(2 + half, rel=1e-6))
    assert d.p == pytest.approx(1 - 2 * math.sqrt(3) / math.sqrt(14), abs=1e-9)
    assert d.p == pytest.approx(0.074180, abs=1e-6)


def test_one_seed_without_examples_has_no_interval():
    d = paired_difference([1.0], [3.0])
    assert d.estimate == 2.0 and d.low is None and d.p is None


def _binary_runs(n_per_stratum, strata, b_only, a_only):
    """Per-example correctness (x100) of A and B: in every stratum ``b_only`` examples only B gets right,
    ``a_only`` only A, and the rest both get wrong."""
    a, b, labels = [], [], []
    for s in range(strata):
        for i in range(n_per_stratum):
            labels.append(s)
            a.append(100.0 if b_only <= i < b_only + a_only else 0.0)
            b.append(100.0 if i < b_only else 0.0)
    return np.array(a), np.array(b), labels


def _scores(values, strata):
    return ExampleScores(list(range(len(values))), strata, {"acc": values}, {"acc": mean_recipe("acc")})


def test_one_seed_with_examples_matches_the_paired_z_test():
    # 4 strata x 100 examples; in each, B alone is right on 8 and A alone on 5 (32 and 20 in all)
    a, b, strata = _binary_runs(100, 4, 8, 5)
    n = len(a)
    d_i = b - a                                            # +100 (32), -100 (20), 0 (348)
    D = d_i.mean()                                         # = 12 * 100 / 400 = 3.0
    # population variance: 52 * 100^2 / 400 - 3^2 = 1291; se = sqrt(1291 / 400) = 1.79652
    # the bootstrap variance of a mean of n draws is the population variance / n (per stratum, summed with
    # weights (1/4)^2; the strata are identical here so it is the same as unstratified)
    se = math.sqrt(d_i.var() / n)
    z = D / se
    sa, sb = _scores(a, strata), _scores(b, strata)
    diff = paired_difference([sa.metric_under("acc")], [sb.metric_under("acc")],
                             a_examples=[lambda w: sa.metric_under("acc", w)],
                             b_examples=[lambda w: sb.metric_under("acc", w)], strata=strata, n_boot=8000)
    assert diff.estimate == pytest.approx(3.0) and diff.examples == 400 and math.isinf(diff.df)
    assert diff.se == pytest.approx(se, rel=0.03)           # 8000 replicates: relative error ~0.8%
    half = 1.959964 * diff.se
    assert (diff.low, diff.high) == (pytest.approx(D - half), pytest.approx(D + half))
    p_closed = 2 * NormalDist().cdf(-z)                     # z = 3 / 1.79652 = 1.66989 -> p = 0.09494
    assert se == pytest.approx(1.79652, abs=1e-5) and p_closed == pytest.approx(0.09494, abs=1e-5)
    assert diff.p == pytest.approx(p_closed, abs=0.01)


def test_the_bootstrap_keeps_strata_apart():
    # stratum 0: B right, A wrong on all 100 (no variance inside it); stratum 1: half each way.
    # Stratified variance of the mean difference: (1/2)^2 * (0 / 100 + 100^2 / 100) = 25 -> se 5.
    # Ignoring the strata it would be var{+100 x 150, -100 x 50} / 200 = 7500 / 200 -> se 6.12.
    a = np.array([0.0] * 100 + [100.0] * 50 + [0.0] * 50)
    b = np.array([100.0] * 100 + [0.0] * 50 + [100.0] * 50)
    strata = [0] * 100 + [1] * 100
    sa, sb = _scores(a, strata), _scores(b, strata)
    diff = paired_difference([sa.metric_under("acc")], [sb.metric_under("acc")],
                             a_examples=[lambda w: sa.metric_under("acc", w)],
                             b_examples=[lambda w: sb.metric_under("acc", w)], strata=strata, n_boot=8000)
    assert diff.estimate == pytest.approx(50.0)
    assert diff.se == pytest.approx(5.0, rel=0.03)


def test_seeds_and_examples_combine_as_stated():
    rng = np.random.default_rng(3)
    n, k = 300, 3
    strata = [0] * n
    base = rng.random(n) < 0.5
    runs_a, runs_b = [], []
    for s in range(k):                                      # B better by a seed-dependent margin
        runs_a.append(_scores(100.0 * (base ^ (rng.random(n) < 0.10)), strata))
        runs_b.append(_scores(100.0 * (base ^ (rng.random(n) < 0.10 - 0.03 * s)), strata))
    a = [s.metric_under("acc") for s in runs_a]
    b = [s.metric_under("acc") for s in runs_b]
    diff = paired_difference(a, b, a_examples=[lambda w, s=s: s.metric_under("acc", w) for s in runs_a],
                             b_examples=[lambda w, s=s: s.metric_under("acc", w) for s in runs_b], strata=strata,
                             n_boot=8000)
    # closed form: v = var(d_s) / k + (population variance over examples of the seed-averaged d_i) / n
    d_s = np.array(b) - np.array(a)
    d_i = np.mean([sb.terms["acc"] - sa.terms["acc"] for sa, sb in zip(runs_a, runs_b)], axis=0)
    v_seed, v_ex = d_s.var(ddof=1) / k, d_i.var() / n
    v = v_seed + v_ex
    df = max(math.floor(v * v * (k - 1) / v_seed ** 2), k - 1)
    assert diff.estimate == pytest.approx(d_s.mean())
    assert diff.se == pytest.approx(math.sqrt(v), rel=0.03)
    assert diff.df == pytest.approx(df, abs=1)            # a bootstrap v_ex within 3% moves df by at most one
    half = stats.t_quantile(0.975, df) * math.sqrt(v)
    assert diff.high - diff.estimate == pytest.approx(half, rel=0.05)
    assert diff.basis == "3 seeds x 300 examples"


def test_the_bootstrap_is_reproducible_and_identical_runs_differ_by_nothing():
    a, b, strata = _binary_runs(50, 2, 5, 3)
    sa, sb = _scores(a, strata), _scores(b, strata)
    kw = dict(a_examples=[lambda w: sa.metric_under("acc", w)], b_examples=[lambda w: sb.metric_under("acc", w)],
              strata=strata)
    first = paired_difference([sa.metric_under("acc")], [sb.metric_under("acc")], **kw)
    again = paired_difference([sa.metric_under("acc")], [sb.metric_under("acc")], **kw)
    assert first == again
    same = paired_difference([sa.metric_under("acc")], [sa.metric_under("acc")],
                             a_examples=[lambda w: sa.metric_under("acc", w)],
                             b_examples=[lambda w: sa.metric_under("acc", w)], strata=strata)
    assert same.estimate == 0.0 and same.p == 1.0 and same.low == same.high == 0.0


@pytest.mark.parametrize("float_bytes", [stats.FLOAT_WEIGHTS_BYTES, 0])   # kept as floats, and as counts
def test_a_shared_bootstrap_gives_each_pair_what_its_own_draw_gives(float_bytes, monkeypatch):
    """compare draws the replicates once per list of strata and resamples a reference run once for all rows; the
    differences must be bitwise those of a fresh generator per pair (the committed study tables depend on it),
    whether the weights are kept as floats or, above FLOAT_WEIGHTS_BYTES, as counts."""
    monkeypatch.setattr(stats, "FLOAT_WEIGHTS_BYTES", float_bytes)
    a, b, strata = _binary_runs(60, 2, 5, 3)
    c, _, _ = _binary_runs(60, 2, 5, 4)
    ref, one, two = (_scores(x, strata) for x in (a, b, c))
    shared = stats.StratifiedBootstrap(strata)
    ref_fn = partial(ref.metric_under, "acc")
    for other in (one, two):
        own = paired_difference([ref.metric_under("acc")], [other.metric_under("acc")],
                                a_examples=[partial(ref.metric_under, "acc")],
                                b_examples=[partial(other.metric_under, "acc")], strata=strata)
        reused = paired_difference([ref.metric_under("acc")], [other.metric_under("acc")], a_examples=[ref_fn],
                                   b_examples=[partial(other.metric_under, "acc")], strata=strata, bootstrap=shared)
        assert reused == own
    assert list(shared._replicates).count(ref_fn) == 1 and len(shared._replicates) == 3   # the reference once
    fresh = list(stats.stratified_weights(strata, stats.N_BOOT, np.random.default_rng(stats.BOOT_SEED)))
    assert all(np.array_equal(x, y) and x.dtype == np.float64 for x, y in zip(shared.weights(), fresh, strict=True))
    assert (shared._counts[0].dtype == np.float64) == (float_bytes > 0)
    with pytest.raises(ValueError, match="other strata"):
        paired_difference([1.0], [2.0], a_examples=[ref_fn], b_examples=[ref_fn], strata=strata[::-1],
                          bootstrap=shared)


# ---- per-example scores ------------------------------------------------------------------------------------

def test_example_scores_align_by_key_and_rebuild_nonlinear_metrics():
    terms = {"x": np.array([1.0, 2.0, 3.0, np.nan]), "y": np.array([4.0, np.nan, 8.0, 2.0])}
    gm = Recipe(("x", "y"), lambda m: np.sqrt(m[..., 0] * m[..., 1]))
    scores = ExampleScores(["a", "b", "c", "d"], [0, 0, 1, 1], terms, {"gm": gm, "x": mean_recipe("x")})
    # x: mean of 1, 2, 3 = 2; y: mean of 4, 8, 2 = 14 / 3; gm = sqrt(28 / 3)
    assert scores.metric_under("gm") == pytest.approx(math.sqrt(28 / 3))
    flipped = scores.aligned(["d", "c", "b", "a"])
    assert flipped.strata == [1, 1, 0, 0] and flipped.metric_under("gm") == pytest.approx(math.sqrt(28 / 3))
    # weights count examples: "a" twice, "c" not at all -> x: (1 + 1 + 2) / 3
    w = np.array([[2.0, 1.0, 0.0, 1.0]])
    assert scores.metric_under("x", w)[0] == pytest.approx(4 / 3)
