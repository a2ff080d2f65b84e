"""Experiment statistics from sufficient statistics: a look at the data costs one aggregation, not a pass per test.

An arm of a metric is summarised by ``Moments`` (n, Σy, Σy², and for ratio metrics and CUPED the second variable x:
Σx, Σx², Σxy). Everything below is a function of two ``Moments``:

- ``welch`` — difference of means, Welch's t interval and p-value, and the relative lift (delta method);
- ``proportions`` — Wilson interval per arm and Newcombe's hybrid score interval for the difference;
- ``ratio`` — a ratio metric Σy/Σx per arm (e.g. revenue per offer) with the delta-method variance;
- ``cuped`` — CUPED: y − θ(x − x̄) with θ = cov(x, y)/var(x) pooled over both arms (x a pre-period covariate);
- ``srm`` — the sample-ratio-mismatch chi-square test against the planned split;
- ``msprt`` — the mixture SPRT's always-valid p-value for sequential looks (guardrails look every tick);
- ``benjamini_hochberg`` — adjusted p-values across metrics.

Each is checked against scipy/statsmodels on random data in tests/experiments/test_stats.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Moments:
    """Sufficient statistics of one arm: n, Σy, Σy² and, when there is a second variable x, Σx, Σx², Σxy."""

    n: int
    sy: float
    syy: float
    sx: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    @classmethod
    def of(cls, y, x=None) -> Moments:
        y = np.asarray(y, dtype=np.float64)
        if x is None:
            return cls(int(y.size), float(y.sum()), float((y * y).sum()))
        x = np.asarray(x, dtype=np.float64)
        return cls(
            int(y.size), float(y.sum()), float((y * y).sum()), float(x.sum()), float((x * x).sum()),
            float((x * y).sum()),
        )  # fmt: skip

    def __add__(self, other: Moments) -> Moments:
        return Moments(
            self.n + other.n, self.sy + other.sy, self.syy + other.syy, self.sx + other.sx, self.sxx + other.sxx,
            self.sxy + other.sxy,
        )  # fmt: skip

    @property
    def mean(self) -> float:
        return self.sy / self.n if self.n else math.nan

    @property
    def var(self) -> float:
        """Sample variance of y (ddof 1)."""
        if self.n < 2:
            return math.nan
        return max(0.0, (self.syy - self.sy * self.sy / self.n) / (self.n - 1))

    @property
    def mean_x(self) -> float:
        return self.sx / self.n if self.n else math.nan

    @property
    def var_x(self) -> float:
        if self.n < 2:
            return math.nan
        return max(0.0, (self.sxx - self.sx * self.sx / self.n) / (self.n - 1))

    @property
    def cov_xy(self) -> float:
        if self.n < 2:
            return math.nan
        return (self.sxy - self.sx * self.sy / self.n) / (self.n - 1)


@dataclass(frozen=True)
class Estimate:
    """treatment − control, with its interval and two-sided p-value; ``lift`` = relative change and its interval."""

    control: float
    treatment: float
    diff: float
    ci: tuple[float, float]
    p_value: float
    lift: float
    lift_ci: tuple[float, float]
    se: float
    n_control: int
    n_treatment: int
    method: str

    def as_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def _lift(mt: float, mc: float, vt_n: float, vc_n: float, z: float) -> tuple[float, tuple[float, float]]:
    """Relative lift mt/mc − 1 and its delta-method interval (vt_n, vc_n: the variances of the two means)."""
    if mc == 0 or not math.isfinite(mc):
        return math.nan, (math.nan, math.nan)
    lift = mt / mc - 1
    se = math.sqrt(vt_n / mc**2 + mt**2 * vc_n / mc**4)
    return lift, (lift - z * se, lift + z * se)


def welch(control: Moments, treatment: Moments, alpha: float = 0.05) -> Estimate:
    """Difference of means with Welch's t interval (unequal variances)."""
    vc, vt = control.var / control.n, treatment.var / treatment.n
    se = math.sqrt(vc + vt)
    diff = treatment.mean - control.mean
    if se == 0 or not math.isfinite(se):
        p = 1.0 if diff == 0 else (0.0 if math.isfinite(diff) else math.nan)
        return Estimate(control.mean, treatment.mean, diff, (diff, diff), p, *_lift(treatment.mean, control.mean, vt, vc, 0),
                        se, control.n, treatment.n, "welch")  # fmt: skip
    df = (vc + vt) ** 2 / (vc**2 / (control.n - 1) + vt**2 / (treatment.n - 1))
    t = stats.t.ppf(1 - alpha / 2, df)
    p = float(2 * stats.t.sf(abs(diff / se), df))
    lift, lift_ci = _lift(treatment.mean, control.mean, vt, vc, stats.norm.ppf(1 - alpha / 2))
    return Estimate(control.mean, treatment.mean, diff, (diff - t * se, diff + t * se), p, lift, lift_ci, se,
                    control.n, treatment.n, "welch")  # fmt: skip


