"""Statistics for deciding claims: seed-paired differences with intervals, proportions, multiplicity, power.

Every function takes plain numbers (one value per seed, or counts) and returns plain numbers; nothing here knows
about experiments. Conventions (docs/claims.md):

- ``paired_test``: the per-seed differences d = treatment − reference of one comparison. With n ≥ 5: Student-t
  interval and two-sided one-sample t-test. With 2 ≤ n < 5 no interval is claimed: a t-interval from 2–4 seeds
  rests wholly on the normal assumption and a bootstrap one returns the seeds' own [min, max] while looking like a
  confidence interval; the "interval" is the range of the n seeds (``method`` "range"), and the p-value the exact
  sign-flip permutation test's, which cannot fall below 2/2ⁿ (0.25 at n = 3) — so such runs never decide a claim,
  and the report says "not decidable at n = …".
- ``wilson_interval``: a proportion's interval, always inside [0, 1].
- ``holm``: Holm–Bonferroni adjusted p-values within one family (one table, one sweep) and the per-comparison
  level α/(m − rank + 1) at which each interval is drawn.
- ``mde``: the smallest |mean difference| a two-sided paired t-test at level α detects with the given power, from
  the noncentral t distribution.
- ``tost``: equivalence within ±margin (two one-sided tests; the (1 − 2α) interval inside the margin).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

DECIDABLE_N = 5  # n below this: the range of the seeds and the exact sign-flip p-value; never decides


def _finite(values) -> np.ndarray:
    v = np.asarray(list(values), dtype=float).ravel()
    return v[np.isfinite(v)]


@dataclass(frozen=True)
class PairedResult:
    """One seed-paired comparison: mean difference, its interval at ``confidence``, p-value, n and paired SD."""

    mean: float
    low: float
    high: float
    p: float
    n: int
    sd: float
    confidence: float
    method: str  # "t", "range" (2 ≤ n < 5: low/high are the seeds' min/max; sign-flip p) or "none" (n < 2)

    @property
    def decidable(self) -> bool:
        return self.method == "t"


def t_interval(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): mean ± t_{(1+c)/2, n−1}·s/√n over the finite values; NaN bounds for n < 2."""
    v = _finite(values)
    if v.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(v.mean())
    if v.size < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf((1 + confidence) / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
    return mean, mean - half, mean + half


def seed_interval(values, confidence: float = 0.95) -> tuple[float, float, float, str]:
    """(mean, low, high, label) as every table prints a per-seed quantity: the t-interval from 5 seeds (label
    "95 % t"), the range of the seeds below (label "range of n seeds"); the verdicts use the same rule."""
    t = paired_test(values, confidence)
    label = f"range of {t.n} seeds" if t.method == "range" else f"{100 * confidence:g} % t"
    return t.mean, t.low, t.high, label


def sign_flip_p(values) -> float:
    """Exact two-sided p-value of the paired sign-flip permutation test of mean 0 (all 2ⁿ sign patterns)."""
    v = _finite(values)
    if v.size == 0:
        return math.nan
    observed = abs(v.mean())
    signs = np.array(list(itertools.product((-1.0, 1.0), repeat=v.size)))
    flipped = np.abs((signs * v).mean(axis=1))
    return float(np.mean(flipped >= observed - 1e-12 * max(1.0, observed)))


def paired_test(differences, confidence: float = 0.95) -> PairedResult:
    """The per-seed differences of one comparison → PairedResult (method by n; module docstring)."""
    d = _finite(differences)
    n = int(d.size)
    sd = float(d.std(ddof=1)) if n > 1 else math.nan
    if n == 0:
        return PairedResult(math.nan, math.nan, math.nan, math.nan, 0, math.nan, confidence, "none")
    if n < 2:
        return PairedResult(float(d.mean()), math.nan, math.nan, math.nan, 1, math.nan, confidence, "none")
    if n < DECIDABLE_N:
        return PairedResult(float(d.mean()), float(d.min()), float(d.max()), sign_flip_p(d), n, sd, confidence,
                            "range")
    mean, lo, hi = t_interval(d, confidence)
    if sd == 0:
        p = 0.0 if mean != 0 else 1.0
    else:
        p = float(stats.ttest_1samp(d, 0.0).pvalue)
    return PairedResult(mean, lo, hi, p, n, sd, confidence, "t")


def wilson_interval(successes: float, n: float, confidence: float = 0.95) -> tuple[float, float, float]:
    """(p̂, low, high): the Wilson score interval of a proportion; always inside [0, 1]. NaN for n = 0.

    Raises:
        ValueError: ``successes`` outside [0, n] or n negative.
    """
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"successes: expected 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return math.nan, math.nan, math.nan
    z = float(stats.norm.ppf((1 + confidence) / 2))
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes == 0 else max(0.0, centre - half)  # exact at the ends (rounding would leave p̂ outside)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return p, lo, hi


def holm(pvalues, alpha: float = 0.05) -> tuple[list[float], list[float]]:
    """(adjusted p-values, per-comparison levels) by Holm–Bonferroni over the finite p-values of one family.

    Adjusted pᵢ = max over ranks ≤ i of (m − rank + 1)·p, capped at 1; the level of the comparison at rank r is
    α/(m − r + 1) (its interval is drawn at confidence 1 − level). NaN p-values (undecidable comparisons) are not
    counted in m and stay NaN.
    """
    p = [float(x) for x in pvalues]
    idx = [i for i, x in enumerate(p) if math.isfinite(x)]
    m = len(idx)
    adjusted, levels = [math.nan] * len(p), [math.nan] * len(p)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda j: p[j])):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
        levels[i] = alpha / (m - rank)
    return adjusted, levels


