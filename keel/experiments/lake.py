"""The experiment data lake: the gateway's exposures joined with outcomes, one wide row per exposure.

Each row of the wide table is one request of one experiment's window (from its start until it is paused, stopped
or rolled back) — for an experiment of the model's split (``traffic: all``) a request routed to its control or
treatment version that named no other experiment, for one of ``traffic: header`` a request that named it —: who (unit_id), what it was shown (variant,
routed_version, model_version, score), where (the use case's segments, hour, hour_band — from the entity key), and what
happened:

- ``late`` — the real outcome: the entity's realized binary label (the use case's validated rows, where known);
- ``log_loss`` — the model's log-loss on that outcome;
- ``offer_accepted``, ``pre_accepted``, ``offers``, ``revenue`` — business outcomes the data lacks, from the seeded
  simulator (keel.experiments.simulator) when the spec asks for it (``simulation:``), with known true effects;
- ``rolled_back`` — the day's data belongs to a rolled-back experiment (kept, marked).

The table is Parquet, one file per day; DuckDB reads it directly, e.g. conversion by score bucket:

    SELECT floor(score * 10) / 10 AS bucket, variant, avg(offer_accepted) AS accept_rate, count(*) AS n
    FROM read_parquet('$KEEL_HOME/storage/<use case>/experiment_wide_table/*.parquet')
    WHERE experiment_id = 'rebooking-offer' GROUP BY ALL ORDER BY ALL;
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from keel.experiments.simulator import hour_band, outcome_exprs
from keel.experiments.spec import ExperimentSpec
from keel.usecase import by_model

EPS = 1e-15
_BEFORE_SEGMENTS = [
    "experiment_id", "day", "ts", "request_id", "unit_id", "variant", "routed_version", "model_version", "status",
    "score", "latency_ms", "entity_key",
]  # fmt: skip
_AFTER_SEGMENTS = [
    "hour", "hour_band", "late", "log_loss", "offer_accepted", "pre_accepted", "offers", "revenue", "rolled_back",
]  # fmt: skip


def wide_columns(segments: tuple[str, ...]) -> list[str]:
    """The wide table's columns: the exposure, the use case's segment columns (read from the entity key), the
    outcome and the simulated business outcomes."""
    return [*_BEFORE_SEGMENTS, *segments, *_AFTER_SEGMENTS]


def key_segments(model: str) -> tuple[str, ...]:
    """The segments of ``model``'s use case that its entity key carries (the lake reads them from the key)."""
    uc = by_model(model)
    key = uc.features.entity.key
    return tuple(c for c in uc.segments if key is not None and c in key.columns)


def window(meta: dict[str, Any]) -> tuple[float, float]:
    """The experiment's analysis window: from its start to its pause, stop or rollback (a paused experiment routes
    everyone to the control, which is not the randomized comparison)."""
    end = min((meta.get(k) for k in ("paused_at", "ended_at") if meta.get(k)), default=math.inf)
    return float(meta.get("started_at") or 0.0), float(end)


def wide_rows(
    exposures: pl.DataFrame,
    spec: ExperimentSpec,
    meta: dict[str, Any],
    *,
    labels: dict[str, int] | None = None,
    rolled_back_days: set[str] = frozenset(),
) -> pl.DataFrame:
    start, end = window(meta)
    versions = [spec.control_version, spec.treatment_version]
    if "experiment_id" not in exposures.columns:
        exposures = exposures.with_columns(pl.lit(None, pl.String).alias("experiment_id"))
    named = exposures["experiment_id"].cast(pl.String)
    mine = named == spec.id
    if meta.get("traffic") == "header":  # only the requests that named it
        own = mine.fill_null(False)
    else:  # the model's split: its arms' requests, but none that named another experiment
        own = exposures["routed_version"].is_in(versions) & (named.is_null() | mine)
    f = exposures.filter(own & (pl.col("ts") >= start) & (pl.col("ts") < end))
    entity_key = by_model(spec.model).features.entity.key  # the served use case's (keel/entity_key.py)
    segments = key_segments(spec.model)
    key = pl.col("entity_key")
    f = f.with_columns(
        pl.lit(spec.id).alias("experiment_id"),
        pl.from_epoch(pl.col("ts"), time_unit="s").dt.strftime("%Y-%m-%d").alias("day"),
        pl.coalesce("unit_id", "request_id").alias("unit_id"),
        pl.when(pl.col("routed_version") == spec.treatment_version)
        .then(pl.lit(spec.treatment_label))
        .otherwise(pl.lit(spec.control_label))
        .alias("variant"),
        *[entity_key.part(key, c).alias(c) for c in segments],
        entity_key.hour(key).alias("hour"),
        key.replace_strict(labels or {}, default=None, return_dtype=pl.Int8).alias("late"),
    ).with_columns(hour_band(pl.col("hour")).alias("hour_band"))
    p = pl.col("score").clip(EPS, 1 - EPS)
    y = pl.col("late").cast(pl.Float64)
    f = f.with_columns(
        pl.when(pl.col("score").is_not_null() & pl.col("late").is_not_null())
        .then(-(y * p.log() + (1 - y) * (1 - p).log()))
        .alias("log_loss"),
        pl.col("day").is_in(sorted(rolled_back_days)).alias("rolled_back"),
    )
    sim = spec.simulation
    if sim:
        inside = None
        if sim["planted"]:
            inside = pl.lit(True)
            for col, value in sim["planted"].items():
                inside = inside & (pl.col(col) == value)
        f = f.with_columns(
            outcome_exprs(
                treated=pl.col("variant") == spec.treatment_label,
                late=pl.col("late").fill_null(0),
                seed=sim["seed"],
                base_rate=sim["base_rate"],
                lift=sim["lift"],
                inside=inside,
                planted_lift=sim["planted_lift"],
            )  # fmt: skip
        ).with_columns((pl.col("offer_accepted") * pl.col("offers") * 100.0).alias("revenue"))
    else:
        f = f.with_columns(
            pl.lit(None, pl.Int8).alias("offer_accepted"), pl.lit(None, pl.Float64).alias("pre_accepted"),
            pl.lit(None, pl.Int64).alias("offers"), pl.lit(None, pl.Float64).alias("revenue"),
        )  # fmt: skip
    return f.select(wide_columns(segments))
