"""The offline path: one row per flight, every feature point-in-time correct.

Nothing a flight's features use comes from after its scheduled departure: weather is the observation of the
scheduled hour (``time_hour`` is the scheduled departure truncated to the hour), plane data is static, and delay
rates count only flights of *earlier days* (an as-of join that excludes the flight's own day). ``as_of`` replaces
each flight's own date with one fixed day — the online store's point of view — for the skew check.
"""

from __future__ import annotations

from datetime import date

import polars as pl

from keel.features.definitions import (
    FEATURE_NAMES,
    HISTORY_VIEWS,
    WEATHER_COLUMNS,
    daily_outcomes,
    entity_frame,
    plane_features_expr,
    plane_table,
    request_expressions,
    smoothed_rate,
)

LABEL = "label_late15"


def history_rates(entities: pl.DataFrame, history: pl.DataFrame, as_of: date | None = None) -> pl.DataFrame:
    """Each entity row plus one delay-rate column per history view, from days strictly before its date (or as_of)."""
    out = entities.with_columns((pl.lit(as_of) if as_of else pl.col("sched_date")).cast(pl.Date).alias("_as_of"))
    for view in HISTORY_VIEWS:
        daily = (
            daily_outcomes(history, view)
            .select([*view.keys, "sched_date", "n_cum", "late_cum"])
            .rename({"sched_date": "_day"})
        )
        out = (
            out.sort("_as_of")
            .join_asof(
                daily.sort("_day"),
                left_on="_as_of",
                right_on="_day",
                by=list(view.keys),
                strategy="backward",
                allow_exact_matches=False,
                check_sortedness=False,
            )
            .with_columns(smoothed_rate(pl.col("late_cum"), pl.col("n_cum")).alias(view.feature))
            .drop("_day", "n_cum", "late_cum")
        )
    return out.drop("_as_of")


def offline_features(
    flights: pl.DataFrame,
    weather: pl.DataFrame,
    planes_raw: pl.DataFrame,
    history: pl.DataFrame,
    *,
    as_of: date | None = None,
) -> pl.DataFrame:
    """Features for ``flights`` (validated rows); ``history`` holds every validated flight the rates may use."""
    entities = entity_frame(flights)
    hist = entity_frame(history) if "sched_date" not in history.columns else history
    out = entities.with_columns(request_expressions())
    out = out.join(
        weather.select(["origin", "time_hour", *WEATHER_COLUMNS]).unique(["origin", "time_hour"], keep="first"),
        on=["origin", "time_hour"],
        how="left",
    )
    out = out.join(plane_table(planes_raw), on="tailnum", how="left").with_columns(plane_features_expr())
    out = history_rates(out, hist, as_of)
    label = (pl.col("arr_delay") > 15).cast(pl.Int8).alias(LABEL)
    return out.select(
        "flight_id", "carrier", "origin", "dest", "tailnum", "sched_date", "hour", "time_hour", *FEATURE_NAMES, label
    ).sort("flight_id")