def mde(n: int, sd: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable |mean difference| of a two-sided paired t-test with n pairs and paired SD ``sd``.

    Solves P(|T| > t_{1−α/2, n−1}) = power for T ~ noncentral t(n − 1, δ√n/sd). NaN for n < 2 or sd NaN; 0 for
    sd = 0. Only meaningful where the t-test is the test run (n ≥ ``DECIDABLE_N``); the verdicts quote no MDE below.
    """
    if n < 2 or not math.isfinite(sd):
        return math.nan
    if sd == 0:
        return 0.0
    df = n - 1
    crit = float(stats.t.ppf(1 - alpha / 2, df))

    def shortfall(nc: float) -> float:
        # The lower tail is negligible for nc > 0 and scipy returns NaN for it at some (df, nc): count it as 0.
        lower = float(np.nan_to_num(stats.nct.cdf(-crit, df, nc), nan=0.0))
        return float(stats.nct.sf(crit, df, nc)) + lower - power

    hi = crit + 3.0
    while shortfall(hi) < 0:  # widen the bracket (at n = 2 the critical value is large)
        hi *= 2
        if hi > 1e4:
            return math.inf
    nc = optimize.brentq(shortfall, 0.0, hi)
    return nc * sd / math.sqrt(n)


def tost(differences, margin: float, alpha: float = 0.05) -> tuple[bool, float, float, float]:
    """Equivalence of the mean difference to 0 within ±``margin``: (equivalent, p, low, high).

    p is the larger of the two one-sided t-test p-values; (low, high) the (1 − 2α) t-interval, which lies inside
    (−margin, margin) exactly when p < α. Needs n ≥ 2.

    Raises:
        ValueError: ``margin`` not positive.
    """
    if not margin > 0:
        raise ValueError(f"margin: expected a positive equivalence margin, got {margin!r}")
    d = _finite(differences)
    if d.size < 2:
        return False, math.nan, math.nan, math.nan
    _, lo, hi = t_interval(d, 1 - 2 * alpha)
    if d.std(ddof=1) == 0:
        p = 0.0 if abs(d.mean()) < margin else 1.0
    else:
        p_low = float(stats.ttest_1samp(d, -margin, alternative="greater").pvalue)
        p_high = float(stats.ttest_1samp(d, margin, alternative="less").pvalue)
        p = max(p_low, p_high)
    return p < alpha, p, lo, hi


# ---- calibration: what a trivial predictor and an oracle score ---------------------------------------------------
def r_squared(mse: float, target_variance: float) -> float:
    """1 − MSE / Var(target): 0 for the mean predictor, 1 for a perfect one."""
    return 1.0 - mse / target_variance if target_variance > 0 else math.nan


def normalised_accuracy(acc: float, chance: float, oracle: float) -> float:
    """(acc − chance) / (oracle − chance): 0 at chance, 1 at the oracle (NaN when the oracle is at chance)."""
    return (acc - chance) / (oracle - chance) if oracle > chance else math.nan


def slope(x, y) -> float:
    """Least-squares slope of y on x (NaN with fewer than two distinct x)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    if len(np.unique(x[ok])) < 2:
        return math.nan
    return float(np.polyfit(x[ok], y[ok], 1)[0])


__all__ = ["DECIDABLE_N", "PairedResult", "holm", "mde", "normalised_accuracy", "paired_test", "r_squared",
           "seed_interval", "sign_flip_p", "slope", "t_interval", "tost", "wilson_interval"]
