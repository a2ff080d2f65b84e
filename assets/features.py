"""A use case's features: the offline table (training source) and the online store, with skew and health checks —
both computed from its feature declarations (keel/features/spec.py) by the platform's offline and online paths."""

import hashlib
import random
from datetime import date, timedelta
from functools import cache
from pathlib import Path

import dagster as dg
import polars as pl

import keel.features.offline as offline_module
import keel.features.spec as spec_module
from assets.partitions import monthly_cadence
from assets.usecase import Wiring, wiring
from keel.contracts.spec import load_contract
from keel.factories.checks import partitioned_check
from keel.features.checks import FeatureStability, feature_health, online_distribution, training_serving_skew
from keel.features.offline import entity_frame, offline_features
from keel.features.online import build_views, get_online_features
from keel.features.spec import FeatureSet
from keel.usecase import UseCase
from resources import simulated
from resources.online_store import OnlineStoreResource

SKEW_CHECK = "training_serving_skew"
DISTRIBUTION_CHECK = "online_distribution"
HEALTH_CHECK = "feature_health"
SKEW_SAMPLE = 300
DISTRIBUTION_SAMPLE = 1000
PSI_WARN = 0.25
HEALTH_MAX_AGE = timedelta(hours=36)
CONTRACT_TYPES = {"int32": "Int32", "int64": "Int64", "float64": "Float64", "string": "String", "bool": "Boolean",
                  "date": "Date", "datetime": "Datetime"}  # fmt: skip

# Delay rates need every earlier month: map each partition to itself and all months before it.
HISTORY = dg.TimeWindowPartitionMapping(start_offset=-12, end_offset=0, allow_nonexistent_upstream_partitions=True)


def feature_code_version(uc: UseCase) -> str:
    """The hash of the feature code (the use case's feature module and the platform's): the code_version of its
    feature assets — editing a definition marks the features (and what they feed) stale."""
    modules = [spec_module, offline_module]
    fn = uc.features.request[0].compute if uc.features.request else None
    files = [Path(m.__file__) for m in modules]
    if fn is not None and getattr(fn, "__code__", None) is not None:
        files.insert(0, Path(fn.__code__.co_filename))
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:16]


def _source_of(uc: UseCase, asset: str):
    """The source behind a table a feature declaration names (``validated_weather``, ``raw_planes``)."""
    return uc.source(asset.split("_", 1)[1])


def column_types(uc: UseCase) -> dict[str, tuple[str, str | None]]:
    """(type, description) of each feature-table column: features from their declaration, entity columns from the
    contract of the entity's source, the id and the label from the entity and the label."""
    fs = uc.features
    contract_file = uc.contract_path(_source_of(uc, fs.entity.source).name)
    columns = {c.name: c for c in load_contract(contract_file).columns} if contract_file.is_file() else {}
    out: dict[str, tuple[str, str | None]] = {}
    for column in fs.table_columns:
        if column in fs.by_name:
            out[column] = (fs.by_name[column].polars_type.__name__, fs.by_name[column].description)
        elif column == fs.entity.id_column:
            out[column] = ("String", f"entity key of a {fs.entity.name}")
        elif column == fs.label.column:
            out[column] = ("Int8" if fs.label.task == "binary" else "Float64", fs.label.description or None)
        elif column == fs.entity.date:
            out[column] = ("Date", None)
        elif column in columns:
            out[column] = (CONTRACT_TYPES.get(columns[column].dtype, columns[column].dtype), None)
        else:
            out[column] = ("String", None)
    return out


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


def _dates(fs: FeatureSet, rows: pl.DataFrame) -> pl.Series:
    """Each source row's entity date (built from its parts when the entity declares them)."""
    return fs.entity.with_date(rows.head(0) if rows.height == 0 else rows)[fs.entity.date]


