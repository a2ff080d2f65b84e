"""The shared simulated clock: computed from one file, resumes where it stopped, never runs backwards."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from keel.clock import DEFAULT_SPEED, ClockError, SimClock

APRIL = datetime(2013, 4, 1, tzinfo=UTC)
WALL = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_without_a_clock_file_now_is_the_wall_clock(tmp_path):
    assert SimClock(tmp_path / "clock.json").now(WALL) == WALL


def test_simulated_time_runs_at_its_speed_and_every_reader_agrees(tmp_path):
    clock = SimClock(tmp_path / "clock.json")
    clock.start(APRIL, speed=3600, wall=WALL)  # an hour per second
    assert clock.now(WALL + timedelta(seconds=24)) == APRIL + timedelta(days=1)
    other = SimClock(tmp_path / "clock.json")  # another process reads the same file
    assert other.now(WALL + timedelta(seconds=24)) == APRIL + timedelta(days=1)
    # the default: April–December in 20 minutes
    assert DEFAULT_SPEED * 20 * 60 == pytest.approx(275 * 86400)


def test_pause_and_resume_continue_where_the_clock_stopped(tmp_path):
    clock = SimClock(tmp_path / "clock.json")
    clock.start(APRIL, speed=3600, wall=WALL)
    paused = clock.pause(wall=WALL + timedelta(seconds=10))
    assert not paused.running and clock.now(WALL + timedelta(hours=5)) == APRIL + timedelta(hours=10)
    clock.resume(wall=WALL + timedelta(hours=5))  # e.g. scripts/up started again hours later
    assert clock.now(WALL + timedelta(hours=5, seconds=2)) == APRIL + timedelta(hours=12)
    assert clock.resume(wall=WALL + timedelta(hours=6)).running  # resuming a running clock changes nothing
    assert clock.now(WALL + timedelta(hours=5, seconds=2)) == APRIL + timedelta(hours=12)


def test_the_end_holds_and_the_clock_never_goes_back(tmp_path):
    clock = SimClock(tmp_path / "clock.json")
    end = APRIL + timedelta(days=2)
    state = clock.start(APRIL, speed=86400, sim_end=end, wall=WALL)
    assert clock.now(WALL + timedelta(seconds=10)) == end and state.finished(WALL + timedelta(seconds=10))
    clock.advance_to(APRIL + timedelta(days=1), wall=WALL)
    with pytest.raises(ClockError, match="never goes back"):
        clock.advance_to(APRIL, wall=WALL)
    faster = clock.set_speed(172800, wall=WALL + timedelta(seconds=0.5))  # re-anchored: no jump at the change
    assert faster.sim_anchor == APRIL + timedelta(days=1, hours=12)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"speed": 0}, "speed must be > 0"),
        ({"sim_end": APRIL}, "not after the start"),
    ],
)
def test_bad_settings_are_refused_with_a_clear_error(tmp_path, kwargs, message):
    with pytest.raises(ClockError, match=message):
        SimClock(tmp_path / "clock.json").start(APRIL, wall=WALL, **kwargs)
    with pytest.raises(ClockError, match="time zone"):
        SimClock(tmp_path / "c.json").start(datetime(2013, 4, 1), wall=WALL)
    with pytest.raises(ClockError, match="start one first"):
        SimClock(tmp_path / "none.json").pause()


def test_a_corrupt_clock_file_is_named(tmp_path):
    path = tmp_path / "clock.json"
    path.write_text("{not json")
    with pytest.raises(ClockError, match="not JSON"):
        SimClock(path).now(WALL)
    path.write_text(json.dumps({"sim_anchor": "2013-04-01T00:00:00"}))
    with pytest.raises(ClockError, match="not valid"):
        SimClock(path).now(WALL)


def test_two_use_cases_share_one_clock_each_on_its_own_span(tmp_path):
    """Flights replays 2013 and hotel rates 2016–2017 on the same clock: each reads it in its own time, pausing or
    changing speed moves both together, and a span ends where its own data ends."""
    path = tmp_path / "clock.json"
    clock = SimClock(path)
    clock.start(APRIL, speed=86400, sim_end=datetime(2014, 2, 1, tzinfo=UTC), wall=WALL)  # a day per second
    offset = datetime(2016, 11, 16, tzinfo=UTC) - datetime(2013, 4, 1, tzinfo=UTC)
    hotels_end = datetime(2017, 9, 1, 12, tzinfo=UTC)
    clock.add_span("hotels", offset, hotels_end)
    flights, hotels = SimClock(path, "flights"), SimClock(path, "hotels")
    later = WALL + timedelta(seconds=10)
    assert flights.now(later) == APRIL + timedelta(days=10)  # no span: the clock's own time
    assert hotels.now(later) == datetime(2016, 11, 26, tzinfo=UTC)
    paused = hotels.pause(wall=later)  # any reader pauses the whole clock; it answers in its own time
    assert paused.sim_anchor == datetime(2016, 11, 26, tzinfo=UTC) and not paused.running
    assert flights.now(later + timedelta(hours=1)) == APRIL + timedelta(days=10)
    hotels.resume(wall=later)
    hotels.advance_to(datetime(2017, 9, 1, tzinfo=UTC), wall=later)  # in hotels' time; flights moves with it
    assert flights.now(later) == datetime(2017, 9, 1, tzinfo=UTC) - offset
    done = later + timedelta(seconds=1)  # hotels' span is over; the clock's own is not (its end is later)
    assert hotels.now(done) == hotels_end and hotels.state().finished(done)
    assert not flights.state().finished(done) and flights.now(done) == datetime(2017, 9, 2, tzinfo=UTC) - offset
    with pytest.raises(ClockError, match="another offset"):
        clock.add_span("hotels", offset + timedelta(days=1))
    assert json.loads(path.read_text())["spans"]["hotels"]["offset_s"] == offset.total_seconds()


def test_shared_spans_start_every_use_case_when_its_history_is_in():
    from keel.clock import shared_spans

    flights_start, flights_end = datetime(2013, 4, 1, 12, tzinfo=UTC), datetime(2014, 1, 1, 12, tzinfo=UTC)
    hotels_start, hotels_end = datetime(2016, 11, 15, 18, tzinfo=UTC), datetime(2017, 9, 16, tzinfo=UTC)
    start, end, spans = shared_spans(
        {"hotels": hotels_start, "flights": flights_start}, {"hotels": hotels_end, "flights": flights_end}
    )
    assert start == flights_start and spans["flights"].offset == timedelta(0)
    hotels_at_start = start + spans["hotels"].offset
    assert hotels_start <= hotels_at_start < hotels_start + timedelta(days=1)  # whole days, never before its data
    assert end == max(flights_end, hotels_end - spans["hotels"].offset)  # the clock runs until the last span ends
    with pytest.raises(ClockError, match="not after its start"):
        shared_spans({"a": flights_start}, {"a": flights_start})


def test_a_wall_clock_replay_holds_while_runs_queue_and_runs_again_once_none_are_queued():
    from keel.clock import PipelineHold

    hold = PipelineHold(hold_at=2, release_at=0)
    queued = [0, 1, 2, 3, 1, 0, 1]  # a backlog builds on a busy machine, then drains
    held, seen = False, []
    for q in queued:
        held = hold.holds(held, q)
        seen.append(held)
    assert seen == [False, False, True, True, True, False, False]  # hysteresis: one queued run holds no clock
