"""The scale axis's fits, multipliers and bootstrap on synthetic ladders with known answers (claims/scaling_fit.py,
claims/scaling.py)."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import curve_fit

from attention_zoo.claims.scaling import compare, ladder
from attention_zoo.claims.scaling_fit import (
    Curve,
    bootstrap_weights,
    fit_curve,
    percentile_interval,
    slope_and_crossing,
    two_sided_p,
    weighted_means,
)
from attention_zoo.claims.spec import Arm

C = np.array([1e12, 3e12, 1e13, 3e13, 1e14])


def _power(c, E=1.2, A=2e5, alpha=0.45):
    return E + A * c ** (-alpha)


def test_the_power_form_recovers_a_known_curve_exactly():
    fit = fit_curve(C, _power(C))
    assert fit.form == "power"
    assert fit.E == pytest.approx(1.2, rel=1e-4) and fit.alpha == pytest.approx(0.45, rel=1e-4)
    assert fit.A == pytest.approx(2e5, rel=1e-3)
    assert fit.compute(_power(5e12)) == pytest.approx(5e12, rel=1e-4)  # the inverse


def test_the_power_form_agrees_with_scipy_curve_fit_on_noisy_points():
    rng = np.random.default_rng(1)
    y = _power(C) + 0.004 * rng.standard_normal(len(C))
    ours = fit_curve(C, y, form="power")
    x = np.log(C / ours.c_ref)
    (E, a, al), _ = curve_fit(lambda x, E, a, al: E + a * np.exp(-al * x), x, y, p0=(1.0, 0.5, 0.4), maxfev=20000)
    sse = lambda E, a, al: float(((y - E - a * np.exp(-al * x)) ** 2).sum())  # noqa: E731
    assert sse(ours.E, ours.a, ours.alpha) <= sse(E, a, al) * (1 + 1e-6)  # at least as good a least-squares fit


def test_a_pure_power_law_falls_back_to_the_log_log_line():
    y = 3.0 * (C / 1e12) ** -0.1  # no floor: E is not identified (it would sit at 0)
    fit = fit_curve(C, y)
    assert fit.form == "loglog" and fit.alpha == pytest.approx(0.1, rel=1e-9)
    assert fit.loss(C) == pytest.approx(y, rel=1e-9)


def test_inverse_is_infinite_below_the_floor():
    curve = Curve("power", 1.0, 0.5, 0.3, 1e12)
    assert math.isinf(float(curve.compute(0.99))) and math.isfinite(float(curve.compute(1.2)))


def test_bootstrap_weights_draw_each_rungs_seeds_with_replacement():
    w = bootstrap_weights([5, 3], 1000, np.random.default_rng(0))
    assert w[0].shape == (1000, 5) and w[1].shape == (1000, 3)
    assert (w[0].sum(1) == 5).all() and (w[1].sum(1) == 3).all()
    assert w[0].mean() == pytest.approx(1.0, abs=0.05)
    vals = np.array([1.0, 2.0, np.nan, 4.0, 5.0])  # a missing seed is left out of the mean
    assert weighted_means(vals, np.ones((1, 5)))[0] == pytest.approx(3.0)


def test_interval_and_p_value_helpers():
    s = np.concatenate([np.linspace(0, 1, 1000), [np.inf] * 10])
    lo, hi = percentile_interval(s, 0.95)
    assert 0 < lo < 0.05 and math.isinf(hi) is False and hi > 0.95
    assert two_sided_p(np.linspace(1.1, 2, 100), 1.0) == pytest.approx(1 / 101)


def test_the_gap_line_and_where_it_crosses_zero():
    x = np.log10(C)[None]
    slope, cross = slope_and_crossing(x, (0.2 - 0.05 * (x - 12)))
    assert slope[0] == pytest.approx(-0.05) and cross[0] == pytest.approx(16.0)  # 0.2 - 0.05·4 = 0 at 1e16
    _, never = slope_and_crossing(x, 0.1 + 0.01 * (x - 12))
    assert math.isinf(never[0])


def _store(mult: float, rel_noise: float = 0.002, seeds: int = 6, gap_slope: float = 0.0) -> pd.DataFrame:
    """A ladder store: MHA on a known curve, ``x`` with the same curve at 1/``mult`` of the compute (so its
    multiplier is ``mult``), plus ``gap_slope`` nats per decade added to x's loss."""
    rng, rows = np.random.default_rng(7), []
    for r, (d, c) in enumerate(zip((16, 32, 48, 64), C[:4])):
        for s in range(seeds):
            for arm, cost, shift in (("mha", c, 0.0), ("x", c, gap_slope * r * 0.477)):
                loss = _power(cost * (mult if arm == "x" else 1.0)) * (1 + rel_noise * rng.standard_normal())
                for metric, value in (("test_loss", loss + shift), ("train_flops", cost),
                                      ("best_cpu_s", cost / 1e10)):
                    rows.append({"variant": arm, "flavor": "paper", "d_model": d, "n_layers": 2, "seed": s,
                                 "metric": metric, "value": value, "status": "ok", "dataset": "shakespeare",
                                 "eval_set": "shakespeare"})
    return pd.DataFrame(rows)


def test_a_known_multiplier_lies_inside_its_bootstrap_interval():
    lad = ladder(_store(1.8), [Arm("x", {"variant": "x"}), Arm("mha", {"variant": "mha"})])
    res = compare(lad, "x", "mha", n_boot=600)
    top = len(res.rungs) - 1
    lo, hi = percentile_interval(res.samples[:, top], 0.95)
    assert lo < 1.8 < hi and res.multiplier[top] == pytest.approx(1.8, rel=0.15)


def test_a_closing_gap_has_a_negative_slope_with_its_interval_below_zero():
    lad = ladder(_store(1.0, gap_slope=-0.03), [Arm("x", {"variant": "x"}), Arm("mha", {"variant": "mha"})])
    res = compare(lad, "x", "mha", n_boot=600)
    lo, hi = percentile_interval(res.slope_samples, 0.95)
    assert hi < 0 and res.slope == pytest.approx(-0.03, abs=0.01)
