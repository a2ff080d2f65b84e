"""The landing zone delivers 2013 day by day as the simulated clock passes: nothing early, nothing twice, no row
lost, no outcome before its flight landed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, date, datetime

import polars as pl
import pytest

from keel.clock import SimClock
from keel.data.landing import LandingZone
from keel.loop.arrivals import Landed
from usecases.flights import usecase as FLIGHTS
from usecases.flights.data import read_raw_month


def test_a_day_lands_only_once_its_outcomes_are_known(tmp_path):
    zone = LandingZone(tmp_path, FLIGHTS)
    assert zone.due("flights", date(2013, 4, 2)) == datetime(2013, 4, 3, 12, tzinfo=UTC)
    landed = zone.deliver(datetime(2013, 1, 2, 11, 59, tzinfo=UTC))
    assert landed == {"flights": [], "weather": [date(2013, 1, 1)]}  # weather of Jan 1 is in, its flights are not
    landed = zone.deliver(datetime(2013, 1, 2, 12, 0, tzinfo=UTC))
    assert landed == {"flights": [date(2013, 1, 1)], "weather": []}
    flights = zone.read_month("flights", "2013-01")
    assert set(flights["day"]) == {"1"} and flights["arr_delay"].null_count() < flights.height  # outcomes present


def test_delivery_is_idempotent_and_resumes(tmp_path):
    zone = LandingZone(tmp_path, FLIGHTS)
    now = datetime(2013, 1, 10, 13, tzinfo=UTC)
    first = zone.deliver(now)
    assert len(first["flights"]) == 9 and len(first["weather"]) == 9
    assert zone.deliver(now) == {"flights": [], "weather": []}  # a restarted replay writes nothing twice
    assert LandingZone(tmp_path, FLIGHTS).delivered("flights")[-1] == date(2013, 1, 9)
    assert zone.landed_by_month() == {"2013-01": Landed((9, 9))}


@pytest.mark.parametrize("table", ["flights", "weather"])
def test_a_complete_month_is_every_raw_row_exactly_once(tmp_path, table):
    zone = LandingZone(tmp_path, FLIGHTS)
    zone.deliver(datetime(2013, 3, 2, 12, tzinfo=UTC))
    assert zone.month_complete(table, "2013-02") and not zone.month_complete(table, "2013-03")
    landed = zone.read_month(table, "2013-02")
    raw = read_raw_month(table, "2013-02")
    assert landed["_source_row"].to_list() == sorted(raw["_source_row"].to_list())
    assert landed.equals(raw.sort("_source_row"))
    partial = zone.read_month(table, "2013-03")
    assert set(partial["day"]) == {"1"} and partial.columns == raw.columns


def test_a_month_with_nothing_landed_is_empty_with_the_raw_columns(tmp_path):
    empty = LandingZone(tmp_path, FLIGHTS).read_month("flights", "2013-06")
    assert empty.height == 0 and "arr_delay" in empty.columns and empty.schema["arr_delay"] == pl.String
    with pytest.raises(ValueError, match="not 'planes'"):
        LandingZone(tmp_path, FLIGHTS).path("planes", date(2013, 1, 1))


def keel_live(home, *args, **kwargs):
    env = os.environ | {"KEEL_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "keel.cli", "live", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        **kwargs,
    )


def test_keel_live_run_delivers_history_then_each_day_and_stops_at_the_end(tmp_path):
    done = keel_live(tmp_path, "run", "--to", "2013-04-03", "--speed", "864000", "--poll", "0.05")
    assert done.returncode == 0, done.stderr
    # the clock starts when the history (the first model's months) has landed: the history at once in the first
    # delivery (how many April days join it depends on how fast the machine is)
    assert "clock started at 2013-04-01 12:00" in done.stdout
    assert "landed flights/flights 2013-01-01…" in done.stdout and "the replay is over" in done.stdout
    zone = LandingZone(tmp_path / "landing", FLIGHTS)
    assert zone.delivered("flights")[-1] == date(2013, 4, 1)  # Apr 2's flights land at Apr 3 12:00: after the end
    status = keel_live(tmp_path, "status")
    assert "2013-04: days landed: 1 of flights, 1 of weather" in status.stdout and "ends 2013-04-03" in status.stdout


def test_keel_live_pauses_on_ctrl_c_and_resumes_where_it_stopped(tmp_path):
    env = os.environ | {"KEEL_HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "keel.cli", "live", "run", "--speed", "60", "--poll", "0.1"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    first = proc.stdout.readline()
    assert "clock started at 2013-04-01 12:00" in first
    deadline = time.monotonic() + 120
    while not (tmp_path / "landing" / "flights" / "flights").exists():  # history landed: the loop is running
        assert time.monotonic() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "paused at 2013-04-01" in out
    paused = SimClock(tmp_path / "clock.json").state()
    assert not paused.running
    # started again later: it resumes at the paused simulated instant (not at April 1st, not jumped ahead)
    time.sleep(1.0)
    resumed = subprocess.Popen(
        [sys.executable, "-m", "keel.cli", "live", "run", "--poll", "0.1"], env=env, stdout=subprocess.PIPE, text=True
    )
    line = resumed.stdout.readline()
    resumed.send_signal(signal.SIGINT)
    resumed.communicate(timeout=60)
    assert f"clock resumed at {paused.sim_anchor:%Y-%m-%d %H:%M}" in line, (line, paused)
