"""The streaming path in the asset graph, generated from a use case's ``streaming`` declarations: a contract compiled to
Flink SQL validates a month of raw rows as a stream (event time, watermarks) on Flink, next to the batch path's
validated table.

``<use case>/stream_validated_<table>`` and ``…/stream_<table>_quarantine`` are the Flink job's sinks (the same
layouts as the batch path's); their metadata carries the job's throughput and lag and whether its split equals the
batch path's for the same partition. They need the Flink environment (``KEEL_WITH_FLINK=1 scripts/setup``) and are
materialized on demand (tag keel/backfill: skip), not by the backfill.
"""

import json
import tempfile
import time
from functools import cache
from pathlib import Path

import dagster as dg
import polars as pl

from assets.usecase import wiring
from keel.contracts.spec import load_contract
from keel.streaming.drift_windows import reference_bins
from keel.usecase import Streaming, UseCase
from resources.flink import FlinkResource


@cache
def build_streaming_assets(uc: UseCase) -> list[dg.AssetsDefinition]:
    return [_stream_asset(uc, st) for st in uc.streaming]


def _stream_asset(uc: UseCase, st: Streaming) -> dg.AssetsDefinition:
    w = wiring(uc)
    table, contract = st.table, uc.contract_path(st.table)
    valid_name, quarantine_name = f"stream_validated_{table}", f"stream_{table}_quarantine"

    @dg.multi_asset(
        name=w.op(f"stream_{table}"),
        outs={
            valid_name: dg.AssetOut(
                key=w.key(valid_name), group_name=w.group("streaming"), kinds={"flink", "parquet"},
                tags={"keel/backfill": "skip"},
                description=f"{table} rows the Flink job found valid (typed), for one month streamed in event-time "
                f"order; metadata: events/s, lag, windows, parity with validated_{table}.",
            ),
            quarantine_name: dg.AssetOut(
                key=w.key(quarantine_name), group_name=w.group("streaming"), kinds={"flink", "parquet"},
                tags={"keel/backfill": "skip"},
                description=f"{table} rows the Flink job quarantined, in the batch path's quarantine layout.",
            ),
        },
        partitions_def=w.monthly,
        ins={"raw": dg.AssetIn(w.key(f"raw_{table}")), "batch_valid": dg.AssetIn(w.key(f"validated_{table}"))},
    )  # fmt: skip
    def stream_table(
        context: dg.AssetExecutionContext, raw: pl.DataFrame, batch_valid: pl.DataFrame, flink: FlinkResource
    ):
        spec = load_contract(contract)
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            rows = raw.select(pl.col("_source_row").cast(pl.Int64), *spec.column_names).sort(
                st.event_time, "_source_row"
            )
            rows.write_csv(tmp / "rows.csv", include_header=False, null_value="")
            (tmp / "reference.json").write_text(json.dumps(reference_bins(batch_valid, list(st.drift_features))))
            started = time.perf_counter()
            report = flink.run_job(
                context,
                ["--contract", str(contract), "--input", str(tmp / "rows.csv"), "--out", str(tmp / "out"),
                 "--skip", *st.skip, "--event-time", st.event_time, "--window-s", str(st.window_s),
                 "--reference", str(tmp / "reference.json")],
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
            "skipped_rules": dg.MetadataValue.json(list(st.skip)),
        }
        yield dg.Output(
            valid,
            output_name=valid_name,
            metadata=common | {
                "dagster/row_count": valid.height,
                "same_valid_rows_as_batch": same,
                "drift_windows": len(drift),
                "max_window_psi": dg.MetadataValue.json(worst),
            },
        )  # fmt: skip
        yield dg.Output(
            quarantine,
            output_name=quarantine_name,
            metadata=common | {"dagster/row_count": quarantine.height},
        )

    return stream_table
