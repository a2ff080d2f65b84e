"""The simulated clock a live replay shares: data landing, sensors' "now", exposure timestamps, label arrival.

A replay of 2013 runs simulated time faster than the wall clock (by default April–December in about 20 minutes:
~20,000 simulated seconds per wall second). Every process reads the same state from ``$KEEL_HOME/clock.json``:
the simulated instant at an anchor, the wall time of that anchor, the speed, and whether it runs. ``now()`` is
computed from that, so no process has to tick it, and stopping and starting again resumes where the clock stopped
(``pause`` re-anchors at the current simulated instant; ``resume`` re-anchors at the wall clock's now).

Without a clock file, ``now()`` is the wall clock: everything that takes a ``SimClock`` works unchanged outside a
replay. Writes are atomic (temp file + rename): a reader never sees half a state.

Several use cases replay on one clock, each on its own time span (flights: 2013; hotel rates: 2016–2017): the clock
keeps one time of its own, and a **span** per use case maps it to that use case's time — a fixed offset (whole days,
so that every use case's days turn at the same instant) and where that use case's span ends. ``SimClock(path,
usecase)`` reads the clock in that use case's time; pausing, resuming or changing speed moves every span together.
A use case with no span (and every use case of a single-use-case replay) is on the clock's own time.

**Stepped** (the reproducible replay, docs/live.md): the clock does not follow the wall clock at all. It stands at a
step's instant until the driver (scripts/materialize.py) moves it to the next one, and it only does so when the
work due at that instant is done. Each step has two phases: ``settle`` — the deliveries due are in, the sensors
evaluate and the runs they ask for finish (keel/steps.py says when that is) — then ``traffic`` — the replayed
traffic of the step is sent against what settling left serving, while the sensors wait. What a machine's load
changes is how long a step takes in wall time, never what happens in it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from keel.errors import KeelError
from keel.storage import write_json_atomic

# April–December 2013 (275 days) in 20 minutes.
DEFAULT_SPEED = 275 * 86400 / (20 * 60)
SETTLE, TRAFFIC = "settle", "traffic"  # a stepped clock's phases (module docstring)


@dataclass(frozen=True)
class PipelineHold:
    """When a wall-clock replay's clock waits for its pipeline. On a busy machine the runs the sensors ask for queue
    behind Dagster's concurrency limit while the clock runs on: a month's labels landed weeks of simulated time after
    the month ended, and a canary's shadow ran out of days before any of its scores had a label. So the clock holds
    (pauses; the replayed traffic with it) once ``hold_at`` runs are queued and runs again when no more than
    ``release_at`` are: what a busy machine changes is how long the year takes, not what the loop saw when it
    decided. ``holds`` is the decision, given whether the clock is held now and how many runs are queued."""

    hold_at: int = 2
    release_at: int = 0

    def holds(self, holding: bool, queued: int) -> bool:
        return queued > self.release_at if holding else queued >= self.hold_at


class ClockError(KeelError):
    """A clock state that cannot be: bad speed, an end before the start, a corrupt clock file."""


@dataclass(frozen=True)
class Span:
    """A use case's time on the shared clock: its time = the clock's + ``offset``; it stops at ``end`` (its time)."""

    offset: timedelta
    end: datetime | None = None

    def to_json(self) -> dict:
        return {"offset_s": self.offset.total_seconds(), "end": self.end.isoformat() if self.end else None}

    @classmethod
    def from_json(cls, data: dict) -> Span:
        return cls(timedelta(seconds=float(data["offset_s"])), _utc(data["end"]) if data.get("end") else None)


@dataclass(frozen=True)
class ClockState:
    sim_anchor: datetime  # the simulated instant at wall_anchor
    wall_anchor: datetime
    speed: float  # simulated seconds per wall second
    running: bool
    sim_end: datetime | None = None  # the clock stops here
    spans: dict[str, Span] = field(default_factory=dict)  # use case → its time span (module docstring)
    stepped: bool = False  # moved by the driver step by step, not by the wall clock (module docstring)
    step: int = 0  # the step the clock stands at (stepped only)
    phase: str = SETTLE  # SETTLE or TRAFFIC (stepped only)
    phase_wall: datetime | None = None  # when the current phase began (wall)
    batch_days: int = 1  # stepped: new days of a month that wait to be built together (keel/loop/arrivals.py)

    def of(self, usecase: str | None) -> ClockState:
        """This state in ``usecase``'s time (itself when the use case has no span)."""
        span = self.spans.get(usecase or "")
        if span is None:
            return self
        ends = [e for e in (span.end, self.sim_end + span.offset if self.sim_end else None) if e is not None]
        end = min(ends) if ends else None  # its own end, or the clock's when that comes first
        return replace(self, sim_anchor=self.sim_anchor + span.offset, sim_end=end, spans={})

    @property
    def sensors_wait(self) -> bool:
        """A stepped clock in its traffic phase: the sensors act only while it settles."""
        return self.stepped and self.phase != SETTLE

    def now(self, wall: datetime) -> datetime:
        if not self.running or self.stepped:
            return self.sim_anchor
        sim = self.sim_anchor + (wall - self.wall_anchor) * self.speed
        return min(sim, self.sim_end) if self.sim_end else sim

    def finished(self, wall: datetime) -> bool:
        return self.sim_end is not None and self.now(wall) >= self.sim_end

    def to_json(self) -> dict:
        out: dict = {
            "sim_anchor": self.sim_anchor.isoformat(),
            "wall_anchor": self.wall_anchor.isoformat(),
            "speed": self.speed,
            "running": self.running,
            "sim_end": self.sim_end.isoformat() if self.sim_end else None,
        }
        if self.spans:
            out["spans"] = {name: span.to_json() for name, span in sorted(self.spans.items())}
        if self.stepped:
            out["stepped"] = {
                "step": self.step,
                "phase": self.phase,
                "phase_wall": self.phase_wall.isoformat() if self.phase_wall else None,
                "batch_days": self.batch_days,
            }
        return out

    @classmethod
    def from_json(cls, data: dict) -> ClockState:
        try:
            stepped = data.get("stepped")
            steps = (
                {
                    "stepped": True,
                    "step": int(stepped["step"]),
                    "phase": str(stepped["phase"]),
                    "phase_wall": _utc(stepped["phase_wall"]) if stepped.get("phase_wall") else None,
                    "batch_days": int(stepped.get("batch_days", 1)),
                }
                if stepped
                else {}
            )
            if steps and steps["phase"] not in (SETTLE, TRAFFIC):
                raise ValueError(f"phase {steps['phase']!r} is neither {SETTLE!r} nor {TRAFFIC!r}")
            return cls(
                sim_anchor=_utc(data["sim_anchor"]),
                wall_anchor=_utc(data["wall_anchor"]),
                speed=float(data["speed"]),
                running=bool(data["running"]),
                sim_end=_utc(data["sim_end"]) if data.get("sim_end") else None,
                spans={name: Span.from_json(v) for name, v in (data.get("spans") or {}).items()},
                **steps,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ClockError(f"clock state is not valid: {exc}") from None


def instant(text: str) -> datetime:
    """A simulated instant as a user types it (``--end``, ``keel live run --to``): a date (its midnight) or an ISO
    date-time; UTC when it names no zone, converted to UTC when it does."""
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise ClockError(
            f"{text!r} is not a date (YYYY-MM-DD) or an ISO date-time (e.g. 2013-07-01T12:00:00+00:00)"
        ) from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def instant_arg(text: str) -> datetime:
    """``instant`` as an argparse type: a bad value is the parser's error, naming the option."""
    import argparse

    try:
        return instant(text)
    except ClockError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _utc(text: str) -> datetime:
    t = datetime.fromisoformat(text)
    if t.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return t.astimezone(UTC)


def _wall(wall: datetime | None) -> datetime:
    return wall or datetime.now(UTC)


class SimClock:
    """The shared clock at ``path`` (``KeelHome.clock``), read in ``usecase``'s time when it has a span there (None:
    the clock's own time). ``wall`` arguments exist for tests; callers omit them."""

    def __init__(self, path: str | Path, usecase: str | None = None):
        self.path = Path(path)
        self.usecase = usecase

    def state(self) -> ClockState | None:
        """The state in this reader's time (its use case's span applied)."""
        raw = self._read()
        return raw.of(self.usecase) if raw is not None else None

    def _read(self) -> ClockState | None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        try:
            return ClockState.from_json(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ClockError(f"{self.path}: not JSON ({exc})") from None

    def now(self, wall: datetime | None = None) -> datetime:
        """The simulated now when a replay is configured, else the wall clock."""
        wall = _wall(wall)
        state = self.state()
        return state.now(wall) if state else wall

    def start(
        self,
        sim_start: datetime,
        *,
        speed: float = DEFAULT_SPEED,
        sim_end: datetime | None = None,
        spans: dict[str, Span] | None = None,
        stepped: bool = False,
        batch_days: int = 1,
        wall=None,
    ) -> ClockState:
        """Set the clock at ``sim_start``, running (a stepped clock: settling its step 0)."""
        if batch_days < 1:
            raise ClockError(f"batch_days must be ≥ 1, got {batch_days}")
        if not speed > 0:
            raise ClockError(f"speed must be > 0 simulated seconds per wall second, got {speed}")
        if sim_start.tzinfo is None:
            raise ClockError("sim_start needs a time zone (UTC)")
        if sim_end is not None and sim_end <= sim_start:
            raise ClockError(f"the end {sim_end.isoformat()} is not after the start {sim_start.isoformat()}")
        wall = _wall(wall)
        return self._write(
            ClockState(
                sim_start.astimezone(UTC),
                wall,
                speed,
                True,
                sim_end,
                dict(spans or {}),
                stepped,
                0,
                SETTLE,
                wall if stepped else None,
                batch_days,
            )  # fmt: skip
        )

    def add_span(self, usecase: str, offset: timedelta, end: datetime | None = None) -> ClockState:
        """Put ``usecase`` on this clock at ``offset`` (its time = the clock's + offset), ending at ``end`` (its
        time). A span, once there, never moves: what was built and logged in that use case's time stays true."""
        state = self._require()
        if usecase in state.spans and state.spans[usecase].offset != offset:
            raise ClockError(f"{usecase} is on this clock at another offset ({state.spans[usecase].offset})")
        return self._write(replace(state, spans=state.spans | {usecase: Span(offset, end)}))

    def pause(self, wall: datetime | None = None) -> ClockState:
        state = self._require()
        wall = _wall(wall)
        return self._write(replace(state, sim_anchor=state.now(wall), wall_anchor=wall, running=False))

    def resume(self, wall: datetime | None = None) -> ClockState:
        """Continue from where the clock stopped (also after a restart: the paused instant is on disk)."""
        state = self._require()
        if state.running:
            return state
        return self._write(replace(state, wall_anchor=_wall(wall), running=True))

    def set_speed(self, speed: float, wall: datetime | None = None) -> ClockState:
        if not speed > 0:
            raise ClockError(f"speed must be > 0, got {speed}")
        state = self._require()
        wall = _wall(wall)
        return self._write(replace(state, sim_anchor=state.now(wall), wall_anchor=wall, speed=speed))

    def advance_to(self, sim: datetime, wall: datetime | None = None) -> ClockState:
        """Jump the simulated clock forward (tests, catching up) to ``sim`` in this reader's time; never backwards."""
        state = self._require()
        wall = _wall(wall)
        mine = state.of(self.usecase)
        if sim < mine.now(wall):
            raise ClockError(f"the clock never goes back: {sim.isoformat()} is before {mine.now(wall).isoformat()}")
        return self._write(replace(state, sim_anchor=state.sim_anchor + (sim - mine.sim_anchor), wall_anchor=wall))

    def step_to(self, sim: datetime, wall: datetime | None = None) -> ClockState:
        """A stepped clock's next step: stand at ``sim`` (this reader's time; forward only), settling."""
        state = self._require()
        if not state.stepped:
            raise ClockError("step_to moves a stepped clock; this one follows the wall clock")
        wall = _wall(wall)
        mine = state.of(self.usecase)
        if sim <= mine.sim_anchor:
            raise ClockError(f"a step goes forward: {sim.isoformat()} is not after {mine.sim_anchor.isoformat()}")
        if state.sim_end is not None and sim - mine.sim_anchor + state.sim_anchor > state.sim_end:
            sim = state.sim_end - state.sim_anchor + mine.sim_anchor  # the last step stops at the end
        return self._write(replace(state, sim_anchor=state.sim_anchor + (sim - mine.sim_anchor), wall_anchor=wall,
                                   step=state.step + 1, phase=SETTLE, phase_wall=wall))  # fmt: skip

    def to_stepped(self, grid: datetime, batch_days: int = 1, wall: datetime | None = None) -> ClockState:
        """A paused wall-clock replay goes on stepped: the clock moves forward to the first instant of the day grid
        through ``grid`` (the clock's own time: where its steps fall, ``grid`` + whole days) not before where it
        stopped, and stands there settling its step 0, still paused. Forward only; a stepped clock stays stepped."""
        state = self._require()
        if state.stepped:
            raise ClockError("the clock is stepped already")
        if state.running:
            raise ClockError("pause the clock before it goes on stepped")
        if batch_days < 1:
            raise ClockError(f"batch_days must be ≥ 1, got {batch_days}")
        if grid.tzinfo is None:
            raise ClockError("the day grid needs a time zone (UTC)")
        behind = state.sim_anchor - grid
        days = -(-behind // timedelta(days=1)) if behind > timedelta(0) else 0  # whole days, rounded up
        at = grid + timedelta(days=days)
        if state.sim_end is not None and at > state.sim_end:
            raise ClockError(f"the next step {at.isoformat()} is past the clock's end {state.sim_end.isoformat()}")
        wall = _wall(wall)
        return self._write(replace(state, sim_anchor=at, wall_anchor=wall, stepped=True, step=0, phase=SETTLE,
                                   phase_wall=wall, batch_days=batch_days))  # fmt: skip

    def set_phase(self, phase: str, wall: datetime | None = None) -> ClockState:
        """A stepped clock's step moves from settling to its traffic (or back, after a restart)."""
        if phase not in (SETTLE, TRAFFIC):
            raise ClockError(f"phase must be {SETTLE!r} or {TRAFFIC!r}, got {phase!r}")
        state = self._require()
        if not state.stepped:
            raise ClockError("only a stepped clock has phases")
        return self._write(replace(state, phase=phase, phase_wall=_wall(wall)))

    def _require(self) -> ClockState:
        state = self._read()
        if state is None:
            raise ClockError(f"no simulated clock at {self.path}: start one first")
        return state

    def _write(self, state: ClockState) -> ClockState:
        """Write the clock's own state; return it in this reader's time."""
        write_json_atomic(state.to_json(), self.path)
        return state.of(self.usecase)


def shared_spans(
    starts: dict[str, datetime], ends: dict[str, datetime]
) -> tuple[datetime, datetime, dict[str, Span]]:
    """One clock for several use cases that each start at ``starts[name]`` and end at ``ends[name]`` (their own
    times): the clock's own time is the one of the use case that starts first (ties: by name), every other use case
    is offset by whole days so that it starts at the same instant (or within the day after: its start is never
    before its data is there), and the clock ends when the last span ends. Returns (start, end, spans)."""
    if not starts or set(starts) != set(ends):
        raise ClockError(f"every use case needs a start and an end: {sorted(starts)} vs {sorted(ends)}")
    first = min(starts, key=lambda n: (starts[n], n))
    start = starts[first]
    spans = {}
    for name in sorted(starts):
        if ends[name] <= starts[name]:
            raise ClockError(f"{name}: its end {ends[name].isoformat()} is not after its start")
        lag = starts[name] - start
        days = lag.days + (1 if lag - timedelta(days=lag.days) > timedelta(0) else 0)  # whole days, rounded up
        spans[name] = Span(timedelta(days=days), ends[name])
    end = max(ends[n] - spans[n].offset for n in spans)
    return start, end, spans


def sim_seconds(wall_seconds: float, speed: float = DEFAULT_SPEED) -> timedelta:
    return timedelta(seconds=wall_seconds * speed)
