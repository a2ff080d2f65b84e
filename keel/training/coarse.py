"""The coarse fallback of a model (``ModelSpec.coarse``): a small LightGBM trained beside every main model, judged
against the constant a caller could know without any model, registered as ``<model>-coarse`` and linked from the
main model's registry record (``coarse_sha256``), so a release of the main model releases its coarse model too.

The gate: on the main model's validation rows, the coarse model's loss (log-loss for a binary label, RMSE for a
regression) must be below the loss of the training window's label mean. A coarse model that does not beat a
constant is not linked — the gateway then has no coarse answer, as for a use case that declares none.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from keel.features.spec import FeatureSet
from keel.intervals import DEFAULT_COVERAGE, INTERVAL_KEY, fit
from keel.registry import coarse_name
from keel.training.model import (
    TrainingConfig,
    _xy,
    calibration_named,
    log_loss,
    predict,
    split_validation,
    train_model,
    training_rows,
    valid_rows_named,
)
from keel.usecase_parts import Coarse


@dataclass(frozen=True)
class CoarseModel:
    text: str
    sha256: str
    loss: str  # "log_loss" | "rmse"
    coarse_loss: float  # on the main model's validation rows
    constant_loss: float  # the training window's label mean, on the same rows
    constant: float
    rows: int
    interval: dict | None = None  # a regression's split-conformal interval on the same rows (keel/intervals.py)

    @property
    def passed(self) -> bool:
        return bool(np.isfinite(self.coarse_loss) and self.coarse_loss < self.constant_loss)

    def verdict(self) -> str:
        better = "beats" if self.passed else "does not beat"
        return (
            f"{self.loss} {self.coarse_loss:.4f} {better} the training window's constant ({self.constant:.4f}: "
            f"{self.loss} {self.constant_loss:.4f}) on {self.rows:,} validation rows"
        )

    def metadata(self, main_sha256: str) -> dict:
        return {
            "coarse_of": main_sha256,
            "gate": {
                "loss": self.loss, "coarse": self.coarse_loss, "constant": self.constant_loss,
                "constant_value": self.constant, "rows": self.rows, "passed": self.passed,
            },
            **({INTERVAL_KEY: self.interval} if self.interval else {}),
        }  # fmt: skip


def _loss(task: str, scores: np.ndarray, labels: np.ndarray) -> float:
    if task == "binary":
        return log_loss(scores, labels)
    return float(np.sqrt(np.mean((scores - labels) ** 2)))


def train_coarse(
    features: pl.DataFrame, config: TrainingConfig, fs: FeatureSet, spec: Coarse, coverage: float = DEFAULT_COVERAGE
) -> CoarseModel:
    """Train the coarse model on ``config``'s months (early-stopped as the main model is) and judge it against the
    training window's label mean on ``config``'s validation rows; a regression's interval (at ``coverage``) is
    calibrated on the half of them its early stopping did not see (``split_validation``)."""
    params = config.params | {"num_leaves": spec.num_leaves, "min_data_in_leaf": max(20, spec.num_leaves * 5)}
    model = train_model(features, replace(config, num_boost_round=spec.rounds, params=params), fs)
    train, valid = training_rows(features, config, fs)
    _, y_train = _xy(train, fs)
    constant = float(y_train.mean())
    scores, labels = predict(model.text, valid, fs)
    task = fs.label.task
    return CoarseModel(
        text=model.text,
        sha256=model.sha256,
        loss="log_loss" if task == "binary" else "rmse",
        coarse_loss=_loss(task, scores, labels),
        constant_loss=_loss(task, np.full_like(labels, constant), labels),
        constant=constant,
        rows=int(labels.size),
        interval=fit(
            *predict(model.text, split_validation(valid, fs)[1], fs),
            coverage,
            calibration_named(valid_rows_named(config)),
        ).as_metadata()
        if task == "regression"
        else None,
    )


def fit_coarse(
    reg,
    model: str,
    spec: Coarse | None,
    features: pl.DataFrame,
    config: TrainingConfig,
    fs: FeatureSet,
    main_sha256: str,
    metadata: dict,
    coverage: float = DEFAULT_COVERAGE,
) -> tuple[CoarseModel, int | None] | None:
    """Train ``model``'s coarse model (when the use case declares one: ``spec``) on the main model's ``config``,
    register it as ``<model>-coarse`` with ``metadata`` and its gate, and link it from the main model's record
    (``coarse_sha256``) when it passed; an earlier link of the same main model is removed when it did not. Returns
    the coarse model and its registry version when linked (None when not), or None when none is declared."""
    if spec is None:
        return None
    coarse = train_coarse(features, config, fs, spec, coverage)
    name = coarse_name(model)
    reg.register(name, coarse.text, metadata | coarse.metadata(main_sha256))
    reg.annotate(model, main_sha256, {"coarse_sha256": coarse.sha256 if coarse.passed else None})
    return coarse, (reg.version(name, coarse.sha256) if coarse.passed else None)


def coarse_metadata(fitted: tuple[CoarseModel, int | None] | None) -> dict[str, str]:
    """What a training asset's materialization says of its coarse model (nothing when none is declared)."""
    if fitted is None:
        return {}
    coarse, version = fitted
    released = f"linked as version {version}" if version is not None else "not linked: no coarse fallback"
    return {"coarse_model": f"{coarse.verdict()}; {released}"}
