"""Impact predictor: what lift will a new experiment have? Learned from past experiments (configuration → realized
lift) with LightGBM quantile regression, so a prediction comes with an interval — and is later compared with what
the experiment really did.

The history can come from real past experiments (their configuration and the analysis's realized lift) or from the
simulator (``simulate_history``): each simulated experiment draws a configuration — the rebooking offer's
``discount`` (0–30 %), whether it targets only units the model scores as likely positive (``target_late``), the
treatment share and the base acceptance rate — whose *true* lift follows a documented rule (more discount helps,
with diminishing returns past 20 %; targeting the likely positives multiplies the effect by 1.6), runs it on a use
case's real units through ``simulate_offers`` and measures the realized lift the way an analysis would (noise included).

The three models (quantiles 0.1, 0.5, 0.9) are LightGBM text models — stored as text, never pickled — and the
interval is conformalized on held-out past experiments, so its 80 % holds on experiments the models did not see.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np
import polars as pl

from keel.errors import KeelError
from keel.experiments.simulator import simulate_offers
from keel.storage import write_json_atomic

FEATURES = ["discount", "target_late", "treatment_share", "base_rate"]
QUANTILES = (0.1, 0.5, 0.9)


def true_lift(discount: float, target_late: int) -> float:
    """The simulator's rule (the truth a predictor should learn)."""
    base = 1.5 * discount - 2.0 * max(0.0, discount - 0.2)
    return base * (1.6 if target_late else 1.0)


