"""Atomic Parquet storage: a crash mid-write leaves the last good file readable; names cannot escape the root."""

import os
import subprocess
import sys
import textwrap

import dagster as dg
import polars as pl
import pytest

from keel.errors import InvalidNameError
from keel.storage import write_parquet_atomic
from resources import ParquetIOManager


def test_write_replaces_whole_file(tmp_path):
    path = tmp_path / "t.parquet"
    write_parquet_atomic(pl.DataFrame({"a": [1]}), path)
    write_parquet_atomic(pl.DataFrame({"a": [2, 3]}), path)
    assert pl.read_parquet(path)["a"].to_list() == [2, 3]
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]  # no temp files left behind


def test_failure_during_write_keeps_last_good_state(tmp_path, monkeypatch):
    path = tmp_path / "t.parquet"
    write_parquet_atomic(pl.DataFrame({"a": [1, 2, 3]}), path)

    def boom(self, file, **kwargs):
        file.write(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", boom)
    with pytest.raises(OSError, match="disk full"):
        write_parquet_atomic(pl.DataFrame({"a": [9]}), path)
    monkeypatch.undo()
    assert pl.read_parquet(path)["a"].to_list() == [1, 2, 3]
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


def test_kill_9_mid_write_keeps_last_good_state(tmp_path):
    """A real process killed while writing a large file: the target is the old file or the new one, never a mix."""
    path = tmp_path / "t.parquet"
    write_parquet_atomic(pl.DataFrame({"a": [1, 2, 3]}), path)
    script = textwrap.dedent(
        f"""
        import os, signal, polars as pl
        from keel import storage
        real = storage.os.replace
        def replace_then_die(src, dst):
            os.kill(os.getpid(), signal.SIGKILL)  # die after the temp file is complete, before the rename
        storage.os.replace = replace_then_die
        storage.write_parquet_atomic(pl.DataFrame({{"a": list(range(1_000_000))}}), {str(path)!r})
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -9
    assert pl.read_parquet(path)["a"].to_list() == [1, 2, 3]


def test_io_manager_round_trip_partitioned(tmp_path):
    parts = dg.StaticPartitionsDefinition(["2013-01", "2013-02"])

    @dg.asset(partitions_def=parts)
    def numbers(context: dg.AssetExecutionContext) -> pl.DataFrame:
        return pl.DataFrame({"month": [context.partition_key], "n": [int(context.partition_key[-1])]})

    @dg.asset(ins={"numbers": dg.AssetIn(partition_mapping=dg.AllPartitionMapping())})
    def total(numbers: pl.DataFrame) -> pl.DataFrame:
        return numbers.select(pl.col("n").sum())

    io = {"io_manager": ParquetIOManager(base_dir=str(tmp_path))}
    instance = dg.DagsterInstance.ephemeral()
    for key in parts.get_partition_keys():
        assert dg.materialize([numbers], partition_key=key, resources=io, instance=instance).success
    assert dg.materialize([numbers, total], selection=[total], resources=io, instance=instance).success
    assert (tmp_path / "numbers" / "2013-01.parquet").exists()
    assert pl.read_parquet(tmp_path / "total.parquet")["n"].to_list() == [3]


def test_an_input_that_allows_missing_partitions_reads_those_that_exist(tmp_path):
    """experiment_analysis reads the wide table's days with traffic: the others are skipped, not an error — while an
    ordinary input still names the file it misses."""
    from resources.parquet_io import ALLOW_MISSING_PARTITIONS

    parts = dg.StaticPartitionsDefinition(["2026-01-01", "2026-01-02", "2026-01-03"])

    @dg.asset(partitions_def=parts)
    def days(context: dg.AssetExecutionContext) -> pl.DataFrame:
        return pl.DataFrame({"day": [context.partition_key]})

    @dg.asset(
        ins={
            "days": dg.AssetIn(partition_mapping=dg.AllPartitionMapping(), metadata={ALLOW_MISSING_PARTITIONS: True})
        }
    )
    def seen(days: pl.DataFrame) -> pl.DataFrame:
        return days

    @dg.asset(ins={"days": dg.AssetIn(partition_mapping=dg.AllPartitionMapping())})
    def strict(days: pl.DataFrame) -> pl.DataFrame:
        return days

    io = {"io_manager": ParquetIOManager(base_dir=str(tmp_path))}
    instance = dg.DagsterInstance.ephemeral()
    assert dg.materialize([days, seen], selection=[seen], resources=io, instance=instance).success
    assert pl.read_parquet(tmp_path / "seen.parquet").is_empty()  # no day yet: an empty frame
    for key in ("2026-01-01", "2026-01-03"):
        assert dg.materialize([days], partition_key=key, resources=io, instance=instance).success
    assert dg.materialize([days, seen], selection=[seen], resources=io, instance=instance).success
    assert sorted(pl.read_parquet(tmp_path / "seen.parquet")["day"]) == ["2026-01-01", "2026-01-03"]
    result = dg.materialize([days, strict], selection=[strict], resources=io, instance=instance, raise_on_error=False)
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "2026-01-02.parquet" in str(failure.event_specific_data.error)


@pytest.mark.parametrize("partition", ["../../etc", "A-UPPER", "a/b", ""])
def test_partition_keys_that_would_escape_are_refused(tmp_path, partition):
    io = ParquetIOManager(base_dir=str(tmp_path))
    with pytest.raises(InvalidNameError):
        io.path_for(dg.AssetKey("numbers"), partition)


def test_no_pickle_files_are_written(tmp_path):
    @dg.asset
    def frame() -> pl.DataFrame:
        return pl.DataFrame({"a": [1]})

    dg.materialize([frame], resources={"io_manager": ParquetIOManager(base_dir=str(tmp_path))})
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert [p.suffix for p in written] == [".parquet"]
    assert not any(open(p, "rb").read(2) == b"\x80\x04" for p in written)
    assert os.path.getsize(written[0]) > 0
