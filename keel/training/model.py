"""Train a use case's LightGBM model deterministically; evaluate it; decide whether it may be promoted.

Determinism: the same data, config and seed give a byte-identical LightGBM text model (single thread,
``deterministic=True``, ``force_row_wise=True``, rows sorted by the entity id before training). Models are only ever
serialised as LightGBM text — never pickled.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import lightgbm as lgb
import numpy as np
import polars as pl

from keel import intervals
from keel.features.spec import FeatureSet
from keel.metrics import auc, summary

# LightGBM objectives that fit a label's task: a regression use case declares its own in ModelSpec.params.
OBJECTIVES = {
    "binary": ("binary", "cross_entropy"),
    "regression": ("regression", "regression_l2", "l2", "regression_l1", "l1", "huber", "fair", "poisson", "tweedie"),
}


DEFAULT_PARAMS: dict[str, Any] = {
    "objective": "binary",
    "learning_rate": 0.05,
    "num_leaves": 31,
    "min_data_in_leaf": 50,
    "feature_fraction": 0.9,
    "bagging_fraction": 0.8,
    "bagging_freq": 1,
    "seed": 2013,
    "deterministic": True,
    "force_row_wise": True,
    "num_threads": 1,
    "verbose": -1,
}


@dataclass(frozen=True)
class TrainingConfig:
    train_months: tuple[str, ...] = ("2013-01", "2013-02", "2013-03")
    valid_month: str = "2013-04"
    # Early-stop on these days of valid_month only (first, last; inclusive), e.g. (1, 21) when its later days judge
    # the model (keel.loop.retrain); None: the whole month.
    valid_days: tuple[int, int] | None = None
    num_boost_round: int = 200
    early_stopping_rounds: int = 20
    params: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_PARAMS))
    # Recency weights: a training row counts 0.5 ** (its age in days before the newest training day / half-life);
    # None: every row counts the same.
    half_life_days: float | None = None


@dataclass(frozen=True)
class TrainedModel:
    text: str
    sha256: str
    best_iteration: int
    features: tuple[str, ...]


def _xy(frame: pl.DataFrame, fs: FeatureSet) -> tuple[np.ndarray, np.ndarray]:
    label = fs.label.column
    labelled = frame.filter(pl.col(label).is_not_null()).sort(fs.entity.id_column)
    x = labelled.select([pl.col(f).cast(pl.Float64) for f in fs.names]).to_numpy()
    return x, labelled[label].to_numpy().astype(np.float64)


def recency_weights(frame: pl.DataFrame, fs: FeatureSet, half_life_days: float) -> np.ndarray:
    """Each labelled row's weight (in ``_xy``'s order): 0.5 ** (days before the newest row's day / half-life)."""
    if not half_life_days > 0:
        raise ValueError(f"half_life_days must be > 0, got {half_life_days}")
    labelled = frame.filter(pl.col(fs.label.column).is_not_null()).sort(fs.entity.id_column)
    day = labelled.select(fs.entity.partition_day.alias("d"))["d"]
    age = (day.max() - day).dt.total_days().to_numpy().astype(np.float64)
    return np.power(0.5, age / half_life_days)


def month_of(frame: pl.DataFrame, month: str, fs: FeatureSet) -> pl.DataFrame:
    """The rows of ``frame`` (a table of ``fs``) of partition ``month`` (YYYY-MM): by the entity's partition date
    (``Entity.partition_date``; default its date)."""
    return frame.filter(fs.entity.partition_day.dt.strftime("%Y-%m") == month)


def training_rows(
    features: pl.DataFrame, config: TrainingConfig, fs: FeatureSet
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(training rows, validation rows) of ``features`` for ``config``: by the partition's months and days (a
    booking's arrival, not its quote; ``Entity.partition_date``)."""
    day = fs.entity.partition_day
    train = features.filter(day.dt.strftime("%Y-%m").is_in(list(config.train_months)))
    valid = month_of(features, config.valid_month, fs)
    if config.valid_days is not None:
        first, last = config.valid_days
        valid = valid.filter(day.dt.day().is_between(first, last))
    return train, valid


def split_validation(valid: pl.DataFrame, fs: FeatureSet) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(early-stopping rows, calibration rows) of validation rows ``valid``. A regression model early-stops on its
    labelled validation rows of even rank in id order and its interval is calibrated on the odd ones: rows the model
    never saw, not even to choose its number of trees — an interval calibrated on the rows early stopping chose the
    model on is optimistic (issue 61 item 6). A binary model (no interval) early-stops on all of them."""
    if fs.label.task != "regression":
        return valid, valid.clear()
    ranked = valid.filter(pl.col(fs.label.column).is_not_null()).sort(fs.entity.id_column).with_row_index("_rank")
    return (
        ranked.filter(pl.col("_rank") % 2 == 0).drop("_rank"),
        ranked.filter(pl.col("_rank") % 2 == 1).drop("_rank"),
    )


def train_model(features: pl.DataFrame, config: TrainingConfig, fs: FeatureSet) -> TrainedModel:
    """Train on ``config.train_months`` of ``features`` (a table of ``fs``), early-stopping on
    ``config.valid_month`` (its ``valid_days`` when set; a regression model on half of those rows,
    ``split_validation``). The objective must fit the label's task."""
    objective = config.params.get("objective")
    if objective not in OBJECTIVES[fs.label.task]:
        raise ValueError(
            f"LightGBM objective {objective!r} does not fit a {fs.label.task} label ({fs.label.column}); "
            f"use one of {', '.join(OBJECTIVES[fs.label.task])}"
        )
    train, valid = training_rows(features, config, fs)
    if train.height == 0 or valid.height == 0:
        raise ValueError(
            f"no rows for training months {config.train_months} or validation month {config.valid_month}"
        )
    xt, yt = _xy(train, fs)
    xv, yv = _xy(split_validation(valid, fs)[0], fs)
    names = fs.names
    weight = recency_weights(train, fs, config.half_life_days) if config.half_life_days is not None else None
    dtrain = lgb.Dataset(xt, yt, weight=weight, feature_name=list(names), params={"verbose": -1},
                         free_raw_data=False)  # fmt: skip
    dvalid = lgb.Dataset(xv, yv, reference=dtrain)
    booster = lgb.train(
        config.params,
        dtrain,
        num_boost_round=config.num_boost_round,
        valid_sets=[dvalid],
        callbacks=[lgb.early_stopping(config.early_stopping_rounds, verbose=False)],
    )
    text = booster.model_to_string(num_iteration=booster.best_iteration)
    return TrainedModel(text, hashlib.sha256(text.encode()).hexdigest(), int(booster.best_iteration), names)


def interval_record(text: str, valid: pl.DataFrame, fs: FeatureSet, coverage: float, on: str) -> dict[str, Any]:
    """What a regression model's registry record adds: its split-conformal interval on the calibration half of its
    validation rows ``valid`` (``split_validation``: the half early stopping did not see; ``on`` says which rows,
    in words; keel/intervals.py). A binary model adds nothing."""
    if fs.label.task != "regression":
        return {}
    scores, labels = predict(text, split_validation(valid, fs)[1], fs)
    return {intervals.INTERVAL_KEY: intervals.fit(scores, labels, coverage, calibration_named(on)).as_metadata()}


def calibration_named(on: str) -> str:
    """The calibration rows of validation rows ``on``, in words."""
    return f"{on}, odd rows in id order (early stopping saw the even ones)"


def valid_rows_named(config: TrainingConfig) -> str:
    """``config``'s validation rows in words: "2016-03", "2016-05 days 1–21"."""
    days = f" days {config.valid_days[0]}–{config.valid_days[1]}" if config.valid_days else ""
    return f"{config.valid_month}{days}"


def predict(model_text: str, frame: pl.DataFrame, fs: FeatureSet) -> tuple[np.ndarray, np.ndarray]:
    """(scores, labels) for the labelled rows of ``frame``, in id order."""
    booster = lgb.Booster(model_str=model_text)
    x, y = _xy(frame, fs)
    return booster.predict(x), y


def feature_matrix(frame: pl.DataFrame, fs: FeatureSet) -> np.ndarray:
    """The features of the labelled rows of ``frame``, in id order (``predict``'s rows)."""
    return _xy(frame, fs)[0]


def labelled_days(frame: pl.DataFrame, fs: FeatureSet) -> np.ndarray:
    """Each labelled row's day (its partition day, ``YYYY-MM-DD``), in id order (``predict``'s rows): the clusters of a
    paired or clustered comparison."""
    labelled = frame.filter(pl.col(fs.label.column).is_not_null()).sort(fs.entity.id_column)
    return labelled.select(fs.entity.partition_day.dt.strftime("%Y-%m-%d").alias("d"))["d"].to_numpy()


def log_loss(scores: np.ndarray, labels: np.ndarray, eps: float = 1e-15) -> float:
    p = np.clip(scores, eps, 1 - eps)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


def brier(scores: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean((scores - labels) ** 2))


def ece(scores: np.ndarray, labels: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error over equal-width score bins."""
    idx = np.minimum((scores * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        mask = idx == b
        if mask.any():
            total += mask.sum() / scores.size * abs(scores[mask].mean() - labels[mask].mean())
    return float(total)


@dataclass(frozen=True)
class Evaluation:
    rows: int
    task: str
    metrics: dict[str, float]  # binary: auc, log_loss, brier, ece; regression: rmse, mae
    label_mean: float  # binary: the share of positives
    segments: dict[str, dict[str, dict[str, float]]]  # dimension -> segment -> rows and the task's summary metrics
    importance: dict[str, float]

    def as_metrics(self) -> dict[str, float]:
        return dict(self.metrics)

    @property
    def auc(self) -> float:
        return self.metrics.get("auc", float("nan"))


def _metrics(task: str, scores: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    out = {k: (float("nan") if v is None else v) for k, v in summary(task, scores, labels).items()}
    if task == "binary":
        out = {"auc": auc(scores, labels), "log_loss": log_loss(scores, labels)} | {
            "brier": brier(scores, labels),
            "ece": ece(scores, labels),
        }
    return out


def evaluate(
    model_text: str,
    holdout: pl.DataFrame,
    dimensions: tuple[str, ...],
    *,
    fs: FeatureSet,
) -> Evaluation:
    """The model's metrics (by the label's task) on ``holdout`` (a table of ``fs``), overall and per segment of
    ``dimensions`` (the use case's declared segments; segments under 50 labelled rows are left out)."""
    task = fs.label.task
    labelled = holdout.filter(pl.col(fs.label.column).is_not_null()).sort(fs.entity.id_column)
    scores, labels = predict(model_text, labelled, fs)
    segments: dict[str, dict[str, dict[str, float]]] = {}
    for dim in dimensions:
        values = labelled[dim].to_numpy()
        segments[dim] = {}
        for seg in sorted(set(values.tolist())):
            m = values == seg
            if m.sum() >= 50:
                segments[dim][str(seg)] = {
                    "rows": int(m.sum()),
                    **{k: float("nan") if v is None else v for k, v in summary(task, scores[m], labels[m]).items()},
                }
    booster = lgb.Booster(model_str=model_text)
    gains = booster.feature_importance(importance_type="gain")
    total = float(gains.sum()) or 1.0
    return Evaluation(
        rows=int(labels.size),
        task=task,
        metrics=_metrics(task, scores, labels),
        label_mean=float(labels.mean()) if labels.size else float("nan"),
        segments=segments,
        importance={name: float(g) / total for name, g in zip(booster.feature_name(), gains, strict=True)},
    )


@dataclass(frozen=True)
class GatePolicy:
    max_auc_drop: float = 0.005  # binary: the candidate's AUC may be at most this much below the champion's
    max_ece: float = 0.05  # binary: calibration bound
    max_rmse_rise: float = 0.01  # regression: the candidate's RMSE may be at most this share above the champion's

    def describe(self, task: str) -> str:
        if task == "regression":
            return f"RMSE not above the champion's by more than {self.max_rmse_rise:.0%}, and defined"
        return f"AUC not worse than the champion's by more than {self.max_auc_drop}, ECE ≤ {self.max_ece}"


@dataclass(frozen=True)
class GateDecision:
    passed: bool
    reasons: tuple[str, ...]


def quality_gate(
    candidate: dict[str, float], champion: dict[str, float] | None, policy: GatePolicy, task: str = "binary"
) -> GateDecision:
    """Compare the candidate with the champion on the same holdout, by the task's metrics: a decision with its
    reasons, not an action."""
    reasons = []
    if task == "regression":
        rmse = candidate.get("rmse", float("nan"))
        if not np.isfinite(rmse):
            reasons.append("candidate RMSE is undefined on the holdout")
        elif champion is not None and rmse > champion["rmse"] * (1 + policy.max_rmse_rise):
            reasons.append(
                f"RMSE {rmse:.4f} is more than {policy.max_rmse_rise:.0%} above the champion's {champion['rmse']:.4f}"
            )
    else:
        if not np.isfinite(candidate.get("auc", float("nan"))):
            reasons.append("candidate AUC is undefined on the holdout")
        if candidate.get("ece", 1.0) > policy.max_ece:
            reasons.append(f"calibration: ECE {candidate['ece']:.4f} > {policy.max_ece}")
        if champion is not None and candidate.get("auc", 0.0) < champion["auc"] - policy.max_auc_drop:
            reasons.append(
                f"AUC {candidate['auc']:.4f} is more than {policy.max_auc_drop} below the champion's "
                f"{champion['auc']:.4f}"
            )
    return GateDecision(
        passed=not reasons, reasons=tuple(reasons) or ("within bounds" + ("" if champion else "; no champion yet"),)
    )
