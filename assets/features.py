"""Flight features: the offline table (training source) and the online store, with skew and health checks."""

import hashlib
import random
from datetime import date, timedelta
from pathlib import Path

import dagster as dg
import polars as pl

import keel.features.offline as offline_module
import keel.features.spec as spec_module
import usecases.flights.features as definitions_module
from assets.partitions import MONTHLY_CADENCE, monthly_2013
from assets.raw import RAW_PLANES
from assets.usecase import group, key
from assets.validated import VALIDATED_FLIGHTS, VALIDATED_WEATHER
from keel.factories.checks import partitioned_check
from keel.features.checks import FeatureStability, feature_health, online_distribution, training_serving_skew
from keel.features.offline import offline_features
from keel.features.online import build_views, get_online_features
from resources.online_store import OnlineStoreResource
from usecases.flights.features import FLIGHT_FEATURES as FEATURE_SET

FEATURES_GROUP = group("features")
FLIGHT_FEATURES = key("flight_features")
ONLINE_FEATURES = key("online_features")
SKEW_CHECK = "training_serving_skew"
DISTRIBUTION_CHECK = "online_distribution"
HEALTH_CHECK = "feature_health"
SKEW_SAMPLE = 300
DISTRIBUTION_SAMPLE = 1000
PSI_WARN = 0.25
HEALTH_MAX_AGE = timedelta(hours=36)
FEATURE_NAMES = FEATURE_SET.names
LABEL = FEATURE_SET.label.column
REQUEST_COLUMNS = list(FEATURE_SET.entity.request_columns)
BY_NAME = FEATURE_SET.by_name
COLUMN_SOURCES = FEATURE_SET.column_sources()

# The feature code's hash is the code_version: editing a definition marks the features (and what they feed) stale.
FEATURE_CODE_VERSION = hashlib.sha256(
    b"".join(Path(m.__file__).read_bytes() for m in (definitions_module, spec_module, offline_module))
).hexdigest()[:16]

# The feature table's columns besides the features themselves: keys and the label.
KEY_COLUMN_TYPES = {
    "flight_id": "String",
    "carrier": "String",
    "origin": "String",
    "dest": "String",
    "tailnum": "String",
    "sched_date": "Date",
    "hour": "Int32",
    "time_hour": "Datetime",
    LABEL: "Int8",
}
KEY_COLUMN_NOTES = {
    "flight_id": "entity key of a flight",
    LABEL: "1 when the flight arrived more than 15 minutes late",
}

# Delay rates need every earlier month: map each partition to itself and all months before it.
HISTORY = dg.TimeWindowPartitionMapping(start_offset=-12, end_offset=0, allow_nonexistent_upstream_partitions=True)


def stability_table(stability: list[FeatureStability]) -> dg.TableMetadataValue:
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord(
                {
                    "feature": s.feature,
                    "psi": None if s.psi is None else round(s.psi, 4),
                    "measure": s.measure,
                    "distinct_values": s.distinct,
                }
            )
            for s in stability
        ],
        schema=dg.TableSchema(
            columns=[
                dg.TableColumn("feature", "string"),
                dg.TableColumn("psi", "float", description=f"population stability index; warns above {PSI_WARN}"),
                dg.TableColumn("measure", "string", description="values: one bin per value; bins: 20 equal-width"),
                dg.TableColumn("distinct_values", "int", description="distinct offline values in the sample"),
            ]
        ),
    )


def _month_of(history: pl.DataFrame, partition_key: str) -> pl.DataFrame:
    year, month = (int(x) for x in partition_key.split("-"))
    return history.filter((pl.col("year") == year) & (pl.col("month") == month))


def _lookups(weather: pl.DataFrame, planes: pl.DataFrame) -> dict[str, pl.DataFrame]:
    return {"validated_weather": weather, "raw_planes": planes}


def _month_end(partition_key: str) -> date:
    year, month = (int(x) for x in partition_key.split("-"))
    return date(year + (month == 12), month % 12 + 1, 1)


