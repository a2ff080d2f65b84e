"""The simulated clock a live replay shares: data landing, sensors' "now", exposure timestamps, label arrival.

A replay of 2013 runs simulated time faster than the wall clock (by default April–December in about 20 minutes:
~20,000 simulated seconds per wall second). Every process reads the same state from ``$KEEL_HOME/clock.json``:
the simulated instant at an anchor, the wall time of that anchor, the speed, and whether it runs. ``now()`` is
computed from that, so no process has to tick it, and stopping and starting again resumes where the clock stopped
(``pause`` re-anchors at the current simulated instant; ``resume`` re-anchors at the wall clock's now).

Without a clock file, ``now()`` is the wall clock: everything that takes a ``SimClock`` works unchanged outside a
replay. Writes are atomic (temp file + rename): a reader never sees half a state.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from keel.errors import KeelError
from keel.storage import write_json_atomic

# April–December 2013 (275 days) in 20 minutes.
DEFAULT_SPEED = 275 * 86400 / (20 * 60)


class ClockError(KeelError):
    """A clock state that cannot be: bad speed, an end before the start, a corrupt clock file."""


@dataclass(frozen=True)
class ClockState:
    sim_anchor: datetime  # the simulated instant at wall_anchor
    wall_anchor: datetime
    speed: float  # simulated seconds per wall second
    running: bool
    sim_end: datetime | None = None  # the clock stops here

    def now(self, wall: datetime) -> datetime:
        if not self.running:
            return self.sim_anchor
        sim = self.sim_anchor + (wall - self.wall_anchor) * self.speed
        return min(sim, self.sim_end) if self.sim_end else sim

    def finished(self, wall: datetime) -> bool:
        return self.sim_end is not None and self.now(wall) >= self.sim_end

    def to_json(self) -> dict:
        out = asdict(self)
        for k in ("sim_anchor", "wall_anchor", "sim_end"):
            out[k] = out[k].isoformat() if out[k] else None
        return out

    @classmethod
    def from_json(cls, data: dict) -> ClockState:
        try:
            return cls(
                sim_anchor=_utc(data["sim_anchor"]),
                wall_anchor=_utc(data["wall_anchor"]),
                speed=float(data["speed"]),
                running=bool(data["running"]),
                sim_end=_utc(data["sim_end"]) if data.get("sim_end") else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ClockError(f"clock state is not valid: {exc}") from None


def _utc(text: str) -> datetime:
    t = datetime.fromisoformat(text)
    if t.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return t.astimezone(UTC)


def _wall(wall: datetime | None) -> datetime:
    return wall or datetime.now(UTC)


class SimClock:
    """The shared clock at ``path`` (``KeelHome.clock``). ``wall`` arguments exist for tests; callers omit them."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def state(self) -> ClockState | None:
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
        self, sim_start: datetime, *, speed: float = DEFAULT_SPEED, sim_end: datetime | None = None, wall=None
    ) -> ClockState:
        if not speed > 0:
            raise ClockError(f"speed must be > 0 simulated seconds per wall second, got {speed}")
        if sim_start.tzinfo is None:
            raise ClockError("sim_start needs a time zone (UTC)")
        if sim_end is not None and sim_end <= sim_start:
            raise ClockError(f"the end {sim_end.isoformat()} is not after the start {sim_start.isoformat()}")
        return self._write(ClockState(sim_start.astimezone(UTC), _wall(wall), speed, True, sim_end))

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
        """Jump the simulated clock forward (tests, catching up); never backwards."""
        state = self._require()
        wall = _wall(wall)
        if sim < state.now(wall):
            raise ClockError(f"the clock never goes back: {sim.isoformat()} is before {state.now(wall).isoformat()}")
        return self._write(replace(state, sim_anchor=sim, wall_anchor=wall))

    def _require(self) -> ClockState:
        state = self.state()
        if state is None:
            raise ClockError(f"no simulated clock at {self.path}: start one first")
        return state

    def _write(self, state: ClockState) -> ClockState:
        write_json_atomic(state.to_json(), self.path)
        return state


def sim_seconds(wall_seconds: float, speed: float = DEFAULT_SPEED) -> timedelta:
    return timedelta(seconds=wall_seconds * speed)
