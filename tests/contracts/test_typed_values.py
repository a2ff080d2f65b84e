"""What a value of each type is, decided once for the batch and the record path: booleans are not numbers, numeric
text is parsed (CSV deliveries are text; a JSON client's "5" is 5 — docs/contracts.md), a timestamp outside the
years 1…9999 is a type violation, and ``timestamp_parts`` holds a UTC timestamp to the local date and hour that
spell it."""

from __future__ import annotations

import polars as pl
import pytest

from keel.contracts.engine import SOURCE_ROW, PartitionWindow
from keel.errors import ContractError
from tests.conftest import make_contract

SCHEDULE = make_contract(
    """
    year: {type: int32}
    month: {type: int32}
    day: {type: int32}
    hour: {type: int32}
    time_hour: {type: datetime, format: '%Y-%m-%dT%H:%M:%SZ'}
    """,
    """
    - {id: same_hour, type: timestamp_parts, column: time_hour, timezone: America/New_York,
       parts: {year: year, month: month, day: day, hour: hour}}
    """,
)


def both_paths(contract, rows: list[dict]) -> list[str]:
    """Each row's sink from the batch path, after asserting the record path puts it in the same one."""
    frame = pl.DataFrame(rows, strict=False)
    result = contract.validate(frame, PartitionWindow("2013-01"))
    batch = {}
    for sink in ("valid", "quarantine", "rejected"):
        for i in getattr(result, sink)[SOURCE_ROW].to_list():
            batch[i] = sink
    record = [contract.validate_record(r).sink for r in rows]
    assert [batch[i] for i in range(len(rows))] == record
    return record


def row(y, m, d, h, th):
    return {"year": y, "month": m, "day": d, "hour": h, "time_hour": th}


def test_timestamp_parts_accepts_the_local_hour_in_utc_on_both_sides_of_each_clock_change():
    rows = [
        row(2013, 1, 1, 5, "2013-01-01T10:00:00Z"),  # EST: UTC-5
        row(2013, 6, 1, 5, "2013-06-01T09:00:00Z"),  # EDT: UTC-4
        row(2013, 3, 10, 1, "2013-03-10T06:00:00Z"),  # the last hour before clocks go forward
        row(2013, 3, 10, 3, "2013-03-10T07:00:00Z"),  # the first one after
        row(2013, 11, 3, 1, "2013-11-03T05:00:00Z"),  # 01:00 EDT
        row(2013, 11, 3, 1, "2013-11-03T06:00:00Z"),  # 01:00 EST: the same local hour, an hour later
        row(2013, 12, 31, 23, "2014-01-01T04:00:00Z"),  # the local year ends before UTC's
    ]
    assert both_paths(SCHEDULE, rows) == ["valid"] * len(rows)


def test_timestamp_parts_refuses_a_time_hour_of_another_moment():
    rows = [
        row(2013, 6, 1, 5, "1999-06-01T09:00:00Z"),  # another year
        row(2013, 6, 1, 5, "2013-06-01T05:00:00Z"),  # the local hour sent as if it were UTC
        row(2013, 6, 2, 5, "2013-06-01T09:00:00Z"),  # another day
        row(2013, 12, 31, 23, "2013-12-31T23:00:00Z"),
    ]
    assert both_paths(SCHEDULE, rows) == ["quarantine"] * len(rows)
    result = SCHEDULE.validate(pl.DataFrame(rows), PartitionWindow("2013-06"))
    assert result.quarantine["_rule_id"].to_list() == ["same_hour"] * 4
    assert "America/New_York" in result.quarantine["_reason"][0]


ON_DAY = make_contract(
    """
    sched_date: {type: date, format: '%Y-%m-%d'}
    hour: {type: int32}
    time_hour: {type: datetime, format: '%Y-%m-%dT%H:%M:%SZ'}
    """,
    """
    - {id: same_day, type: timestamp_parts, column: time_hour, timezone: America/New_York,
       parts: {date: sched_date, hour: hour}}
    """,
)