@dg.asset(
    key=FLIGHT_FEATURES,
    partitions_def=monthly_2013,
    group_name=FEATURES_GROUP,
    kinds={"polars", "parquet"},
    code_version=FEATURE_CODE_VERSION,
    ins={
        "history": dg.AssetIn(VALIDATED_FLIGHTS, partition_mapping=HISTORY),
        "weather": dg.AssetIn(VALIDATED_WEATHER),
        "planes": dg.AssetIn(RAW_PLANES),
    },
    metadata={
        "dagster/column_schema": dg.TableSchema(
            columns=[
                dg.TableColumn(
                    column,
                    BY_NAME[column].polars_type.__name__ if column in BY_NAME else KEY_COLUMN_TYPES[column],
                    description=BY_NAME[column].description if column in BY_NAME else KEY_COLUMN_NOTES.get(column),
                )
                for column in COLUMN_SOURCES
            ]
        ),
        "dagster/column_lineage": dg.TableColumnLineage(
            deps_by_column={
                column: [dg.TableColumnDep(asset_key=key(a), column_name=c) for a, c in sources]
                for column, sources in COLUMN_SOURCES.items()
            }
        ),
    },
    description="One row per flight of the month with every feature, point-in-time correct (weather of the "
    "scheduled hour, delay rates from earlier days only) and the label arr_delay > 15 min: the training source.",
)
def flight_features(
    context: dg.AssetExecutionContext, history: pl.DataFrame, weather: pl.DataFrame, planes: pl.DataFrame
) -> dg.Output[pl.DataFrame]:
    flights = _month_of(history, context.partition_key)
    table = offline_features(FEATURE_SET, flights, _lookups(weather, planes), history)
    nulls = table.select([pl.col(n).null_count().alias(n) for n in FEATURE_NAMES]).transpose(
        include_header=True, header_name="feature", column_names=["nulls"]
    )
    summary = table.select([pl.col(n).cast(pl.Float64).mean().alias(n) for n in FEATURE_NAMES]).transpose(
        include_header=True, header_name="feature", column_names=["mean"]
    )
    return dg.Output(
        table,
        metadata={
            "dagster/row_count": table.height,
            "late_share": dg.MetadataValue.float(round(float(table[LABEL].drop_nulls().mean() or 0.0), 4)),
            "features": dg.MetadataValue.table(
                records=[
                    dg.TableRecord({"feature": f, "mean": None if m is None else round(m, 4), "nulls": n})
                    for f, m, n in summary.join(nulls, on="feature").iter_rows()
                ],
                schema=dg.TableSchema(
                    columns=[
                        dg.TableColumn("feature", "string"),
                        dg.TableColumn("mean", "float"),
                        dg.TableColumn("nulls", "int"),
                    ]
                ),
            ),
        },
    )