def _month_of(uc: UseCase, history: pl.DataFrame, partition_key: str) -> pl.DataFrame:
    """The rows of the entity's source partition ``partition_key``: by the source's own day columns (a hotel booking
    is partitioned by its arrival, though it is scored as of the day it was made), else by the entity date."""
    fs = uc.features
    name = fs.entity.source.removeprefix("validated_")
    if name in uc.source_names and uc.source(name).partitioned:
        y, m, _ = uc.source(name).day_columns
        year, month = (int(x) for x in partition_key.split("-"))
        return history.filter((pl.col(y).cast(pl.Int32) == year) & (pl.col(m).cast(pl.Int32) == month))
    return history.filter(_dates(fs, history).dt.strftime("%Y-%m") == partition_key)


def _requests(fs: FeatureSet, rows: pl.DataFrame, request_columns: list[str]) -> list[dict]:
    """What a caller sends for each source row, in the offline table's order (by id): the request columns."""
    return entity_frame(fs, rows).sort(fs.entity.id_column).select(request_columns).to_dicts()


def _month_end(partition_key: str) -> date:
    year, month = (int(x) for x in partition_key.split("-"))
    return date(year + (month == 12), month % 12 + 1, 1)


@cache
def build_feature_assets(uc: UseCase) -> list[dg.AssetsDefinition]:
    """``<use case>/<feature_table>`` (the offline table, one partition per month) and ``<use case>/online_features``
    (the online store as of each month's end, with its skew, distribution and health checks)."""
    w: Wiring = wiring(uc)
    fs = uc.features
    table_key, online_key = w.key(uc.feature_table), w.key("online_features")
    code_version = feature_code_version(uc)
    names, label, request_columns = list(fs.names), fs.label.column, list(fs.entity.request_columns)
    sources = fs.column_sources()
    types = column_types(uc)
    lookup_tables = sorted({v.source for v in fs.lookups})
    ins = {"history": dg.AssetIn(w.key(fs.entity.source), partition_mapping=HISTORY)} | {
        t: dg.AssetIn(w.key(t)) for t in lookup_tables
    }

    def lookups(tables: dict) -> dict[str, pl.DataFrame]:
        return {t: tables[t] for t in lookup_tables}

    @dg.asset(
        key=table_key,
        partitions_def=w.monthly,
        group_name=w.group("features"),
        kinds={"polars", "parquet"},
        code_version=code_version,
        ins=ins,
        metadata={
            "dagster/column_schema": dg.TableSchema(
                columns=[
                    dg.TableColumn(
                        column,
                        types[column][0],
                        description=types[column][1],
                    )
                    for column in sources
                ]
            ),
            "dagster/column_lineage": dg.TableColumnLineage(
                deps_by_column={
                    column: [dg.TableColumnDep(asset_key=w.key(a), column_name=c) for a, c in deps]
                    for column, deps in sources.items()
                }
            ),
        },
        description=f"One row per {fs.entity.name} of the month with every feature, point-in-time correct (lookups "
        f"as of the row's time, aggregates from earlier days only) and the label {label}"
        + (f" ({fs.label.description})" if fs.label.description else "")
        + ": the training source.",
    )
    def feature_table(
        context: dg.AssetExecutionContext, history: pl.DataFrame, **tables: pl.DataFrame
    ) -> dg.Output[pl.DataFrame]:
        rows = _month_of(uc, history, context.partition_key)
        table = offline_features(fs, rows, lookups(tables), history)
        nulls = table.select([pl.col(n).null_count().alias(n) for n in names]).transpose(
            include_header=True, header_name="feature", column_names=["nulls"]
        )
        summary = table.select([pl.col(n).cast(pl.Float64).mean().alias(n) for n in names]).transpose(
            include_header=True, header_name="feature", column_names=["mean"]
        )
        return dg.Output(
            table,
            metadata={
                "dagster/row_count": table.height,
                ("positive_share" if fs.label.task == "binary" else "label_mean"): dg.MetadataValue.float(
                    round(float(table[label].drop_nulls().mean() or 0.0), 4)
                ),
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
        key=online_key,
        partitions_def=w.monthly,
        freshness_policy=monthly_cadence(),
        group_name=w.group("features"),
        kinds={"sqlite"},
        code_version=code_version,
        ins=ins,
        # Its checks compare the store with the offline path (the code that builds the feature table), recomputed as of
        # the store's snapshot; the dependency keeps them in order and in the lineage.
        deps=[table_key],
        check_specs=[
            partitioned_check(
                SKEW_CHECK,
                asset=online_key,
                partitions_def=w.monthly,
                description=f"a sample of {fs.entity.name} rows through the offline and the online path, compared "
                "field by field",
            ),
            partitioned_check(
                DISTRIBUTION_CHECK,
                asset=online_key,
                partitions_def=w.monthly,
                description=f"PSI ≤ {PSI_WARN} per feature between the store's answers and the offline path for the same "
                f"1,000 {fs.entity.name} rows of the month's last week, both as of the month's end (few-valued "
                "features value by value)",
            ),
            partitioned_check(
                HEALTH_CHECK,
                asset=online_key,
                partitions_def=w.monthly,
                description="store reachable, written recently, hot keys non-null and in their declared ranges",
            ),
        ],
        description="The online store (SQLite, WAL; Redis when KEEL_ONLINE_STORE names one) as of the end of the "
        f"month: {', '.join(fs.view_fields)}. get_online_features reads it with the same definitions.",
    )
    def online_features(
        context: dg.AssetExecutionContext,
        online_store: OnlineStoreResource,
        history: pl.DataFrame,
        **tables: pl.DataFrame,
    ):
        as_of = _month_end(context.partition_key)
        with online_store.open(uc) as store:
            views = build_views(fs, lookups(tables), history, as_of=as_of)
            store.write_snapshot(views, as_of=as_of, partition=context.partition_key)
            yield dg.MaterializeResult(
                asset_key=online_key,
                metadata={
                    **simulated.of_run(context),
                    "as_of": as_of.isoformat(),
                    "store": online_store.shown(uc),
                    "rows_per_view": dg.MetadataValue.json({k: v.height for k, v in views.items()}),
                },
            )
            # Skew: rows of the month's last day, as the store sees them (as of the month's end), both paths.
            month = _month_of(uc, history, context.partition_key)
            if month.height == 0:  # a month without rows (a field study's winter): nothing to compare, said so
                for check in (SKEW_CHECK, DISTRIBUTION_CHECK, HEALTH_CHECK):
                    yield dg.AssetCheckResult(asset_key=online_key, check_name=check, passed=True,
                                              metadata={"compared": 0, "note": "no rows in the month"})  # fmt: skip
                return
            dates = _dates(fs, month)
            last_day = month.filter(dates == dates.max())
            rng = random.Random(f"skew:{context.partition_key}")
            sample = last_day[sorted(rng.sample(range(last_day.height), min(SKEW_SAMPLE, last_day.height)))]
            expected = offline_features(fs, sample, lookups(tables), history, as_of=as_of)
            served = get_online_features(store, _requests(fs, sample, request_columns))
            skew = training_serving_skew(fs, expected.select(names), served, expected[fs.entity.id_column].to_list())
            yield dg.AssetCheckResult(
                asset_key=online_key,
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
            # of the last week's rows, against the store's answers for the same rows.
            week = month.filter(dates > dates.max() - timedelta(days=7))
            week = week.sample(min(DISTRIBUTION_SAMPLE, week.height), seed=7)
            offline_as_of = offline_features(fs, week, lookups(tables), history, as_of=as_of)
            served_week = get_online_features(store, _requests(fs, week, request_columns))
            stability = online_distribution(fs, offline_as_of, served_week)
            worst = [s.feature for s in stability if s.psi is not None and s.psi > PSI_WARN]
            yield dg.AssetCheckResult(
                asset_key=online_key,
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
            # Hot keys: last-week rows whose every feature has a value offline; the store must serve them too. (Not
            # the last day's: a lookup table may end before the month does — flights' weather ends on 30 December.)
            complete = offline_as_of.drop_nulls(names).head(100)[fs.entity.id_column]
            hot = _requests(
                fs,
                entity_frame(fs, week).filter(pl.col(fs.entity.id_column).is_in(complete.implode())),
                request_columns,
            )
            health = feature_health(store, hot, max_age=HEALTH_MAX_AGE)
            yield dg.AssetCheckResult(
                asset_key=online_key,
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

    return [feature_table, online_features]


# The flights use case's feature assets, by name (the wiring still its own imports them).
