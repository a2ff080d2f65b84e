"""The delivery gate on real data: every day of the shipped 2013 data is admitted (no false alarm in a year), a day
of weather in °C and a day of flights with a broken schema are held back whole, and a month is read only from the
days the gate admitted."""

from __future__ import annotations

from datetime import UTC, date, datetime

import polars as pl
import pytest

from keel.data.delivery import DeliveryGate, check_delivery, held_back
from keel.data.landing import LandingZone
from keel.storage import write_parquet_atomic
from usecases.flights import usecase as FLIGHTS
from usecases.flights import usecase as flights
from usecases.flights.data import read_raw


def _day_rows(table, day):
    return LandingZone("/nonexistent", FLIGHTS).day_rows(table, day)


@pytest.fixture(scope="module")
def contracts():
    return {t: flights.compiled_contract(t) for t in ("flights", "weather")}


@pytest.fixture(scope="module")
def references():
    return {"planes.tailnum": read_raw("planes")["tailnum"]}


def test_every_day_of_2013_is_admitted(contracts, references):
    held = []
    for table in ("flights", "weather"):
        raw = read_raw(table)
        for (y, m, d), frame in raw.group_by(["year", "month", "day"]):
            verdict = check_delivery(table, date(int(y), int(m), int(d)), frame, contracts[table], references)
            if not verdict.ok:
                held.append(verdict.summary())
    assert held == []  # blizzards, the 1,048 mph wind, the doubled hour of 3 November: all rows' business


def test_a_day_of_weather_in_celsius_is_a_systematic_breach_of_the_dew_point_rule(contracts):
    day = date(2013, 7, 14)
    verdict = check_delivery(
        "weather", day, FLIGHTS.drills.unit_change.apply(_day_rows("weather", day)), contracts["weather"]
    )
    assert not verdict.ok
    [breach] = verdict.breaches
    assert breach.rule == "dewpoint_not_above_temp" and breach.share > 0.9
    assert set(verdict.columns) == {"dewp", "temp"}


def test_a_day_of_flights_with_a_renamed_and_a_missing_column_is_held_for_its_schema(contracts, references):
    day = date(2013, 4, 2)
    frame = FLIGHTS.drills.schema_break.apply(_day_rows("flights", day))
    verdict = check_delivery("flights", day, frame, contracts["flights"], references)
    assert not verdict.ok
    assert set(verdict.missing_columns) == {"arr_delay", "tailnum"}
    assert verdict.unexpected_columns == ("arrival_delay",)
    assert verdict.summary().endswith("columns missing: arr_delay, tailnum; unexpected columns: arrival_delay")
    assert verdict.columns == (
        "arr_delay",
        "tailnum",
    )  # the rules on them fail because they are missing: not repeated


def test_the_gate_holds_a_bad_day_back_whole_and_the_month_reads_only_admitted_days(tmp_path, contracts):
    zone = LandingZone(tmp_path / "landing", FLIGHTS)
    zone.deliver(datetime(2013, 4, 4, 7, tzinfo=UTC), first_day=date(2013, 4, 1))  # weather Apr 1–3, flights 1–2
    bad_day = date(2013, 4, 4)
    bad = FLIGHTS.drills.unit_change.apply(_day_rows("weather", bad_day))
    write_parquet_atomic(bad, zone.path("weather", bad_day))  # delivered early, in °C
    gate = DeliveryGate(zone, contracts)
    verdicts = gate.check_new()
    assert sorted((v.table, v.day, v.ok) for v in verdicts) == [
        ("flights", "2013-04-01", True), ("flights", "2013-04-02", True),
        ("weather", "2013-04-01", True), ("weather", "2013-04-02", True), ("weather", "2013-04-03", True),
        ("weather", "2013-04-04", False),
    ]  # fmt: skip
    assert bad_day not in zone.delivered("weather")
    [verdict] = held_back(zone.root)
    kept = pl.read_parquet(verdict["held_at"])
    assert kept.equals(bad)  # every row of the bad delivery, in exactly one place
    assert gate.check_new() == []  # admitted days are not checked again
    # the upstream delivers the day again, genuine: admitted
    zone.deliver(datetime(2013, 4, 5, 7, tzinfo=UTC), first_day=date(2013, 4, 1))
    [again] = [v for v in gate.check_new() if v.day == "2013-04-04"]
    assert again.ok and gate.admitted("weather", bad_day)
    # a file replaced after its admission is checked again
    write_parquet_atomic(bad, zone.path("weather", date(2013, 4, 2)))
    assert not gate.admitted("weather", date(2013, 4, 2))
    month = zone.read_month(
        "weather", "2013-04", days=[d for d in zone.delivered("weather") if gate.admitted("weather", d)]
    )
    assert month["day"].unique().sort().to_list() == ["1", "3", "4"]


def test_a_backfill_holds_back_the_same_day_as_the_live_gate(tmp_path):
    """A `flag` rule broken on a whole day: the live gate holds the day back, and a backfill (no clock) of the month
    as shipped holds back the same day — both build the month without it, its rows whole in the quarantine."""
    import dataclasses

    import dagster as dg

    from assets.raw import build_raw_assets
    from resources.home import KeelHomeResource

    bad_day = date(2013, 4, 4)
    weather = FLIGHTS.source("weather")
    shipped = weather.read()
    is_bad = weather.day_rows(bad_day)
    celsius = pl.concat([shipped.filter(~is_bad), FLIGHTS.drills.unit_change.apply(shipped.filter(is_bad))])
    uc = dataclasses.replace(
        FLIGHTS,
        sources=tuple(
            dataclasses.replace(s, read=lambda: celsius) if s.name == "weather" else s for s in FLIGHTS.sources
        ),
    )
    [raw_weather] = [a for a in build_raw_assets(uc) if a.key.path[-1] == "raw_weather"]
    result = dg.materialize(
        [raw_weather], partition_key="2013-04", resources={"keel_home": KeelHomeResource(home=str(tmp_path))}
    )
    month = result.output_for_node(raw_weather.node_def.name)
    assert "4" not in month["day"].unique().to_list() and month["day"].n_unique() == 29
    [verdict] = held_back(tmp_path / "landing" / "flights")
    assert verdict["day"] == "2013-04-04" and verdict["held_by"] == "backfill"
    assert [b["rule"] for b in verdict["breaches"]] == ["dewpoint_not_above_temp"]
    kept = pl.read_parquet(verdict["held_at"])
    assert kept.height + month.height == shipped.filter(pl.col("month") == "4").height  # every row in one place
    [mat] = result.asset_materializations_for_node(raw_weather.node_def.name)
    assert mat.metadata["days_held_back"].value == "2013-04-04"


def test_one_bad_row_of_a_small_day_is_noise_not_a_systematic_breach(contracts):
    """A two-row delivery with one row in °C breaks the dew-point rule on half its rows — but one row is no evidence
    of a changed unit: the day is admitted (the month's validation flags the row); five such rows are."""
    day = date(2013, 7, 14)
    rows = _day_rows("weather", day)
    small = pl.concat([rows.head(1), FLIGHTS.drills.unit_change.apply(rows.slice(1, 1))])
    assert check_delivery("weather", day, small, contracts["weather"]).ok
    ten = pl.concat([rows.head(5), FLIGHTS.drills.unit_change.apply(rows.slice(5, 5))])
    assert not check_delivery("weather", day, ten, contracts["weather"]).ok
