"""Property tests: whatever a frame looks like, validation never crashes and never loses or duplicates a row."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keel.contracts.engine import SOURCE_ROW, PartitionWindow
from tests.conftest import make_contract

CONTRACT = make_contract(
    """
    k: {type: int64, nullable: false}
    x: {type: float64}
    s: {type: string}
    t: {type: datetime, format: '%Y-%m-%dT%H:%M:%S'}
    flag: {type: bool}
    """,
    """
    - {id: x_range, type: range, column: x, min: -100, max: 100}
    - {id: s_code, type: regex, column: s, pattern: '^[a-z]+$', severity: warning, action: reject}
    - {id: s_short, type: max_length, column: s, max: 20, severity: warning, action: quarantine}
    - {id: s_fill, type: not_null, column: s, severity: warning, action: enrich, enrich: {column: s, prefix: 'unknown_', md5_of: [k]}}
    - {id: k_unique, type: unique, columns: k, severity: warning, action: quarantine}
    - {id: x_money, type: decimal, column: x, precision: 6, scale: 2, severity: info, action: flag}
    - {id: fresh, type: freshness, column: t, max_age: 30d}
    - {id: s_set, type: in_set, column: s, values: [abc, def], severity: info, action: flag}
    - {id: cond, type: condition, expr: x > 0 when flag == true, severity: warning, action: reject}
    """,
)
WINDOW = PartitionWindow("2013-01", datetime(2013, 1, 1, tzinfo=UTC), datetime(2013, 2, 1, tzinfo=UTC))

ints = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))
floats = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True))
texts = st.one_of(
    st.none(),
    st.text(max_size=30),
    st.sampled_from(["1", "1.5", "nan", "-inf", "abc", "true", "2013-01-05T10:00:00", ""]),
)
bools = st.one_of(st.none(), st.booleans())
lists = st.one_of(st.none(), st.lists(st.integers(0, 5), max_size=3))
COLUMN_KINDS = {
    "int": (ints, pl.Int64),
    "float": (floats, pl.Float64),
    "text": (texts, pl.String),
    "bool": (bools, pl.Boolean),
    "list": (lists, pl.List(pl.Int64)),
}


@st.composite
def malformed_frames(draw) -> pl.DataFrame:
    n = draw(st.integers(0, 40))
    names = draw(st.lists(st.sampled_from(["k", "x", "s", "t", "flag", "extra", "k2"]), unique=True, max_size=7))
    data = {}
    for name in names:
        kind = draw(st.sampled_from(sorted(COLUMN_KINDS)))
        strategy, dtype = COLUMN_KINDS[kind]
        data[name] = pl.Series(name, draw(st.lists(strategy, min_size=n, max_size=n)), dtype=dtype)
    return pl.DataFrame(data) if data else pl.DataFrame({"k": pl.Series([None] * n, dtype=pl.Int64)})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(malformed_frames(), st.booleans())
def test_every_row_ends_in_exactly_one_sink(df, dry_run):
    result = CONTRACT.validate(df, WINDOW, dry_run=dry_run)
    rep = result.report
    rows = [r[SOURCE_ROW].to_list() for r in (result.valid, result.quarantine, result.rejected)]
    everything = sorted(rows[0] + rows[1] + rows[2])
    assert everything == list(range(df.height)), "a row was lost or duplicated"
    assert rep.conserved and rep.rows_in == df.height
    assert (rep.valid, rep.quarantined, rep.rejected) == tuple(len(r) for r in rows)
    # outputs always have the contract's schema, so partitions can be concatenated
    assert result.valid.columns[: len(CONTRACT.spec.columns)] == list(CONTRACT.spec.column_names)
    assert result.valid.schema["k"] == pl.Int64 and result.valid.schema["t"] == pl.Datetime("us", "UTC")


@settings(max_examples=200, deadline=None)
@given(malformed_frames())
def test_single_record_gets_the_batch_verdict(df):
    """Each row validated alone lands in the same sink as in the batch (unique is the one batch-only rule)."""
    batch = CONTRACT.validate(df, WINDOW)
    sink_of = {}
    for name, frame in (("valid", batch.valid), ("quarantine", batch.quarantine), ("rejected", batch.rejected)):
        for row in frame[SOURCE_ROW].to_list():
            sink_of[row] = name
    unique_failures = set(
        batch.quarantine.filter(pl.col("_failed_rules").str.contains("k_unique"))[SOURCE_ROW].to_list()
    )
    for i, record in enumerate(df.iter_rows(named=True)):
        if i in unique_failures:
            continue
        verdict = CONTRACT.validate_record(record, WINDOW)
        # a one-row frame built from Python values can only widen types (e.g. a null column), never narrow them
        assert verdict.sink == sink_of[i], (record, verdict.failed_rules)
