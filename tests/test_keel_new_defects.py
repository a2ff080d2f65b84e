"""What ``keel new`` finds wrong in a table that no single value shows (issue 61 items 8, 9, 11, 12, 13): ranges from a
column's nature, columns that give the label away, a stuck sensor, impossible zeros and missing hours, rows keyed by
what a caller has, and the user's own file validated against the contract it wrote. The planted shop table and its
helpers: tests/test_keel_new.py."""

from __future__ import annotations

from datetime import date

import numpy as np
import polars as pl
import pytest

from keel.cli import main
from keel.contracts.engine import CompiledContract
from keel.contracts.spec import load_contract
from tests.test_keel_new import _import, generated, planted_table  # noqa: F401 - generated: the shared fixture


def test_a_labels_domain_comes_from_its_nature():
    """A count: never negative, whole numbers; a share: [0, 1]; a signed value: unbounded."""
    from keel.new.profile import ColumnProfile
    from keel.new.rules import label_domain

    def col(kind, lo, hi):
        return ColumnProfile("y", "y", kind, 100, 0, 50, min=lo, max=hi)

    assert label_domain(col("int", 0, 977)) == ((0.0, None, True), "never negative (min 0); whole numbers only")
    assert label_domain(col("float", 0.0, 0.93))[0] == (0.0, 1.0, False)
    assert label_domain(col("float", -3.5, 12.0)) == ((None, None, False), "any real number")
    from keel.new.profile import QUANTILES

    fahrenheit = ColumnProfile(
        "t",
        "t",
        "float",
        100,
        0,
        155,
        min=12.0,
        max=98.1,
        quantiles=dict(zip((f"{q:g}" for q in QUANTILES), (15, 20, 39, 54, 70, 86, 93), strict=True)),
    )
    assert label_domain(fahrenheit)[0] == (None, None, False)  # never negative here, but far above 0: no floor


@pytest.mark.parametrize(
    ("kind", "distinct", "lo", "hi", "quantiles", "expected", "why"),
    [
        # an hour of the day: 24 values — [0, 23], not [0, 529] from a skew test (issue 61 item 8)
        ("int", 24, 0, 23, (0, 0, 6, 12, 18, 23, 23), (0, 23), "an integer of 24 values"),
        # a count label (hourly bikes): from 0 to twice its 99.9th percentile, not [0, 307000]
        ("int", 869, 1, 977, (1, 2, 40, 142, 281, 782, 948), (0, 1900), "never negative"),
        # a share
        ("float", 90, 0.0, 0.97, (0.0, 0.05, 0.4, 0.6, 0.8, 0.95, 0.97), (0.0, 1.0), "a share"),
        # a signed value: its bulk widened
        ("float", 500, -20.0, 35.0, (-18, -10, 2, 10, 18, 30, 34), (-50.0, 70.0), "p1 -10 … p99 30 widened"),
        # found by the JFK weather trial (BENCHMARKS.md): rain in inches an hour, 0 … 0.66, is no share
        ("float", 42, 0.0, 0.66, (0, 0, 0, 0, 0, 0.12, 0.4), (0.0, 0.8), "never negative"),
        # relative humidity: a percentage, not [0, 200]
        ("float", 1934, 15.2, 100.0, (16, 24.7, 50, 65.6, 82, 100, 100), (0.0, 100.0), "a percentage"),
        # wind direction: an angle, not [0, 720]
        ("float", 37, 0.0, 360.0, (0, 0, 130, 220, 280, 360, 360), (0.0, 360.0), "an angle in degrees"),
        # °F in a year that never froze below 12: far above 0, so no floor at 0 — not [0, 190]
        ("float", 155, 12.0, 98.1, (15, 19.94, 39, 54, 70, 86, 93), (-46.2, 153.0), "p1 19.94 … p99 86 widened"),
    ],
)
def test_a_range_follows_the_columns_nature(kind, distinct, lo, hi, quantiles, expected, why):
    from keel.new.profile import QUANTILES, ColumnProfile
    from keel.new.rules import numeric_range

    c = ColumnProfile(
        "x",
        "x",
        kind,
        1000,
        0,
        distinct,
        min=lo,
        max=hi,
        quantiles={f"{p:g}": float(v) for p, v in zip(QUANTILES, quantiles, strict=True)},
    )
    got_lo, got_hi, how = numeric_range(c)
    assert (got_lo, got_hi) == expected and how.startswith(why), how


