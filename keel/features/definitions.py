"""The flight-delay feature set, declared once.

Every feature has a name, a type, a declared range (feature health checks values against it) and a reference
default (what a frozen feature serves when it has no last good value). They come in four groups, each with one
definition that both paths use:

- **request**: computed from the flight being scored (calendar, distance) — ``request_features``;
- **weather**: the hourly observation at the origin at the scheduled hour (UTC ``time_hour``) — keyed by
  ``(origin, time_hour)``;
- **plane**: age and seats of the aircraft — keyed by ``tailnum``;
- **history**: smoothed share of flights arriving more than 15 minutes late, per carrier, route and origin × hour,
  from flights on *earlier days only* (their outcomes were known before the flight was scheduled) — keyed by the
  group's columns, as of a day.

The computations are written once against a handful of primitives (month, weekday, year, casts, fill-null) that
have a polars implementation (``PolarsOps``, the offline path) and a numpy one (``NumpyOps``, the online path, where
a per-call polars frame would cost more than the whole lookup).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

LATE_MINUTES = 15
PRIOR_RATE = 0.2  # smoothing prior for delay rates: the long-run share of late arrivals at NYC airports
PRIOR_WEIGHT = 20.0  # pseudo-flights of the prior: a group with few flights stays near it


@dataclass(frozen=True)
class Feature:
    name: str
    group: str  # request | weather | plane | history
    dtype: type[pl.DataType]
    lo: float
    hi: float
    default: float
    description: str


FEATURES: tuple[Feature, ...] = (
    Feature("month", "request", pl.Int32, 1, 12, 6, "month of the scheduled departure"),
    Feature("day_of_week", "request", pl.Int32, 1, 7, 4, "ISO day of week, 1 = Monday"),
    Feature("sched_hour", "request", pl.Int32, 0, 23, 13, "scheduled departure hour, local"),
    Feature("is_weekend", "request", pl.Int32, 0, 1, 0, "1 on Saturday and Sunday"),
    Feature("distance", "request", pl.Float64, 0, 5000, 1000, "route distance, miles"),
    Feature("temp", "weather", pl.Float64, -40, 130, 55, "temperature at the origin, °F"),
    Feature("wind_speed", "weather", pl.Float64, 0, 250, 10, "wind speed at the origin, mph"),
    Feature("precip", "weather", pl.Float64, 0, 10, 0, "precipitation in the hour, inches"),
    Feature("visib", "weather", pl.Float64, 0, 10, 10, "visibility, miles"),
    Feature("humid", "weather", pl.Float64, 0, 100, 60, "relative humidity, %"),
    Feature("plane_age", "plane", pl.Float64, 0, 80, 12, "years since the aircraft was built"),
    Feature("seats", "plane", pl.Float64, 1, 600, 150, "seats on the aircraft"),
    Feature("carrier_delay_rate", "history", pl.Float64, 0, 1, PRIOR_RATE, "carrier's late share, earlier days"),
    Feature("route_delay_rate", "history", pl.Float64, 0, 1, PRIOR_RATE, "origin→dest late share, earlier days"),
    Feature(
        "origin_hour_delay_rate", "history", pl.Float64, 0, 1, PRIOR_RATE, "origin × hour late share, earlier days"
    ),
)
FEATURE_NAMES = tuple(f.name for f in FEATURES)
BY_NAME = {f.name: f for f in FEATURES}

WEATHER_COLUMNS = tuple(f.name for f in FEATURES if f.group == "weather")


# Where each output column of the feature table comes from: (input dataset, column). The asset layer publishes this
# as Dagster column lineage, and ``keel lineage impact <column>`` follows it. Join keys count as sources: a wrong
# tailnum changes plane_age as surely as a wrong year built.
_DATE = (("validated_flights", "year"), ("validated_flights", "month"), ("validated_flights", "day"))
_WEATHER_KEYS = (
    ("validated_flights", "origin"),
    ("validated_flights", "time_hour"),
    ("validated_weather", "origin"),
    ("validated_weather", "time_hour"),
)
_PLANE_KEYS = (("validated_flights", "tailnum"), ("raw_planes", "tailnum"))
_OUTCOME = (("validated_flights", "arr_delay"), *_DATE)
COLUMN_SOURCES: dict[str, tuple[tuple[str, str], ...]] = {
    "flight_id": (
        *_DATE,
        ("validated_flights", "carrier"),
        ("validated_flights", "flight"),
        ("validated_flights", "origin"),
        ("validated_flights", "sched_dep_time"),
    ),
    "carrier": (("validated_flights", "carrier"),),
    "origin": (("validated_flights", "origin"),),
    "dest": (("validated_flights", "dest"),),
    "tailnum": (("validated_flights", "tailnum"),),
    "sched_date": _DATE,
    "hour": (("validated_flights", "hour"),),
    "time_hour": (("validated_flights", "time_hour"),),
    "month": _DATE,
    "day_of_week": _DATE,
    "sched_hour": (("validated_flights", "hour"),),
    "is_weekend": _DATE,
    "distance": (("validated_flights", "distance"),),
    **{name: (("validated_weather", name), *_WEATHER_KEYS) for name in WEATHER_COLUMNS},
    "plane_age": (("raw_planes", "year"), *_PLANE_KEYS, ("validated_flights", "year")),
    "seats": (("raw_planes", "seats"), *_PLANE_KEYS),
    "carrier_delay_rate": (*_OUTCOME, ("validated_flights", "carrier")),
    "route_delay_rate": (*_OUTCOME, ("validated_flights", "origin"), ("validated_flights", "dest")),
    "origin_hour_delay_rate": (*_OUTCOME, ("validated_flights", "origin"), ("validated_flights", "hour")),
    "label_late15": (("validated_flights", "arr_delay"),),
}


@dataclass(frozen=True)
class HistoryView:
    """A delay rate per group of flights, from earlier days only."""

    feature: str
    keys: tuple[str, ...]


HISTORY_VIEWS = (
    HistoryView("carrier_delay_rate", ("carrier",)),
    HistoryView("route_delay_rate", ("origin", "dest")),
    HistoryView("origin_hour_delay_rate", ("origin", "hour")),
)


def flight_id_expr() -> pl.Expr:
    """The entity key of a flight: date, carrier, number, origin and scheduled time (unique per the contract)."""
    return pl.concat_str(
        [
            pl.col("sched_date").cast(pl.String),
            pl.col("carrier"),
            pl.col("flight").cast(pl.String),
            pl.col("origin"),
            pl.col("sched_dep_time").cast(pl.String),
        ],
        separator="-",
    )


def entity_frame(flights: pl.DataFrame) -> pl.DataFrame:
    """Validated flights → the entity rows both paths start from (what is known when the flight is scheduled)."""
    return flights.with_columns(
        pl.date(pl.col("year"), pl.col("month"), pl.col("day")).alias("sched_date")
    ).with_columns(flight_id_expr().alias("flight_id"))


class PolarsOps:
    """The primitives definitions use, on polars expressions (the offline path)."""

    @staticmethod
    def month(d: pl.Expr) -> pl.Expr:
        return d.dt.month()

    @staticmethod
    def weekday(d: pl.Expr) -> pl.Expr:
        return d.dt.weekday()

    @staticmethod
    def year(d: pl.Expr) -> pl.Expr:
        return d.dt.year().cast(pl.Float64)

    @staticmethod
    def as_int(x: pl.Expr) -> pl.Expr:
        return x.cast(pl.Int32)

    @staticmethod
    def as_float(x: pl.Expr) -> pl.Expr:
        return x.cast(pl.Float64)

    @staticmethod
    def fill0(x: pl.Expr) -> pl.Expr:
        return x.fill_null(0)


class NumpyOps:
    """The same primitives on numpy arrays (the online path): dates are datetime64[D], numbers float64 with NaN for
    null. tests/features/test_parity.py holds the two to the same answers."""

    @staticmethod
    def month(d: np.ndarray) -> np.ndarray:
        return (d.astype("datetime64[M]").astype(np.int64) % 12 + 1).astype(np.float64)

    @staticmethod
    def weekday(d: np.ndarray) -> np.ndarray:
        return ((d.astype(np.int64) + 3) % 7 + 1).astype(np.float64)  # 1970-01-01 was a Thursday (ISO 4)

    @staticmethod
    def year(d: np.ndarray) -> np.ndarray:
        return (d.astype("datetime64[Y]").astype(np.int64) + 1970).astype(np.float64)

    @staticmethod
    def as_int(x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float64)  # integer-valued; null stays NaN until the answer is built

    @staticmethod
    def as_float(x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float64)

    @staticmethod
    def fill0(x: np.ndarray) -> np.ndarray:
        return np.where(x == x, x, 0.0)  # NaN is the only value not equal to itself


# -- the definitions, written once against the primitives above ------------------------------------------------


def request_features(col: Callable[[str], Any], ops: Any) -> dict[str, Any]:
    """Features computed from the flight being scored."""
    weekday = ops.weekday(col("sched_date"))
    return {
        "month": ops.as_int(ops.month(col("sched_date"))),
        "day_of_week": ops.as_int(weekday),
        "sched_hour": ops.as_int(col("hour")),
        "is_weekend": ops.as_int(weekday >= 6),
        "distance": ops.as_float(col("distance")),
    }


def plane_features(col: Callable[[str], Any], ops: Any) -> dict[str, Any]:
    """From the plane's year built and seats: age at the flight's year."""
    return {"plane_age": ops.year(col("sched_date")) - col("plane_year"), "seats": col("seats")}


def smoothed_rate(late: Any, n: Any, ops: Any = PolarsOps) -> Any:
    """Late share of a group, pulled towards PRIOR_RATE by PRIOR_WEIGHT pseudo-flights."""
    return (ops.fill0(late) + PRIOR_RATE * PRIOR_WEIGHT) / (ops.fill0(n) + PRIOR_WEIGHT)


def request_expressions() -> list[pl.Expr]:
    return [e.alias(name) for name, e in request_features(pl.col, PolarsOps).items()]


def plane_table(planes_raw: pl.DataFrame) -> pl.DataFrame:
    """tailnum → year built and seats (raw planes are text)."""
    return planes_raw.select(
        pl.col("tailnum"),
        pl.col("year").cast(pl.Float64, strict=False).alias("plane_year"),
        pl.col("seats").cast(pl.Float64, strict=False).alias("seats"),
    ).unique("tailnum", keep="first")


def plane_features_expr() -> list[pl.Expr]:
    return [e.alias(name) for name, e in plane_features(pl.col, PolarsOps).items()]


def daily_outcomes(history: pl.DataFrame, view: HistoryView) -> pl.DataFrame:
    """Per group and day: flights with a known outcome and how many of them arrived late."""
    return (
        history.filter(pl.col("arr_delay").is_not_null())
        .group_by([*view.keys, "sched_date"])
        .agg(pl.len().alias("n"), (pl.col("arr_delay") > LATE_MINUTES).sum().alias("late"))
        .sort("sched_date")
        .with_columns(
            pl.col("n").cum_sum().over(list(view.keys)).alias("n_cum"),
            pl.col("late").cum_sum().over(list(view.keys)).alias("late_cum"),
        )
    )
