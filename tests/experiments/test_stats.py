"""Each statistic against a reference implementation (scipy / statsmodels) on random data, and the sequential
test's false-alarm rate under repeated peeking on A/A data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import confint_proportions_2indep, proportion_confint

from keel.experiments.stats import (
    Moments,
    benjamini_hochberg,
    cuped,
    msprt_pvalue,
    proportions,
    ratio,
    srm,
    welch,
    wilson,
)

SEEDS = range(5)


@pytest.mark.parametrize("seed", SEEDS)
def test_welch_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(10, 3, rng.integers(50, 3000))
    b = rng.normal(10.3, 5, rng.integers(50, 3000))
    est = welch(Moments.of(a), Moments.of(b))
    ref = stats.ttest_ind(b, a, equal_var=False)
    lo, hi = ref.confidence_interval(0.95)
    assert est.diff == pytest.approx(b.mean() - a.mean(), rel=1e-12)
    assert est.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    assert est.ci == pytest.approx((lo, hi), rel=1e-9)


@pytest.mark.parametrize("seed", SEEDS)
def test_wilson_and_newcombe_match_statsmodels(seed):
    rng = np.random.default_rng(seed)
    nc, nt = (int(x) for x in rng.integers(100, 20_000, 2))
    yc, yt = rng.random(nc) < 0.1, rng.random(nt) < rng.uniform(0.05, 0.2)
    assert wilson(yt.sum(), nt) == pytest.approx(proportion_confint(yt.sum(), nt, method="wilson"), rel=1e-9)
    est = proportions(Moments.of(yc), Moments.of(yt))
    ref = confint_proportions_2indep(yt.sum(), nt, yc.sum(), nc, method="newcomb", compare="diff")
    assert est.ci == pytest.approx(ref, rel=1e-9)
    from statsmodels.stats.proportion import proportions_ztest

    _, p = proportions_ztest(  # the pooled two-proportion z-test
        [yt.sum(), yc.sum()], [nt, nc]
    )
    assert est.p_value == pytest.approx(p, rel=1e-9)


def test_the_delta_method_ratio_matches_linearization_and_covers_the_truth():
    rng = np.random.default_rng(3)
    # offers per unit (denominator) and revenue per unit (numerator): true ratio 2.5 in both arms
    covered = 0
    for _ in range(400):
        x = rng.poisson(3, (2, 2000)) + 1
        y = rng.gamma(2.0, 1.25, x.shape) * x
        est = ratio(Moments.of(y[0], x[0]), Moments.of(y[1], x[1]))
        covered += est.ci[0] <= 0 <= est.ci[1]
    assert 0.93 <= covered / 400 <= 0.97
    # the variance equals the per-unit linearization's: var((y − R x) / x̄) / n
    x, y = x[0], y[0]
    r = y.sum() / x.sum()
    lin = (y - r * x) / x.mean()
    from keel.experiments.stats import ratio_variance

    assert ratio_variance(Moments.of(y, x)) == pytest.approx(lin.var(ddof=1) / x.size, rel=1e-9)


def test_cuped_matches_ancova_and_reduces_variance():
    import statsmodels.api as sm

    rng = np.random.default_rng(11)
    n = 20_000
    pre = rng.normal(5, 2, n)
    treat = rng.random(n) < 0.5
    y = 0.8 * pre + rng.normal(0, 1, n) + 0.1 * treat
    est, theta, reduction = cuped(Moments.of(y[~treat], pre[~treat]), Moments.of(y[treat], pre[treat]))
    X = sm.add_constant(np.column_stack([treat.astype(float), pre - pre.mean()]))
    ols = sm.OLS(y, X).fit()
    assert est.diff == pytest.approx(ols.params[1], abs=2e-3)  # θ pooled vs the OLS slope: equal to sampling noise
    assert est.se == pytest.approx(ols.bse[1], rel=0.02)
    assert theta == pytest.approx(0.8, abs=0.02)
    rho2 = np.corrcoef(y, pre)[0, 1] ** 2
    assert reduction == pytest.approx(rho2, abs=0.01)
    raw = welch(Moments.of(y[~treat]), Moments.of(y[treat]))
    assert est.se == pytest.approx(raw.se * math.sqrt(1 - rho2), rel=0.03) and est.ci[0] <= 0.1 <= est.ci[1]


def test_srm_matches_scipy_and_flags_a_broken_split():
    for nc, nt, share in ((5000, 5100, 0.5), (9000, 1000, 0.1), (4000, 6000, 0.5)):
        r = srm(nc, nt, share)
        ref = stats.chisquare([nc, nt], [(nc + nt) * (1 - share), (nc + nt) * share])
        assert r.chi2 == pytest.approx(ref.statistic) and r.p_value == pytest.approx(ref.pvalue)
    assert not srm(5000, 5100, 0.5).flagged and srm(4000, 6000, 0.5).flagged
    assert not srm(0, 0, 0.5).flagged


def test_benjamini_hochberg_matches_statsmodels():
    rng = np.random.default_rng(5)
    for m in (1, 3, 10, 50):
        p = rng.random(m) ** 3
        assert benjamini_hochberg(p.tolist()) == pytest.approx(multipletests(p, method="fdr_bh")[1].tolist())


def test_msprt_keeps_the_false_alarm_rate_under_peeking_on_aa_data():
    """A/A data, a look after every batch of 200 units per arm (50 looks): the always-valid p-value crosses α in at
    most α of the runs, while a fixed-horizon t-test looked at the same way alarms far more often."""
    rng = np.random.default_rng(2026)
    alpha, runs, looks, batch = 0.05, 400, 50, 200
    msprt_alarms = naive_alarms = 0
    for _ in range(runs):
        c = t = Moments(0, 0.0, 0.0)
        p_seq, naive = 1.0, False
        for _ in range(looks):
            a, b = rng.normal(0, 1, batch), rng.normal(0, 1, batch)
            c, t = c + Moments.of(a), t + Moments.of(b)
            est = welch(c, t)
            p_seq = msprt_pvalue(est.diff, est.se, tau=0.1, previous=p_seq)
            naive |= est.p_value < alpha
        msprt_alarms += p_seq < alpha
        naive_alarms += naive
    bound = alpha + 2 * math.sqrt(alpha * (1 - alpha) / runs)
    assert msprt_alarms / runs <= bound, msprt_alarms
    assert naive_alarms / runs > 2 * alpha  # why the sequential test exists
    # and it does detect a real effect
    c, t = Moments.of(rng.normal(0, 1, 5000)), Moments.of(rng.normal(0.15, 1, 5000))
    est = welch(c, t)
    assert msprt_pvalue(est.diff, est.se, tau=0.1) < 1e-4