def test_columns_that_give_the_label_away_are_found_named_and_never_features(tmp_path, capsys):
    """Issue 61 item 9: two columns that sum to the label in every row became features and keel new said "defects
    found: none". Planted beside the shop's honest columns: the sales paid in cash and by card (they add up to the
    sales), a copy of the sales in cents, and the next row's sales. Each is refused as a feature and named with its
    evidence; the honest columns stay features."""
    source = tmp_path / "leaky.csv"
    table = planted_table(source)
    sales = pl.col("Sales").cast(pl.Float64, strict=False)
    paid_in_cash = pl.Series(np.random.default_rng(61).uniform(0, 1, table.height))  # each sale's own split
    table = table.with_columns(
        (sales * paid_in_cash).round(2).alias("Cash"),
        (sales - (sales * paid_in_cash).round(2)).round(2).alias("Card"),
        (sales * 100).round(0).alias("Sales Cents"),
        sales.shift(-1).alias("Next Sales"),
    )
    table.write_csv(source)
    assert (
        main(["new", "leaky", "--from", str(source), "--label", "Sales", "--time", "Day", "--root", str(tmp_path)])
        == 0
    )
    out = capsys.readouterr().out
    leaky = _import(tmp_path, "leaky").usecase
    names = set(leaky.features.names)
    assert not names & {"cash", "card", "sales_cents", "next_sales"}, names
    assert {"units", "unit_price", "promo"} <= names  # the honest columns are features still
    profile = (tmp_path / "usecases" / "leaky" / "PROFILE.md").read_text()
    for col, evidence in (
        ("cash", "part of the label: cash + card"),
        ("card", "part of the label: cash + card"),
        ("sales_cents", "a copy of the label: correlation +1.0000"),
        ("next_sales", "the label shifted: equal to sales of the row after it"),
    ):
        assert f"{col}: gives the label away — {evidence}" in profile, col
    assert "defects found: none" not in out


STUCK_DAY = "2021-03-17"  # the humidity sensor reads 0 all day

MISSING_WEEK = (date(2021, 6, 7), date(2021, 6, 13))


def hourly_table(path) -> pl.DataFrame:
    """A year of hourly readings and rides (a bike-share counter): a day the humidity sensor is stuck at 0, a wind
    sensor that reads exactly 0 when it fails (12 % of hours; otherwise it never reads under its floor, ~6), a missing week and 30
    missing single hours."""
    rng = np.random.default_rng(61)
    hours = pl.datetime_range(pl.datetime(2021, 1, 1), pl.datetime(2021, 12, 31, 23), "1h", eager=True)
    n = hours.len()
    hour = hours.dt.hour().to_numpy()
    temp = 12 + 10 * np.sin(np.arange(n) / n * 2 * np.pi) + 4 * np.sin(hour / 24 * 2 * np.pi) + rng.normal(0, 1, n)
    humidity = np.clip(60 + 20 * np.sin(hour / 24 * 2 * np.pi + 1) + rng.normal(0, 5, n), 10, 100).round(1)
    wind = np.where(rng.random(n) < 0.12, 0.0, 6 + rng.gamma(2.0, 5.0, n)).round(1)  # an anemometer's floor: ~6
    rides = np.maximum(0, 50 + 30 * np.sin(hour / 24 * 2 * np.pi) + 3 * temp - 0.3 * wind + rng.normal(0, 8, n))
    frame = pl.DataFrame(
        {
            "ts": hours.dt.strftime("%Y-%m-%d %H:%M:%S"),
            "hr": hour,
            "temp": temp.round(2),
            "humidity": humidity,
            "windspeed": wind,
            "rides": rides.round().astype(int),
        }
    )
    frame = frame.with_columns(
        pl.when(pl.col("ts").str.starts_with(STUCK_DAY)).then(0.0).otherwise(pl.col("humidity")).alias("humidity")
    )
    day = pl.col("ts").str.slice(0, 10)
    frame = frame.filter(~day.is_between(pl.lit(MISSING_WEEK[0].isoformat()), pl.lit(MISSING_WEEK[1].isoformat())))
    dropped = set(rng.choice(np.arange(100, frame.height - 100), size=30, replace=False).tolist())
    frame = frame.with_row_index("i").filter(~pl.col("i").is_in(list(dropped))).drop("i")
    frame.write_csv(path)
    return frame


def new_rides(source, root) -> int:
    """``keel new rides`` on the hourly table, every month of it."""
    args = ["new", "rides", "--from", str(source), "--label", "rides", "--time", "ts", "--months", "0"]
    return main([*args, "--root", str(root)])


