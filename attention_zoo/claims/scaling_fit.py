"""Loss-vs-compute fits, compute multipliers and their seed-stratified bootstrap (numpy and scipy, no pandas).

A curve is ``L(C) = E + a·(C/c_ref)^(−α)`` (form ``power``; ``A = a·c_ref^α`` in the usual ``E + A·C^(−α)``) or,
where four or five points do not identify E, the log-log line ``L(C) = a·(C/c_ref)^(−α)`` (form ``loglog``: E = 0,
a straight line in log L over log C). ``c_ref`` (the geometric mean of the reference arm's compute) only conditions
the fit. The power form is fitted by variable projection: for each α on a fine log grid over ``ALPHA_RANGE`` the model
is linear in (E, a), solved in closed form with E ≥ 0 and a ≥ 0, and the α of least squared error wins (the point
estimate is then refined with ``scipy.optimize.minimize_scalar`` between its grid neighbours). ``form="auto"``
keeps the power form when it is identified — α strictly inside the range, E more than 1 % of the smallest
loss away from both 0 and that loss — and otherwise takes the log-log line; the form is chosen once, on the full
data, and every bootstrap replicate refits that form.

The multiplier of an arm at a rung is ``C_ref(L_arm) / C_arm``: the compute at which the reference arm's fitted
curve reaches the arm's mean loss there, over the arm's mean compute (> 1: the arm reaches that loss with less
compute). It is ``inf`` where the arm's loss lies below the reference curve's floor E (the reference never gets
there) and is flagged as extrapolated where the reference reaches it outside the compute it was measured at.

Intervals: a seed-stratified bootstrap (``bootstrap_weights``): in every replicate each rung's seeds are drawn with
replacement (the same draw for every arm: seeds are paired), the seed means are recomputed and both curves refitted.
Percentile intervals; a fit's own standard errors are not used (they are far too narrow on so few points).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize_scalar

FORMS = ("power", "loglog")
ALPHA_RANGE = (0.01, 2.0)  # exponents beyond this are not identified by a decade or two of compute
GRID = np.geomspace(*ALPHA_RANGE, 1200)


@dataclass(frozen=True)
class Curve:
    """A fitted ``L(C)``: ``form``, the floor ``E`` (0 for ``loglog``), ``a`` and ``alpha`` at ``c_ref``."""

    form: str
    E: float
    a: float
    alpha: float
    c_ref: float

    @property
    def A(self) -> float:
        """The coefficient of ``E + A·C^(−α)`` in raw compute units."""
        return self.a * self.c_ref ** self.alpha

    def loss(self, c) -> np.ndarray:
        return self.E + self.a * (np.asarray(c, float) / self.c_ref) ** (-self.alpha)

    def compute(self, loss) -> np.ndarray:
        """The compute at which the curve reaches ``loss`` (inf where ``loss`` is at or below the floor E)."""
        return inverse(np.asarray(loss, float), self.E, self.a, self.alpha, self.c_ref)


def inverse(loss, E, a, alpha, c_ref) -> np.ndarray:
    """``C`` with ``E + a·(C/c_ref)^(−α) = loss`` (broadcasting); inf where ``loss <= E`` or the curve is flat."""
    loss, E, a, alpha = (np.asarray(v, float) for v in (loss, E, a, alpha))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = c_ref * ((loss - E) / a) ** (-1.0 / alpha)
    return np.where((loss > E) & (a > 0) & (alpha > 0) & np.isfinite(out), out, np.inf)


def _check(c, loss) -> tuple[np.ndarray, np.ndarray]:
    c, loss = np.atleast_2d(np.asarray(c, float)), np.atleast_2d(np.asarray(loss, float))
    if c.shape != loss.shape or c.shape[-1] < 2:
        raise ValueError(f"points: expected matching compute and loss arrays of at least 2 points, got {c.shape} "
                         f"and {loss.shape}")
    if not (np.all(np.isfinite(c)) and np.all(c > 0) and np.all(np.isfinite(loss)) and np.all(loss > 0)):
        raise ValueError("points: compute and loss must be finite and positive")
    return c, loss


def _linear(u: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least squares of ``y ≈ E + a·u`` along the last axis with E ≥ 0 and a ≥ 0: (E, a, squared error)."""
    ub, yb = u.mean(-1, keepdims=True), y.mean(-1, keepdims=True)
    var = ((u - ub) ** 2).sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(var > 0, ((u - ub) * (y - yb)).sum(-1) / var, 0.0)
    a = np.maximum(a, 0.0)
    E = yb[..., 0] - a * ub[..., 0]
    neg = E < 0  # the floor at 0: a alone through the origin
    with np.errstate(divide="ignore", invalid="ignore"):
        a0 = (u * y).sum(-1) / (u * u).sum(-1)
    a = np.where(neg, np.maximum(a0, 0.0), a)
    E = np.where(neg, 0.0, E)
    sse = ((y - E[..., None] - a[..., None] * u) ** 2).sum(-1)
    return E, a, sse


