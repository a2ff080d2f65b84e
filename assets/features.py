"""Flight features: the offline table (training source) and the online store, with skew and health checks."""

import hashlib
import random
from datetime import date, timedelta
from pathlib import Path

import dagster as dg
import polars as pl

import keel.features.definitions as definitions_module
import keel.features.offline as offline_module
from assets.partitions import monthly_2013
from assets.raw import RAW_PLANES
from assets.validated import VALIDATED_FLIGHTS, VALIDATED_WEATHER
from keel.factories.markdown import frame_to_markdown
from keel.features.checks import feature_health, online_distribution, training_serving_skew
from keel.features.definitions import BY_NAME, COLUMN_SOURCES, FEATURE_NAMES, FEATURES
from keel.features.offline import LABEL, offline_features
from keel.features.online import REQUEST_COLUMNS, build_views, get_online_features
from resources.online_store import OnlineStoreResource

FEATURES_GROUP = "features"
FLIGHT_FEATURES = dg.AssetKey("flight_features")
ONLINE_FEATURES = dg.AssetKey("online_features")
SKEW_CHECK = "training_serving_skew"
DISTRIBUTION_CHECK = "online_distribution"
HEALTH_CHECK = "feature_health"
SKEW_SAMPLE = 300
PSI_WARN = 0.25
HEALTH_MAX_AGE = timedelta(hours=36)

# The feature code's hash is the code_version: editing a definition marks the features (and what they feed) stale.
FEATURE_CODE_VERSION = hashlib.sha256(
    b"".join(Path(m.__file__).read_bytes() for m in (definitions_module, offline_module))
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


def _month_of(history: pl.DataFrame, partition_key: str) -> pl.DataFrame:
    year, month = (int(x) for x in partition_key.split("-"))
    return history.filter((pl.col("year") == year) & (pl.col("month") == month))


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
                    BY_NAME[column].dtype.__name__ if column in BY_NAME else KEY_COLUMN_TYPES[column],
                    description=BY_NAME[column].description if column in BY_NAME else KEY_COLUMN_NOTES.get(column),
                )
                for column in COLUMN_SOURCES
            ]
        ),
        "dagster/column_lineage": dg.TableColumnLineage(
            deps_by_column={
                column: [dg.TableColumnDep(asset_key=dg.AssetKey(a), column_name=c) for a, c in sources]
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
    table = offline_features(flights, weather, planes, history)
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
            "late_share": dg.MetadataValue.float(float(table[LABEL].drop_nulls().mean() or 0.0)),
            "features": dg.MetadataValue.md(
                frame_to_markdown(
                    summary.join(nulls, on="feature").with_columns(pl.col("mean").round(4)), max_rows=50
                )
            ),
        },
    )


@dg.asset(
    key=ONLINE_FEATURES,
    partitions_def=monthly_2013,
    group_name=FEATURES_GROUP,
    kinds={"sqlite"},
    code_version=FEATURE_CODE_VERSION,
    ins={
        "history": dg.AssetIn(VALIDATED_FLIGHTS, partition_mapping=HISTORY),
        "weather": dg.AssetIn(VALIDATED_WEATHER),
        "planes": dg.AssetIn(RAW_PLANES),
        "offline": dg.AssetIn(FLIGHT_FEATURES),
    },
    check_specs=[
        dg.AssetCheckSpec(
            SKEW_CHECK,
            asset=ONLINE_FEATURES,
            description="a sample of flights through the offline and the online path, compared field by field",
        ),
        dg.AssetCheckSpec(
            DISTRIBUTION_CHECK,
            asset=ONLINE_FEATURES,
            description=f"PSI of sampled online values against the offline partition ≤ {PSI_WARN}",
        ),
        dg.AssetCheckSpec(
            HEALTH_CHECK,
            asset=ONLINE_FEATURES,
            description="store reachable, written recently, hot keys non-null and in their declared ranges",
        ),
    ],
    description="The online store (SQLite, WAL) as of the end of the month: delay-rate counters per carrier, route "
    "and origin × hour, hourly weather, planes. get_online_features reads it with the same definitions.",
)
def online_features(
    context: dg.AssetExecutionContext,
    online_store: OnlineStoreResource,
    history: pl.DataFrame,
    weather: pl.DataFrame,
    planes: pl.DataFrame,
    offline: pl.DataFrame,
):
    as_of = _month_end(context.partition_key)
    with online_store.open() as store:
        views = build_views(weather, planes, history, as_of=as_of)
        store.write_snapshot(views, as_of=as_of, partition=context.partition_key)
        yield dg.MaterializeResult(
            asset_key=ONLINE_FEATURES,
            metadata={
                "as_of": as_of.isoformat(),
                "path": dg.MetadataValue.path(str(online_store.store_path())),
                "rows_per_view": dg.MetadataValue.json({k: v.height for k, v in views.items()}),
            },
        )
        # Skew: flights of the month's last day, as the store sees them (as of the month's end), both paths.
        month = _month_of(history, context.partition_key)
        last_day = month.filter(pl.col("day") == month["day"].max())
        rng = random.Random(f"skew:{context.partition_key}")
        sample = last_day[sorted(rng.sample(range(last_day.height), min(SKEW_SAMPLE, last_day.height)))]
        expected = offline_features(sample, weather, planes, history, as_of=as_of)
        served = get_online_features(store, expected.select(REQUEST_COLUMNS).to_dicts())
        skew = training_serving_skew(expected.select(FEATURE_NAMES), served, expected["flight_id"].to_list())
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
        # Distribution: online answers for flights of the month's last week against the offline rows of that week
        # (the store is as of the month's end; earlier weeks had less history behind their rates).
        last_week = offline.filter(pl.col("sched_date") > pl.col("sched_date").max() - timedelta(days=7))
        served_sample = get_online_features(
            store, last_week.sample(min(1000, last_week.height), seed=7).select(REQUEST_COLUMNS).to_dicts()
        )
        psi = online_distribution(last_week, served_sample)
        worst = {k: v for k, v in psi.items() if v is not None and v > PSI_WARN}
        yield dg.AssetCheckResult(
            asset_key=ONLINE_FEATURES,
            check_name=DISTRIBUTION_CHECK,
            passed=not worst,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={
                "psi": dg.MetadataValue.json({k: (round(v, 4) if v is not None else None) for k, v in psi.items()}),
                "over_threshold": dg.MetadataValue.json(worst),
            },
        )
        # Hot keys: the sampled flights whose every feature has a value offline; the store must serve them too.
        hot = expected.drop_nulls(FEATURE_NAMES).head(100).select(REQUEST_COLUMNS).to_dicts()
        health = feature_health(store, hot, max_age=HEALTH_MAX_AGE)
        yield dg.AssetCheckResult(
            asset_key=ONLINE_FEATURES,
            check_name=HEALTH_CHECK,
            passed=health.healthy,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={
                "reachable": health.reachable,
                "fresh": health.fresh,
                "sampled": health.sampled,
                "problems": dg.MetadataValue.json(health.problems),
            },
        )


feature_assets = [flight_features, online_features]
assert {f.name for f in FEATURES} == set(FEATURE_NAMES)
