"""Contract validation speed: keel vs hand-written polars (the floor) vs pandera-polars vs Great Expectations.

All four run in this one process, on the same flights-shaped data (real 2013 flights resampled to N rows, with
defects injected at known rates) and the same 12 rules (bench/contracts_bench.yaml). keel and the floor produce
the same outputs — valid rows, quarantined rows with the failing rule, per-rule counts — and the script checks that
their counts agree before it prints a ratio. pandera-polars is timed for validate(lazy=True) plus splitting off
the failing rows by its failure-case indices; Great Expectations for one validation run of an equivalent suite
(counts only: it does not split rows) on a pandas frame, the conversion not timed.

Also measured: single-record validation latency (keel's serving path), p50/p99 over real records.

    .venv/bin/python bench/contracts.py                 # 1M and 10M rows, ~5 minutes on 2 cores
    .venv/bin/python bench/contracts.py --rows 100000   # a quick run
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from keel.contracts.engine import CompiledContract  # noqa: E402
from keel.contracts.spec import load_contract  # noqa: E402
from usecases.flights import usecase as FLIGHTS  # noqa: E402
from usecases.flights.data import read_raw  # noqa: E402

HERE = Path(__file__).resolve().parent
CONTRACT = HERE / "contracts_bench.yaml"
COLUMNS = [
    "year", "month", "day", "dep_time", "sched_dep_time", "dep_delay", "arr_time", "sched_arr_time", "arr_delay",
    "carrier", "flight", "tailnum", "origin", "dest", "air_time", "distance", "hour", "minute",
]  # fmt: skip


def flights_like(rows: int, seed: int = 2013) -> pl.DataFrame:
    """Real flights, typed, resampled to ``rows``, with defects injected at known rates."""
    spec = load_contract(CONTRACT)
    raw = read_raw("flights").select(COLUMNS)
    typed = raw.select([pl.col(c.name).cast(c.polars_dtype, strict=False) for c in spec.columns])
    rng = np.random.default_rng(seed)
    df = typed[rng.integers(0, typed.height, rows)]
    bad = lambda p: pl.Series(rng.random(rows) < p)  # noqa: E731
    return df.with_columns(
        pl.when(bad(0.002)).then(pl.lit(9999.0)).otherwise("dep_delay").alias("dep_delay"),
        pl.when(bad(0.001)).then(pl.lit("u$")).otherwise("carrier").alias("carrier"),
        pl.when(bad(0.001)).then(pl.lit("XXXX")).otherwise("dest").alias("dest"),
        pl.when(bad(0.0005)).then(pl.lit("N1234567")).otherwise("tailnum").alias("tailnum"),
        pl.when(bad(0.0005)).then(pl.lit(2500, dtype=pl.Int32)).otherwise("dep_time").alias("dep_time"),
    )


# -- the floor: the same rules written by hand as polars expressions ---------------------------------------------


def floor_rules() -> dict[str, pl.Expr]:
    c = pl.col
    return {
        "schema_not_null_carrier": c("carrier").is_null(),
        "schema_type_carrier": c("carrier").str.contains("\ufffd", literal=True).fill_null(False),
        "schema_type_tailnum": c("tailnum").str.contains("\ufffd", literal=True).fill_null(False),
        "schema_type_origin": c("origin").str.contains("\ufffd", literal=True).fill_null(False),
        "schema_type_dest": c("dest").str.contains("\ufffd", literal=True).fill_null(False),
        "dep_time_hhmm": ((c("dep_time") < 1) | (c("dep_time") > 2400)).fill_null(False),
        "arr_time_hhmm": ((c("arr_time") < 1) | (c("arr_time") > 2400)).fill_null(False),
        "dep_delay_plausible": ((c("dep_delay") < -120) | (c("dep_delay") > 1440)).fill_null(False),
        "hour_of_day": ((c("hour") < 0) | (c("hour") > 23)).fill_null(False),
        "distance_positive": ((c("distance") <= 0) | (c("distance") > 5000)).fill_null(False),
        "carrier_code": (c("carrier").is_not_null() & ~c("carrier").str.contains("^[A-Z0-9]{2}$")).fill_null(False),
        "dest_faa_code": (c("dest").is_not_null() & ~c("dest").str.contains("^[A-Z]{3}$")).fill_null(False),
        "origin_airport": (c("origin").is_not_null() & ~c("origin").is_in(["EWR", "JFK", "LGA"])).fill_null(False),
        "tailnum_length": (c("tailnum").str.len_chars() > 6).fill_null(False),
        "tailnum_present": c("tailnum").is_null(),
        "departed_has_arrival": (c("dep_time").is_not_null() & c("arr_delay").is_null()),
        "cancelled_has_no_arrival": (c("dep_time").is_null() & c("arr_time").is_not_null()),
    }


def run_floor(df: pl.DataFrame) -> dict[str, int]:
    rules = floor_rules()
    masked = df.with_row_index("_source_row").with_columns([e.alias("__" + k) for k, e in rules.items()])
    bad = pl.any_horizontal([pl.col("__" + k) for k in rules])
    counts = masked.select([pl.col("__" + k).sum().alias(k) for k in rules]).row(0, named=True)
    valid = masked.filter(~bad).select(COLUMNS + ["_source_row"])
    first = pl.coalesce([pl.when(pl.col("__" + k)).then(pl.lit(k)) for k in rules])
    quarantine = masked.filter(bad).select(
        [pl.col(c).cast(pl.String) for c in COLUMNS] + ["_source_row", first.alias("_rule_id")]
    )
    return counts | {"valid": valid.height, "quarantined": quarantine.height}


def run_keel(compiled: CompiledContract, df: pl.DataFrame) -> dict[str, int]:
    result = compiled.validate(df)
    rep = result.report
    return {r.id: r.failed for r in rep.rules} | {"valid": rep.valid, "quarantined": rep.quarantined}


# -- pandera (polars backend) -------------------------------------------------------------------------------------


def pandera_schema():
    import pandera.polars as pa

    def frame_check(expr: pl.Expr):
        return pa.Check(lambda data: data.lazyframe.select(expr))

    return pa.DataFrameSchema(
        {
            "dep_time": pa.Column(pl.Int32, pa.Check.in_range(1, 2400), nullable=True),
            "arr_time": pa.Column(pl.Int32, pa.Check.in_range(1, 2400), nullable=True),
            "dep_delay": pa.Column(pl.Float64, pa.Check.in_range(-120, 1440), nullable=True),
            "hour": pa.Column(pl.Int32, pa.Check.in_range(0, 23), nullable=True),
            "distance": pa.Column(pl.Float64, [pa.Check.gt(0), pa.Check.le(5000)], nullable=True),
            "carrier": pa.Column(pl.String, pa.Check.str_matches(r"^[A-Z0-9]{2}$"), nullable=False),
            "dest": pa.Column(pl.String, pa.Check.str_matches(r"^[A-Z]{3}$"), nullable=True),
            "origin": pa.Column(pl.String, pa.Check.isin(["EWR", "JFK", "LGA"]), nullable=True),
            "tailnum": pa.Column(pl.String, pa.Check.str_length(max_value=6), nullable=False),
        },
        checks=[
            frame_check(~(pl.col("dep_time").is_not_null() & pl.col("arr_delay").is_null())),
            frame_check(~(pl.col("dep_time").is_null() & pl.col("arr_time").is_not_null())),
            # keel's schema rule for strings: no U+FFFD (invalid UTF-8 replaced when read) — same work for everyone
            *[
                frame_check(~pl.col(c).str.contains("\ufffd", literal=True).fill_null(False))
                for c in ("carrier", "tailnum", "origin", "dest")
            ],
        ],
    )


def run_pandera(schema, df: pl.DataFrame) -> dict[str, int]:
    import pandera.errors

    try:
        schema.validate(df, lazy=True)
        failing = pl.Series("index", [], dtype=pl.Int64)
    except pandera.errors.SchemaErrors as exc:
        failing = exc.failure_cases["index"].drop_nulls().cast(pl.Int64).unique()
    valid = df.with_row_index("_i").filter(~pl.col("_i").is_in(failing.implode()))
    return {"valid": valid.height, "quarantined": df.height - valid.height}


# -- Great Expectations -------------------------------------------------------------------------------------------


def ge_validation():
    import great_expectations as gx

    ctx = gx.get_context(mode="ephemeral")
    batch = (
        ctx.data_sources.add_pandas("bench")
        .add_dataframe_asset("flights")
        .add_batch_definition_whole_dataframe("all")
    )
    suite = ctx.suites.add(gx.ExpectationSuite(name="flights_bench"))
    e = gx.expectations
    for col, lo, hi in (("dep_time", 1, 2400), ("arr_time", 1, 2400), ("dep_delay", -120, 1440), ("hour", 0, 23)):
        suite.add_expectation(e.ExpectColumnValuesToBeBetween(column=col, min_value=lo, max_value=hi))
    suite.add_expectation(
        e.ExpectColumnValuesToBeBetween(column="distance", min_value=0, max_value=5000, strict_min=True)
    )
    suite.add_expectation(e.ExpectColumnValuesToMatchRegex(column="carrier", regex=r"^[A-Z0-9]{2}$"))
    suite.add_expectation(e.ExpectColumnValuesToMatchRegex(column="dest", regex=r"^[A-Z]{3}$"))
    suite.add_expectation(e.ExpectColumnValuesToBeInSet(column="origin", value_set=["EWR", "JFK", "LGA"]))
    suite.add_expectation(e.ExpectColumnValueLengthsToBeBetween(column="tailnum", max_value=6))
    suite.add_expectation(e.ExpectColumnValuesToNotBeNull(column="tailnum"))
    suite.add_expectation(e.ExpectColumnValuesToNotBeNull(column="carrier"))
    suite.add_expectation(
        e.ExpectColumnValuesToNotBeNull(
            column="arr_delay", row_condition="dep_time.notnull()", condition_parser="pandas"
        )
    )
    suite.add_expectation(
        e.ExpectColumnValuesToBeNull(column="arr_time", row_condition="dep_time.isnull()", condition_parser="pandas")
    )
    return ctx.validation_definitions.add(gx.ValidationDefinition(name="flights_bench", data=batch, suite=suite))


def run_ge(validation, pdf) -> dict[str, int]:
    result = validation.run(batch_parameters={"dataframe": pdf}, result_format="SUMMARY")
    return {"unexpected_total": sum(r.result.get("unexpected_count") or 0 for r in result.results)}


# -- timing -------------------------------------------------------------------------------------------------------


def interleaved(fns: dict[str, object], repeats: int) -> dict[str, tuple[float, object]]:
    """Median time of each function, run in alternating rounds so that machine noise hits all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    outs: dict[str, object] = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            gc.collect()
            t = time.perf_counter()
            outs[name] = fn()
            times[name].append(time.perf_counter() - t)
    return {name: (statistics.median(times[name]), outs[name]) for name in fns}


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        gc.collect()
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def record_latency(n: int = 20_000) -> dict[str, float]:
    spec = load_contract(FLIGHTS.contract_path("flights"))
    compiled = CompiledContract(spec)
    refs = {"planes.tailnum": read_raw("planes")["tailnum"]}
    raw = read_raw("flights").drop("_source_row").sample(n, seed=1)
    typed = compiled.validate(read_raw("flights").sample(n, seed=1), references=refs).valid.drop(
        "_source_row", "_enriched"
    )
    out = {}
    for label, frame in (("typed", typed), ("text", raw)):
        records = frame.to_dicts()
        for r in records[:500]:
            compiled.validate_record(r, references=refs)
        lat = []
        for r in records:
            t = time.perf_counter()
            compiled.validate_record(r, references=refs)
            lat.append(time.perf_counter() - t)
        lat.sort()
        out[f"{label}_p50_ms"] = lat[len(lat) // 2] * 1e3
        out[f"{label}_p99_ms"] = lat[int(len(lat) * 0.99)] * 1e3
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1000000,10000000", help="comma-separated row counts")
    parser.add_argument("--repeats", type=int, default=7, help="rounds of keel/floor/pandera; medians are reported")
    parser.add_argument("--ge-max-rows", type=int, default=10_000_000, help="skip Great Expectations above this size")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "contracts.json")
    args = parser.parse_args()

    compiled = CompiledContract(load_contract(CONTRACT))
    schema = pandera_schema()
    validation = ge_validation()
    results = []
    for rows in (int(x) for x in args.rows.split(",")):
        print(f"\n== {rows:,} rows, 12 rules (2 regex, 2 conditions) ==", flush=True)
        df = flights_like(rows)
        measured = interleaved(
            {
                "keel": lambda df=df: run_keel(compiled, df),
                "floor": lambda df=df: run_floor(df),
                "pandera": lambda df=df: run_pandera(schema, df),
            },
            args.repeats,
        )
        (t_keel, keel_out), (t_floor, floor_out), (t_pandera, pandera_out) = (
            measured[k] for k in ("keel", "floor", "pandera")
        )
        mismatch = {k: (keel_out[k], v) for k, v in floor_out.items() if keel_out.get(k) != v}
        if mismatch:
            print(f"keel and the floor disagree: {mismatch}", file=sys.stderr)
            return 1
        row = {
            "rows": rows,
            "keel_s": t_keel,
            "floor_s": t_floor,
            "pandera_s": t_pandera,
            "quarantined": keel_out["quarantined"],
        }
        row["pandera_flagged"] = pandera_out["quarantined"]
        if rows <= args.ge_max_rows:
            pdf = df.to_pandas()
            t_ge, ge_out = timed(lambda pdf=pdf: run_ge(validation, pdf), 1)
            row["ge_s"] = t_ge
            del pdf
        for name in ("keel", "floor", "pandera", "ge"):
            if f"{name}_s" in row:
                print(
                    f"  {name:<8} {row[f'{name}_s']:8.3f} s   {rows / row[f'{name}_s'] / 1e6:8.2f} M rows/s",
                    flush=True,
                )
        print(f"  keel / floor     = {t_keel / t_floor:.2f}x   (target ≤ 1.30x)")
        print(f"  pandera / keel   = {t_pandera / t_keel:.1f}x   (target ≥ 3x)")
        if "ge_s" in row:
            print(f"  GE / keel        = {row['ge_s'] / t_keel:.1f}x")
        print(
            f"  rows quarantined: keel {keel_out['quarantined']:,} = floor {floor_out['quarantined']:,}; pandera flagged {pandera_out['quarantined']:,}"
        )
        results.append(row)
        del df
    print("\n== single-record validation (flights contract, 20,000 real records) ==", flush=True)
    latency = record_latency()
    for k, v in latency.items():
        print(f"  {k:<14} {v:.3f} ms")
    print("  target: p99 ≤ 1 ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"batch": results, "record": latency}, indent=2))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
