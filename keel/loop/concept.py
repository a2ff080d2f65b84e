"""Was it concept drift? Once a month's labels are in, whether the one assumption of a served version's estimator
(keel/loop/estimate.py) still held on it — so that when an estimate misses, the report can say why (issue 62).

An estimate from the scores alone assumes that the label follows the served answer as it did on the reference rows
the estimator was fitted on. A change of the features alone (covariate shift) leaves that true and the estimate
follows it; a change of how the label follows the features (concept drift) does not, and no estimate made before
the labels can see it. On realized labels it can be seen:

- **binary** (CBPE's calibration): refit the label on the calibrated log-odds the estimator uses — Cox's
  recalibration, P(y = 1) = sigmoid(a + b · logit(q)). The calibration held when a = 0 (the level: as many
  positives as the probabilities said) and b = 1 (the spread: the scores separate as sharply as they did); a
  two-degree-of-freedom Wald test.
- **regression** (DLE's error model): the level — the mean residual against the reference rows' —, the spread —
  the realized absolute error against what the error model predicted for the same answers — and the tail — the
  realized squared error against the predicted one (the RMSE's own assumption: a few larger errors move it where the
  absolute errors hardly move); a z-test each, held to a third of the level (Bonferroni).

Rows are not independent: the flights of one day share its weather, the stays of one arrival day its season and
events — the covariances are clustered by day (on 2013's flights an i.i.d. test would find drift in any month of
18,000 flights). Pure numpy and scipy.

Measured on 2013 (docs/live.md "Quality before the labels"): the first flights model's CBPE estimate, with the
calibration of its validation month, missed the realized AUC by more than 0.01 in eight of nine months — and the
test found the calibration moved in exactly those eight; with each month's own calibration (what the labels show
afterwards) the same estimator is within 0.006 in all nine.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy.stats import chi2, norm

from keel.loop.estimate import Calibration, Estimator, _logit
from keel.loop.shadow import clustered_mean_se

CONCEPT_ALPHA = 0.05  # the level at which a month's labels say the estimator's assumption broke
MIN_CLUSTERS = 5  # fewer days than this judge nothing


@dataclass(frozen=True)
class ConceptDrift:
    """The verdict on one version's month: ``drifted`` when the estimator's assumption broke at ``CONCEPT_ALPHA``.
    ``level`` and ``spread``: binary — Cox's intercept (0 when held) and slope (1 when held); regression — the mean
    residual's move from the reference's and the realized minus the predicted mean absolute error (0 when held);
    ``tail`` (regression): the realized mean squared error over the predicted one (1 when held)."""

    drifted: bool
    p_value: float
    level: float
    spread: float
    days: int
    task: str
    tail: float | None = None

    def describe(self) -> str:
        if self.task == "binary":
            what = f"the calibration's intercept {self.level:+.3f} (0 held), slope {self.spread:.3f} (1 held)"
        else:
            what = (
                f"the mean residual {self.level:+.2f} from the reference rows', the mean absolute error "
                f"{self.spread:+.2f} from the error model's"
                + (f", the mean squared error ×{self.tail:.2f} the error model's" if self.tail is not None else "")
            )
        verdict = "concept drift" if self.drifted else "no concept drift"
        return f"{verdict}: {what}; p = {self.p_value:.3g} over {self.days} days"

    def as_metadata(self) -> dict:
        return asdict(self)


def _cox_wald(q: np.ndarray, y: np.ndarray, clusters: np.ndarray) -> tuple[float, float, float, int]:
    """(intercept, slope, Wald p-value of (0, 1), clusters) of the label refitted on logit(q), sandwich covariance
    clustered by ``clusters`` (CR1)."""
    refit = Calibration.fit(q, y)  # Platt on logit(q) is Cox's recalibration; Newton's method starts at the null
    x = np.column_stack([np.ones_like(q), _logit(q)])
    w = np.array([refit.intercept, refit.slope])
    p = 1 / (1 + np.exp(-(x @ w)))
    bread = np.linalg.inv((x * (p * (1 - p))[:, None]).T @ x + 1e-9 * np.eye(2))
    _, group = np.unique(clusters, return_inverse=True)
    g = int(group.max()) + 1
    scores = np.column_stack([np.bincount(group, weights=x[:, k] * (y - p), minlength=g) for k in range(2)])
    covariance = g / (g - 1) * bread @ (scores.T @ scores) @ bread
    deviation = w - np.array([0.0, 1.0])
    stat = float(deviation @ np.linalg.solve(covariance, deviation))
    return float(w[0]), float(w[1]), float(chi2.sf(stat, 2)), g


def concept_drift(
    estimator: Estimator,
    scores: np.ndarray,
    labels: np.ndarray,
    clusters: np.ndarray,
    features: np.ndarray | None = None,
    alpha: float = CONCEPT_ALPHA,
) -> ConceptDrift | None:
    """Whether ``estimator``'s assumption held on these answers (``scores``), by their realized ``labels``, rows
    clustered by ``clusters`` (their days); None when too few days or rows to judge, or nothing to judge with."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    days = np.asarray(clusters)
    if s.size < 30 or len(np.unique(days)) < MIN_CLUSTERS:
        return None
    if estimator.calibration is not None:
        if y.min() == y.max():
            return None  # one class only: no slope to fit
        a, b, p, g = _cox_wald(estimator.calibration(s), y, days)
        return ConceptDrift(bool(p < alpha), p, a, b, g, "binary")
    if estimator.error_model is None or features is None:
        return None
    predicted_abs, predicted_sq = estimator.error_model.predict(features, s)
    residual = y - s
    level, level_se, g = clustered_mean_se(residual - estimator.error_model.bias, days)
    spread, spread_se, _ = clustered_mean_se(np.abs(residual) - predicted_abs, days)
    excess, excess_se, _ = clustered_mean_se(residual**2 - predicted_sq, days)
    # the error model's own uncertainty: its predictions are means of the reference rows' errors, ``rows`` of them
    ref = max(estimator.rows, 1)
    spread_se = math.hypot(spread_se, estimator.error_model.absolute_sd / math.sqrt(ref))
    excess_se = math.hypot(excess_se, estimator.error_model.squared_sd / math.sqrt(ref))
    tests = ((level, level_se), (spread, spread_se), (excess, excess_se))
    ps = [2 * norm.sf(abs(m) / se) if se > 0 and math.isfinite(se) else 1.0 for m, se in tests]
    p = min(1.0, len(ps) * min(ps))  # Bonferroni over the three
    expected_sq = float(predicted_sq.mean())
    tail = 1.0 + excess / expected_sq if expected_sq > 0 else float("nan")
    return ConceptDrift(bool(p < alpha), p, level, spread, g, "regression", tail)
