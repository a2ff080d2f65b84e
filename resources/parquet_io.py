"""Parquet storage for every asset: one file per asset (per partition), written atomically, never pickled.

Layout: ``<base_dir>/<asset key path>/<partition>.parquet`` for partitioned assets and
``<base_dir>/<asset key path>.parquet`` otherwise. Asset key parts and partition keys become path components, so
they are validated as names first; nothing is written outside ``base_dir``.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import polars as pl

from keel.home import KeelHome, asset_file
from keel.storage import write_parquet_atomic
from resources.simulated import simulated_metadata

ALLOW_MISSING_PARTITIONS = "keel/allow_missing_partitions"  # AssetIn metadata: read the partitions that exist
PARTITION_COLUMN = "keel/partition_column"  # asset metadata: the column a run over several partitions splits by


class ParquetIOManager(dg.ConfigurableIOManager):
    """Stores polars DataFrames as Parquet files (zstd), atomically (temp file + fsync + rename)."""

    base_dir: str | None = None  # default: <home>/storage
    home: str | None = None  # KEEL_HOME (definitions.py: the KEEL_HOME environment variable); None: read when used

    def _root(self) -> Path:
        return Path(self.base_dir).resolve() if self.base_dir else KeelHome.of(self.home).storage

    def path_for(self, key: dg.AssetKey, partition: str | None) -> Path:
        return asset_file(self._root(), list(key.path), partition)

    def handle_output(self, context: dg.OutputContext, obj: pl.DataFrame) -> None:
        if obj is None:
            return
        if not isinstance(obj, pl.DataFrame):
            raise TypeError(
                f"ParquetIOManager stores polars DataFrames, got {type(obj).__name__} for {context.asset_key}"
            )
        if context.has_asset_partitions and len(context.asset_partition_keys) > 1:
            self._write_range(context, obj)
            return
        partition = context.asset_partition_key if context.has_asset_partitions else None
        path = self.path_for(context.asset_key, partition)
        write_parquet_atomic(obj, path)
        shown = KeelHome.of(self.home).shown(path) if not self.base_dir else str(path)
        context.add_output_metadata({"path": shown, "dagster/row_count": obj.height} | self._simulated(context))

    def _simulated(self, context: dg.OutputContext) -> dict[str, str]:
        """A live replay's run: the simulated time of the materialization (resources/simulated.py)."""
        try:
            tags = context.step_context.dagster_run.tags
        except Exception:  # noqa: BLE001 - an output context built outside a run (tests) has no run to read
            return {}
        return simulated_metadata(tags, KeelHome.of(self.home).root)

    def _write_range(self, context: dg.OutputContext, obj: pl.DataFrame) -> None:
        """A run over several partitions (a single-run backfill): the frame is split by the column the asset names
        in its metadata (``PARTITION_COLUMN``), one file per partition — an empty one for a partition without rows."""
        column = (context.definition_metadata or {}).get(PARTITION_COLUMN)
        if column is None or column not in obj.columns:
            raise ValueError(
                f"{context.asset_key.to_user_string()}: a run over {len(context.asset_partition_keys)} partitions "
                f"needs the asset's metadata {PARTITION_COLUMN!r} naming the column to split its frame by"
            )
        keys = set(context.asset_partition_keys)
        stray = sorted(set(obj[column].cast(pl.Utf8).unique().to_list()) - keys)
        if stray:
            raise ValueError(
                f"{context.asset_key.to_user_string()}: rows for partitions outside the run: {stray[:3]}"
            )
        for key in sorted(keys):
            write_parquet_atomic(
                obj.filter(pl.col(column).cast(pl.Utf8) == key), self.path_for(context.asset_key, key)
            )
        context.add_output_metadata(
            {"dagster/row_count": obj.height, "partitions_written": len(keys)} | self._simulated(context)
        )

    def load_input(self, context: dg.InputContext) -> pl.DataFrame:
        key = context.asset_key
        if context.has_asset_partitions:
            paths = [self.path_for(key, pk) for pk in context.asset_partition_keys]
        else:
            paths = [self.path_for(key, None)]
        missing = [str(p) for p in paths if not p.exists()]
        if missing and (context.definition_metadata or {}).get(ALLOW_MISSING_PARTITIONS):
            # An input that reads whatever partitions exist (experiment days with traffic): skip the others.
            paths = [p for p in paths if p.exists()]
            if not paths:
                return pl.DataFrame()
            missing = []
        if missing:
            raise FileNotFoundError(
                f"{key.to_user_string()}: not materialized yet, no file at {', '.join(missing[:3])}"
            )
        frames = [pl.read_parquet(p) for p in paths]
        return frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")
