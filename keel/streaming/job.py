"""The streaming job: a contract compiled to Flink SQL validates a stream, sends each row to exactly one sink, and
computes windowed drift on event time. Runs in the Flink environment (.venv-flink), on Flink's local mini-cluster by
default or a remote cluster (``--jobmanager host:port``):

    .venv-flink/bin/python -m keel.streaming.job --contract usecases/flights/contracts/weather.yaml \
        --input rows.csv --out out/ [--skip RULE …] [--parallelism 2] \
        [--event-time time_hour --window-s 10 --reference reference.json]

Source: a CSV file (first column ``_source_row``, then the contract's columns in its order, no header, empty =
null) through Flink's filesystem connector; the Kafka connector is a configuration of the same table
(``--kafka-topic``, ``--kafka-bootstrap``, and the connector jar with ``--jars``; not exercised here: no Kafka). Flink's
distribution has no socket SQL connector; a socket feed reaches the job through a file or Kafka.
Sinks: ``valid.parquet``, ``quarantine.parquet`` (the batch path's quarantine layout), ``rejected.parquet``, written
atomically by the driver as the job's results arrive; ``drift.json`` (per window and feature: bin counts, PSI);
``report.json`` last: rows in, per sink, per rule, elapsed, events/s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path


def build_env(parallelism: int, jobmanager: str | None, jars: list[str] = ()):
    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    config.set("parallelism.default", str(parallelism))
    config.set("python.fn-execution.bundle.size", "10000")
    config.set("execution.checkpointing.interval", "2s")  # commits the filesystem sinks' files
    if jars:
        config.set("pipeline.jars", ";".join(Path(j).resolve().as_uri() for j in jars))
    if jobmanager:
        host, port = jobmanager.rsplit(":", 1)
        config.set("rest.address", host)
        config.set("rest.port", port)
        config.set("execution.target", "remote")
    return env


def source_ddl(plan, path: str, event_time: str | None, watermark_s: float, args) -> str:
    cols = ["`_source_row` BIGINT"] + [f"`{c}` STRING" for c in plan.contract.column_names]
    if event_time:
        from keel.streaming.contract_sql import java_pattern

        fmt = plan.contract.column(event_time).format or "%Y-%m-%dT%H:%M:%S"
        parsed = (
            f"TO_TIMESTAMP(NULLIF(TRIM(`{event_time}`), ''), '{java_pattern(fmt).replace(chr(39), chr(39) * 2)}')"
        )
        # A row time cannot be null; a row whose event time does not parse is quarantined by its schema rule, and
        # the epoch keeps it out of every window (late) without holding the watermark back.
        cols.append(f"`__et` AS COALESCE({parsed}, TIMESTAMP '1970-01-01 00:00:00')")
        cols.append(f"WATERMARK FOR `__et` AS `__et` - INTERVAL '{int(watermark_s)}' SECOND")
    if args.kafka_topic:
        conn = (f"'connector' = 'kafka', 'topic' = '{args.kafka_topic}', 'properties.bootstrap.servers' = "
                f"'{args.kafka_bootstrap}', 'scan.startup.mode' = 'earliest-offset', 'format' = 'csv'")  # fmt: skip
    else:
        conn = f"'connector' = 'filesystem', 'path' = '{path}', 'format' = 'csv'"
    return (
        f"CREATE TEMPORARY TABLE src ({', '.join(cols)}) WITH ({conn}, 'csv.null-literal' = '', "
        f"'csv.ignore-parse-errors' = 'false')"
    )


def interval(seconds: float) -> str:
    """A Flink SQL interval literal in the largest unit that divides it (SECOND(2) holds only 99 s)."""
    n = int(seconds)
    for unit, size in (("DAY", 86400), ("HOUR", 3600), ("MINUTE", 60)):
        if n % size == 0 and n >= size:
            return f"INTERVAL '{n // size}' {unit}"
    return f"INTERVAL '{n}' SECOND(9)" if n > 99 else f"INTERVAL '{n}' SECOND"


def register_regex_udfs(env, plan) -> None:
    if not plan.regex_rules:
        return
    from pyflink.table import DataTypes
    from pyflink.table.udf import udf

    for i, (_rule, _col, pattern) in enumerate(plan.regex_rules):

        def make(p):
            compiled: dict = {}  # compiled in each Python worker: a compiled pattern cannot be pickled to it

            def matches(series):  # vectorised: one pandas Series per Arrow batch
                import flpc
                import pandas as pd

                regex = compiled.get("re") or compiled.setdefault("re", flpc.compile(p))
                return pd.Series([bool(flpc.search(regex, v)) if v is not None else True for v in series])

            return matches

        env.create_temporary_function(
            f"keel_regex_{i}", udf(make(pattern), result_type=DataTypes.BOOLEAN(), func_type="pandas")
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keel.streaming.job", description=__doc__.split("\n\n")[0])
    parser.add_argument("--contract", required=True, type=Path)
    parser.add_argument("--input", type=Path, help="CSV: _source_row, then the contract's columns; no header")
    parser.add_argument(
        "--kafka-topic", help="read the CSV lines from Kafka (needs the Kafka SQL connector jar, --jars)"
    )
    parser.add_argument("--kafka-bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--jars", nargs="*", default=[], help="connector jars for Flink's classpath (pipeline.jars)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument(
        "--skip", nargs="*", default=[], help="rule ids with no streaming form, skipped in both paths"
    )
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument("--jobmanager", help="host:port of a remote Flink cluster (default: local mini-cluster)")
    parser.add_argument("--event-time", help="the contract's datetime column windows are on")
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--watermark-s", type=float, default=5.0)
    parser.add_argument("--reference", type=Path, help="reference bins (JSON) for windowed drift")
    parser.add_argument(
        "--request-features",
        metavar="USECASE_MODULE",
        help="add the request features of a use case (its package: usecases.<name>) to valid",
    )
    args = parser.parse_args(argv)

    import polars as pl

    from keel.contracts.spec import load_contract
    from keel.storage import write_json_atomic, write_parquet_atomic
    from keel.streaming.contract_sql import SQL_TYPES, compile_contract
    from keel.streaming.drift_windows import bin_case_sql, psi

    spec = load_contract(args.contract)
    plan = compile_contract(spec, skip=set(args.skip))
    started = time.perf_counter()
    env = build_env(args.parallelism, args.jobmanager, args.jars)
    env.execute_sql(
        source_ddl(plan, str(args.input.resolve()) if args.input else "", args.event_time, args.watermark_s, args)
    )
    register_regex_udfs(env, plan)
    print(f"keel stream: {spec.name} contract → {len(plan.rules)} rules in Flink SQL "
          f"({len(plan.regex_rules)} as flpc UDFs), parallelism {args.parallelism}", flush=True)  # fmt: skip

    # One job, one pass over the source: every sink is an INSERT of the same statement set, written by Flink's
    # filesystem connector (checkpoints commit the files; the end of a bounded source commits the last ones).
    sinks = args.out / "_flink"
    shutil.rmtree(sinks, ignore_errors=True)
    cols = list(spec.column_names)
    types = {c.name: SQL_TYPES[c.dtype] for c in spec.columns}
    env.create_temporary_view("checked", env.sql_query(plan.select_sql("src", ("__et",) if args.event_time else ())))

    def sink(name: str, columns: list[tuple[str, str]]) -> None:
        ddl = ", ".join(f"`{c}` {t}" for c, t in columns)
        env.execute_sql(
            f"CREATE TEMPORARY TABLE {name} ({ddl}) WITH ('connector' = 'filesystem', 'path' = "
            f"'{(sinks / name).as_posix()}', 'format' = 'csv', 'csv.null-literal' = '\\N')"
        )

    meta = ["_rule_id", "_failed_rules", "_severity", "_reason"]
    features = {}
    if args.request_features:
        from keel.streaming.features_sql import request_feature_sql
        from keel.usecase import from_module

        fs = from_module(args.request_features).features
        features = {
            f"feature_{n}": e for n, e in request_feature_sql(fs).items()
        }  # month etc. are contract columns too
    feature_types = {
        n: "INT" if fs.by_name[n.removeprefix("feature_")].dtype == "int" else "DOUBLE" for n in features
    }
    sink("valid_sink", [("_source_row", "BIGINT")] + [(c, types[c]) for c in cols] + list(feature_types.items()))
    sink(
        "quarantine_sink", [("_source_row", "BIGINT")] + [(c, "STRING") for c in cols] + [(m, "STRING") for m in meta]
    )
    sink("rejected_sink", [("_source_row", "BIGINT"), ("_rule_id", "STRING"), ("_failed_rules", "STRING")])
    statements = env.create_statement_set()
    feature_sql = "".join(f", {e} AS `{n}`" for n, e in features.items())
    names = ", ".join(f"`{c}`" for c in cols)
    raws = ", ".join(f"`__raw_{c}`" for c in cols)
    statements.add_insert_sql(
        f"INSERT INTO valid_sink SELECT _source_row, {names}{feature_sql} FROM checked WHERE _sink = 'valid'"
    )
    statements.add_insert_sql(
        f"INSERT INTO quarantine_sink SELECT _source_row, {raws}, {', '.join(meta)} FROM checked "
        "WHERE _sink = 'quarantine'"
    )
    statements.add_insert_sql(
        "INSERT INTO rejected_sink SELECT _source_row, _reject_rule_id, _failed_rules FROM checked "
        "WHERE _sink = 'rejected'"
    )
    reference = json.loads(args.reference.read_text()) if args.event_time and args.reference else None
    if reference:
        bins = [b for f, ref in reference.items() for b in bin_case_sql(f, ref["edges"])]
        bin_cols = [f"{f}__b{i}" for f, ref in reference.items() for i in range(len(ref["edges"]) + 1)]
        sink("drift_sink", [("window_start", "TIMESTAMP(3)"), ("n", "BIGINT")] + [(b, "INT") for b in bin_cols])
        statements.add_insert_sql(
            f"INSERT INTO drift_sink SELECT window_start, COUNT(*) AS n, {', '.join(bins)} FROM TABLE(TUMBLE("
            f"(SELECT * FROM checked WHERE _sink = 'valid'), DESCRIPTOR(`__et`), {interval(args.window_s)})) "
            "GROUP BY window_start, window_end"
        )
    statements.execute().wait()
    elapsed = time.perf_counter() - started

    def read(name: str, schema: dict) -> pl.DataFrame:
        files = [f for f in sorted((sinks / name).rglob("*")) if f.is_file() and not f.name.startswith(".")]
        frames = [
            pl.read_csv(f, has_header=False, new_columns=list(schema), schema_overrides=schema, null_values=["\\N"])
            for f in files
            if f.stat().st_size
        ]
        return pl.concat(frames) if frames else pl.DataFrame(schema=schema)

    polars_types = {c.name: (pl.String if c.dtype in ("datetime", "date") else c.polars_dtype) for c in spec.columns}
    feature_polars = {n: pl.Int32 if t == "INT" else pl.Float64 for n, t in feature_types.items()}
    valid = read("valid_sink", {"_source_row": pl.Int64} | polars_types | feature_polars).sort("_source_row")
    for c in spec.columns:
        if c.dtype == "datetime":
            valid = valid.with_columns(pl.col(c.name).str.to_datetime(strict=False, time_unit="us"))
    q = read(
        "quarantine_sink", {"_source_row": pl.Int64} | {c: pl.String for c in cols} | {m: pl.String for m in meta}
    )
    quarantine = q.sort("_source_row").select(
        *cols,
        pl.lit(spec.name).alias("_contract"),
        pl.lit(spec.version, pl.Int64).alias("_contract_version"),
        pl.lit(spec.content_hash).alias("_contract_hash"),
        *meta,
        pl.lit(None, pl.String).alias("_partition"),
        pl.col("_source_row"),
        pl.lit(None, pl.String).alias("_extra_columns"),
        pl.lit("pending").alias("_replay_status"),
        pl.lit(datetime.now(UTC)).cast(pl.Datetime("us", "UTC")).alias("_quarantined_at"),
    )  # fmt: skip
    rejected = read("rejected_sink", {"_source_row": pl.Int64, "_rule_id": pl.String, "_failed_rules": pl.String})
    write_parquet_atomic(valid, args.out / "valid.parquet")
    write_parquet_atomic(quarantine, args.out / "quarantine.parquet")
    write_parquet_atomic(rejected.sort("_source_row"), args.out / "rejected.parquet")
    drift = []
    if reference:
        windows = read("drift_sink", {"window_start": pl.String, "n": pl.Int64} | {b: pl.Int64 for b in bin_cols})
        for r in windows.sort("window_start").iter_rows(named=True):
            start = datetime.fromisoformat(r["window_start"]).isoformat()
            entry = {"window_start": start, "rows": int(r["n"]), "features": {}}
            for f, ref in reference.items():
                counts = [int(r[f"{f}__b{i}"]) for i in range(len(ref["edges"]) + 1)]
                entry["features"][f] = {"counts": counts, "psi": psi(counts, ref["shares"])}
            drift.append(entry)
        write_json_atomic(drift, args.out / "drift.json")
    shutil.rmtree(sinks, ignore_errors=True)
    frame = pl.concat([valid.select("_source_row"), quarantine.select("_source_row"), rejected.select("_source_row")])
    failed = pl.concat([quarantine.select("_failed_rules"), rejected.select("_failed_rules")])
    total = time.perf_counter() - started
    report = {
        "contract": spec.name,
        "rows_in": frame.height,
        "valid": valid.height,
        "quarantined": quarantine.height,
        "rejected": rejected.height,
        "rules": {
            r.id: int(failed["_failed_rules"].cast(pl.String).str.contains(rf"(^|,){r.id}(,|$)").sum())
            for r in plan.rules
        }
        if frame.height
        else {},
        "skipped_rules": list(args.skip),
        "parallelism": args.parallelism,
        "validation_s": round(elapsed, 3),
        "total_s": round(total, 3),
        "events_per_s": round(frame.height / elapsed, 1) if elapsed > 0 else None,
        "windows": len(drift),
    }
    write_json_atomic(report, args.out / "report.json")
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