def test_a_stuck_sensor_impossible_zeros_and_missing_periods_are_found_named_and_ruled(tmp_path):
    """Issue 61 item 11: on a real hourly table keel new said "no gaps, defects found: none" beside a day of humidity
    0, wind readings of exactly 0 and 115 missing hours. Each is found, named in PROFILE.md with its evidence and
    given a rule (the missing periods: named — no row to judge); every row still ends in exactly one sink."""
    source = tmp_path / "rides.csv"
    table = hourly_table(source)
    assert new_rides(source, tmp_path) == 0
    folder = tmp_path / "usecases" / "rides"
    profile = (folder / "PROFILE.md").read_text()
    assert f"humidity: stuck on 1 day ({STUCK_DAY} at 0; 24 rows)" in profile
    assert "windspeed: " in profile and "read exactly 0 while its values never come near it" in profile
    assert "2021-06-07 … 2021-06-13" in profile  # the missing week
    assert "ts: 30 hours without a row in an hourly table" in profile  # the single hours, besides the week
    assert "humidity: " in profile and "temp: stuck" not in profile and "rides: stuck" not in profile
    spec = load_contract(folder / "contracts" / "rides.yaml")
    rules = {r.id: r for r in spec.rules}
    assert (rules["humidity_stuck"].type, rules["humidity_stuck"].action) == ("stuck", "flag")
    assert rules["windspeed_not_zero"].type == "condition" and "temp_not_zero" not in rules
    # the rules as the contract runs them: the stuck day's 24 rows fail it, the zero readings fail theirs
    contract = CompiledContract(spec)
    uc = _import(tmp_path, "rides").usecase
    valid, quarantined, rejected, stuck, zeros = [], [], 0, 0, 0
    for month in uc.months:
        result = contract.validate(uc.source("rides").read_month(month))
        valid.append(result.valid)
        quarantined.append(result.quarantine)
        rejected += result.report.rejected
        counts = {r.id: r.failed for r in result.report.rules}
        stuck += counts.get("humidity_stuck", 0)
        zeros += counts.get("windspeed_not_zero", 0)
    assert stuck == 24
    assert zeros == table.filter(pl.col("windspeed") == 0).height
    assert sum(v.height for v in valid) + sum(q.height for q in quarantined) + rejected == table.height


def test_a_table_without_an_entity_is_keyed_by_its_time_and_a_part_of_the_time_is_held_to_it(tmp_path):
    """Issue 61 item 12: requests were keyed by the file's row number (``row_ref``), which no caller has, and an hour
    column of 100 was scored. An hourly table with no entity is keyed by its time; ``hr`` is the hour of ``ts`` on
    every row, so both contracts hold it to it, and its range is the hours it holds."""
    source = tmp_path / "rides.csv"
    hourly_table(source)
    assert new_rides(source, tmp_path) == 0
    uc = _import(tmp_path, "rides").usecase
    entity = uc.features.entity
    assert entity.key.columns == () and entity.key.time == "ts" and "row_ref" not in entity.request_columns
    request = CompiledContract(load_contract(tmp_path / "usecases" / "rides" / "contracts" / "request.yaml"))
    assert "row_ref" not in request.spec.column_names
    [asked] = uc.replay.requests("2021-11", limit=1)
    assert asked["ts"] == "2021-11-01 00:00:00"  # what the caller has and sends: the hour it asks about …
    assert entity.key.of(request.validate(pl.DataFrame([asked])).valid.row(0, named=True)) == "2021-11-01T00:00:00Z"
    assert request.validate(pl.DataFrame([asked])).valid.height == 1
    for wrong in ({"hr": 5}, {"hr": 100}):  # another hour than its ts, an hour that is none
        checked = request.validate(pl.DataFrame([asked | wrong]))
        assert checked.valid.height == 0, wrong
    rules = {r.id: r for r in request.spec.rules}
    assert rules["hr_is_the_hour"].params["parts"] == {"hour": "hr"}
    assert (rules["hr_range"].params["min"], rules["hr_range"].params["max"]) == (0, 23)


def test_keel_contracts_validate_on_the_users_own_file_judges_it_as_the_pipeline_does(
    generated,  # noqa: F811 - the shared fixture (tests/test_keel_new.py)
    tmp_path,
    capsys,
):
    """Issue 61 item 13: ``keel contracts validate`` of the user's own CSV against the contract keel new wrote
    quarantined 100 % — the contract needs columns only keel's reader adds (the day's parts, the row number) and
    names columns as keel does (``unit_price`` for ``Unit Price``). Now those are read as the contract names them
    and derived as the reader derives them: the same sinks as the pipeline's (every row in exactly one)."""
    root, table = generated
    out = tmp_path / "out"
    code = main(
        [
            "contracts",
            "validate",
            "--contract",
            str(root / "usecases" / "shop" / "contracts" / "shop.yaml"),
            "--data",
            str(root / "shop_sales.csv"),
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "'Unit Price' as unit_price" in printed and "derived" in printed and "row_ref" in printed
    valid, quarantine = pl.read_parquet(out / "valid.parquet"), pl.read_parquet(out / "quarantine.parquet")
    rejected = pl.read_parquet(out / "rejected.parquet")
    assert valid.height + quarantine.height + rejected.height == table.height
    by_rule = dict(quarantine.group_by("_rule_id").len().iter_rows())
    assert by_rule == {"units_range": 1, "one_row_once": 3, "schema_not_null_sales": 2}
