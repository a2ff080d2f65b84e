"""The usage and cost_report assets on a KEEL_HOME with a gateway's logs: one day, and a run over a range of days
(as the metering sensor launches in a live replay) that still writes each day's own partition."""

from __future__ import annotations

from datetime import UTC, datetime

import dagster as dg
import polars as pl
import pytest

from assets.metering import cost_report, usage
from keel.exposure_log import ExposureLog
from keel.home import asset_file
from keel.metering.compute import ComputeSample
from keel.policies import PolicyStore
from resources import keel_resources
from sensors.metering import RANGE_END, RANGE_START, metering_run

JUNE_1 = datetime(2013, 6, 1, 12, tzinfo=UTC).timestamp()
PRICES = {"currency": "USD", "per_1000_requests": 1.0, "per_cpu_second": 0.5, "per_gpu_second": 2.0}


@pytest.fixture
def home(tmp_path):
    with PolicyStore(tmp_path / "policies.sqlite") as store:
        store.apply({"prices": ("cost", PRICES)}, author="finance", reason="prices")
    log = ExposureLog(tmp_path / "serving" / "exposures")
    compute = ExposureLog(tmp_path / "serving" / "compute", prefix="compute")
    for day, n in ((0, 100), (2, 50)):  # June 1st and 3rd have traffic, the 2nd none
        for i in range(n):
            log.append({"ts": JUNE_1 + day * 86_400 + i, "tenant_id": "ops", "model_version": 1, "status": 200,
                        "rows": 1, "latency_ms": 2.0, "policy_version": 1})  # fmt: skip
        compute.append(
            ComputeSample(JUNE_1 + day * 86_400 + 200, "flight-delay", 1, (day + 1) * 10**9, 1, 1).as_record()
        )
    log.close()
    compute.close()
    return tmp_path


def test_a_run_over_three_days_writes_each_days_partition(home):
    run = metering_run(["2013-06-01", "2013-06-03"])
    assert run.tags[RANGE_START] == "2013-06-01" and run.tags[RANGE_END] == "2013-06-03"
    assert run.run_key == "metering-2013-06-01..2013-06-03"
    result = dg.materialize([usage, cost_report], resources=keel_resources(home), tags=dict(run.tags))
    assert result.success
    days = {
        d: pl.read_parquet(asset_file(home / "storage", ["usage"], d))
        for d in ("2013-06-01", "2013-06-02", "2013-06-03")
    }
    assert [int(f["requests"].sum()) for f in days.values()] == [100, 0, 50]
    assert days["2013-06-03"]["compute_s"].sum() == pytest.approx(2.0)  # 3 s cumulative − 1 s on the 1st
    costs = {d: pl.read_parquet(asset_file(home / "storage", ["cost_report"], d)) for d in days}
    assert costs["2013-06-01"]["cost"].sum() == pytest.approx(100 / 1000 + 1.0 * 0.5)
    assert costs["2013-06-02"].is_empty()
    materialized = {e.partition for e in result.get_asset_materialization_events() if e.asset_key == usage.key}
    assert materialized == set(days)
    # each day's partition shows that day's numbers (not the run's), its month to date up to that day
    meta = {e.partition: e.materialization.metadata for e in result.get_asset_materialization_events()
            if e.asset_key == cost_report.key}  # fmt: skip
    assert {d: m["run_days"].value for d, m in meta.items()} == dict.fromkeys(
        days, "2013-06-01 … 2013-06-03 (3 days)"
    )
    assert meta["2013-06-01"]["cost"].value == pytest.approx(0.6) and meta["2013-06-02"]["cost"].value is None
    assert meta["2013-06-03"]["cost"].value == pytest.approx(0.05 + 2.0 * 0.5)
    assert [meta[d]["month_to_date_cost"].value for d in days] == pytest.approx([0.6, 0.6, 0.6 + 0.05 + 2.0 * 0.5])
    requests = {e.partition: e.materialization.metadata["requests"].value
                for e in result.get_asset_materialization_events() if e.asset_key == usage.key}  # fmt: skip
    assert requests == {"2013-06-01": 100, "2013-06-02": 0, "2013-06-03": 50}


def test_one_day_and_its_month_to_date_from_earlier_days(home):
    assert dg.materialize([usage, cost_report], resources=keel_resources(home), partition_key="2013-06-01").success
    third = dg.materialize([usage, cost_report], resources=keel_resources(home), partition_key="2013-06-03")
    meta = third.asset_materializations_for_node("cost_report")[0].metadata
    assert meta["cost"].value == pytest.approx(0.05 + 1.0)
    assert meta["month_to_date_cost"].value == pytest.approx(0.6 + 1.05)  # June 1st read from its usage partition
    assert third.asset_materializations_for_node("usage")[0].metadata["requests"].value == 50


def test_without_a_price_table_the_cost_is_said_unpriced_not_zero(home):
    """A home with no cost policy in force (a replay before anyone set prices): every row is unpriced, and the report
    says so instead of a cost of 0 in currency "none"."""
    import shutil

    bare = home.parent / "bare"
    shutil.copytree(home / "serving", bare / "serving")  # the same traffic, no policy store
    result = dg.materialize([usage, cost_report], resources=keel_resources(bare), partition_key="2013-06-01")
    meta = result.asset_materializations_for_node("cost_report")[0].metadata
    assert meta["cost"].value is None and meta["month_to_date_cost"].value is None
    assert meta["currency"].value.startswith("unpriced") and meta["unpriced_rows"].value >= 1


