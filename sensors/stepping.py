"""The deciding sensors on a stepped clock (keel/steps.py): they wait while the step's traffic is sent, and each
evaluation leaves a record of what it asked for, so the driver knows when the step has settled."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import dagster as dg

from keel.clock import SimClock
from keel.steps import TickRecord, record_tick, sensor_wait_reason


def interval_s(default: int = 10) -> int:
    """The deciding sensors' minimum interval: ``$KEEL_SENSOR_INTERVAL_S`` (a stepped replay sets it low — every
    step waits for their ticks), else ``default``."""
    raw = os.environ.get("KEEL_SENSOR_INTERVAL_S")
    try:
        return max(1, int(raw)) if raw else default
    except ValueError:
        raise ValueError(f"KEEL_SENSOR_INTERVAL_S must be a whole number of seconds, got {raw!r}") from None


def asked(result, cursor_before: str | None) -> int:
    """How much a sensor's evaluation asked for: its run requests, its asset events, and 1 for a moved cursor (a
    skip asks for nothing)."""
    if result is None or isinstance(result, dg.SkipReason):
        return 0
    if isinstance(result, dg.RunRequest):
        return 1
    if isinstance(result, dg.SensorResult):
        moved = result.cursor is not None and result.cursor != cursor_before
        return len(result.run_requests or []) + len(result.asset_events or []) + int(moved)
    return sum(1 for r in result if isinstance(r, dg.RunRequest))


def stepped_tick(context, name: str, usecase: str, keel_home, evaluate: Callable[[], object]):
    """``evaluate()`` as the sensor ``name`` of ``usecase`` — unless a stepped clock is sending its traffic — and its
    tick record when the clock is stepped."""
    home = keel_home.layout()
    state = SimClock(home.clock, usecase).state()
    wait = sensor_wait_reason(state)
    if wait:
        return dg.SkipReason(wait)
    started = time.time()
    cursor_before = context.cursor
    result = evaluate()
    if state is not None and state.stepped:
        record_tick(home.clock_ticks, TickRecord(name, state.step, started, asked(result, cursor_before)))
    return result
