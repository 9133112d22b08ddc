"""The statistics of the claims layer against scipy on fixtures (attention_zoo/claims/stats.py)."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from attention_zoo.claims import stats

D = np.array([1.2, 0.4, 2.1, -0.3, 1.7, 0.9, 1.1, 0.2])


def test_t_interval_and_p_match_scipy():
    res = stats.paired_test(D)
    lo, hi = sps.t.interval(0.95, len(D) - 1, loc=D.mean(), scale=sps.sem(D))
    assert (res.low, res.high) == (pytest.approx(lo), pytest.approx(hi))
    assert res.p == pytest.approx(sps.ttest_1samp(D, 0.0).pvalue)
    assert res.method == "t" and res.n == 8 and res.sd == pytest.approx(D.std(ddof=1))
    wide = stats.paired_test(D, 0.99)
    assert wide.low < res.low and wide.high > res.high


def test_small_n_gives_the_range_of_the_seeds_and_the_exact_sign_flip_test():
    d = D[:4]
    res = stats.paired_test(d)
    assert res.method == "range" and not res.decidable and stats.paired_test(D).decidable
    assert (res.low, res.high) == (d.min(), d.max())  # no interval is claimed from 4 seeds
    perm = sps.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=np.inf,
                                alternative="two-sided")
    assert res.p == pytest.approx(perm.pvalue)
    # the smallest p-value three seeds can give: 2/2³ — never below 0.05
    assert stats.sign_flip_p([1.0, 2.0, 3.0]) == pytest.approx(0.25)


@pytest.mark.parametrize("k,n", [(0, 10), (10, 10), (3, 10), (1, 1), (499, 1000)])
def test_wilson_matches_scipy_and_stays_inside_0_1(k, n):
    p, lo, hi = stats.wilson_interval(k, n)
    ref = sps.binomtest(k, n).proportion_ci(0.95, method="wilson")
    assert (lo, hi) == (pytest.approx(ref.low), pytest.approx(ref.high))
    assert 0.0 <= lo <= p <= hi <= 1.0
    with pytest.raises(ValueError, match="^successes:"):
        stats.wilson_interval(11, 10)


def test_holm_on_known_p_values():
    adjusted, levels = stats.holm([0.01, 0.04, 0.03, 0.005])
    # sorted 0.005, 0.01, 0.03, 0.04 -> ×4, ×3, ×2, ×1 with the running max
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert levels == pytest.approx([0.05 / 3, 0.05 / 1, 0.05 / 2, 0.05 / 4])
    adjusted, levels = stats.holm([0.2, math.nan])
    assert adjusted[0] == pytest.approx(0.2) and math.isnan(adjusted[1]) and math.isnan(levels[1])


@pytest.mark.parametrize("n,alpha", [(5, 0.05), (10, 0.05), (10, 0.01), (30, 0.05)])
def test_mde_has_the_stated_power(n, alpha):
    sd = 2.5
    delta = stats.mde(n, sd, alpha)
    crit = sps.t.ppf(1 - alpha / 2, n - 1)
    nc = delta / (sd / math.sqrt(n))
    power = sps.nct.sf(crit, n - 1, nc) + sps.nct.cdf(-crit, n - 1, nc)
    assert power == pytest.approx(0.8, abs=1e-6)
    assert stats.mde(n, 0.0) == 0.0 and math.isnan(stats.mde(1, sd))


def test_tost_against_two_one_sided_scipy_tests():
    d = np.array([0.1, -0.2, 0.05, 0.15, -0.05, 0.0, 0.1, -0.1])
    ok, p, lo, hi = stats.tost(d, margin=0.5)
    p_ref = max(sps.ttest_1samp(d, -0.5, alternative="greater").pvalue,
                sps.ttest_1samp(d, 0.5, alternative="less").pvalue)
    assert ok and p == pytest.approx(p_ref)
    assert -0.5 < lo < hi < 0.5
    assert not stats.tost(d + 1.0, margin=0.5)[0]
    with pytest.raises(ValueError, match="^margin:"):
        stats.tost(d, 0.0)


def test_calibration_helpers():
    assert stats.r_squared(0.25, 1.0) == pytest.approx(0.75)
    assert stats.normalised_accuracy(0.5, 1 / 6, 5 / 6) == pytest.approx(0.5)
    assert math.isnan(stats.normalised_accuracy(0.5, 0.5, 0.5))
    assert stats.slope([4, 8, 12], [0.9, 0.7, 0.5]) == pytest.approx(-0.05)