@dg.asset(
    key=ONLINE_FEATURES,
    partitions_def=monthly_2013,
    freshness_policy=MONTHLY_CADENCE,
    group_name=FEATURES_GROUP,
    kinds={"sqlite"},
    code_version=FEATURE_CODE_VERSION,
    ins={
        "history": dg.AssetIn(VALIDATED_FLIGHTS, partition_mapping=HISTORY),
        "weather": dg.AssetIn(VALIDATED_WEATHER),
        "planes": dg.AssetIn(RAW_PLANES),
    },
    # Its checks compare the store with the offline path (the code that builds flight_features), recomputed as of
    # the store's snapshot; the dependency keeps them in order and in the lineage.
    deps=[FLIGHT_FEATURES],
    check_specs=[
        partitioned_check(
            SKEW_CHECK,
            asset=ONLINE_FEATURES,
            partitions_def=monthly_2013,
            description="a sample of flights through the offline and the online path, compared field by field",
        ),
        partitioned_check(
            DISTRIBUTION_CHECK,
            asset=ONLINE_FEATURES,
            partitions_def=monthly_2013,
            description=f"PSI ≤ {PSI_WARN} per feature between the store's answers and the offline path for the same "
            "1,000 flights of the month's last week, both as of the month's end (few-valued features value by value)",
        ),
        partitioned_check(
            HEALTH_CHECK,
            asset=ONLINE_FEATURES,
            partitions_def=monthly_2013,
            description="store reachable, written recently, hot keys non-null and in their declared ranges",
        ),
    ],
    description="The online store (SQLite, WAL; Redis when KEEL_ONLINE_STORE names one) as of the end of the month: delay-rate counters per carrier, route "
    "and origin × hour, hourly weather, planes. get_online_features reads it with the same definitions.",
)
def online_features(
    context: dg.AssetExecutionContext,
    online_store: OnlineStoreResource,
    history: pl.DataFrame,
    weather: pl.DataFrame,
    planes: pl.DataFrame,
):
    as_of = _month_end(context.partition_key)
    with online_store.open() as store:
        views = build_views(FEATURE_SET, _lookups(weather, planes), history, as_of=as_of)
        store.write_snapshot(views, as_of=as_of, partition=context.partition_key)
        yield dg.MaterializeResult(
            asset_key=ONLINE_FEATURES,
            metadata={
                "as_of": as_of.isoformat(),
                "store": online_store.shown(),
                "rows_per_view": dg.MetadataValue.json({k: v.height for k, v in views.items()}),
            },
        )
        # Skew: flights of the month's last day, as the store sees them (as of the month's end), both paths.
        month = _month_of(history, context.partition_key)
        last_day = month.filter(pl.col("day") == month["day"].max())
        rng = random.Random(f"skew:{context.partition_key}")
        sample = last_day[sorted(rng.sample(range(last_day.height), min(SKEW_SAMPLE, last_day.height)))]
        expected = offline_features(FEATURE_SET, sample, _lookups(weather, planes), history, as_of=as_of)
        served = get_online_features(store, expected.select(REQUEST_COLUMNS).to_dicts())
        skew = training_serving_skew(
            FEATURE_SET, expected.select(FEATURE_NAMES), served, expected["flight_id"].to_list()
        )
        yield dg.AssetCheckResult(
            asset_key=ONLINE_FEATURES,
            check_name=SKEW_CHECK,
            passed=skew.ok,
            severity=dg.AssetCheckSeverity.ERROR,
            metadata={
                "compared": skew.compared,
                "mismatching_fields": dg.MetadataValue.json(skew.mismatches),
                "examples": dg.MetadataValue.json(skew.examples),
            },
        )
        # Distribution: like with like — the offline path as of the store's snapshot (the month's end) for a sample
        # of the last week's flights, against the store's answers for the same flights.
        week = month.filter(pl.col("day") > pl.col("day").max() - 7)
        week = week.sample(min(DISTRIBUTION_SAMPLE, week.height), seed=7)
        offline_as_of = offline_features(FEATURE_SET, week, _lookups(weather, planes), history, as_of=as_of)
        served_week = get_online_features(store, offline_as_of.select(REQUEST_COLUMNS).to_dicts())
        stability = online_distribution(FEATURE_SET, offline_as_of, served_week)
        worst = [s.feature for s in stability if s.psi is not None and s.psi > PSI_WARN]
        yield dg.AssetCheckResult(
            asset_key=ONLINE_FEATURES,
            check_name=DISTRIBUTION_CHECK,
            passed=not worst,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={
                "compared": len(served_week),
                "max_psi": dg.MetadataValue.float(round(max((s.psi or 0.0) for s in stability), 4)),
                "over_threshold": ", ".join(worst) or "none",
                "psi": stability_table(stability),
            },
        )
        # Hot keys: last-week flights whose every feature has a value offline; the store must serve them too. (Not
        # the last day's: weather ends on 30 December, so none of 31 December's flights has every feature.)
        hot = offline_as_of.drop_nulls(FEATURE_NAMES).head(100).select(REQUEST_COLUMNS).to_dicts()
        health = feature_health(store, hot, max_age=HEALTH_MAX_AGE)
        yield dg.AssetCheckResult(
            asset_key=ONLINE_FEATURES,
            check_name=HEALTH_CHECK,
            passed=health.healthy,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={
                "reachable": health.reachable,
                "fresh": health.fresh,
                "sampled": health.sampled,  # hot keys read back; 0 would make the check vacuous
                "problems": "; ".join(health.problems) or "none",
            },
        )


feature_assets = [flight_features, online_features]