def wilson(successes: float, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Wilson score interval of a proportion."""
    if n == 0:
        return (math.nan, math.nan)
    z = stats.norm.ppf(1 - alpha / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (centre - half, centre + half)


def proportions(control: Moments, treatment: Moments, alpha: float = 0.05) -> Estimate:
    """Difference of two proportions (y is 0/1): Newcombe's hybrid score interval (method 10) from the two Wilson
    intervals; the p-value is the pooled two-proportion z-test's."""
    pc, pt = control.mean, treatment.mean
    lc, uc = wilson(control.sy, control.n, alpha)
    lt, ut = wilson(treatment.sy, treatment.n, alpha)
    diff = pt - pc
    lo = diff - math.sqrt((pt - lt) ** 2 + (uc - pc) ** 2)
    hi = diff + math.sqrt((ut - pt) ** 2 + (pc - lc) ** 2)
    pooled = (control.sy + treatment.sy) / (control.n + treatment.n)
    se0 = math.sqrt(pooled * (1 - pooled) * (1 / control.n + 1 / treatment.n))
    p = float(2 * stats.norm.sf(abs(diff) / se0)) if se0 > 0 else (1.0 if diff == 0 else 0.0)
    vc, vt = pc * (1 - pc) / control.n, pt * (1 - pt) / treatment.n
    lift, lift_ci = _lift(pt, pc, vt, vc, stats.norm.ppf(1 - alpha / 2))
    return Estimate(pc, pt, diff, (lo, hi), p, lift, lift_ci, math.sqrt(vc + vt), control.n, treatment.n,
                    "newcombe")  # fmt: skip


def ratio_variance(m: Moments) -> float:
    """Delta-method variance of R = Σy/Σx (per-unit pairs (x, y), x the denominator)."""
    r = m.sy / m.sx
    mx = m.mean_x
    return (m.var - 2 * r * m.cov_xy + r * r * m.var_x) / (m.n * mx * mx)


def ratio(control: Moments, treatment: Moments, alpha: float = 0.05) -> Estimate:
    """A ratio metric Σy/Σx per arm (y numerator, x denominator per unit), normal interval by the delta method."""
    rc, rt = control.sy / control.sx, treatment.sy / treatment.sx
    vc, vt = ratio_variance(control), ratio_variance(treatment)
    se = math.sqrt(vc + vt)
    z = stats.norm.ppf(1 - alpha / 2)
    diff = rt - rc
    p = float(2 * stats.norm.sf(abs(diff) / se)) if se > 0 else (1.0 if diff == 0 else 0.0)
    lift, lift_ci = _lift(rt, rc, vt, vc, z)
    return Estimate(rc, rt, diff, (diff - z * se, diff + z * se), p, lift, lift_ci, se, control.n, treatment.n,
                    "delta")  # fmt: skip


def cuped(control: Moments, treatment: Moments, alpha: float = 0.05) -> tuple[Estimate, float, float]:
    """CUPED-adjusted difference of means (x: the pre-period covariate). Returns the estimate, θ and the variance
    reduction (1 − var(adjusted)/var(raw), pooled)."""
    pooled = control + treatment
    theta = pooled.cov_xy / pooled.var_x if pooled.var_x > 0 else 0.0
    xbar = pooled.mean_x

    def adjusted(m: Moments) -> tuple[float, float]:
        mean = m.mean - theta * (m.mean_x - xbar)
        var = m.var - 2 * theta * m.cov_xy + theta * theta * m.var_x
        return mean, max(var, 0.0)

    (mc, varc), (mt, vart) = adjusted(control), adjusted(treatment)
    vc, vt = varc / control.n, vart / treatment.n
    se = math.sqrt(vc + vt)
    diff = mt - mc
    df = (vc + vt) ** 2 / (vc**2 / (control.n - 1) + vt**2 / (treatment.n - 1)) if se > 0 else math.inf
    t = stats.t.ppf(1 - alpha / 2, df)
    p = float(2 * stats.t.sf(abs(diff / se), df)) if se > 0 else (1.0 if diff == 0 else 0.0)
    lift, lift_ci = _lift(mt, mc, vt, vc, stats.norm.ppf(1 - alpha / 2))
    raw = pooled.var
    reduction = 1 - (pooled.var - 2 * theta * pooled.cov_xy + theta * theta * pooled.var_x) / raw if raw > 0 else 0.0
    est = Estimate(
        mc, mt, diff, (diff - t * se, diff + t * se), p, lift, lift_ci, se, control.n, treatment.n, "cuped"
    )
    return est, theta, reduction


@dataclass(frozen=True)
class SrmResult:
    chi2: float
    p_value: float
    expected_treatment_share: float
    observed_treatment_share: float
    flagged: bool


def srm(n_control: int, n_treatment: int, treatment_share: float, threshold: float = 0.001) -> SrmResult:
    """Sample-ratio mismatch: chi-square goodness of fit of the arm counts against the planned split; p below
    ``threshold`` (default 0.001) flags the experiment — its conclusions are withheld."""
    n = n_control + n_treatment
    if n == 0:
        return SrmResult(0.0, 1.0, treatment_share, math.nan, False)
    expected = np.array([n * (1 - treatment_share), n * treatment_share])
    observed = np.array([n_control, n_treatment], dtype=np.float64)
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    p = float(stats.chi2.sf(chi2, 1))
    return SrmResult(chi2, p, treatment_share, n_treatment / n, p < threshold)


def msprt_lambda(diff: float, se: float, tau: float, theta0: float = 0.0) -> float:
    """The normal-mixture SPRT statistic for H0: true difference = θ0, given an estimate with standard error
    ``se`` and the mixing prior N(θ0, τ²) on the difference. Under H0 it is a martingale with mean 1, so by
    Ville's inequality P(sup Λ ≥ 1/α) ≤ α: any number of looks keeps the false-alarm rate at α."""
    if not (se > 0 and math.isfinite(se) and math.isfinite(diff)):
        return 1.0
    s2, t2 = se * se, tau * tau
    return math.sqrt(s2 / (s2 + t2)) * math.exp(t2 * (diff - theta0) ** 2 / (2 * s2 * (s2 + t2)))


def msprt_pvalue(diff: float, se: float, tau: float, previous: float = 1.0, theta0: float = 0.0) -> float:
    """Always-valid p-value after this look: min(previous, 1/Λ). Keep it between looks (it never goes back up)."""
    return min(previous, 1.0 / msprt_lambda(diff, se, tau, theta0))


def benjamini_hochberg(pvalues: list[float]) -> list[float]:
    """Benjamini–Hochberg adjusted p-values (step-up, monotone), in the input order."""
    p = np.asarray(pvalues, dtype=np.float64)
    m = p.size
    if m == 0:
        return []
    order = np.argsort(p)
    ranked = p[order] * m / np.arange(1, m + 1)
    adjusted = np.minimum.accumulate(ranked[::-1])[::-1]
    out = np.empty(m)
    out[order] = np.minimum(adjusted, 1.0)
    return out.tolist()