def test_timestamp_parts_holds_a_date_column_to_the_timestamps_local_date():
    """A request's date column and its timestamp (issue 49: a date and hour that disagreed were answered 200)."""
    rows = [
        {"sched_date": "2013-06-01", "hour": 5, "time_hour": "2013-06-01T09:00:00Z"},
        {"sched_date": "2013-12-31", "hour": 23, "time_hour": "2014-01-01T04:00:00Z"},  # local day ends before UTC's
        {"sched_date": "2013-06-02", "hour": 5, "time_hour": "2013-06-01T09:00:00Z"},  # another day
        {"sched_date": "2014-01-01", "hour": 23, "time_hour": "2014-01-01T04:00:00Z"},  # UTC's date, not New York's
    ]
    assert both_paths(ON_DAY, rows) == ["valid", "valid", "quarantine", "quarantine"]
    with pytest.raises(ContractError, match="'hour' must be a date column, is int32"):
        make_contract("hour: {type: int32}\nt: {type: datetime}",
                      "- {id: r, type: timestamp_parts, column: t, parts: {date: hour}}")  # fmt: skip


def test_a_timestamp_python_cannot_hold_is_a_type_violation_not_a_crash():
    rows = [row(0, 6, 30, 5, "0000-06-30T09:00:00Z"), row(2013, 6, 30, 5, "2013-06-30T09:00:00Z")]
    assert both_paths(SCHEDULE, rows) == ["quarantine", "valid"]
    verdict = SCHEDULE.validate_record(rows[0])
    assert "schema_type_time_hour" in verdict.failed_rules


NUMBERS = make_contract("i: {type: int32}\nf: {type: float64}")


@pytest.mark.parametrize("column", ["i", "f"])
def test_booleans_are_not_numbers_in_either_path(column):
    rows = [{"i": 1, "f": 1.0} | {column: True}, {"i": 1, "f": 1.0} | {column: False}]  # a Boolean column
    assert both_paths(NUMBERS, rows) == ["quarantine", "quarantine"]
    assert f"schema_type_{column}" in NUMBERS.validate_record(rows[0]).failed_rules
    assert NUMBERS.validate_record({"i": 1, "f": 1.0}).sink == "valid"


def test_numeric_text_is_the_number_it_spells_in_both_paths():
    assert NUMBERS.validate_record({"i": "5", "f": "2.5"}).record == {"i": 5, "f": 2.5}
    text = [{"i": "5", "f": "2.5"}, {"i": "5.5", "f": "x"}]
    frame = pl.DataFrame(text)
    result = NUMBERS.validate(frame, PartitionWindow("2013-01"))
    assert result.valid.select("i", "f").rows() == [(5, 2.5)]
    assert [NUMBERS.validate_record(r).sink for r in text] == ["valid", "quarantine"]


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("{id: r, type: timestamp_parts, column: t, timezone: Mars/Base, parts: {hour: h}}", "unknown time zone"),
        ("{id: r, type: timestamp_parts, column: t, parts: {second: h}}", "unknown part 'second'"),
        ("{id: r, type: timestamp_parts, column: t, parts: {hour: nope}}", "'nope' is not in the schema"),
        ("{id: r, type: timestamp_parts, column: t, parts: {hour: s}}", "must be an integer column"),
        ("{id: r, type: timestamp_parts, column: h, parts: {hour: h}}", "needs a datetime column"),
    ],
)
def test_a_bad_timestamp_parts_rule_is_refused_when_the_contract_is_read(rule, message):
    with pytest.raises(ContractError, match=message):
        make_contract("t: {type: datetime}\nh: {type: int32}\ns: {type: string}", f"- {rule}")


def test_the_flights_and_request_contracts_hold_time_hour_to_the_schedule():
    from keel.contracts.spec import load_contract
    from usecases.flights import usecase as flights

    for name in ("flights", "predict_request"):
        rules = {r.id: r for r in load_contract(flights.contract_path(name)).rules}
        rule = rules["time_hour_is_the_scheduled_hour"]
        assert rule.type == "timestamp_parts" and rule.params["timezone"] == "America/New_York"
