"""The Flink job launched and observed from Dagster: a month of raw weather streamed through the contract on the
real mini-cluster, its sinks as assets of the same graph, throughput, lag and parity with the batch path as
materialization metadata. Marked ``flink`` (needs .venv-flink)."""

from __future__ import annotations

import dagster as dg
import polars as pl
import pytest

import definitions
from resources import FlinkResource, ParquetIOManager
from tests.streaming.flink_env import FLINK_PY, require_flink_environment

pytestmark = pytest.mark.flink


def test_the_stream_assets_materialize_with_throughput_and_parity(tmp_path):
    require_flink_environment()
    keys = [dg.AssetKey(["flights", k]) for k in ("raw_weather", "validated_weather", "weather_quarantine",
                                     "stream_validated_weather", "stream_weather_quarantine")]  # fmt: skip
    result = dg.materialize(
        list(definitions.defs.assets),
        selection=keys,
        partition_key="2013-02",
        resources=dict(definitions.defs.resources)
        | {"io_manager": ParquetIOManager(base_dir=str(tmp_path)), "flink": FlinkResource(python=str(FLINK_PY))},
    )
    assert result.success
    mats = {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}
    meta = mats["stream_validated_weather"]
    assert meta["same_valid_rows_as_batch"].value is True
    assert meta["events_per_s"].value > 0 and meta["lag_s"].value > 0 and meta["drift_windows"].value >= 28
    stream = pl.read_parquet(tmp_path / "flights" / "stream_validated_weather" / "2013-02.parquet")
    batch = pl.read_parquet(tmp_path / "flights" / "validated_weather" / "2013-02.parquet")
    assert stream.height == batch.height == meta["dagster/row_count"].value
    graph = definitions.defs.resolve_asset_graph()
    assert (
        dg.AssetKey(["flights", "raw_weather"])
        in graph.get(dg.AssetKey(["flights", "stream_validated_weather"])).parent_keys
    )
