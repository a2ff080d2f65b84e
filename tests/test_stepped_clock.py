"""The stepped clock of the reproducible replay (keel/clock.py, keel/steps.py): it stands still until the driver
moves it, sensors wait in the traffic phase, and a step settles only at a fixpoint — every deciding sensor looked
after the last run and found nothing to do."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest

from keel.clock import SETTLE, TRAFFIC, ClockError, SimClock, Span
from keel.errors import InvalidNameError
from keel.steps import TickRecord, deciding_sensors, read_ticks, record_tick, sensor_wait_reason, settled
from sensors.stepping import asked, interval_s

APRIL = datetime(2013, 4, 1, 12, tzinfo=UTC)
WALL = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)


def started(tmp_path, **kw) -> SimClock:
    clock = SimClock(tmp_path / "clock.json")
    clock.start(APRIL, stepped=True, batch_days=7, wall=WALL, **kw)
    return clock


def test_a_stepped_clock_stands_still_whatever_the_wall_clock_does(tmp_path):
    clock = started(tmp_path)
    assert clock.now(WALL + timedelta(hours=5)) == APRIL  # a slow machine: still the step's instant
    state = clock.step_to(APRIL + timedelta(days=1), wall=WALL + timedelta(hours=5))
    assert (state.step, state.phase, state.batch_days) == (1, SETTLE, 7)
    assert clock.now(WALL + timedelta(days=30)) == APRIL + timedelta(days=1)
    # every process reads the same step and phase from the file
    again = SimClock(tmp_path / "clock.json").state()
    assert (again.stepped, again.step, again.phase, again.phase_wall) == (True, 1, SETTLE, WALL + timedelta(hours=5))


def test_the_sensors_wait_while_the_traffic_is_sent(tmp_path):
    clock = started(tmp_path)
    assert sensor_wait_reason(clock.state()) is None  # settling: the sensors act
    clock.set_phase(TRAFFIC)
    assert "replaying step 0's traffic" in sensor_wait_reason(clock.state())
    clock.step_to(APRIL + timedelta(days=1))
    assert sensor_wait_reason(clock.state()) is None  # a new step begins settling
    assert sensor_wait_reason(None) is None  # no replay: nothing to wait for


def test_steps_go_forward_and_the_last_stops_at_the_end(tmp_path):
    clock = started(tmp_path, sim_end=APRIL + timedelta(days=1, hours=6))
    with pytest.raises(ClockError, match="goes forward"):
        clock.step_to(APRIL)
    clock.step_to(APRIL + timedelta(days=1))
    last = clock.step_to(APRIL + timedelta(days=2))
    assert last.sim_anchor == APRIL + timedelta(days=1, hours=6) and last.finished(WALL)


def test_a_use_case_on_a_span_steps_in_its_own_time(tmp_path):
    offset = timedelta(days=1324)
    clock = started(tmp_path, spans={"hotels": Span(offset)})
    hotels = SimClock(tmp_path / "clock.json", "hotels")
    assert hotels.now() == APRIL + offset and hotels.state().stepped
    hotels.step_to(APRIL + offset + timedelta(days=1))
    assert clock.now() == APRIL + timedelta(days=1) and clock.state().step == 1


def test_a_wall_clock_has_no_steps_and_a_bad_phase_is_named(tmp_path):
    wall = SimClock(tmp_path / "wall.json")
    wall.start(APRIL, wall=WALL)
    with pytest.raises(ClockError, match="stepped"):
        wall.step_to(APRIL + timedelta(days=1))
    with pytest.raises(ClockError, match="phases"):
        wall.set_phase(TRAFFIC)
    assert "stepped" not in json.loads((tmp_path / "wall.json").read_text())  # the file of a wall clock is unchanged
    clock = started(tmp_path)
    with pytest.raises(ClockError, match="phase must be"):
        clock.set_phase("lunch")
    raw = json.loads((tmp_path / "clock.json").read_text())
    raw["stepped"]["phase"] = "lunch"
    (tmp_path / "clock.json").write_text(json.dumps(raw))
    with pytest.raises(ClockError, match="lunch"):
        clock.state()


SENSORS = deciding_sensors(["flights"])
T0 = WALL.timestamp()


def ticks(step=0, started=T0 + 1, asked=0, **over) -> dict[str, TickRecord]:
    return {s: TickRecord(s, over.get(s, {}).get("step", step), over.get(s, {}).get("started", started),
                          over.get(s, {}).get("asked", asked)) for s in SENSORS}  # fmt: skip


@pytest.mark.parametrize(
    ("records", "last_run_end", "busy", "done", "why"),
    [
        (ticks(), None, 0, True, "settled"),
        ({}, None, 0, False, "flights_landing_sensor (no tick"),  # nobody looked yet
        (ticks(started=T0 - 5), None, 0, False, "no tick since"),  # looked before the step began
        (ticks(step=-1), None, 0, False, "no tick since"),  # a record of another step
        (ticks(), None, 1, False, "1 run(s)"),  # a run is still going
        (ticks(), T0 + 2, 0, False, "no tick since"),  # a run ended after the ticks: look again
        (ticks(started=T0 + 3), T0 + 2, 0, True, "settled"),  # ... and they did
        (ticks(flights_drift_sensor={"asked": 1}), None, 0, False, "asked for 1"),  # its request is not looked at yet
    ],
)
def test_a_step_settles_only_at_a_fixpoint(tmp_path, records, last_run_end, busy, done, why):
    state = started(tmp_path).state()
    state = type(state)(**{**state.__dict__, "phase_wall": WALL})
    got, reason = settled(state, records, SENSORS, last_run_end, busy)
    assert got is done and why in reason


def test_tick_records_round_trip_and_names_are_checked(tmp_path):
    record_tick(tmp_path, TickRecord("flights_canary_sensor", 3, T0, 2))
    assert read_ticks(tmp_path, SENSORS) == {"flights_canary_sensor": TickRecord("flights_canary_sensor", 3, T0, 2)}
    with pytest.raises(InvalidNameError, match="invalid sensor"):
        record_tick(tmp_path, TickRecord("../clock", 0, T0, 0))


def test_what_a_sensor_evaluation_asked_for():
    request = dg.RunRequest(run_key="a")
    assert asked(dg.SkipReason("nothing"), None) == 0
    assert asked(dg.SensorResult(run_requests=[request, dg.RunRequest(run_key="b")]), None) == 2
    assert asked(dg.SensorResult(run_requests=[], cursor="x"), "x") == 0  # the same cursor: nothing new
    assert asked(dg.SensorResult(run_requests=[], cursor="y"), "x") == 1  # a moved cursor is something done
    assert asked(dg.SensorResult(run_requests=[], skip_reason="holding"), None) == 0
    assert asked([request], None) == 1


def test_the_sensor_interval_follows_the_environment(monkeypatch):
    monkeypatch.delenv("KEEL_SENSOR_INTERVAL_S", raising=False)
    assert interval_s() == 10
    monkeypatch.setenv("KEEL_SENSOR_INTERVAL_S", "1")
    assert interval_s() == 1
    monkeypatch.setenv("KEEL_SENSOR_INTERVAL_S", "soon")
    with pytest.raises(ValueError, match="KEEL_SENSOR_INTERVAL_S"):
        interval_s()


def test_a_replayer_whose_span_is_over_is_never_behind_and_a_failed_one_stops_the_replay(tmp_path, monkeypatch):
    """scripts/live_steps.py's traffic wait: flights' replayer ends with its span (exit 0, ``finished``) while hotels'
    goes on; a replayer that fails, or every replayer gone while a use case is behind, stops the replay."""
    import subprocess
    import sys

    from tests import REPO

    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    import live_steps

    flights, hotels = tmp_path / "flights.json", tmp_path / "hotels.json"
    flights.write_text(json.dumps({"step": 275, "finished": True}))
    hotels.write_text(json.dumps({"step": 276}))
    summaries = {"flights": flights, "hotels": hotels}
    assert live_steps.traffic_behind(276, summaries) == []
    assert live_steps.traffic_behind(277, summaries) == ["hotels"]
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        finished.wait(timeout=60), failed.wait(timeout=60)
        live_steps.wait_traffic(None, 276, summaries, [finished, alive], print)  # nobody behind: returns at once
        # hotels behind at step 277 catches up while the driver waits: it returns only then (not before)
        catch_up = threading.Timer(0.5, lambda: hotels.write_text(json.dumps({"step": 277})))
        catch_up.start()
        live_steps.wait_traffic(None, 277, summaries, [finished, alive], print)
        assert json.loads(hotels.read_text()) == {"step": 277}
        catch_up.join()
        hotels.write_text(json.dumps({"step": 276}))  # behind again, for the failures below
        with pytest.raises(live_steps.StepError, match=r"exited \(3\)"):
            live_steps.wait_traffic(None, 277, summaries, [alive, failed], print)
    finally:
        alive.kill()
    with pytest.raises(live_steps.StepError, match="hotels did not finish step 277"):
        live_steps.wait_traffic(None, 277, summaries, [finished], print)


def test_a_paused_wall_clock_replay_goes_on_stepped_from_the_next_days_step(tmp_path):
    clock = SimClock(tmp_path / "clock.json")
    start = datetime(2013, 4, 1, 12, tzinfo=UTC)
    clock.start(start, sim_end=datetime(2013, 4, 20, 12, tzinfo=UTC), wall=WALL)
    with pytest.raises(ClockError, match="pause the clock"):
        clock.to_stepped(start)
    clock.advance_to(datetime(2013, 4, 9, 7, 13, tzinfo=UTC), wall=WALL)
    clock.pause(wall=WALL)
    state = clock.to_stepped(start, batch_days=7, wall=WALL + timedelta(hours=1))
    # where a replay stepped from the start has its step: noon (the day's flights are in), never back in time
    assert (state.sim_anchor, state.stepped, state.step, state.phase, state.batch_days, state.running) == (
        datetime(2013, 4, 9, 12, tzinfo=UTC), True, 0, SETTLE, 7, False)  # fmt: skip
    assert clock.now(WALL + timedelta(days=3)) == datetime(2013, 4, 9, 12, tzinfo=UTC)  # it stands, resumed or not
    with pytest.raises(ClockError, match="stepped already"):
        clock.to_stepped(start)
    on_grid = SimClock(tmp_path / "on_grid.json")
    on_grid.start(start, wall=WALL)
    on_grid.advance_to(datetime(2013, 4, 19, 12, tzinfo=UTC), wall=WALL)
    on_grid.pause(wall=WALL)
    assert on_grid.to_stepped(start).sim_anchor == datetime(2013, 4, 19, 12, tzinfo=UTC)  # on a step: stays there
    late = SimClock(tmp_path / "late.json")
    late.start(start, sim_end=datetime(2013, 4, 20, tzinfo=UTC), wall=WALL)
    late.advance_to(datetime(2013, 4, 19, 13, tzinfo=UTC), wall=WALL)
    late.pause(wall=WALL)
    with pytest.raises(ClockError, match="past the clock's end"):
        late.to_stepped(start)


def test_the_replays_clock_is_set_checked_and_switched_to_stepped(tmp_path, monkeypatch, capsys):
    """scripts/live_steps.py set_clock, as scripts/materialize.py --live calls it on flights' real landing zone: a new
    home starts its clock on the wall clock (paused, when the history has landed); run again with --stepped it goes on
    stepped from the next day's noon; a stepped replay refuses to go back to the wall clock."""
    from argparse import Namespace

    from keel.data.landing import LandingZone
    from keel.home import KeelHome
    from keel.usecase import get
    from tests import REPO

    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    import live_steps

    home = KeelHome(tmp_path)
    zones = {"flights": LandingZone(home.landing, get("flights"))}
    clock = SimClock(home.clock)
    wall = Namespace(stepped=False, speed=None, end=None)
    assert live_steps.set_clock(clock, home, zones, wall) == 0
    state = clock.state()
    assert (state.sim_anchor, state.running, state.stepped) == (datetime(2013, 4, 1, 12, tzinfo=UTC), False, False)
    clock.advance_to(datetime(2013, 4, 9, 7, 13, tzinfo=UTC))  # the wall-clock replay ran to here and was stopped
    assert live_steps.set_clock(clock, home, zones, Namespace(stepped=True, speed=None, end=None)) == 0
    state = clock.state()
    assert (state.sim_anchor, state.stepped, state.step) == (datetime(2013, 4, 9, 12, tzinfo=UTC), True, 0)
    assert (
        "on the wall clock until 2013-04-09 07:13, goes on stepped from 2013-04-09 12:00" in capsys.readouterr().out
    )
    assert live_steps.set_clock(clock, home, zones, wall) == 2
    assert "it goes on stepped" in capsys.readouterr().err
    assert clock.state().stepped
