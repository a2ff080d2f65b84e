"""The shipped contracts catch the real defects of NYC 2013 flights and weather (the whole year, every partition)."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl
import pytest

from keel.contracts.engine import SOURCE_ROW, CompiledContract, PartitionWindow
from keel.contracts.spec import load_contract
from tests import CONTRACTS
from usecases.flights.data import MONTHS, read_raw, read_raw_month


def month_window(key: str) -> PartitionWindow:
    y, m = (int(x) for x in key.split("-"))
    end = datetime(y + 1, 1, 1, tzinfo=UTC) if m == 12 else datetime(y, m + 1, 1, tzinfo=UTC)
    return PartitionWindow(key, datetime(y, m, 1, tzinfo=UTC), end)


@pytest.fixture(scope="module")
def year_results():
    out = {}
    for table in ("flights", "weather"):
        compiled = CompiledContract(load_contract(CONTRACTS / f"{table}.yaml"))
        refs = {"planes.tailnum": read_raw("planes")["tailnum"]}
        out[table] = [
            compiled.validate(read_raw_month(table, key), month_window(key), references=refs) for key in MONTHS
        ]
    return out


def total(results, rule_id: str) -> int:
    return sum(r.report.rule(rule_id).failed for r in results)


def test_raw_tables_have_the_documented_sizes():
    assert read_raw("flights").height == 336_776
    assert read_raw("weather").height == 26_115
    assert sum(read_raw_month("flights", k).height for k in MONTHS) == 336_776


def test_no_row_lost_over_the_year(year_results):
    for table, expected in (("flights", 336_776), ("weather", 26_115)):
        results = year_results[table]
        assert all(r.report.conserved for r in results)
        placed = sum(r.valid.height + r.quarantine.height + r.rejected.height for r in results)
        assert placed == expected
        rows = pl.concat(
            [
                pl.concat(
                    [r.valid.select(SOURCE_ROW), r.quarantine.select(SOURCE_ROW), r.rejected.select(SOURCE_ROW)]
                )
                for r in results
            ]
        )
        assert rows[SOURCE_ROW].n_unique() == expected


def test_the_1048_mph_wind_reading_is_quarantined(year_results):
    q = pl.concat([r.quarantine for r in year_results["weather"]])
    wind = q.filter(pl.col("_rule_id") == "wind_speed_physical")
    assert wind.height == 1
    row = wind.row(0, named=True)
    assert float(row["wind_speed"]) > 1000 and row["origin"] == "EWR" and row["_partition"] == "2013-02"
    valid = pl.concat([r.valid for r in year_results["weather"]])
    assert valid["wind_speed"].max() < 250


def test_visib_decimals_are_typed_not_lost(year_results):
    valid = pl.concat([r.valid for r in year_results["weather"]])
    assert valid.schema["visib"] == pl.Float64
    assert valid.filter((pl.col("visib") % 1) != 0).height > 0  # 1.5, 0.12, ... survive as decimals
    assert total(year_results["weather"], "schema_type_visib") == 0


def test_cancelled_flights_are_an_explicit_rule(year_results):
    results = year_results["flights"]
    assert total(results, "cancelled_flight") == 8_255  # counted by the info rule, not by accident
    valid = pl.concat([r.valid for r in results])
    assert valid.filter(pl.col("dep_time").is_null()).height == 8_255  # and kept: they are real events
    assert total(results, "cancelled_has_no_arrival") == 0


def test_diverted_flights_without_arrival_are_quarantined(year_results):
    results = year_results["flights"]
    assert total(results, "departed_has_arrival") == 1_175
    q = pl.concat([r.quarantine for r in results])
    assert q.filter(pl.col("_rule_id") == "departed_has_arrival").height == 1_175


def test_missing_tailnums_are_enriched_with_a_stable_surrogate(year_results):
    valid = pl.concat([r.valid for r in year_results["flights"]])
    enriched = valid.filter(pl.col("_enriched"))
    assert enriched.height == 2_512 and enriched["tailnum"].str.starts_with("unknown_").all()
    assert valid["tailnum"].null_count() == 0


def test_tailnums_absent_from_planes_are_flagged(year_results):
    results = year_results["flights"]
    assert total(results, "tailnum_known_plane") == 50_094
    # flagged, not dropped: the rows stay valid (the rule's action is flag)
    assert all(r.report.rule("tailnum_known_plane").action == "flag" for r in results)


def test_duplicate_local_hours_at_the_dst_change_are_quarantined(year_results):
    q = pl.concat([r.quarantine for r in year_results["weather"]])
    dup = q.filter(pl.col("_rule_id") == "one_reading_per_local_hour")
    assert dup.height == 3 and set(dup["_partition"]) == {"2013-11"}


def test_no_partition_exceeds_its_critical_budget(year_results):
    for table, results in year_results.items():
        assert not any(r.report.budget_exceeded for r in results), table


@pytest.mark.parametrize("table, month", [("weather", "2013-11"), ("flights", "2013-02")])
def test_single_record_path_agrees_with_batch_on_real_rows(table, month):
    compiled = CompiledContract(load_contract(CONTRACTS / f"{table}.yaml"))
    refs = {"planes.tailnum": read_raw("planes")["tailnum"]}
    raw = read_raw_month(table, month)
    if table == "flights":
        raw = raw.sample(4000, seed=7)
    batch = compiled.validate(raw, month_window(month), references=refs)
    sink = {row: "valid" for row in batch.valid[SOURCE_ROW]}
    sink |= {row: "quarantine" for row in batch.quarantine[SOURCE_ROW]}
    sink |= {row: "rejected" for row in batch.rejected[SOURCE_ROW]}
    batch_only = set(
        batch.quarantine.filter(pl.col("_failed_rules").str.contains("one_reading|one_departure"))[SOURCE_ROW]
    )
    valid_by_row = {r[SOURCE_ROW]: r for r in batch.valid.iter_rows(named=True)}
    for record in raw.iter_rows(named=True):
        row = record.pop(SOURCE_ROW)
        if row in batch_only:
            continue
        verdict = compiled.validate_record(record, month_window(month), references=refs)
        assert verdict.sink == sink[row], (row, verdict.failed_rules)
        if verdict.sink == "valid":
            expected = {k: v for k, v in valid_by_row[row].items() if not k.startswith("_")}
            assert verdict.record == expected