def fit_power(c, loss, c_ref: float, refine: bool = False) -> tuple[np.ndarray, ...]:
    """The power form on each row of ``c``/``loss`` ([B, K]): arrays (E, a, alpha, at_bound), ``at_bound`` true where
    the fit is not identified (α at an end of its range, E at 0 or at the smallest loss)."""
    c, loss = _check(c, loss)
    x = np.log(c / c_ref)
    u = np.exp(-GRID[:, None, None] * x[None])  # [G, B, K]
    E, a, sse = _linear(u, loss[None])
    best = np.argmin(np.where(np.isfinite(sse), sse, np.inf), axis=0)  # [B]
    rows = np.arange(c.shape[0])
    E, a, alpha = E[best, rows], a[best, rows], GRID[best]
    if refine:
        for i in rows:
            lo, hi = GRID[max(best[i] - 1, 0)], GRID[min(best[i] + 1, len(GRID) - 1)]

            def sse_at(al, i=i):
                return float(_linear(np.exp(-al * x[i]), loss[i])[2])

            r = minimize_scalar(sse_at, bounds=(lo, hi), method="bounded", options={"xatol": 1e-7})
            if r.success and r.fun <= sse_at(alpha[i]):
                alpha[i] = r.x
                E[i], a[i], _ = (float(v) for v in _linear(np.exp(-r.x * x[i]), loss[i]))
    floor = loss.min(-1)  # E within 1 % of 0 or of the smallest loss: the floor is not identified
    at_bound = (best == 0) | (best == len(GRID) - 1) | (E <= 0.01 * floor) | (E >= 0.99 * floor) | (a <= 0)
    return E, a, alpha, at_bound


def fit_loglog(c, loss, c_ref: float) -> tuple[np.ndarray, ...]:
    """The log-log line on each row: arrays (E = 0, a, alpha)."""
    c, loss = _check(c, loss)
    x, y = np.log(c / c_ref), np.log(loss)
    xb, yb = x.mean(-1, keepdims=True), y.mean(-1, keepdims=True)
    slope = ((x - xb) * (y - yb)).sum(-1) / ((x - xb) ** 2).sum(-1)
    b = yb[..., 0] - slope * xb[..., 0]
    return np.zeros_like(slope), np.exp(b), -slope


