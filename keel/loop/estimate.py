"""Quality before the labels: what a serving arm's answers are worth, estimated from its own scores (issue 62).

A flight's label lands the next day, a booking's months later; a canary judged only on labels waits for them. The
estimate judges sooner, from what each answer already says:

- **binary** (confidence-based performance estimation, NannyML's CBPE): a calibrated probability q says the label is
  1 with probability q. The served score s is first mapped through the calibration fitted on the model's reference
  rows (``Calibration``: Platt scaling on the log-odds). Over a window of answers, if the labels fall as the
  q say, the expected log-loss of the served scores is the mean cross-entropy −[q log s + (1 − q) log(1 − s)], and
  the expected AUC the chance that a positive outranks a negative, each row weighted by how likely it is to be each:
  Σ_{i≠j} q_i (1 − q_j) [s_i > s_j] / Σ_{i≠j} q_i (1 − q_j) (ties count a half).
- **regression** (direct loss estimation, NannyML's DLE): a model of each answer's absolute and squared error, fitted
  on the reference rows from the features and the prediction (``ErrorModel``), predicts them for the new answers:
  their mean is the expected MAE, the square root of the squared ones' mean the expected RMSE.

Each ``Estimate`` carries a standard error — how far the realized value may fall from the expectation when the
labels land: for log-loss the Bernoulli variance of each row's loss, for AUC Hanley & McNeil's, for a regression
the reference rows' spread of the realized error around the predicted one. Rows are taken as independent given
their scores; a day whose errors move together makes the error wider than this says.

What it cannot see: a change in how the label follows the features that leaves the scores where they were (concept
drift). The estimate is as good as the calibration — it judges a canary's step early, and keel's outcome gate still
judges the promotion on realized labels. Pure numpy (LightGBM for the error model); the estimator is measured
against the realized value once labels land (the loop's ``quality_estimates``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass

import numpy as np
import polars as pl
from scipy.stats import norm

from keel.features.spec import FeatureSet
from keel.metrics import EPS, SUMMARY, summary
from keel.training.model import calibration_named, feature_matrix, predict, split_validation

MIN_ROWS = 30  # fewer answers estimate nothing


@dataclass(frozen=True)
class Estimate:
    """An expected metric over a window of answers, and the standard error of the realized value around it."""

    metric: str  # "auc", "log_loss", "rmse" or "mae"
    value: float
    se: float
    rows: int

    def as_metadata(self) -> dict:
        return asdict(self)


# -- binary: the calibration and CBPE ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """The probability the label is 1 given a served score: Platt scaling on the score's log-odds,
    q = sigmoid(slope · logit(s) + intercept), fitted by maximum likelihood on reference rows. Two numbers: it cannot
    learn the reference rows' labels by heart (an isotonic map fitted on the rows it then judges spreads its
    probabilities and overstates the AUC it expects), and a LightGBM model's miscalibration is mostly a log-odds
    scale and shift."""

    slope: float
    intercept: float

    @classmethod
    def fit(cls, scores: np.ndarray, labels: np.ndarray, iterations: int = 50) -> Calibration:
        s = np.asarray(scores, dtype=np.float64)
        y = np.asarray(labels, dtype=np.float64)
        if s.size < MIN_ROWS or s.shape != y.shape:
            raise ValueError(f"a calibration needs at least {MIN_ROWS} scored and labelled rows, got {s.size}")
        x = np.column_stack([_logit(s), np.ones_like(s)])
        w = np.array([1.0, 0.0])
        for _ in range(iterations):  # Newton's method on the log-likelihood (a tiny ridge keeps it defined)
            q = 1 / (1 + np.exp(-(x @ w)))
            hessian = (x * (q * (1 - q))[:, None]).T @ x + 1e-9 * np.eye(2)
            step = np.linalg.solve(hessian, x.T @ (y - q))
            w = w + step
            if np.max(np.abs(step)) < 1e-10:
                break
        return cls(float(w[0]), float(w[1]))

    def __call__(self, scores: np.ndarray) -> np.ndarray:
        z = self.slope * _logit(np.asarray(scores, dtype=np.float64)) + self.intercept
        return np.clip(1 / (1 + np.exp(-z)), EPS, 1 - EPS)

    def as_metadata(self) -> dict:
        return {"slope": self.slope, "intercept": self.intercept}


def _logit(s: np.ndarray) -> np.ndarray:
    p = np.clip(s, 1e-9, 1 - 1e-9)
    return np.log(p / (1 - p))


def expected_auc(scores: np.ndarray, q: np.ndarray) -> tuple[float, float]:
    """(expected AUC of ``scores`` when row i is positive with probability ``q[i]``, Hanley–McNeil standard error)."""
    s = np.asarray(scores, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    groups, inverse = np.unique(s, return_inverse=True)  # equal scores tie: half a win
    pos = np.bincount(inverse, weights=q, minlength=groups.size)
    neg = np.bincount(inverse, weights=1 - q, minlength=groups.size)
    neg_below = np.concatenate(([0.0], np.cumsum(neg)[:-1]))
    self_pairs = float(np.sum(q * (1 - q)))
    wins = float(np.sum(pos * neg_below) + 0.5 * (np.sum(pos * neg) - self_pairs))
    pairs = float(pos.sum() * neg.sum() - self_pairs)
    if pairs <= 0:
        return float("nan"), float("nan")
    a = wins / pairs
    n1, n0 = max(float(pos.sum()), 1.0), max(float(neg.sum()), 1.0)
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (n1 - 1) * (q1 - a * a) + (n0 - 1) * (q2 - a * a)) / (n1 * n0)
    return a, math.sqrt(max(var, 0.0))


def expected_log_loss(scores: np.ndarray, q: np.ndarray) -> tuple[float, float]:
    """(expected mean log-loss of the served ``scores`` when row i is positive with probability ``q[i]``, its
    standard error: each row's loss is −log s with probability q, −log(1 − s) otherwise)."""
    s = np.clip(np.asarray(scores, dtype=np.float64), EPS, 1 - EPS)
    q = np.asarray(q, dtype=np.float64)
    loss = -(q * np.log(s) + (1 - q) * np.log(1 - s))
    var = q * (1 - q) * np.log(s / (1 - s)) ** 2
    return float(loss.mean()), float(math.sqrt(var.sum()) / s.size)


def estimate_binary(scores: np.ndarray, calibration: Calibration) -> dict[str, Estimate]:
    """The expected AUC and log-loss of a window of served binary scores (CBPE)."""
    s = np.asarray(scores, dtype=np.float64)
    if s.size < MIN_ROWS:
        return {}
    q = calibration(s)
    auc, auc_se = expected_auc(s, q)
    loss, loss_se = expected_log_loss(s, q)
    return {"auc": Estimate("auc", auc, auc_se, s.size), "log_loss": Estimate("log_loss", loss, loss_se, s.size)}


# -- regression: DLE --------------------------------------------------------------------------------------------------

ERROR_MODEL_PARAMS = {
    "objective": "regression",
    "learning_rate": 0.1,
    "num_leaves": 7,
    "min_data_in_leaf": 50,
    "verbose": -1,
    "num_threads": 1,
    "seed": 7,
    "deterministic": True,
}
ERROR_MODEL_ROUNDS = 100  # small trees, few: a record keeps them as text


@dataclass(frozen=True)
class ErrorModel:
    """Each answer's absolute and squared error predicted from its features and prediction (two LightGBM models
    fitted on the reference rows, kept as text), and how far the realized errors fell from the predicted ones there
    (the standard deviation per row, for the estimate's standard error)."""

    absolute: str  # LightGBM model text
    squared: str
    absolute_sd: float
    squared_sd: float
    bias: float = 0.0  # the mean residual (label − prediction) on the reference rows (keel/loop/concept.py's level)

    @classmethod
    def fit(cls, features: np.ndarray, predictions: np.ndarray, labels: np.ndarray) -> ErrorModel:
        import lightgbm as lgb

        x = _design(features, predictions)
        residual = np.asarray(labels, dtype=np.float64) - np.asarray(predictions, dtype=np.float64)
        if x.shape[0] < MIN_ROWS:
            raise ValueError(f"an error model needs at least {MIN_ROWS} labelled rows, got {x.shape[0]}")
        texts, sds = [], []
        for target in (np.abs(residual), residual**2):
            booster = lgb.train(ERROR_MODEL_PARAMS, lgb.Dataset(x, target), num_boost_round=ERROR_MODEL_ROUNDS)
            texts.append(booster.model_to_string())
            sds.append(float(np.std(target - booster.predict(x))))
        return cls(texts[0], texts[1], sds[0], sds[1], float(residual.mean()))

    def predict(self, features: np.ndarray, predictions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(predicted absolute error, predicted squared error) of each answer, neither below 0."""
        x = _design(features, predictions)
        absolute, squared = _booster(self.absolute).predict(x), _booster(self.squared).predict(x)
        return np.maximum(absolute, 0.0), np.maximum(squared, 0.0)


@functools.lru_cache(maxsize=16)
def _booster(text: str):
    """A LightGBM model from its text, parsed once per process (every tick estimates with the same few)."""
    import lightgbm as lgb

    return lgb.Booster(model_str=text)


def _design(features: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    f = np.asarray(features, dtype=np.float64)
    f = f.reshape(-1, 1) if f.ndim == 1 else f
    return np.column_stack([f, np.asarray(predictions, dtype=np.float64)])


def estimate_regression(features: np.ndarray, predictions: np.ndarray, model: ErrorModel) -> dict[str, Estimate]:
    """The expected RMSE and MAE of a window of served regression answers (DLE)."""
    n = np.asarray(predictions).size
    if n < MIN_ROWS:
        return {}
    absolute, squared = model.predict(features, predictions)
    mae, mse = float(absolute.mean()), float(squared.mean())
    rmse = math.sqrt(mse)
    rmse_se = model.squared_sd / math.sqrt(n) / (2 * rmse) if rmse > 0 else float("nan")
    return {
        "rmse": Estimate("rmse", rmse, rmse_se, n),
        "mae": Estimate("mae", mae, model.absolute_sd / math.sqrt(n), n),
    }


# -- a model's estimator, as its registry record keeps it ------------------------------------------------------------

ESTIMATOR_KEY = "estimator"  # where a registry record keeps its estimator
# How far an estimate may miss the realized value before the month's report says the estimator missed (concept drift:
# the labels moved where the scores did not): AUC by 0.01, RMSE by 10 %.
TOLERANCE = {"auc": 0.01, "rmse": 0.10}


@dataclass(frozen=True)
class Estimator:
    """What estimates one model's quality from its answers: a binary model's calibration, a regression model's error
    model — fitted on reference rows when it was trained (``fitted_on`` says which) and kept in its registry record."""

    task: str
    fitted_on: str
    rows: int
    calibration: Calibration | None = None
    error_model: ErrorModel | None = None

    @classmethod
    def fit(cls, task: str, scores, labels, features=None, fitted_on: str = "") -> Estimator:
        if task == "binary":
            return cls(task, fitted_on, len(scores), calibration=Calibration.fit(scores, labels))
        if features is None:
            raise ValueError("a regression's estimator needs the reference rows' features")
        return cls(task, fitted_on, len(scores), error_model=ErrorModel.fit(features, scores, labels))

    def estimate(self, scores, features=None) -> dict[str, Estimate]:
        if self.calibration is not None:
            return estimate_binary(scores, self.calibration)
        if self.error_model is None or features is None:
            return {}
        return estimate_regression(features, scores, self.error_model)

    def as_metadata(self) -> dict:
        return {
            "task": self.task,
            "fitted_on": self.fitted_on,
            "rows": self.rows,
            "calibration": self.calibration.as_metadata() if self.calibration else None,
            "error_model": asdict(self.error_model) if self.error_model else None,
        }

    @classmethod
    def from_metadata(cls, metadata: dict) -> Estimator | None:
        """The estimator a registry record keeps (None: the model was trained before records kept one)."""
        d = metadata.get(ESTIMATOR_KEY)
        if not d:
            return None
        cal = d.get("calibration")
        err = d.get("error_model")
        return cls(
            d["task"],
            d.get("fitted_on", ""),
            int(d.get("rows", 0)),
            Calibration(cal["slope"], cal["intercept"]) if cal else None,
            ErrorModel(**err) if err else None,
        )


def estimator_record(text: str, valid: pl.DataFrame, fs: FeatureSet, on: str) -> dict:
    """What every model's registry record adds: the estimator of its quality before the labels,
    fitted on its validation rows ``valid`` (``on`` says which, in words) — a regression's error model on the half
    early stopping did not see (as its interval), a binary model's calibration on all of them (early stopping chose
    the number of trees there, not the scores' meaning). Too few labelled rows: nothing."""
    rows = split_validation(valid, fs)[1] if fs.label.task == "regression" else valid
    scores, labels = predict(text, rows, fs)
    if labels.size < MIN_ROWS:
        return {}
    named = calibration_named(on) if fs.label.task == "regression" else on
    estimator = Estimator.fit(fs.label.task, scores, labels, feature_matrix(rows, fs), fitted_on=named)
    return {ESTIMATOR_KEY: estimator.as_metadata()}


def estimation_error(metric: str, estimated: float, realized: float) -> tuple[float, bool]:
    """(the estimate's error — absolute for AUC, relative for RMSE/MAE —, whether it is within ``TOLERANCE``)."""
    if metric == "auc":
        err = estimated - realized
        return err, abs(err) <= TOLERANCE["auc"]
    err = estimated / realized - 1 if realized else float("inf")
    return err, abs(err) <= TOLERANCE["rmse"]


# -- judging two arms on their estimates ------------------------------------------------------------------------------

HIGHER_IS_BETTER = {"auc": True, "log_loss": False, "rmse": False, "mae": False}


@dataclass(frozen=True)
class EstimateVerdict:
    """A challenger's arm against the champion's on their estimates: ``worse`` when the challenger is surely worse
    by more than ``margin`` (one-sided p < alpha), ``not_worse`` when it is surely no worse than ``margin`` below;
    neither while the estimates cannot tell."""

    metric: str
    challenger: float
    champion: float
    delta: float  # challenger − champion, in the direction "positive is worse"
    se: float
    p_worse: float  # one-sided: H0 the challenger is no worse than margin
    p_not_worse: float  # one-sided: H0 the challenger is worse by margin or more
    worse: bool
    not_worse: bool

    def as_metadata(self) -> dict:
        return asdict(self)


def compare(challenger: Estimate, champion: Estimate, margin: float, alpha: float = 0.01) -> EstimateVerdict:
    """Judge ``challenger`` against ``champion`` (same metric) on their estimates; ``margin`` in the metric's units."""
    if challenger.metric != champion.metric:
        raise ValueError(f"cannot compare {challenger.metric} with {champion.metric}")
    sign = -1.0 if HIGHER_IS_BETTER[challenger.metric] else 1.0
    delta = sign * (challenger.value - champion.value)
    se = math.hypot(challenger.se, champion.se)
    if not (math.isfinite(delta) and math.isfinite(se)) or se <= 0:
        return EstimateVerdict(challenger.metric, challenger.value, champion.value, delta, se, 1.0, 1.0, False, False)
    p_worse = float(norm.sf((delta - margin) / se))
    p_not_worse = float(norm.cdf((delta - margin) / se))
    return EstimateVerdict(
        challenger.metric,
        challenger.value,
        champion.value,
        delta,
        se,
        p_worse,
        p_not_worse,
        p_worse < alpha,
        p_not_worse < alpha,
    )


def primary_metric(task: str) -> str:
    """The metric a canary's step is judged on before labels: the task's first summary metric."""
    return SUMMARY[task][0]


def realized(task: str, scores: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """The realized values of the estimated metrics, for the record beside the estimate."""
    return {k: v for k, v in summary(task, scores, labels).items() if v is not None}


# -- when a canary may act on estimates ------------------------------------------------------------------------------

TRUST_MONTHS = 3  # the estimate acts on a canary only after it held on this many reported months in a row
CANARY_METRIC = {"binary": "log_loss", "regression": "rmse"}  # the canary's own loss, estimated


def canary_estimate(task: str, margin: float, held: list[list[bool]], need: int = TRUST_MONTHS) -> dict | None:
    """The ``estimate`` setting of a loop canary (keel/canary.py rolls a step back on a surely-worse estimate), or
    None while the estimates have not earned it: ``held`` is, newest month last, whether each served version's
    estimate held in the loop report (``estimate_held``) — the last ``need`` months each with an estimate, all held.
    Measured on flights 2013 (docs/live.md), CBPE misses by far more than its tolerance — labels clustered by day
    and a base rate that moves every month — so flights' canaries never act on it; a use case whose estimates hold
    earns it. Binary models only: a regression's estimate needs each answer's features, which a canary's evidence
    (the exposure log) does not keep."""
    recent = held[-need:]
    if task != "binary":  # a regression's error model needs each answer's features, which the exposure log lacks
        return None
    if len(recent) < need or not all(months and all(months) for months in recent):
        return None
    trust = f"the estimates held in each of the last {need} reported months"
    return {"metric": CANARY_METRIC[task], "margin": margin, "alpha": 0.01, "trust": trust}
