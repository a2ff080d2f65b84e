"""Impact predictor: what lift will a new experiment have? Learned from past experiments (configuration → realized
lift) with LightGBM quantile regression, so a prediction comes with an interval — and is later compared with what
the experiment really did.

The history can come from real past experiments (their configuration and the analysis's realized lift) or from the
simulator (``simulate_history``): each simulated experiment draws a configuration — the rebooking offer's
``discount`` (0–30 %), whether it targets only flights the model scores as likely late (``target_late``), the
treatment share and the base acceptance rate — whose *true* lift follows a documented rule (more discount helps,
with diminishing returns past 20 %; targeting late flights multiplies the effect by 1.6), runs it on real flights
through ``simulate_offers`` and measures the realized lift the way an analysis would (noise included).

The three models (quantiles 0.1, 0.5, 0.9) are LightGBM text models — stored as text, never pickled — and the
interval is conformalized on held-out past experiments, so its 80 % holds on experiments the models did not see.
"""

from __future__ import annotations

from dataclasses import dataclass

import lightgbm as lgb
import numpy as np
import polars as pl

from keel.experiments.simulator import simulate_offers

FEATURES = ["discount", "target_late", "treatment_share", "base_rate"]
QUANTILES = (0.1, 0.5, 0.9)


def true_lift(discount: float, target_late: int) -> float:
    """The simulator's rule (the truth a predictor should learn)."""
    base = 1.5 * discount - 2.0 * max(0.0, discount - 0.2)
    return base * (1.6 if target_late else 1.0)


def simulate_history(units: pl.DataFrame, n: int, *, seed: int = 0, sample: int = 6000) -> pl.DataFrame:
    """``n`` past experiments on real flights: configuration, true lift and realized (measured) lift."""
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