def test_the_metering_days_are_the_use_cases_spans_not_the_years_between():
    """Flights (its replay serving from April 1st, 2013, when March's flights and weather have landed, to January
    1st, 2014, when December 31st's have) and hotels (from November 15th, 2016, when October's bookings have landed
    two weeks on, to September 15th, 2017): every day either can log traffic on is a partition; the history months
    (built at once, nothing served), the years between the spans and today are not."""
    from datetime import date

    from assets.metering import METERING_DAYS, metering_days
    from keel.usecase import get, served_spans

    spans = served_spans([get("flights"), get("hotels")])
    assert spans == {
        "flights": (date(2013, 4, 1), date(2014, 1, 1)),
        "hotels": (date(2016, 11, 15), date(2017, 9, 15)),
    }
    days = metering_days([get("flights"), get("hotels")])
    for day in ("2013-04-01", "2013-06-01", "2014-01-01", "2016-11-15", "2017-09-15"):
        assert days.has_partition_key(day), day
    for day in ("2013-03-31", "2014-01-02", "2015-06-01", "2016-11-14", "2017-09-16", date.today().isoformat()):
        assert not days.has_partition_key(day), day
    assert len(days.get_partition_keys()) == 276 + 305
    assert METERING_DAYS.get_partition_keys() == days.get_partition_keys()  # the installed use cases


def test_a_use_case_without_a_period_meters_wall_clock_days_open_ended():
    from dataclasses import replace
    from datetime import date

    from assets.metering import metering_days
    from keel.usecase import get

    production = replace(get("flights"), period=None)
    days = metering_days([production, get("hotels")])
    assert days.has_partition_key(date.today().isoformat()) and days.has_partition_key("2016-11-15")


def test_the_sensor_says_which_logged_days_lie_outside_every_use_case_and_meters_the_rest(tmp_path, monkeypatch):
    """Traffic logged on a day of the years between the two use cases' spans (2015) is not a partition: the sensor
    launches no run for it (a run for it would fail: no such partition), says so in its log once, and meters a day of
    a span beside it."""
    from keel.clock import SimClock
    from tests.conftest import evaluate_sensor

    log = ExposureLog(tmp_path / "serving" / "exposures")
    for day in (datetime(2013, 6, 1, 12, tzinfo=UTC), datetime(2015, 3, 1, 12, tzinfo=UTC)):
        log.append({"ts": day.timestamp(), "tenant_id": "ops", "model_version": 1, "status": 200, "rows": 1,
                    "latency_ms": 2.0, "policy_version": 1})  # fmt: skip
    log.close()
    SimClock(tmp_path / "clock.json").start(datetime(2015, 3, 5, tzinfo=UTC), speed=1.0)
    tick = evaluate_sensor("metering_sensor", tmp_path, monkeypatch)
    assert [r.partition_key for r in tick.run_requests] == ["2013-06-01"]
    from keel.metering.usage import MeteredDays

    assert MeteredDays.parse(tick.cursor).through == "2015-03-01"  # said once: not retried at each tick


def test_two_use_cases_years_apart_meter_every_logged_day_each_partition_its_own_numbers(tmp_path, monkeypatch):
    """Flights logs June 2013 and hotels January 2017 on one shared clock: one sensor tick asks for a run per use
    case's days (never a three-year range), and each day's usage and cost_report partition holds that day's requests
    alone — priced where a price table is in force, said unpriced (never a cost of 0) where none is."""
    from datetime import timedelta

    from keel.clock import SimClock, Span
    from tests.conftest import evaluate_sensor

    log = ExposureLog(tmp_path / "serving" / "exposures")
    logged = {"2013-06-01": 30, "2013-06-02": 20, "2017-01-09": 7, "2017-01-10": 5}
    for day, n in logged.items():
        noon = datetime.fromisoformat(f"{day}T12:00:00+00:00").timestamp()
        tenant = "ops" if day.startswith("2013") else "pricing"
        for i in range(n):
            log.append({"ts": noon + i, "tenant_id": tenant, "model_version": 1, "status": 200, "rows": 1,
                        "latency_ms": 2.0, "policy_version": 1})  # fmt: skip
    log.close()
    offset = datetime(2017, 1, 13, tzinfo=UTC) - datetime(2013, 6, 5, tzinfo=UTC)
    SimClock(tmp_path / "clock.json").start(
        datetime(2013, 6, 5, tzinfo=UTC), speed=1.0, spans={"flights": Span(timedelta(0)), "hotels": Span(offset)}
    )
    tick = evaluate_sensor("metering_sensor", tmp_path, monkeypatch)
    runs = [
        dict(r.tags) | ({"dagster/partition": r.partition_key} if r.partition_key else {}) for r in tick.run_requests
    ]
    assert [r.get("keel/metered_days") for r in runs] == ["2013-06-01..2013-06-02", "2017-01-09..2017-01-10"]
    for tags in runs:
        assert dg.materialize([usage, cost_report], resources=keel_resources(tmp_path), tags=tags).success
    for day, n in logged.items():
        assert int(pl.read_parquet(asset_file(tmp_path / "storage", ["usage"], day))["requests"].sum()) == n, day
        cost = pl.read_parquet(asset_file(tmp_path / "storage", ["cost_report"], day))
        assert cost["cost"].is_null().all() and cost.height >= 1, day  # no price table: unpriced, not 0
    with PolicyStore(tmp_path / "policies.sqlite") as store:  # prices set: the same day again is priced
        store.apply({"prices": ("cost", PRICES)}, author="finance", reason="prices")
    again = dg.materialize([usage, cost_report], resources=keel_resources(tmp_path), partition_key="2017-01-10")
    meta = again.asset_materializations_for_node("cost_report")[0].metadata
    assert meta["day"].value == "2017-01-10" and meta["currency"].value == "USD"
    assert meta["cost"].value == pytest.approx(5 / 1000 * PRICES["per_1000_requests"])  # its 5 requests alone