def fit_curve(c, loss, form: str = "auto", c_ref: float | None = None) -> Curve:
    """One curve through the points (``form``: ``power``, ``loglog`` or ``auto``, module docstring).

    Raises:
        ValueError: fewer than two points, non-positive or non-finite values, an unknown form.
    """
    if form not in (*FORMS, "auto"):
        raise ValueError(f"form: expected one of {FORMS + ('auto',)}, got {form!r}")
    c, loss = _check(c, loss)
    c_ref = float(np.exp(np.log(c).mean())) if c_ref is None else float(c_ref)
    if form in ("power", "auto") and c.shape[-1] >= 3:
        E, a, alpha, bound = fit_power(c, loss, c_ref, refine=True)
        if form == "power" or not bound[0]:
            return Curve("power", float(E[0]), float(a[0]), float(alpha[0]), c_ref)
    E, a, alpha = fit_loglog(c, loss, c_ref)
    return Curve("loglog", 0.0, float(a[0]), float(alpha[0]), c_ref)


def fit_many(c, loss, form: str, c_ref: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(E, a, alpha) per row of [B, K] points, in one given form (the bootstrap's refits)."""
    if form == "power":
        E, a, alpha, _ = fit_power(c, loss, c_ref)
        return E, a, alpha
    return fit_loglog(c, loss, c_ref)


def bootstrap_weights(seeds_per_rung: list[int], n_boot: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Per rung, [n_boot, n_seeds] counts of each seed in a replicate: each rung's seeds drawn with replacement,
    as many as it has (stratified by rung; one draw shared by every arm)."""
    out = []
    for n in seeds_per_rung:
        draws = rng.integers(0, n, size=(n_boot, n))
        out.append(np.stack([np.bincount(d, minlength=n) for d in draws]).astype(float))
    return out


def weighted_means(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """[B] means of one arm's per-seed ``values`` ([n], NaN where it has no seed) under replicate ``weights``."""
    have = np.isfinite(values)
    w = weights * have
    with np.errstate(invalid="ignore", divide="ignore"):
        return (w * np.where(have, values, 0.0)).sum(-1) / w.sum(-1)


def percentile_interval(samples, level: float = 0.95) -> tuple[float, float]:
    """The percentile interval of bootstrap ``samples`` (inf allowed: an upper end may be inf)."""
    s = np.asarray(samples, float)
    s = s[~np.isnan(s)]
    if s.size == 0:
        return math.nan, math.nan
    q, big = (1 - level) / 2, np.finfo(float).max / 4  # inf sorts last; interpolating two infs would give NaN
    lo, hi = (float(np.quantile(np.where(np.isinf(s), np.sign(s) * big, s), x)) for x in (q, 1 - q))
    return tuple(math.copysign(math.inf, v) if abs(v) >= big / 2 else v for v in (lo, hi))


def two_sided_p(samples, null: float) -> float:
    """Bootstrap p-value of ``null`` (twice the smaller tail beyond it; at least 1/(B+1))."""
    s = np.asarray(samples, float)
    s = s[~np.isnan(s)]
    if s.size == 0:
        return math.nan
    tail = min((s <= null).mean(), (s >= null).mean())
    return float(min(1.0, max(2 * tail, 1 / (s.size + 1))))


def slope_and_crossing(x: np.ndarray, gap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of [B, K] points (``x`` = log10 compute, ``gap`` = the treatment's loss minus the reference's at
    equal compute, positive = the treatment worse): the least-squares slope of the gap per decade of compute and the
    log10 compute at which that line reaches 0 while falling (at or before the largest rung where it is already
    there; +inf where the gap is positive and not falling)."""
    xb, gb = x.mean(-1, keepdims=True), gap.mean(-1, keepdims=True)
    slope = ((x - xb) * (gap - gb)).sum(-1) / ((x - xb) ** 2).sum(-1)
    last_x = x[..., -1]
    last_g = gb[..., 0] + slope * (last_x - xb[..., 0])  # the line at the largest rung
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = last_x - last_g / slope
    return slope, np.where(slope < 0, cross, np.where(last_g > 0, np.inf, last_x))


__all__ = ["ALPHA_RANGE", "FORMS", "Curve", "bootstrap_weights", "fit_curve", "fit_loglog", "fit_many", "fit_power",
           "inverse", "percentile_interval", "slope_and_crossing", "two_sided_p", "weighted_means"]
