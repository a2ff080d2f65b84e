"""Metering in the asset graph: ``usage`` (what each tenant used, per model version and day) → ``cost_report`` (what it
cost under the price table in force, the day and the month to date). Daily partitions on the gateway's clock: the use
cases' simulated days in a live replay (from the earliest declared period's first day), wall-clock days in production.
The metering sensor materializes each day once it is over (job ``keel_metering``); by hand, from the UI or `keel
usage` / `keel cost`.

A run may cover several days (a single-run backfill: the sensor meters every day finished since its last tick in one
run — a live replay finishes a simulated day every few seconds, and a run per day would be a run every few seconds).
Each day is still its own partition and file (the IO manager splits the frame by ``day``), with that day's own
numbers as its metadata (``run_days`` says which run built it with which other days).
"""

import warnings
from datetime import UTC, datetime, time, timedelta

import dagster as dg
import polars as pl

from keel.factories.markdown import frame_to_markdown
from keel.home import asset_file
from keel.metering.cost import cost_frame, price_tables, totals
from keel.metering.usage import read_usage
from keel.plots import stacked_bars_svg, svg_markdown
from keel.usecase import first_day, installed, served_spans
from resources.home import KeelHomeResource
from resources.parquet_io import PARTITION_COLUMN
from resources.policy import PolicyStoreResource

METERING_GROUP = "metering"
USAGE = dg.AssetKey("usage")
COST_REPORT = dg.AssetKey("cost_report")
SERVING_HEALTH = dg.AssetKey("serving_health")  # assets/serving_health.py: built with each metered day


def metering_days(ucs) -> dg.DailyPartitionsDefinition:
    """The days metering can have: those on which the use cases ``ucs`` can log traffic (keel.usecase.served_spans:
    each period and the days its replay serves on), the years between two use cases' spans excluded — no partition is
    "missing" that could never have traffic. A use case without a declared period (production) meters wall-clock
    days, open-ended, from the earliest first day (keel.usecase.first_day)."""
    spans = served_spans(ucs)
    if spans is None:
        return dg.DailyPartitionsDefinition(start_date=first_day(ucs).isoformat(), end_offset=1)
    first = min(a for a, _ in spans.values())
    last = max(b for _, b in spans.values())
    gaps = [
        datetime.combine(d, time(), UTC)
        for n in range((last - first).days + 1)
        if not any(a <= (d := first + timedelta(days=n)) <= b for a, b in spans.values())
    ]
    return dg.DailyPartitionsDefinition(
        start_date=first.isoformat(), end_date=(last + timedelta(days=1)).isoformat(), exclusions=gaps or None
    )


METERING_DAYS = metering_days(installed().values())
ON_DEMAND = {"keel/backfill": "skip"}
BY_DAY = {PARTITION_COLUMN: "day"}  # a run over several days writes each day's rows to its own partition


_DAILY: list[tuple[dict, object]] = []  # each metering asset's dg.asset arguments and function (daily_asset)


def daily_asset(**kwargs):
    """Declares a metering asset of one day that a run may materialize with others (single-run backfills); made a
    ``dg.asset`` by ``build_metering_assets`` on the day partitions it is given."""

    def wrap(fn):
        _DAILY.append((kwargs, fn))
        return fn

    return wrap


def build_metering_assets(days: dg.DailyPartitionsDefinition) -> list[dg.AssetsDefinition]:
    """``usage`` and ``cost_report`` on ``days`` (the installed use cases' calendar: ``METERING_DAYS``). The backfill
    policy is a beta parameter of Dagster 1.13; keel relies on it knowingly, so its BetaWarning is not repeated."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        return [
            dg.asset(partitions_def=days, group_name=METERING_GROUP, tags=ON_DEMAND, metadata=BY_DAY,
                     backfill_policy=dg.BackfillPolicy.single_run(), **kwargs)(fn)
            for kwargs, fn in _DAILY
        ]  # fmt: skip


@daily_asset(
    key=USAGE,
    kinds={"parquet", "triton"},
    description="What each tenant used on one day, per model version: requests (every answer — equal to the exposure "
    "log's count), rows scored, answers by outcome (scored, fallback, 4xx, 5xx), gateway seconds, and model compute "
    "seconds from Triton's statistics API attributed to tenants by their share of the rows scored (compute no "
    "request explains is `_unattributed`), with the price table's version in force. See docs/metering.md.",
)
def meter_usage(
    context: dg.AssetExecutionContext, keel_home: KeelHomeResource, policies: PolicyStoreResource
) -> pl.DataFrame:
    days = context.partition_keys
    with policies.open() as store:
        frame, skipped = read_usage([d.root for d in keel_home.layout().serving_dirs()], days[0], days[-1], store)
    if skipped:
        context.log.warning(f"{skipped} exposure-log lines of {day_span(days)} were not whole records: not metered")
    context.add_asset_metadata({"run_days": day_span(days), "skipped_lines": skipped})
    for day in days:  # each day's partition shows its own numbers, not the run's
        context.add_asset_metadata(
            {"day": day, **_usage_metadata(frame.filter(pl.col("day") == day))}, partition_key=day
        )
    return frame


def _usage_metadata(frame: pl.DataFrame) -> dict:
    """One day's usage as the UI shows it: totals, per tenant, and the rows."""
    by_tenant = (
        frame.group_by("tenant_id")
        .agg(pl.col("requests", "rows_scored", "scored", "fallback", "client_errors", "server_errors").sum(),
             pl.col("gateway_s", "compute_s").sum().round(4))
        .sort("tenant_id")
    )  # fmt: skip
    return {
        "requests": int(frame["requests"].sum()),
        "rows_scored": int(frame["rows_scored"].sum()),
        "compute_s": dg.MetadataValue.float(round(float(frame["compute_s"].sum()), 6)),
        "gateway_s": dg.MetadataValue.float(round(float(frame["gateway_s"].sum()), 3)),
        "tenants": frame.filter(pl.col("requests") > 0)["tenant_id"].n_unique(),
        "by_tenant": dg.MetadataValue.md(_shown(by_tenant)),
        "usage": dg.MetadataValue.md(_shown(frame)),
    }


