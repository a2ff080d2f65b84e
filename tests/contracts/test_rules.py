"""Every rule type and every action, on small frames whose right answer is known row by row."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl
import pytest

from keel.contracts.engine import ENRICHED, SOURCE_ROW, PartitionWindow
from tests.conftest import make_contract


def sinks(result) -> dict[str, list[int]]:
    return {
        "valid": sorted(result.valid[SOURCE_ROW].to_list()),
        "quarantine": sorted(result.quarantine[SOURCE_ROW].to_list()),
        "rejected": sorted(result.rejected[SOURCE_ROW].to_list()),
    }


def failed_rows(result, rule_id: str) -> int:
    return result.report.rule(rule_id).failed


def test_not_null_quarantines_with_reason_and_provenance():
    c = make_contract("a: {type: int64}", "- {id: a_present, type: not_null, column: a}")
    r = c.validate(pl.DataFrame({"a": [1, None, 3]}), PartitionWindow("2013-01"))
    assert sinks(r) == {"valid": [0, 2], "quarantine": [1], "rejected": []}
    q = r.quarantine.row(0, named=True)
    assert q["_rule_id"] == "a_present" and q["_reason"] == "a is null" and q["_partition"] == "2013-01"
    assert q["_contract"] == "t" and q["_contract_version"] == 1 and len(q["_contract_hash"]) == 64
    assert q["_replay_status"] == "pending" and q["_source_row"] == 1


def test_schema_type_parses_text_and_quarantines_what_does_not_fit():
    c = make_contract("i: {type: int32}\nf: {type: float64}\nb: {type: bool}\nd: {type: date}")
    df = pl.DataFrame(
        {
            "i": ["1", "1.5", "x", None],
            "f": ["2.5", "inf", "NaN", "1e3"],
            "b": ["true", "0", "maybe", "F"],
            "d": ["2013-01-01", "2013-02-30", "2013-03-01", None],
        }
    )
    r = c.validate(df)
    assert sinks(r)["valid"] == [0, 3]
    assert failed_rows(r, "schema_type_i") == 2  # "1.5" and "x"
    assert failed_rows(r, "schema_type_f") == 2  # inf and NaN are not finite
    assert failed_rows(r, "schema_type_b") == 1
    assert failed_rows(r, "schema_type_d") == 1  # 30 February
    # the quarantine keeps the original text, so nothing is lost to the failed cast
    q = r.quarantine.sort(SOURCE_ROW)
    assert q[SOURCE_ROW].to_list() == [1, 2]
    assert (
        q["i"].to_list() == ["1.5", "x"] and q["f"].to_list() == ["inf", "NaN"] and q["b"].to_list() == ["0", "maybe"]
    )


def test_float_to_int_never_truncates():
    c = make_contract("i: {type: int64}")
    r = c.validate(pl.DataFrame({"i": [1.0, 1.5, float("nan"), None]}))
    assert sinks(r) == {"valid": [0, 3], "quarantine": [1, 2], "rejected": []}
    assert r.valid["i"].to_list() == [1, None]


def test_non_finite_allowed_when_declared():
    c = make_contract("f: {type: float64, allow_non_finite: true}")
    r = c.validate(pl.DataFrame({"f": [1.0, float("inf"), float("nan")]}))
    assert r.report.valid == 3


def test_non_nullable_column():
    c = make_contract("k: {type: string, nullable: false}")
    r = c.validate(pl.DataFrame({"k": ["a", None]}))
    assert sinks(r)["quarantine"] == [1] and r.quarantine["_rule_id"][0] == "schema_not_null_k"


def test_range_inclusive_and_exclusive_bounds():
    c = make_contract(
        "x: {type: float64}",
        """
        - {id: incl, type: range, column: x, min: 0, max: 10, action: flag, severity: warning}
        - {id: excl, type: range, column: x, min: 0, max: 10, min_inclusive: false, max_inclusive: false, action: flag, severity: warning}
        """,
    )
    r = c.validate(pl.DataFrame({"x": [-0.1, 0.0, 5.0, 10.0, 10.1, None]}))
    assert failed_rows(r, "incl") == 2  # -0.1, 10.1; null is not_null's business
    assert failed_rows(r, "excl") == 4
    assert r.report.valid == 6 and r.report.flagged == 4


def test_range_on_datetimes():
    c = make_contract(
        "t: {type: datetime, format: '%Y-%m-%d %H:%M'}",
        "- {id: in_2013, type: range, column: t, min: '2013-01-01T00:00:00', max: '2013-12-31T23:59:59'}",
    )
    r = c.validate(pl.DataFrame({"t": ["2013-05-01 10:00", "2014-01-01 00:00"]}))
    assert sinks(r)["quarantine"] == [1]


def test_in_set():
    c = make_contract("o: {type: string}", "- {id: origin, type: in_set, column: o, values: [EWR, JFK, LGA]}")
    r = c.validate(pl.DataFrame({"o": ["EWR", "jfk", None, "LGA"]}))
    assert sinks(r)["quarantine"] == [1]


def test_regex_uses_search_semantics_and_anchors():
    c = make_contract("s: {type: string}", "- {id: code, type: regex, column: s, pattern: '^[A-Z]{3}$'}")
    r = c.validate(pl.DataFrame({"s": ["ABC", "ABCD", "ab", "", None]}))
    assert sinks(r)["quarantine"] == [1, 2, 3]


def test_max_length_counts_characters_not_bytes():
    c = make_contract("s: {type: string}", "- {id: short, type: max_length, column: s, max: 3}")
    r = c.validate(pl.DataFrame({"s": ["ééé", "abcd", "x" * 1_000_000]}))
    assert sinks(r)["quarantine"] == [1, 2]


def test_decimal_precision_and_scale():
    c = make_contract("v: {type: float64}", "- {id: money, type: decimal, column: v, precision: 5, scale: 2}")
    r = c.validate(pl.DataFrame({"v": [1.25, 0.1, 999.99, 1.255, 1000.0, -999.99, None]}))
    assert sinks(r)["quarantine"] == [3, 4]


def test_freshness_against_partition_end_and_batch():
    c = make_contract("t: {type: datetime}", "- {id: fresh, type: freshness, column: t, max_age: 2d}")
    df = pl.DataFrame(
        {
            "t": [
                datetime(2013, 1, 31, tzinfo=UTC),
                datetime(2013, 1, 29, 23, tzinfo=UTC),
                datetime(2013, 1, 30, 1, tzinfo=UTC),
            ]
        }
    )
    window = PartitionWindow("2013-01", datetime(2013, 1, 1, tzinfo=UTC), datetime(2013, 2, 1, tzinfo=UTC))
    # ages at the partition end (2013-02-01): 1 day, 2 days 1 hour, 1 day 23 hours
    assert sinks(c.validate(df, window))["quarantine"] == [1]
    # without a window: relative to the newest event in the batch (2013-01-31 00:00)
    assert sinks(c.validate(df))["quarantine"] == []
    # a monthly partition's key is that window (issue 49: the docs' walkthrough passed "YYYY-MM" and failed)
    assert PartitionWindow.month("2013-01") == window
    assert sinks(c.validate(df, "2013-01")) == sinks(c.validate(df, window))
    with pytest.raises(ValueError, match=r"partition '2013-1': a monthly partition is YYYY-MM"):
        c.validate(df, "2013-1")


def test_freshness_relative_to_now():
    c = make_contract(
        "t: {type: datetime}", "- {id: fresh, type: freshness, column: t, max_age: 1h, relative_to: now}"
    )
    now = datetime.now(UTC)
    r = c.validate(pl.DataFrame({"t": [now, datetime(2013, 1, 1, tzinfo=UTC)]}))
    assert sinks(r)["quarantine"] == [1]


def test_unique_single_and_composite_keeps_first_occurrence():
    c = make_contract(
        "a: {type: int64}\nb: {type: string}",
        """
        - {id: a_unique, type: unique, columns: a, action: flag, severity: warning}
        - {id: ab_unique, type: unique, columns: [a, b]}
        """,
    )
    r = c.validate(pl.DataFrame({"a": [1, 1, 2, 1, None, None], "b": ["x", "y", "x", "x", "z", "z"]}))
    assert failed_rows(r, "a_unique") == 2  # rows 1 and 3; null keys are not compared
    assert sinks(r)["quarantine"] == [3]  # (1, x) again


def test_condition_between_columns():
    c = make_contract(
        "dep: {type: int64}\narr: {type: int64}",
        "- {id: arrived, type: condition, expr: arr is not null when dep is not null}",
    )
    r = c.validate(pl.DataFrame({"dep": [1, 1, None, None], "arr": [2, None, None, 5]}))
    assert sinks(r)["quarantine"] == [1]


def test_parseable_rule():
    c = make_contract("s: {type: string}", "- {id: numeric_text, type: parseable, column: s, as: float64}")
    r = c.validate(pl.DataFrame({"s": ["1.5", "abc", None]}))
    assert sinks(r)["quarantine"] == [1]


def test_reject_drops_and_logs_reason():
    c = make_contract("a: {type: int64}", "- {id: positive, type: range, column: a, min: 0, action: reject}")
    r = c.validate(pl.DataFrame({"a": [1, -1, 2]}))
    assert sinks(r) == {"valid": [0, 2], "quarantine": [], "rejected": [1]}
    assert r.rejected.row(0, named=True)["_reason"] == "a outside [0, inf]"


def test_quarantine_wins_over_reject():
    c = make_contract(
        "a: {type: int64}",
        """
        - {id: positive, type: range, column: a, min: 0, action: reject}
        - {id: small, type: range, column: a, max: 5, action: quarantine}
        """,
    )
    r = c.validate(pl.DataFrame({"a": [-10, -1, 10]}))
    assert sinks(r) == {"valid": [], "quarantine": [2], "rejected": [0, 1]}
    c2 = make_contract(
        "a: {type: int64}",
        "- {id: both, type: range, column: a, min: 0, max: 5, action: quarantine}\n- {id: neg, type: range, column: a, min: 0, action: reject}",
    )
    r2 = c2.validate(pl.DataFrame({"a": [-1]}))
    assert sinks(r2)["quarantine"] == [0] and r2.quarantine["_failed_rules"][0] == "both,neg"


def test_enrich_with_constant_marks_row():
    c = make_contract(
        "a: {type: int64}\ns: {type: string}",
        "- {id: s_filled, type: not_null, column: s, severity: warning, action: enrich, enrich: {column: s, value: unknown}}",
    )
    r = c.validate(pl.DataFrame({"a": [1, 2], "s": ["x", None]}))
    assert r.valid.sort(SOURCE_ROW)["s"].to_list() == ["x", "unknown"]
    assert r.valid.sort(SOURCE_ROW)[ENRICHED].to_list() == [False, True]
    assert r.report.enriched == 1 and r.report.valid == 2


def test_enrich_with_md5_of_other_columns():
    import hashlib

    c = make_contract(
        "carrier: {type: string}\nflight: {type: int64}\ntailnum: {type: string}",
        "- {id: tail, type: not_null, column: tailnum, severity: warning, action: enrich, enrich: {column: tailnum, prefix: unknown_, md5_of: [carrier, flight]}}",
    )
    r = c.validate(pl.DataFrame({"carrier": ["UA", "AA"], "flight": [1545, 11], "tailnum": ["N14228", None]}))
    expected = "unknown_" + hashlib.md5(b"AA|11").hexdigest()
    assert r.valid.sort(SOURCE_ROW)["tailnum"].to_list() == ["N14228", expected]


def test_flag_keeps_rows_and_counts():
    c = make_contract("a: {type: int64}", "- {id: odd, type: condition, expr: a == 2, severity: info, action: flag}")
    r = c.validate(pl.DataFrame({"a": [1, 2, 3]}))
    assert r.report.valid == 3 and r.report.flagged == 2 and r.report.rule("odd").failed == 2


def test_dry_run_changes_no_rows_but_reports_everything():
    c = make_contract(
        "a: {type: int64}\ns: {type: string}",
        """
        - {id: positive, type: range, column: a, min: 0}
        - {id: s_filled, type: not_null, column: s, severity: warning, action: enrich, enrich: {column: s, value: unknown}}
        """,
        dry_run="true",
    )
    df = pl.DataFrame({"a": [1, -1, 2], "s": ["x", "y", None]})
    r = c.validate(df)
    assert r.report.dry_run and r.report.valid == 3 and r.quarantine.height == 0
    assert r.valid["s"].to_list() == ["x", "y", None] and not r.valid[ENRICHED].any()
    assert r.report.planned == {"valid": 2, "quarantined": 1, "rejected": 0, "enriched": 1}
    assert r.report.rule("positive").failed == 1


def test_severity_budget():
    c = make_contract(
        "a: {type: int64}",
        """
        - {id: crit, type: range, column: a, min: 0}
        - {id: warn, type: range, column: a, max: 100, severity: warning, action: quarantine}
        """,
        critical_budget="{max_fraction: 0.25}",
    )
    ok = c.validate(pl.DataFrame({"a": [1, 2, 3, -1, 500, 500]}))  # 1/6 critical
    assert not ok.report.budget_exceeded and ok.report.critical_failed_rows == 1
    bad = c.validate(pl.DataFrame({"a": [1, -2, -3, -1]}))
    assert bad.report.budget_exceeded and bad.report.critical_failed_fraction == 0.75


def test_a_budget_of_rows_is_a_floor_under_the_share():
    """``allowed_rows``: a partition of 8 rows with one bad label is not a blocked month (2 % of it is under one row);
    two are, and in a large partition the share decides as before."""
    c = make_contract("a: {type: int64}", "- {id: crit, type: range, column: a, min: 0}",
                      critical_budget="{max_fraction: 0.02, allowed_rows: 1}")  # fmt: skip
    one = c.validate(pl.DataFrame({"a": [1, 2, 3, 4, 5, 6, 7, -1]}))
    assert one.report.critical_failed_rows == 1 and not one.report.budget_exceeded
    assert one.report.quarantined == 1  # the row is quarantined all the same
    assert one.report.budget_text == "2.00% of the rows or 1 row, the larger"
    assert c.validate(pl.DataFrame({"a": [1, 2, 3, 4, 5, 6, -7, -1]})).report.budget_exceeded
    large = c.validate(pl.DataFrame({"a": [1] * 970 + [-1] * 30}))  # 3 % of 1,000 rows
    assert large.report.budget_exceeded
    without = make_contract("a: {type: int64}", "- {id: crit, type: range, column: a, min: 0}",
                            critical_budget="{max_fraction: 0.02}")  # fmt: skip
    assert without.validate(pl.DataFrame({"a": [1, 2, 3, 4, 5, 6, 7, -1]})).report.budget_exceeded


def test_missing_column_quarantines_every_row_and_says_which():
    c = make_contract("a: {type: int64}\nb: {type: int64}")
    r = c.validate(pl.DataFrame({"a": [1, 2]}))
    assert r.report.missing_columns == ["b"] and r.report.quarantined == 2
    assert set(r.quarantine["_rule_id"]) == {"schema_columns"} and r.report.budget_exceeded


def test_unexpected_columns_dropped_or_quarantined():
    c = make_contract("a: {type: int64}")
    r = c.validate(pl.DataFrame({"a": [1], "extra": ["x"]}))
    assert r.report.unexpected_columns == ["extra"] and r.report.valid == 1 and "extra" not in r.valid.columns
    cq = make_contract("a: {type: int64}\nschema_x: {type: int64}".replace("\nschema_x: {type: int64}", ""))
    spec_text = cq.spec.text.replace("schema:\n", "schema:\n  unexpected_columns: quarantine\n")
    from keel.contracts.engine import CompiledContract
    from keel.contracts.spec import parse_contract

    cq = CompiledContract(parse_contract(spec_text))
    rq = cq.validate(pl.DataFrame({"a": [1], "extra": ["x"]}))
    assert rq.report.quarantined == 1 and rq.quarantine["_extra_columns"][0] == '{"extra":"x"}'


def test_invalid_utf8_in_csv_is_a_type_violation_not_a_crash(tmp_path):
    from keel.contracts.io import read_data_file

    path = tmp_path / "bad.csv"
    path.write_bytes(b"s,a\nok,1\nbad\xff\xfe,2\n")
    c = make_contract("s: {type: string}\na: {type: int64}")
    r = c.validate(read_data_file(path))
    assert sinks(r) == {"valid": [0], "quarantine": [1], "rejected": []}
    assert r.quarantine["_rule_id"][0] == "schema_type_s"


@pytest.mark.parametrize("rows", [0, 1])
def test_empty_and_single_row_partitions(rows):
    c = make_contract("a: {type: int64}", "- {id: u, type: unique, columns: a}")
    r = c.validate(pl.DataFrame({"a": [1] * rows}, schema={"a": pl.Int64}))
    assert r.report.rows_in == rows and r.report.conserved and not r.report.budget_exceeded


def test_nested_values_fail_the_type_rule():
    c = make_contract("a: {type: int64}")
    r = c.validate(pl.DataFrame({"a": [[1], [2, 3], None]}))
    assert r.report.quarantined == 2 and r.report.valid == 1 and r.report.conserved
