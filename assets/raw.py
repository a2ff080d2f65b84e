"""A use case's raw tables (its ``sources``, keel/usecase.py), every column as text.

A partitioned source is one asset with a partition per month of the use case's period (by its local day columns);
a reference table is read whole. In a live replay (a simulated clock under KEEL_HOME) a partitioned source holds the
days of the month that have landed so far and passed the delivery gate (keel/data/delivery.py). ``_source_row`` is
the row number in what was delivered, carried into the quarantine so a reviewer can find the original line.
"""

from functools import cache

import dagster as dg
import polars as pl

from assets.partitions import monthly_cadence
from assets.usecase import wiring
from keel.clock import SimClock
from keel.data.delivery import DeliveryGate
from keel.data.landing import LandingZone
from keel.usecase import Source, UseCase
from resources.home import KeelHomeResource

LIVE = (
    " In a live replay (a simulated clock under KEEL_HOME): the days of the month that have landed so far and passed"
    " the delivery gate (keel/data/delivery.py)."
)


def _raw_metadata(src: Source, df: pl.DataFrame) -> dict:
    return {
        "dagster/row_count": df.height,
        "columns": ", ".join(c for c in df.columns if c != "_source_row"),
        "source": src.origin or dg.MetadataValue.null(),
    }


def _monthly_table(uc: UseCase, src: Source) -> dg.AssetsDefinition:
    w = wiring(uc)

    @dg.asset(
        key=w.key(f"raw_{src.name}"),
        partitions_def=w.monthly,
        freshness_policy=monthly_cadence(),
        group_name=w.group("raw"),
        kinds={"csv", "polars"},
        code_version="1",
        description=(src.description or f"The {src.name} table of the partition's month, as text.")
        + (LIVE if src.landing_after is not None else ""),
    )
    def _asset(context: dg.AssetExecutionContext, keel_home: KeelHomeResource) -> dg.Output[pl.DataFrame]:
        home = keel_home.layout()
        if src.landing_after is None:  # a table that never lands day by day: the month as shipped
            df = src.read_month(context.partition_key)
            return dg.Output(df, metadata=_raw_metadata(src, df))
        if SimClock(home.clock, uc.name).state() is None:  # a backfill: the month as shipped, through the same gate
            df, held = DeliveryGate(LandingZone(home.landing, uc)).screen_month(
                src.name, src.read_month(context.partition_key)
            )
            for verdict in held:
                context.log.warning(f"day held back, as the live replay's delivery gate would: {verdict.summary()}")
            return dg.Output(
                df,
                metadata=_raw_metadata(src, df)
                | {"days_held_back": ", ".join(v.day for v in held) or dg.MetadataValue.null()},
            )
        # A live replay: the days of the month that have landed so far (keel/data/landing.py)
        zone = LandingZone(home.landing, uc)
        gate = DeliveryGate(zone)
        for verdict in gate.check_new([src.name], context.partition_key):  # a run never reads a day nobody checked
            if not verdict.ok:
                context.log.warning(f"delivery held back: {verdict.summary()}")
        days = [
            d
            for d in zone.delivered(src.name)
            if d.strftime("%Y-%m") == context.partition_key and gate.admitted(src.name, d)
        ]
        df = zone.read_month(src.name, context.partition_key, days=days)
        return dg.Output(
            df,
            metadata=_raw_metadata(src, df)
            | {
                "source": "landing zone ($KEEL_HOME/landing)",
                "days_landed": len(days),
                "last_day": days[-1].isoformat() if days else dg.MetadataValue.null(),
                "month_complete": zone.month_complete(src.name, context.partition_key),
            },
        )

    return _asset


def _reference_table(uc: UseCase, src: Source) -> dg.AssetsDefinition:
    w = wiring(uc)

    @dg.asset(
        key=w.key(f"raw_{src.name}"),
        group_name=w.group("raw"),
        kinds={"csv", "polars"},
        code_version="1",
        description=src.description or f"The {src.name} reference table, as text.",
    )
    def _asset() -> dg.Output[pl.DataFrame]:
        df = src.read()
        return dg.Output(df, metadata=_raw_metadata(src, df))

    return _asset


@cache
def build_raw_assets(uc: UseCase) -> list[dg.AssetsDefinition]:
    """One raw asset per source of ``uc``: ``<use case>/raw_<source>``, in its ``raw`` group."""
    return [(_monthly_table if src.partitioned else _reference_table)(uc, src) for src in uc.sources]


# The flights use case's raw tables, by name (the wiring still its own imports them).