def _shown(frame: pl.DataFrame) -> str:
    """A frame as a markdown table for the UI, its floats rounded (costs to 6 decimals, seconds to 4)."""
    rounded = frame.with_columns(
        [pl.col(c).round(6 if "cost" in c or "price" in c else 4) for c, t in frame.schema.items() if t == pl.Float64]
    )
    return frame_to_markdown(rounded, max_rows=50)


def day_span(days: list[str]) -> str:
    """A run's days as text: the day, or "first … last (N days)"."""
    return days[0] if len(days) == 1 else f"{days[0]} … {days[-1]} ({len(days)} days)"


def _bars(cost: pl.DataFrame, bar: str, segment: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for r in totals(cost, [bar, segment]).iter_rows(named=True):
        if r["cost"]:
            seg = f"v{r[segment]}" if segment == "model_version" else str(r[segment])
            out.setdefault(str(r[bar]), {})[seg] = r["cost"]
    return out


@daily_asset(
    key=COST_REPORT,
    kinds={"parquet"},
    ins={"usage": dg.AssetIn(USAGE)},
    description="What the day's usage cost: each usage row × the `cost` policy (price table) in force when its "
    "requests were answered — per 1,000 requests answered 200, per CPU- or GPU-second of attributed model compute, "
    "per-tenant overrides — with totals by tenant and model version, a plot, and the month to date (the usage of the "
    "month's earlier days, priced the same way). Unpriced rows (no price table yet) are counted, never costed at 0.",
)
def price_usage(
    context: dg.AssetExecutionContext, usage: pl.DataFrame, keel_home: KeelHomeResource,
    policies: PolicyStoreResource,
) -> pl.DataFrame:  # fmt: skip
    days = context.partition_keys
    storage = keel_home.layout().storage
    stored: dict[str, pl.DataFrame | None] = {}  # the usage partitions materialized before this run, read once

    def before_run(month: str) -> list[pl.DataFrame]:
        """The month's days before this run's whose usage was materialized."""
        for d in (f"{month}-{n:02d}" for n in range(1, 32)):
            if d < days[0] and d not in stored:
                path = asset_file(storage, list(USAGE.path), d)
                stored[d] = pl.read_parquet(path) if path.exists() else None
        return [f for d, f in sorted(stored.items()) if d.startswith(month) and f is not None]

    with policies.open() as store:
        cost = cost_frame(usage, price_tables(store, usage["price_version"].to_list()))
        for day in days:  # each day's partition: that day's cost and its month to date
            month = before_run(day[:7])
            this_month = usage.filter(pl.col("day").str.starts_with(day[:8]) & (pl.col("day") <= day))
            mtd_usage = pl.concat([*month, this_month], how="vertical_relaxed")
            mtd = cost_frame(mtd_usage, price_tables(store, mtd_usage["price_version"].to_list()))
            context.add_asset_metadata(_cost_metadata(day, cost.filter(pl.col("day") == day), mtd), partition_key=day)
    context.add_asset_metadata({"run_days": day_span(days)})
    return cost


def _cost_metadata(day: str, cost: pl.DataFrame, mtd: pl.DataFrame) -> dict:
    """One day's cost report as the UI shows it: the day's cost, its month to date, totals and two plots."""
    currency = next((c for c in [*cost["currency"].to_list(), *mtd["currency"].to_list()] if c), None)
    unit = currency or "(unpriced)"

    def amount(frame: pl.DataFrame) -> dg.MetadataValue:  # nothing priced is said, never shown as a cost of 0
        priced = frame["cost"].drop_nulls()
        return dg.MetadataValue.float(round(float(priced.sum()), 6)) if priced.len() else dg.MetadataValue.null()

    by_version = svg_markdown(
        stacked_bars_svg(f"{day}: cost by tenant and model version", _bars(cost, "tenant_id", "model_version"), unit)
    )
    by_day = svg_markdown(
        stacked_bars_svg(f"{day[:7]} to {day}: cost by day and tenant", _bars(mtd, "day", "tenant_id"), unit)
    )
    return {
        "day": day,
        "cost": amount(cost),
        "currency": currency or "unpriced: no cost policy (price table) in force — docs/metering.md",
        "unpriced_rows": int(cost["cost"].is_null().sum()),
        "month_to_date_cost": amount(mtd),
        "by_tenant": dg.MetadataValue.md(_shown(totals(cost, ["tenant_id"]))),
        "by_model_version": dg.MetadataValue.md(_shown(totals(cost, ["model_version"]))),
        "month_to_date": dg.MetadataValue.md(_shown(totals(mtd, ["tenant_id"]))),
        "plot": dg.MetadataValue.md(f"{by_version}\n\n{by_day}"),
    }


metering_assets = build_metering_assets(METERING_DAYS)
usage, cost_report = metering_assets

metering_job = dg.define_asset_job(
    "keel_metering",
    executor_def=dg.in_process_executor,
    selection=dg.AssetSelection.assets(USAGE, COST_REPORT, SERVING_HEALTH),
    description="Meter one day: usage from the gateway's exposure and compute logs, then its cost report, and what "
    "actually answered against each model's tier (serving_health; launched by metering_sensor for each finished day "
    "of the gateway's clock).",
)
