"""A live replay's events carry their simulated time (resources/simulated.py): a materialization through the Parquet
IO manager, in a real run tagged as the replay's sensors tag theirs, says when in the replayed year it happened;
outside a replay (no clock in the home) nothing is added."""

from __future__ import annotations

import dagster as dg
import polars as pl

from keel.clock import SimClock
from resources.parquet_io import ParquetIOManager
from resources.simulated import SIM_TAG, simulated_metadata
from sensors.metering import metering_run

MAY_1 = "2013-05-01T12:00:00+00:00"


@dg.asset
def rows() -> pl.DataFrame:
    return pl.DataFrame({"x": [1, 2, 3]})


def materialized(home, tags: dict[str, str]) -> dict:
    result = dg.materialize([rows], resources={"io_manager": ParquetIOManager(home=str(home))}, tags=tags)
    [event] = result.get_asset_materialization_events()
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_a_replays_materialization_says_when_in_the_year_it_happened(tmp_path):
    from datetime import UTC, datetime

    SimClock(tmp_path / "clock.json").start(datetime(2013, 4, 1, 12, tzinfo=UTC))
    meta = materialized(tmp_path, {SIM_TAG: MAY_1})
    assert (meta["simulated_at"], meta["simulated_month"]) == (MAY_1, "2013-05") and meta["dagster/row_count"] == 3
    assert "simulated_at" not in materialized(tmp_path, {})  # a run no replay launched (a person's, from the UI)


def test_outside_a_replay_nothing_is_added(tmp_path):
    assert "simulated_at" not in materialized(tmp_path, {SIM_TAG: MAY_1})  # no clock: the tag is the wall clock's
    assert simulated_metadata({SIM_TAG: MAY_1}, None) == {}


def test_metering_runs_are_dated_by_the_last_day_they_meter():
    assert metering_run(["2013-05-01"]).tags[SIM_TAG] == "2013-05-01T23:59:59+00:00"
    assert metering_run(["2013-05-01", "2013-05-03"]).tags[SIM_TAG] == "2013-05-03T23:59:59+00:00"
