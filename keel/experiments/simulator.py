"""A seeded simulator of the business outcomes a use case's data lacks (an offer and whether it is accepted), with
known true effects.

The units are real rows of a use case (its ``late`` column the real binary outcome: for flights, arriving more than
15 minutes late — usecases/flights/experiments.py); what a customer does when made an offer is not in the data, so it
is simulated — documented here so that tests can check estimates against the truth:

- each unit has a latent propensity to accept an offer: ``u = base_rate × late_factor × noise``, where
  late_factor = 1.8 for a unit whose real outcome is 1 (people on late flights rebook more) and noise is log-normal
  (σ = 0.5, mean 1);
- ``pre_accepted``: the unit's pre-period acceptance share over 4 earlier offers, Binomial(4, u)/4 — the CUPED
  covariate, correlated with the outcome through u;
- the variant: treatment with probability ``treatment_share`` (seeded), else control;
- every draw comes from a hash of the unit id and the seed, so a unit's outcome is the same wherever it is computed
  (a test, a replay through the gateway, the experiment data lake);
- acceptance probability: control u, treatment u × (1 + lift) × (1 + planted_lift inside the planted segment);
  ``offer_accepted`` ~ Bernoulli of it, clipped to [0, 1];
- ``offers`` = 1, 2 or 3 offers shown (probabilities 0.71, 0.26, 0.03 — about 1 + Poisson(0.3)), ``revenue`` =
  accepted × offers × the unit's ``offer_value`` (a column the use case's units carry: what one accepted offer is
  worth; 100 where the units have none);
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


def _uniform(col: str, seed: int, k: int) -> pl.Expr:
    """A uniform(0, 1) draw per unit, from a hash of its id: the same unit always draws the same number."""
    return ((pl.col(col).hash(seed * 1_000 + k) // 2048).cast(pl.Float64) + 0.5) / float(2**53)


def outcome_exprs(
    *,
    unit: str = "unit_id",
    treated: pl.Expr,
    late: pl.Expr,
    seed: int = 0,
    base_rate: float = 0.12,
    lift: float = 0.0,
    inside: pl.Expr | None = None,
    planted_lift: float = 0.0,
) -> list[pl.Expr]:
    """The simulated columns (see the module doc) as expressions: _p0, _p1 (the two potential acceptance
    probabilities), offer_accepted, pre_accepted, offers. Every draw hashes the unit id, so a unit's outcome does
    not depend on which rows happen to be in the frame — the same in a test, a replay and the data lake."""
    z = (-2 * _uniform(unit, seed, 1).log()).sqrt() * (2 * np.pi * _uniform(unit, seed, 2)).cos()
    u = (base_rate * pl.when(late > 0).then(LATE_FACTOR).otherwise(1.0) * (-0.125 + 0.5 * z).exp()).clip(0.0, 1.0)
    bump = pl.when(inside).then(1 + planted_lift).otherwise(1.0) if inside is not None else pl.lit(1.0)
    p1 = (u * (1 + lift) * bump).clip(0.0, 1.0)
    pre = sum((_uniform(unit, seed, 10 + k) < u).cast(pl.Float64) for k in range(4)) / 4.0
    offers = 1 + (_uniform(unit, seed, 20) < 0.26).cast(pl.Int64) + (_uniform(unit, seed, 21) < 0.04).cast(pl.Int64)
    accepted = _uniform(unit, seed, 30) < pl.when(treated).then(p1).otherwise(u)
    return [
        u.alias("_p0"),
        p1.alias("_p1"),
        accepted.cast(pl.Int8).alias("offer_accepted"),
        pre.alias("pre_accepted"),
        offers.alias("offers"),
    ]


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
    treated = _uniform("unit_id", seed, 0) < treatment_share
    inside = None
    if planted:
        inside = pl.lit(True)
        for col, value in planted.items():
            inside = inside & (pl.col(col) == value)
    late = pl.col("late") if "late" in units.columns else pl.lit(0)
    fare = pl.col("offer_value") if "offer_value" in units.columns else pl.lit(100.0)
    frame = (
        units.with_columns(
            treated.alias("_treated"), (inside if inside is not None else pl.lit(False)).alias("_inside")
        )
        .with_columns(
            outcome_exprs(
                treated=pl.col("_treated"),
                late=late,
                seed=seed,
                base_rate=base_rate,
                lift=lift,
                inside=pl.col("_inside") if planted else None,
                planted_lift=planted_lift,
            )  # fmt: skip
        )
        .with_columns(
            pl.when(pl.col("_treated")).then(pl.lit("treatment")).otherwise(pl.lit("control")).alias("variant"),
            (pl.col("offer_accepted") * pl.col("offers") * fare).alias("revenue"),
        )
    )
    effect = (frame["_p1"] - frame["_p0"]).to_numpy()
    inside_mask = frame["_inside"].to_numpy()
    share = float(effect[inside_mask].sum() / effect.sum()) if planted and effect.sum() != 0 else 0.0
    truth = Truth(
        float(effect.mean()), float(frame["_p1"].mean() / frame["_p0"].mean() - 1), share, dict(planted or {})
    )
    if drop_treatment > 0:
        frame = frame.filter(~(pl.col("_treated") & (_uniform("unit_id", seed, 40) < drop_treatment)))
    return frame.drop("_p0", "_p1", "_treated", "_inside"), truth


def synthetic_exposures(
    n: int,
    *,
    segments: int = 10,
    seed: int = 0,
    lift: float = 0.02,
    planted: dict[str, int] | None = None,
    planted_lift: float = 0.0,
) -> pl.DataFrame:
    """``n`` exposure rows × 2 arms × ``segments`` segments (plus ``channel`` 0–2 and ``band`` 0–3 for drill-downs)
    with a mean outcome, a 0/1 outcome, a pre-period covariate and a ratio pair — the benchmark's data
    (bench/experiments.py). ``planted``: e.g. {"segment": 7, "channel": 2} gets ``planted_lift`` added to the
    treatment's conversion probability there."""
    rng = np.random.default_rng(seed)
    segment = rng.integers(0, segments, n).astype(np.int32)
    channel = rng.integers(0, 3, n).astype(np.int32)
    band = rng.integers(0, 4, n).astype(np.int32)
    treated = rng.random(n) < 0.5
    pre = rng.gamma(2.0, 5.0, n)
    value = 0.6 * pre + rng.normal(0, 4, n) + lift * 10 * treated + segment * 0.1
    p = 0.1 + 0.005 * segment + lift * treated
    if planted:
        inside = np.ones(n, dtype=bool)
        for col, v in planted.items():
            inside &= {"segment": segment, "channel": channel, "band": band}[col] == v
        p = p + planted_lift * (treated & inside)
    converted = rng.random(n) < np.clip(p, 0, 1)
    offers = 1 + rng.poisson(0.3, n)
    return pl.DataFrame(
        {
            "variant": np.where(treated, "treatment", "control"),
            "segment": segment,
            "channel": channel,
            "band": band,
            "value": value,
            "converted": converted.astype(np.int8),
            "pre_value": pre,
            "offers": offers,
            "revenue": converted * offers * 100.0,
        }
    )
