"""The statistics behind ``posbench compare``: intervals over seeds and paired differences between encodings.

* **Mean over seeds** (``seed_interval``): the mean of a metric over the runs that differ only in their seed,
  with the Student-t 95% interval ``mean ± t(0.975, k-1) · s / sqrt(k)`` (``s`` the sample standard deviation
  of the k seed values). It needs k >= 2 (k = 2 gives a wide interval: t = 12.71); with one seed there is no
  interval over seeds.

* **Paired difference** (``paired_difference``), B minus A, seeds paired by their number (the same seed gives
  the same training data order to both):

  - ``d_s`` = B's metric minus A's under seed s; the estimate is ``D = mean_s d_s``.
  - Training variance: ``s_d^2 / k`` (the sample variance of the ``d_s``), with k-1 degrees of freedom.
  - Evaluation variance, when both runs scored the same examples (per-example results in their
    predictions): a paired bootstrap over the examples: each replicate draws the examples with replacement
    (within strata -- grid cells, data sets -- so every stratum keeps its size), gives the same draw to every
    run of both encodings, recomputes each run's metric from its per-example values and takes ``D*``; the
    variance of ``D*`` over ``n_boot`` replicates (seeded: the same tree gives the same numbers).
  - The interval is ``D ± t(0.975, df) · sqrt(v)``, ``v`` the sum of the variances that are known, ``df``
    Welch-Satterthwaite's (the bootstrap part counted as exact), rounded down; the p-value is the two-sided
    t-test of ``D = 0`` with the same ``v`` and ``df``. The sum counts the seed x example interaction twice
    (it is in both parts), so the interval errs, slightly, on the wide side.
  - One seed with per-example data: only the evaluation variance is known (``df`` infinite): the interval
    says whether these two trained models differ on this evaluation, not whether the encodings do.
    Several seeds without per-example data (perplexity): the paired t-test over seeds. One seed and no
    per-example data: no interval and no p-value.

The t distribution is computed in closed form for whole degrees of freedom (Abramowitz & Stegun 26.7.3),
the normal one (``statistics.NormalDist``) from 1000 degrees of freedom on (t(0.975, 1000) = 1.9623 against
1.9600). ``ExampleScores`` is what a task returns (``Task.example_scores``) to say how its metrics are built
from its per-example results.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

LEVEL = 0.95
NORMAL_DF = 1000          # from here on the t distribution is replaced by the normal one
N_BOOT = 2000
BOOT_SEED = 0


# ---- the t distribution ----------------------------------------------------------------------------------

def _two_sided_mass(t: float, df: int) -> float:
    """P(|T| <= t) for T ~ t(df), t >= 0, df a positive whole number (Abramowitz & Stegun 26.7.3)."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 1:
        total, term = 0.0, math.cos(theta)
        for k in range(1, (df - 1) // 2 + 1):        # cos + 2/3 cos^3 + (2*4)/(3*5) cos^5 + ... (df-2 power)
            total += term
            term *= c2 * (2 * k) / (2 * k + 1)
        return 2 / math.pi * (theta + s * total) if df > 1 else 2 * theta / math.pi
    total, term = 0.0, 1.0
    for k in range(1, df // 2 + 1):                  # 1 + 1/2 cos^2 + (1*3)/(2*4) cos^4 + ... (df-2 power)
        total += term
        term *= c2 * (2 * k - 1) / (2 * k)
    return s * total


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (rounded down; ``inf``: the normal)."""
    if math.isinf(df) or df >= NORMAL_DF:
        return NormalDist().cdf(t)
    dfi = int(math.floor(df))
    if dfi < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    mass = _two_sided_mass(abs(t), dfi)
    return 0.5 + mass / 2 if t >= 0 else 0.5 - mass / 2


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|)."""
    if math.isinf(df) or df >= NORMAL_DF:
        return 2 * NormalDist().cdf(-abs(t))
    return max(0.0, 1.0 - _two_sided_mass(abs(t), int(math.floor(df))))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of t(df) (0 < p < 1), by bisection on ``t_cdf``."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    if math.isinf(df) or df >= NORMAL_DF:
        return NormalDist().inv_cdf(p)
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


# ---- intervals over seeds --------------------------------------------------------------------------------

@dataclass
class SeedInterval:
    mean: float
    half_width: float | None             # None with one seed
    n: int
    sd: float | None = None

    @property
    def low(self) -> float | None:
        return None if self.half_width is None else self.mean - self.half_width

    @property
    def high(self) -> float | None:
        return None if self.half_width is None else self.mean + self.half_width


def seed_interval(values: Sequence[float], level: float = LEVEL) -> SeedInterval | None:
    """Mean and Student-t interval of the finite ``values`` (one per seed); None when there are none."""
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return None
    k = len(vals)
    mean = sum(vals) / k
    if k < 2:
        return SeedInterval(mean, None, 1)
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (k - 1))
    return SeedInterval(mean, t_quantile(0.5 + level / 2, k - 1) * sd / math.sqrt(k), k, sd)


# ---- per-example scores ----------------------------------------------------------------------------------

@dataclass
class Recipe:
    """A metric as a function of the means of some per-example terms: ``combine(means)`` with ``means`` of
    shape ``(..., len(terms))`` in the order of ``terms``; without ``combine``, the mean of the one term."""

    terms: tuple[str, ...]
    combine: Callable[[np.ndarray], np.ndarray] | None = None

    def value(self, means: np.ndarray) -> np.ndarray:
        return means[..., 0] if self.combine is None else self.combine(means)


@dataclass
class ExampleScores:
    """The per-example results behind a run's metrics, for paired comparisons.

    ``keys``: one hashable id per example; two runs scored the same examples when their keys are the same.
    ``strata``: one label per example (a grid cell, a data set); resampling keeps every stratum's size.
    ``terms``: name -> one value per example (NaN where the example does not belong to the term).
    ``metrics``: metric name -> the ``Recipe`` that rebuilds the metric from the means of its terms.
    """

    keys: list[Hashable]
    strata: list[Hashable]
    terms: dict[str, np.ndarray]
    metrics: dict[str, Recipe] = field(default_factory=dict)

    def aligned(self, order: Sequence[Hashable]) -> ExampleScores:
        """The same scores with the examples in the order of ``order`` (which must hold the same keys)."""
        where = {k: i for i, k in enumerate(self.keys)}
        index = np.array([where[k] for k in order], dtype=np.int64)
        return ExampleScores(list(order), [self.strata[i] for i in index],
                             {n: np.asarray(v, dtype=float)[index] for n, v in self.terms.items()}, self.metrics)

    def metric_under(self, name: str, weights: np.ndarray | None = None) -> np.ndarray:
        """The metric with every example counted ``weights[..., i]`` times (None: once)."""
        recipe = self.metrics[name]
        n = len(self.keys)
        w = np.ones((1, n)) if weights is None else np.atleast_2d(weights)
        means = []
        for term in recipe.terms:
            values = np.asarray(self.terms[term], dtype=float)
            inside = np.isfinite(values)
            with np.errstate(invalid="ignore", divide="ignore"):
                means.append((w @ np.where(inside, values, 0.0)) / (w @ inside.astype(float)))
        out = recipe.value(np.stack(means, axis=-1))
        return out if weights is not None and np.ndim(weights) == 2 else out.reshape(-1)[0]


def mean_recipe(term: str) -> Recipe:
    return Recipe((term,))


def stratified_weights(strata: Sequence[Hashable], n_boot: int, rng: np.random.Generator,
                       chunk: int = 256):
    """Yield bootstrap weight matrices ``(replicates, examples)``: in every replicate each stratum's examples
    are drawn with replacement as many times as the stratum has examples."""
    groups: dict[Hashable, list[int]] = {}
    for i, s in enumerate(strata):
        groups.setdefault(s, []).append(i)
    index = [np.array(g, dtype=np.int64) for g in groups.values()]
    done = 0
    while done < n_boot:
        size = min(chunk, n_boot - done)
        w = np.zeros((size, len(strata)))
        for g in index:
            w[:, g] = rng.multinomial(len(g), np.full(len(g), 1.0 / len(g)), size=size)
        yield w
        done += size


#: the most memory a ``StratifiedBootstrap`` keeps its weights in as floats (ready for the products); larger ones
#: are kept as counts in the smallest integer type and converted on each use (the same values)
FLOAT_WEIGHTS_BYTES = 256 << 20


class StratifiedBootstrap:
    """The replicates of ``stratified_weights(strata, n_boot, default_rng(seed))``, drawn once and kept (as
    floats within ``FLOAT_WEIGHTS_BYTES``, else as counts in the smallest integer type that holds them): every
    paired difference over the same examples reads the same replicates, exactly what each would draw from its own
    generator seeded alike, without redrawing."""

    def __init__(self, strata: Sequence[Hashable], n_boot: int = N_BOOT, seed: int = BOOT_SEED):
        self.strata, self.n_boot, self.seed = list(strata), n_boot, seed
        self._counts: list[np.ndarray] | None = None
        self._replicates: dict[Callable, list[np.ndarray]] = {}

    def weights(self):
        """Yield the weight matrices ``(replicates, examples)``, as ``stratified_weights`` yields them."""
        if self._counts is None:
            largest = max(collections.Counter(self.strata).values(), default=1)
            as_floats = self.n_boot * len(self.strata) * 8 <= FLOAT_WEIGHTS_BYTES
            kind = np.float64 if as_floats else np.min_scalar_type(largest)
            self._counts = [w.astype(kind) for w in
                            stratified_weights(self.strata, self.n_boot, np.random.default_rng(self.seed))]
            for counts in self._counts:
                counts.flags.writeable = False
        for counts in self._counts:
            yield counts if counts.dtype == np.float64 else counts.astype(float)

    def replicates(self, metric: Callable[[np.ndarray], np.ndarray]) -> list[np.ndarray]:
        """``metric`` under each weight matrix (one array per matrix), computed once per callable (by identity):
        a reference run paired with many rows is resampled once."""
        if metric not in self._replicates:
            self._replicates[metric] = [metric(w) for w in self.weights()]
        return self._replicates[metric]


# ---- paired differences ----------------------------------------------------------------------------------

@dataclass
class Difference:
    estimate: float
    low: float | None
    high: float | None
    p: float | None
    df: float | None
    seeds: int
    examples: int | None                  # examples paired per seed (None: seeds only)
    se: float | None = None
    basis: str = ""                       # what the interval covers, in words

    def to_dict(self) -> dict:
        return {"difference": self.estimate, "ci_low": self.low, "ci_high": self.high, "p": self.p,
                "df": None if self.df is None or math.isinf(self.df) else self.df, "seeds": self.seeds,
                "examples": self.examples, "se": self.se, "basis": self.basis}


def paired_difference(a: Sequence[float], b: Sequence[float], *,
                      a_examples: Sequence[Callable[[np.ndarray], np.ndarray]] | None = None,
                      b_examples: Sequence[Callable[[np.ndarray], np.ndarray]] | None = None,
                      strata: Sequence[Hashable] | None = None, n_boot: int = N_BOOT, seed: int = BOOT_SEED,
                      level: float = LEVEL, bootstrap: StratifiedBootstrap | None = None) -> Difference:
    """B minus A, seeds paired by position (``a[s]``, ``b[s]`` are the two metrics under seed s).

    With ``a_examples`` / ``b_examples`` (one callable per seed mapping bootstrap weights ``(R, n)`` to the
    run's metric under them, ``(R,)``) and ``strata`` (one label per example), the evaluation examples are
    resampled too (see the module docstring). ``bootstrap``: the same replicates already drawn for these strata
    (a compare draws them once for all its pairs); it must have been made with ``strata``, ``n_boot`` and ``seed``."""
    if len(a) != len(b) or not a:
        raise ValueError("paired_difference needs the same number (>= 1) of A and B values")
    d = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)
    k = len(d)
    estimate = float(d.mean())
    v_seed = float(d.var(ddof=1)) / k if k >= 2 else None
    v_ex = None
    n_examples = None
    if a_examples is not None and b_examples is not None and strata is not None:
        n_examples = len(strata)
        if bootstrap is None:
            bootstrap = StratifiedBootstrap(strata, n_boot, seed)
        elif (bootstrap.n_boot, bootstrap.seed) != (n_boot, seed) or bootstrap.strata != list(strata):
            raise ValueError("paired_difference: the bootstrap was drawn for other strata, replicates or seed")
        a_reps = [bootstrap.replicates(f) for f in a_examples]
        b_reps = [bootstrap.replicates(f) for f in b_examples]
        draws = [np.mean([fb[i] - fa[i] for fa, fb in zip(a_reps, b_reps)], axis=0) for i in range(len(a_reps[0]))]
        v_ex = float(np.var(np.concatenate(draws), ddof=1))
    if v_seed is None and v_ex is None:
        return Difference(estimate, None, None, None, None, k, None, None, "1 seed, no per-example data")
    if v_seed is not None and v_ex is not None:
        v = v_seed + v_ex
        df = math.floor(v * v * (k - 1) / (v_seed * v_seed)) if v_seed > 0 else math.inf
        df = max(df, k - 1)
        basis = f"{k} seeds x {n_examples} examples"
    elif v_seed is not None:
        v, df, basis = v_seed, k - 1, f"{k} seeds (paired t)"
    else:
        v, df, basis = v_ex, math.inf, f"1 seed x {n_examples} examples (these two models only)"
    se = math.sqrt(v)
    if se == 0.0:
        return Difference(estimate, estimate, estimate, 1.0 if estimate == 0 else 0.0, df, k, n_examples, 0.0,
                          basis)
    q = t_quantile(0.5 + level / 2, df)
    return Difference(estimate, estimate - q * se, estimate + q * se, t_two_sided_p(estimate / se, df), df, k,
                      n_examples, se, basis)