def simulate_history(units: pl.DataFrame, n: int, *, seed: int = 0, sample: int = 6000) -> pl.DataFrame:
    """``n`` past experiments on real units: configuration, true lift and realized (measured) lift."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        cfg = {
            "discount": float(rng.uniform(0.0, 0.3)),
            "target_late": int(rng.integers(0, 2)),
            "treatment_share": float(rng.choice([0.1, 0.2, 0.3, 0.5])),
            "base_rate": float(rng.uniform(0.08, 0.25)),
        }
        lift = true_lift(cfg["discount"], cfg["target_late"])
        pool = units.filter(pl.col("late") == 1) if cfg["target_late"] else units
        sampled = pool.sample(min(sample, pool.height), seed=seed * 1000 + i)
        frame, truth = simulate_offers(
            sampled,
            seed=seed * 1000 + i,
            lift=lift,
            treatment_share=cfg["treatment_share"],
            base_rate=cfg["base_rate"],
        )
        rates = frame.group_by("variant").agg(pl.col("offer_accepted").mean()).to_dict(as_series=False)
        by = dict(zip(rates["variant"], rates["offer_accepted"], strict=True))
        realized = by["treatment"] / by["control"] - 1 if by.get("control") else float("nan")
        rows.append(cfg | {"true_lift": truth.lift, "realized_lift": realized})
    return pl.DataFrame(rows)


@dataclass
class ImpactPredictor:
    models: dict[float, str]  # quantile → LightGBM text model
    widen: float = 0.0  # conformal correction added to both ends of the interval

    @staticmethod
    def _train(x: np.ndarray, y: np.ndarray, seed: int) -> dict[float, str]:
        models = {}
        for q in QUANTILES:
            params = {
                "objective": "quantile", "alpha": q, "learning_rate": 0.05, "num_leaves": 7, "min_data_in_leaf": 8,
                "seed": seed, "deterministic": True, "force_row_wise": True, "verbose": -1, "num_threads": 1,
            }  # fmt: skip
            booster = lgb.train(params, lgb.Dataset(x, y, feature_name=FEATURES), num_boost_round=200)
            models[q] = booster.model_to_string()
        return models

    @classmethod
    def fit(cls, history: pl.DataFrame, *, seed: int = 0, calibration: float = 0.3) -> ImpactPredictor:
        """Quantile models on (1 − calibration) of the history; the rest calibrates the interval (conformalized
        quantile regression: the interval is widened until it covers 80 % of experiments the models did not see)."""
        h = history.filter(pl.col("realized_lift").is_finite())
        x = h.select(FEATURES).to_numpy().astype(np.float64)
        y = h["realized_lift"].to_numpy()
        order = np.random.default_rng(seed).permutation(len(y))
        n_cal = max(5, int(len(y) * calibration))
        cal, train = order[:n_cal], order[n_cal:]
        draft = cls(cls._train(x[train], y[train], seed))
        lo, _, hi = draft._quantiles(x[cal])
        scores = np.sort(np.maximum(lo - y[cal], y[cal] - hi))
        k = min(len(scores) - 1, int(np.ceil((len(scores) + 1) * 0.8)) - 1)
        return cls(cls._train(x, y, seed), widen=float(max(scores[k], 0.0)))

    def _quantiles(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        preds = {q: lgb.Booster(model_str=m).predict(x) for q, m in self.models.items()}
        stacked = np.vstack([preds[q] for q in QUANTILES])
        return stacked.min(axis=0), preds[0.5], stacked.max(axis=0)

    def to_json(self) -> dict[str, Any]:
        """Text models and the conformal widening: what is stored (JSON; never a pickle)."""
        return {"quantiles": {str(q): m for q, m in self.models.items()}, "widen": self.widen}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ImpactPredictor:
        return cls({float(q): m for q, m in raw["quantiles"].items()}, float(raw["widen"]))

    @property
    def sha256(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()

    def save(self, path: str | Path, **about: Any) -> None:
        write_json_atomic(self.to_json() | {"about": about}, path)

    @classmethod
    def load(cls, path: str | Path) -> ImpactPredictor:
        try:
            return cls.from_json(json.loads(Path(path).read_text()))
        except FileNotFoundError:
            raise ImpactError(
                f"no impact predictor at {path}: materialize the impact_predictor asset (scripts/up does)"
            ) from None
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ImpactError(f"{path}: not an impact predictor ({exc})") from None

    def predict(self, configs: pl.DataFrame) -> pl.DataFrame:
        """Per configuration: predicted lift (median) and its 80 % interval."""
        lo, mid, hi = self._quantiles(configs.select(FEATURES).to_numpy().astype(np.float64))
        return configs.with_columns(
            pl.Series("predicted_lift", mid),
            pl.Series("lift_low", lo - self.widen),
            pl.Series("lift_high", hi + self.widen),
        )


def compare(predicted: pl.DataFrame, realized: pl.Series) -> dict[str, float]:
    """How the predictions did once the experiments ran: interval coverage and median absolute error (and the
    error of always predicting the history's mean, for scale)."""
    r = realized.to_numpy()
    inside = (predicted["lift_low"].to_numpy() <= r) & (r <= predicted["lift_high"].to_numpy())
    err = np.abs(predicted["predicted_lift"].to_numpy() - r)
    return {"coverage_80": float(inside.mean()), "median_abs_error": float(np.median(err)), "n": int(r.size)}


class ImpactError(KeelError):
    """No predictor, or an experiment without the configuration the predictor reads."""


def predictor_path(home: str | Path, model: str) -> Path:
    """Where the impact predictor of ``model``'s use case is stored."""
    from keel.home import KeelHome
    from keel.usecase import by_model

    return KeelHome(Path(home)).impact_predictor(by_model(model).name)


def prediction_path(home: str | Path, exp_id: str) -> Path:
    from keel.home import KeelHome

    return KeelHome(Path(home)).experiment(exp_id) / "impact_prediction.json"


def train_predictor(units: pl.DataFrame, *, history: int = 120, held_out: int = 25, seed: int = 2013):
    """The predictor on a simulated history of experiments over real units, and how it did on experiments run
    after it was trained (coverage of its 80 % interval, median error against always predicting the mean)."""
    past = simulate_history(units, history, seed=seed)
    predictor = ImpactPredictor.fit(past, seed=seed)
    later = simulate_history(units, held_out, seed=seed + 1)
    check = compare(predictor.predict(later), later["realized_lift"])
    baseline = float(np.median(np.abs(past["realized_lift"].mean() - later["realized_lift"].to_numpy())))
    return predictor, check | {"always_the_mean_error": baseline, "history": history}


def spec_config(spec) -> dict[str, float]:
    """The predictor's features for an experiment spec (its ``impact`` block and traffic ratio)."""
    if not spec.impact:
        raise ImpactError(
            f"{spec.source}: spec.impact is missing: say what the treatment is ({{metric, discount, target_late}}) "
            "to predict its lift"
        )
    return {
        "discount": spec.impact["discount"],
        "target_late": spec.impact["target_late"],
        "treatment_share": spec.traffic_ratio,
        "base_rate": spec.impact["base_rate"],
    }


def predict_experiment(predictor: ImpactPredictor, spec) -> dict[str, Any]:
    """The lift of the spec's impact metric, predicted before the experiment runs, with its 80 % interval."""
    config = spec_config(spec)
    row = predictor.predict(pl.DataFrame([config])).row(0, named=True)
    return {
        "experiment": spec.id,
        "metric": spec.impact["metric"],
        "predicted_lift": row["predicted_lift"],
        "interval_80": [row["lift_low"], row["lift_high"]],
        "config": config,
        "predictor_sha256": predictor.sha256,
        "predicted_at": time.time(),
    }


def record_prediction(home: str | Path, prediction: dict[str, Any], *, started_at: float | None = None) -> bool:
    """Keep the prediction made when the experiment started: written once, never replaced by a later one (a
    prediction made after the data is in would not be a prediction). Returns whether it was written now."""
    path = prediction_path(home, prediction["experiment"])
    if path.exists():
        kept = json.loads(path.read_text())
        if started_at is None or kept.get("started_at") == started_at:
            return False
    write_json_atomic(prediction | {"started_at": started_at}, path)
    return True


def realized_vs_predicted(prediction: dict[str, Any] | None, report: dict[str, Any]) -> dict[str, Any] | None:
    """Prediction against what the analysis measured: the realized lift of the predicted metric (with its 95 %
    interval), whether it fell inside the predicted 80 % interval, and the error."""
    if not prediction:
        return None
    metric = next((m for m in report["metrics"] if m["name"] == prediction["metric"] and "lift" in m), None)
    out = {
        "metric": prediction["metric"],
        "predicted_lift": prediction["predicted_lift"],
        "interval_80": prediction["interval_80"],
        "predicted_at": prediction["predicted_at"],
    }
    if metric is None:
        return out | {"realized_lift": None, "note": "not measured yet"}
    lo, hi = prediction["interval_80"]
    return out | {
        "realized_lift": metric["lift"],
        "realized_ci": metric["lift_ci"],
        "inside_interval": bool(lo <= metric["lift"] <= hi),
        "error": metric["lift"] - prediction["predicted_lift"],
    }


def predict_at_start(home: str | Path, spec, started_at: float) -> dict[str, Any] | None:
    """When an experiment starts: predict its lift with the stored predictor and record it. None (nothing
    recorded) when the spec has no ``impact`` block or no predictor has been trained yet."""
    if not spec.impact:
        return None
    path = predictor_path(home, spec.model)
    if not path.exists():
        return None
    prediction = predict_experiment(ImpactPredictor.load(path), spec)
    record_prediction(home, prediction, started_at=started_at)
    return prediction
