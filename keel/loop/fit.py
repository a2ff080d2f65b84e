"""Fitting a drift decision's candidates (the Dagster asset: assets/challengers.py ``challenger_model``): the rows
each is early-stopped and judged on, and each recipe's model text with its registry record — a window refit, the
recency-weighted one, the committee of registered models (keel/loop/committee.py), the champion recalibrated
(keel/loop/recalibrate.py).

``config`` is what the drift sensor's plan says (keel/loop/retrain.py ``RetrainPlan``, as the asset's config):
``train_months``, ``gate_month`` and ``gate_from_day`` — the newest labelled month early-stops a candidate on its days
before ``gate_from_day`` and judges it on the days from it."""

from __future__ import annotations

import hashlib

import lightgbm as lgb
import polars as pl

from keel.errors import KeelError
from keel.loop.candidates import CandidateSpec
from keel.loop.committee import committee_model_text
from keel.loop.recalibrate import affine_model_text, fit_recalibration
from keel.training.model import TrainingConfig, _xy, month_of, train_model
from keel.usecase import UseCase


class FitError(KeelError):
    """A candidate cannot be fitted: no labelled rows to recalibrate on, no model to anchor a committee."""


def gate_rows(uc: UseCase, frame: pl.DataFrame, config) -> pl.DataFrame:
    """The rows that judge the candidates: the gate month's days from ``gate_from_day`` on."""
    fs = uc.features
    return month_of(frame, config.gate_month, fs).filter(fs.entity.partition_day.dt.day() >= config.gate_from_day)


def newest_rows(uc: UseCase, frame: pl.DataFrame, config) -> pl.DataFrame:
    """The newest labelled days before the gate's: the gate month's days before ``gate_from_day`` (early stopping's,
    and a recalibration's)."""
    fs = uc.features
    return month_of(frame, config.gate_month, fs).filter(fs.entity.partition_day.dt.day() < config.gate_from_day)


def recalibrated(uc: UseCase, champion_text: str, newest: pl.DataFrame) -> tuple[str, dict]:
    """The champion's trees with their output refitted on ``newest`` (keel.loop.recalibrate): text and its record."""
    x, y = _xy(newest, uc.features)
    if y.size == 0:
        raise FitError("no labelled rows on the newest days: nothing to recalibrate on")
    raw = lgb.Booster(model_str=champion_text).predict(x, raw_score=True)
    methods = ("platt",) if uc.task == "binary" else ("bias",)
    fit = fit_recalibration(uc.task, raw, y, methods[0])
    return affine_model_text(champion_text, fit.a, fit.b), {
        "method": fit.method, "a": fit.a, "b": fit.b, "rows": fit.rows, "loss_before": fit.loss_before,
        "loss_after": fit.loss_after, "describe": fit.describe(),
    }  # fmt: skip


def candidate_training(spec: CandidateSpec, config, params: dict, uc: UseCase) -> TrainingConfig:
    return TrainingConfig(
        train_months=spec.train_months or tuple(config.train_months),
        valid_month=config.gate_month,
        valid_days=(1, config.gate_from_day - 1),
        params=params | {"objective": spec.objective} if spec.objective else params,
        half_life_days=spec.half_life_days,
        early_stopping_rounds=uc.loop.early_stopping_rounds,
    )


def committee_members(reg, name: str, gate_month: str, previous: bool = True) -> list[tuple[str, str]]:
    """(role, sha256) of a committee's members that a drift decision judged on ``gate_month`` finds registered: the
    use case's own trained model (the newest version its training asset registered: the record has the asset's
    ``training_code_version`` — a candidate that reproduced it byte for byte shares its record, so "no candidate key"
    would not do) and the expanding refit of the decision before this one (the newest version marked
    ``window: expanding`` judged on an earlier month), when there is one and ``previous`` asks for it."""
    anchor = before = None
    for version in sorted(reg.versions(name), reverse=True):
        sha = reg.sha_of_version(name, version)
        meta = reg.get(name, sha).metadata
        if anchor is None and "training_code_version" in meta:
            anchor = sha
        if before is None and meta.get("window") == "expanding" and meta.get("gate_month", "") < gate_month:
            before = sha
    if anchor is None:
        raise FitError(f"{name} has no model of its own training in the registry: the committee has no anchor")
    return [("first model", anchor)] + ([("previous expanding refit", before)] if before and previous else [])


def fit_candidate(uc: UseCase, spec: CandidateSpec, config, features, reg, params,
         fitted: dict[CandidateSpec, str]) -> tuple[str, dict]:  # fmt: skip
    """A candidate's model text and its registry record (``fitted``: the texts of the decision's earlier specs)."""
    if spec.committee:
        refit = next((t for s, t in fitted.items() if s.expanding), None)
        if refit is None:
            raise FitError("the committee needs this decision's expanding refit: fit it first")
        members = committee_members(reg, uc.model.name, config.gate_month, uc.loop.committee_previous)
        members.append(("this decision's expanding refit", hashlib.sha256(refit.encode()).hexdigest()))
        text = committee_model_text([reg.load(sha) for _, sha in members])
        return text, {"train_months": list(spec.train_months), "valid_month": config.gate_month,
                      "committee": [{"role": role, "version": reg.version(uc.model.name, sha), "sha256": sha}
                                    for role, sha in members]}  # fmt: skip
    if spec.recalibrate:
        champion = reg.alias(uc.model.name, "champion")
        newest = newest_rows(uc, features, config)
        text, fit = recalibrated(uc, reg.load(champion), newest)
        base = reg.get(uc.model.name, champion).metadata
        return text, {"train_months": list(base.get("train_months") or []), "valid_month": base.get("valid_month"),
                      "recalibration": fit | {"of_version": reg.version(uc.model.name, champion),
                                              "fitted_on": f"{config.gate_month} days 1–{config.gate_from_day - 1}"}}  # fmt: skip
    training = candidate_training(spec, config, params, uc)
    model = train_model(features, training, uc.features)
    return model.text, {"train_months": list(training.train_months), "valid_month": training.valid_month,
                        "valid_days": list(training.valid_days), "params": training.params,
                        "early_stopping_rounds": training.early_stopping_rounds,
                        "half_life_days": spec.half_life_days, "best_iteration": model.best_iteration}  # fmt: skip
