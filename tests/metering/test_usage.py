"""Usage from exposure records and Triton compute samples: counts equal the log's, compute is shared by rows and
never lost, counters that restart are followed, and the files are read as the gateway writes them."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import orjson
import polars as pl
import pytest

from keel.exposure_log import ExposureLog
from keel.metering.compute import ComputeSample, compute_deltas, compute_ns, read_compute_samples
from keel.metering.usage import UNATTRIBUTED, finished_days, outcome, read_usage, usage_frame

DAY = datetime(2013, 6, 1, 12, tzinfo=UTC).timestamp()
NEXT = DAY + 86_400


def rec(tenant="ops", version=1, status=200, rows=1, degraded=None, ts=DAY, policy=None, latency=2.0, **extra):
    return {"ts": ts, "tenant_id": tenant, "model_version": version, "status": status, "rows": rows,
            "degraded": degraded, "latency_ms": latency, "policy_version": policy, **extra}  # fmt: skip


def sample(ns, version=1, ts=DAY, device="cpu"):
    return ComputeSample(ts, "flight-delay", version, ns, 0, 0, device)


@pytest.mark.parametrize(
    "record, expected",
    [
        (rec(), "scored"),
        (rec(degraded=["fallback", "breaker_open"]), "fallback"),
        (rec(degraded=["runtime_unavailable"], version=None), "fallback"),
        (rec(degraded=["frozen:temp"]), "scored"),
        (rec(status=422, version=None), "client_error"),
        (rec(status=429, version=None), "client_error"),
        (rec(status=502), "server_error"),
        (rec(status=503, version=None), "server_error"),
    ],
)
def test_each_answer_has_one_outcome(record, expected):
    assert outcome(record) == expected


def test_every_record_is_one_metered_request_and_compute_is_shared_by_rows():
    records = [rec("ops", rows=3)] * 4 + [rec("pricing", rows=1)] * 4 + [rec("ops", status=422, version=None)]
    records += [rec("pricing", status=502), rec("pricing", degraded=["fallback"], rows=2)]
    deltas = compute_deltas([sample(2_000_000_000)])  # 2 s of compute since load
    u = usage_frame(records, deltas)
    assert u["requests"].sum() == len(records)
    ops = u.filter((pl.col("tenant_id") == "ops") & pl.col("model_version").is_not_null()).row(0, named=True)
    pricing = u.filter(pl.col("tenant_id") == "pricing").row(0, named=True)
    assert (ops["requests"], ops["rows_scored"], ops["scored"]) == (4, 12, 4)
    assert (pricing["requests"], pricing["rows_scored"], pricing["scored"], pricing["fallback"],
            pricing["server_errors"]) == (6, 6, 4, 1, 1)  # fmt: skip
    assert ops["compute_s"] == pytest.approx(2.0 * 12 / 18) and pricing["compute_s"] == pytest.approx(2.0 * 6 / 18)
    refused = u.filter(pl.col("model_version").is_null()).row(0, named=True)
    assert (refused["tenant_id"], refused["client_errors"], refused["compute_s"]) == ("ops", 1, 0.0)
    assert u["compute_s"].sum() == pytest.approx(2.0)
    assert u["gateway_s"].sum() == pytest.approx(len(records) * 0.002)


def test_compute_no_request_explains_is_kept_as_unattributed():
    records = [rec("ops", version=1)]
    deltas = compute_deltas([sample(1_000_000_000, 1), sample(500_000_000, 2)])  # version 2: warm-up only
    u = usage_frame(records, deltas)
    orphan = u.filter(pl.col("tenant_id") == UNATTRIBUTED).row(0, named=True)
    assert (orphan["model_version"], orphan["compute_s"], orphan["requests"]) == (2, 0.5, 0)
    assert u["compute_s"].sum() == pytest.approx(1.5)


def test_compute_of_a_version_whose_requests_all_failed_is_not_lost():
    u = usage_frame([rec("ops", status=502)], compute_deltas([sample(300_000_000)]))
    assert u["compute_s"].sum() == pytest.approx(0.3)
    assert u.filter(pl.col("tenant_id") == UNATTRIBUTED).height == 1


def test_deltas_follow_consecutive_samples_a_restarted_counter_and_the_day_of_the_closing_sample():
    samples = [sample(1_000_000_000, ts=DAY), sample(3_000_000_000, ts=DAY + 60),
               sample(500_000_000, ts=DAY + 120),  # Triton loaded the version again: its counter restarted
               sample(900_000_000, ts=NEXT)]  # fmt: skip
    d = compute_deltas(samples, baseline=[sample(400_000_000, ts=DAY - 86_400)])
    assert dict(zip(d["day"], d["compute_s"], strict=True)) == pytest.approx(
        {"2013-06-01": 0.6 + 2.0 + 0.5, "2013-06-02": 0.4}
    )


def test_triton_statistics_json_gives_input_infer_and_output_nanoseconds():
    entry = {"version": "1", "inference_stats": {"compute_input": {"count": "4", "ns": "100"},
             "compute_infer": {"count": "4", "ns": "2000"}, "compute_output": {"count": "4", "ns": "30"},
             "queue": {"count": "4", "ns": "999999"}}}  # fmt: skip
    assert compute_ns(entry) == 2130  # queueing is not compute


def test_prices_follow_the_policy_version_each_request_was_served_under():
    records = [rec("ops", policy=1), rec("ops", policy=2), rec("ops", policy=3)]
    mapping = {None: None, 1: 1, 2: 1, 3: 3}  # store version → the version that last set the price table
    u = usage_frame(records, compute_deltas([]), mapping.get)
    assert dict(zip(u["price_version"], u["requests"], strict=True)) == {1: 2, 3: 1}


def test_read_usage_reads_the_gateways_files_and_skips_a_torn_line(tmp_path):
    serving = tmp_path / "serving"
    log = ExposureLog(serving / "exposures")
    for r in [rec("ops"), rec("pricing"), rec("ops", ts=NEXT)]:
        log.append(r)
    log.close()
    with open(serving / "exposures" / "exposures-20130601.jsonl", "ab") as fh:
        fh.write(b'{"ts": 1370088000, "tenant_id": "ops", "sta')  # a crash mid-append
    compute = ExposureLog(serving / "compute", prefix="compute")
    compute.append(sample(700_000_000, ts=DAY - 86_400 * 3).as_record())  # the baseline, days before
    compute.append(sample(1_000_000_000, ts=DAY + 10).as_record())
    compute.close()
    u, skipped = read_usage(serving, "2013-06-01", "2013-06-01")
    assert skipped == 1 and u["requests"].sum() == 2
    assert u["compute_s"].sum() == pytest.approx(0.3)  # from the baseline sample on, not from zero
    assert [s.compute_ns for s in read_compute_samples(serving / "compute")] == [700_000_000, 1_000_000_000]
    lines = (serving / "compute" / "compute-20130601.jsonl").read_bytes().splitlines()
    assert orjson.loads(lines[0])["model_version"] == 1


@pytest.mark.parametrize(
    "exposure_days, compute_days, today, after, expected",
    [
        (["2013-06-01"], ["2013-06-01"], "2013-06-01", None, []),  # still today
        (["2013-06-01"], ["2013-06-01"], "2013-06-02", None, []),  # no sample after it yet
        (["2013-06-01"], ["2013-06-01", "2013-06-02"], "2013-06-02", None, ["2013-06-01"]),
        (["2013-06-01"], ["2013-06-01"], "2013-06-03", None, ["2013-06-01"]),  # the gateway stopped
        (["2013-06-01", "2013-06-02"], ["2013-06-03"], "2013-06-03", "2013-06-01", ["2013-06-02"]),  # cursor
    ],
)
def test_a_day_is_metered_once_it_is_over_and_its_last_interval_closed(
    exposure_days, compute_days, today, after, expected
):
    assert finished_days(exposure_days, compute_days, today, after) == expected


def test_days_are_utc_days_of_the_records_ts():
    late = datetime(2013, 6, 1, 23, 59, 59, tzinfo=UTC).timestamp()
    u = usage_frame([rec(ts=late), rec(ts=late + 2)], compute_deltas([]))
    assert u["day"].to_list() == ["2013-06-01", "2013-06-02"]
    assert time.strftime("%Y-%m-%d", time.gmtime(late)) == "2013-06-01"


def test_two_use_cases_on_one_clock_meter_their_days_each_when_over():
    """Flights logs 2013 and hotels 2017 on one shared clock (keel/clock.py): each one's day is metered once that use
    case is past it — a hotels day does not finish flights' running day, nor does the cursor skip flights' days."""
    from keel.metering.usage import MeteredDays, day_groups

    exposure = ["2013-06-01", "2013-06-02", "2017-01-09", "2017-01-10"]
    compute = ["2013-06-01", "2013-06-02", "2017-01-09", "2017-01-10"]
    todays = ["2013-06-02", "2017-01-10"]
    assert finished_days(exposure, compute, todays, None) == ["2013-06-01", "2017-01-09"]
    cursor = MeteredDays().with_days(["2013-06-01", "2017-01-09"], exposure)
    assert cursor.through == "2013-06-01" and cursor.also == ("2017-01-09",)
    later = ["2013-06-03", "2017-01-11"]
    compute += ["2013-06-03", "2017-01-11"]
    exposure += ["2013-06-03", "2017-01-11"]
    days = finished_days(exposure, compute, later, cursor.days_done(exposure))
    assert days == ["2013-06-02", "2017-01-10"]
    assert day_groups(days) == [["2013-06-02"], ["2017-01-10"]]  # one metering run each: no three-year range
    assert MeteredDays.parse(cursor.with_days(days, exposure).dump()).through == "2013-06-02"
    assert MeteredDays.parse("2013-05-31").done("2013-05-30")  # a cursor of an earlier keel: the last day metered
