"""When a stepped clock's step has settled: the sensors that decide have looked at it, and nothing is left to do.

A stepped replay (keel/clock.py) moves to its next step only when the work due at the current one is done. "Done"
is a fixpoint, observed from outside the sensors:

- every sensor that decides (a use case's landing, drift and canary sensors: ``deciding_sensors``) has evaluated
  a tick **in this step's settle phase** that began after the last run finished, and that tick asked for nothing
  (no run requested, no policy committed);
- no run is queued or in progress.

A tick that asks for something does not settle the step: its runs (or its commit's consequences) are looked at by a
later tick, which must itself find nothing to do. So a drift report that leads to a challenger, a gate and a canary
start all happen in the step whose delivery caused them, however long the runs take on this machine.

Each deciding sensor writes one small record per evaluation — which step, when the tick began, how much it asked for
— to ``$KEEL_HOME/clock_ticks/<sensor>.json`` (``record_tick``; atomic). ``settled`` is pure: the driver reads the
records and the runs and asks it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from keel.clock import ClockState
from keel.names import validate_name
from keel.storage import write_json_atomic

DECIDING = ("landing_sensor", "drift_sensor", "canary_sensor")


def deciding_sensors(usecases: list[str] | tuple[str, ...]) -> list[str]:
    """The sensors a step waits for: each use case's landing, drift and canary sensor (sensors/)."""
    return [f"{uc}_{kind}" for uc in sorted(usecases) for kind in DECIDING]


@dataclass(frozen=True)
class TickRecord:
    sensor: str
    step: int  # the clock's step the tick saw
    started: float  # wall epoch seconds when the tick began
    asked: int  # runs requested + commits made by the tick (0: it found nothing to do)


def sensor_wait_reason(state: ClockState | None) -> str | None:
    """Why a deciding sensor must not act now (a stepped clock sending its traffic), or None."""
    if state is not None and state.sensors_wait:
        return f"the stepped clock is replaying step {state.step}'s traffic: the sensors act when it settles"
    return None


def record_tick(directory: str | Path, record: TickRecord) -> None:
    """Keep ``record`` as its sensor's newest tick (one file per sensor, replaced atomically)."""
    validate_name(record.sensor, what="sensor")
    write_json_atomic(asdict(record), Path(directory) / f"{record.sensor}.json")


def read_ticks(directory: str | Path, sensors: list[str]) -> dict[str, TickRecord]:
    """The newest tick record of each of ``sensors`` that has one."""
    out = {}
    for name in sensors:
        path = Path(directory) / f"{validate_name(name, what='sensor')}.json"
        try:
            out[name] = TickRecord(**json.loads(path.read_text()))
        except FileNotFoundError:
            continue
    return out


def settled(
    state: ClockState,
    ticks: dict[str, TickRecord],
    sensors: list[str],
    last_run_end: float | None,
    runs_in_progress: int,
) -> tuple[bool, str]:
    """Has the clock's current step settled (module docstring)? (yes/no, what it waits for). ``last_run_end``: wall
    epoch seconds when the newest finished run ended (None: none yet)."""
    if not state.stepped:
        raise ValueError("only a stepped clock has steps to settle")
    if runs_in_progress:
        return False, f"{runs_in_progress} run(s) queued or in progress"
    since = max(x for x in (state.phase_wall.timestamp() if state.phase_wall else 0.0, last_run_end or 0.0))
    waiting = []
    for name in sensors:
        tick = ticks.get(name)
        if tick is None or tick.step != state.step or tick.started < since:
            waiting.append(f"{name} (no tick since the step began or the last run ended)")
        elif tick.asked:
            waiting.append(f"{name} (asked for {tick.asked}: its next tick looks at the result)")
    if waiting:
        return False, "waiting for " + ", ".join(waiting)
    return True, f"step {state.step} settled"
