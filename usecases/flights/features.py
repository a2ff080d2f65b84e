"""The flight-delay features, declared once; keel computes them offline (the training table) and online (the
gateway's lookups) from this declaration (keel/features/spec.py says what each part means).

- **calendar** (request): month, weekday, weekend and scheduled hour of the flight, its route distance;
- **weather** (lookup): the hourly observation at the origin at the scheduled hour (UTC ``time_hour``);
- **plane** (lookup): age and seats of the aircraft, keyed by ``tailnum``;
- **history**: smoothed share of flights arriving more than 15 minutes late, per carrier, route and origin × hour,
  from flights on *earlier days only* (their outcomes were known before the flight was scheduled).
"""

from __future__ import annotations

from datetime import date

import polars as pl

from keel.entity_key import EntityKey
from keel.features.spec import Entity, Feature, FeatureSet, History, Key, Label, Lookup, RequestFeatures

LATE_MINUTES = 15
PRIOR_RATE = 0.2  # smoothing prior for delay rates: the long-run share of late arrivals at NYC airports
PRIOR_WEIGHT = 20.0  # pseudo-flights of the prior: a group with few flights stays near it

FLIGHT = Entity(
    name="flight",
    source="validated_flights",
    id_column="flight_id",
    id_parts=("sched_date", "carrier", "flight", "origin", "sched_dep_time"),  # unique per the flights contract
    date="sched_date",
    date_parts=("year", "month", "day"),
    request_columns=("carrier", "origin", "dest", "tailnum", "sched_date", "hour", "time_hour", "distance"),
    carried=("carrier", "origin", "dest", "tailnum", "sched_date", "hour", "time_hour"),
    key=EntityKey(("carrier", "flight", "origin"), time="time_hour"),  # e.g. UA-1545-EWR-2013-01-01T10:00:00Z
)


def calendar(col, ops):
    """Features computed from the flight being scored."""
    weekday = ops.weekday(col("sched_date"))
    return {
        "month": ops.as_int(ops.month(col("sched_date"))),
        "day_of_week": ops.as_int(weekday),
        "sched_hour": ops.as_int(col("hour")),
        "is_weekend": ops.as_int(weekday >= 6),
        "distance": ops.as_float(col("distance")),
    }


def plane(col, ops):
    """From the plane's year built and seats: age at the flight's year."""
    return {"plane_age": ops.year(col("sched_date")) - col("plane_year"), "seats": col("seats")}


WEATHER_COLUMNS = ("temp", "wind_speed", "precip", "visib", "humid")
LATE = pl.col("arr_delay") > LATE_MINUTES  # null while the flight has not arrived: not counted

FLIGHT_FEATURES = FeatureSet(
    entity=FLIGHT,
    features=(
        Feature("month", "int", 1, 12, 6, "month of the scheduled departure"),
        Feature("day_of_week", "int", 1, 7, 4, "ISO day of week, 1 = Monday"),
        Feature("sched_hour", "int", 0, 23, 13, "scheduled departure hour, local"),
        Feature("is_weekend", "int", 0, 1, 0, "1 on Saturday and Sunday"),
        Feature("distance", "float", 0, 5000, 1000, "route distance, miles"),
        Feature("temp", "float", -40, 130, 55, "temperature at the origin, °F"),
        Feature("wind_speed", "float", 0, 250, 10, "wind speed at the origin, mph"),
        Feature("precip", "float", 0, 10, 0, "precipitation in the hour, inches"),
        Feature("visib", "float", 0, 10, 10, "visibility, miles"),
        Feature("humid", "float", 0, 100, 60, "relative humidity, %"),
        Feature("plane_age", "float", 0, 80, 12, "years since the aircraft was built"),
        Feature("seats", "float", 1, 600, 150, "seats on the aircraft"),
        Feature("carrier_delay_rate", "float", 0, 1, PRIOR_RATE, "carrier's late share, earlier days"),
        Feature("route_delay_rate", "float", 0, 1, PRIOR_RATE, "origin→dest late share, earlier days"),
        Feature("origin_hour_delay_rate", "float", 0, 1, PRIOR_RATE, "origin × hour late share, earlier days"),
    ),
    label=Label(
        "label_late15",
        (pl.col("arr_delay") > LATE_MINUTES).cast(pl.Int8),
        task="binary",
        known_after="the flight arrives (arr_delay in the day's delivery)",
        classes=("on time", "late"),
        description="1 when the flight arrived more than 15 minutes late",
    ),
    request=(RequestFeatures("calendar", calendar),),
    lookups=(
        Lookup(
            "weather",
            source="validated_weather",
            keys=(Key("origin"), Key("time_hour", kind="utc_hour")),
            fields={c: pl.col(c).cast(pl.Float64) for c in WEATHER_COLUMNS},
        ),
        Lookup(
            "plane",
            source="raw_planes",  # raw planes are text
            keys=(Key("tailnum"),),
            fields={
                "plane_year": pl.col("year").cast(pl.Float64, strict=False),
                "seats": pl.col("seats").cast(pl.Float64, strict=False),
            },
            compute=plane,
        ),
    ),
    histories=(
        History("carrier_delay_rate", ("carrier",), LATE, PRIOR_RATE, PRIOR_WEIGHT),
        History("route_delay_rate", ("origin", "dest"), LATE, PRIOR_RATE, PRIOR_WEIGHT),
        History("origin_hour_delay_rate", ("origin", "hour"), LATE, PRIOR_RATE, PRIOR_WEIGHT),
    ),
)

# -- the tables by the names the flights pipeline uses ---------------------------------------------------------

FEATURES = FLIGHT_FEATURES.features
FEATURE_NAMES = FLIGHT_FEATURES.names
BY_NAME = FLIGHT_FEATURES.by_name
LABEL = FLIGHT_FEATURES.label.column
REQUEST_COLUMNS = list(FLIGHT_FEATURES.entity.request_columns)
COLUMN_SOURCES = FLIGHT_FEATURES.column_sources()


def lookups(weather: pl.DataFrame, planes: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """The lookup tables by their declared sources."""
    return {"validated_weather": weather, "raw_planes": planes}


def offline_features(
    flights: pl.DataFrame,
    weather: pl.DataFrame,
    planes: pl.DataFrame,
    history: pl.DataFrame,
    *,
    as_of: date | None = None,
) -> pl.DataFrame:
    """The feature table of ``flights`` (keel.features.offline.offline_features on this use case's tables)."""
    from keel.features.offline import offline_features as table

    return table(FLIGHT_FEATURES, flights, lookups(weather, planes), history, as_of=as_of)


def build_views(
    weather: pl.DataFrame, planes: pl.DataFrame, history: pl.DataFrame, *, as_of: date
) -> dict[str, pl.DataFrame]:
    """An online-store snapshot (keel.features.online.build_views on this use case's tables)."""
    from keel.features.online import build_views as views

    return views(FLIGHT_FEATURES, lookups(weather, planes), history, as_of=as_of)
