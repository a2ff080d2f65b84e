"""The streaming path in the asset graph: the weather contract compiled to Flink SQL validates a month of raw
readings as a stream (event time, watermarks) on Flink, next to the batch path's validated_weather.

``stream_validated_weather`` and ``stream_weather_quarantine`` are the Flink job's sinks (the same layouts as the
batch path's); their metadata carries the job's throughput and lag and whether its split equals the batch path's
for the same partition. They need the Flink environment (``KEEL_WITH_FLINK=1 scripts/setup``) and are materialized
on demand (tag keel/backfill: skip), not by the 2013 backfill.
"""

import json
import tempfile
import time
from pathlib import Path

import dagster as dg
import polars as pl

from assets.partitions import monthly_2013
from assets.raw import RAW_WEATHER
from assets.usecase import group, key
from assets.validated import VALIDATED_WEATHER
from keel.contracts.catalog import contract_path
from keel.contracts.spec import load_contract
from keel.streaming.drift_windows import reference_bins
from resources.flink import FlinkResource

STREAMING_GROUP = group("streaming")
CONTRACT = contract_path("weather")
# Partition-wide rules (a unique key over the month, freshness against the partition window) have no streaming form:
# the stream skips them, and its parity with the batch path is over the other 33.
SKIP = ["one_reading_per_local_hour", "observed_in_window"]
DRIFT_FEATURES = ["temp", "humid", "wind_speed", "visib"]


@dg.multi_asset(
    outs={
        "stream_validated_weather": dg.AssetOut(
            key=key("stream_validated_weather"), group_name=STREAMING_GROUP, kinds={"flink", "parquet"}, tags={"keel/backfill": "skip"},
            description="Weather readings the Flink job found valid (typed), for one month streamed in event-time "
            "order; metadata: events/s, lag, windows, parity with validated_weather.",
        ),
        "stream_weather_quarantine": dg.AssetOut(
            key=key("stream_weather_quarantine"), group_name=STREAMING_GROUP, kinds={"flink", "parquet"}, tags={"keel/backfill": "skip"},
            description="Readings the Flink job quarantined, in the batch path's quarantine layout.",
        ),
    },
    partitions_def=monthly_2013,
    ins={"raw": dg.AssetIn(RAW_WEATHER), "batch_valid": dg.AssetIn(VALIDATED_WEATHER)},
)  # fmt: skip
def stream_weather(
    context: dg.AssetExecutionContext, raw: pl.DataFrame, batch_valid: pl.DataFrame, flink: FlinkResource
):
    spec = load_contract(CONTRACT)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rows = raw.select(pl.col("_source_row").cast(pl.Int64), *spec.column_names).sort("time_hour", "_source_row")
        rows.write_csv(tmp / "rows.csv", include_header=False, null_value="")
        (tmp / "reference.json").write_text(json.dumps(reference_bins(batch_valid, DRIFT_FEATURES)))
        started = time.perf_counter()
        report = flink.run_job(
            context,
            ["--contract", str(CONTRACT), "--input", str(tmp / "rows.csv"), "--out", str(tmp / "out"), "--skip", *SKIP,
             "--event-time", "time_hour", "--window-s", "86400", "--reference", str(tmp / "reference.json")],
        )  # fmt: skip
        wall = time.perf_counter() - started
        valid = pl.read_parquet(tmp / "out" / "valid.parquet")
        quarantine = pl.read_parquet(tmp / "out" / "quarantine.parquet")
        drift = json.loads((tmp / "out" / "drift.json").read_text())
    same = set(valid["_source_row"].to_list()) == set(batch_valid["_source_row"].cast(pl.Int64).to_list())
    worst = max(
        ((w["window_start"], f, s["psi"]) for w in drift for f, s in w["features"].items()), key=lambda x: x[2],
        default=None,
    )  # fmt: skip
    common = {
        "events_per_s": report["events_per_s"],
        "lag_s": round(wall, 3),  # submit → last window out: the end-to-end lag of this bounded run
        "rows_in": report["rows_in"],
        "parallelism": report["parallelism"],
        "skipped_rules": dg.MetadataValue.json(SKIP),
    }
    yield dg.Output(
        valid,
        output_name="stream_validated_weather",
        metadata=common | {
            "dagster/row_count": valid.height,
            "same_valid_rows_as_batch": same,
            "drift_windows": len(drift),
            "max_window_psi": dg.MetadataValue.json(worst),
        },
    )  # fmt: skip
    yield dg.Output(
        quarantine,
        output_name="stream_weather_quarantine",
        metadata=common | {"dagster/row_count": quarantine.height},
    )


streaming_assets = [stream_weather]
