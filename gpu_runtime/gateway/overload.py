"""Telling a broken model from a busy machine: the process's load signals, and the decision whether a Triton
timeout is the model version's fault.

A breaker that counts every timeout turns a starved machine into "every version is broken": it opens, every request
goes down the fallback path, and the fallback's own cost starves the machine further — the feedback loop that took
the gateway down (issue 45). So a **timeout** is blamed on the version only when the process and the machine were
not overloaded while it ran (``blame_timeout``):

- the event loop lagged (``loop_lag_s``: how late a 5 ms timer fired, the worst of the last second) by at least
  ``LAG_SHARE`` of the call's timeout (and ``MIN_LAG_S``) — the gateway itself could not keep up, so the answer may
  have been there and not read;
- the request had already waited ``WAIT_SHARE`` of its budget before the call started (admission, lanes, features:
  the process's own queueing) — the call got the remains of a deadline, not the model's timeout;
- the machine's CPU pressure (Linux PSI ``/proc/pressure/cpu`` "some": the share of the last second in which a
  runnable task waited for a CPU; else the load average per core) was at least ``PRESSURE_LOCAL`` — Triton was
  starved of CPU, not broken.

Otherwise — an idle process, a machine with CPU to spare — the timeout is the version's (a slow model), and so is
every error that is not a timeout, whatever the load. Pure: the gateway samples the signals (``LoadMonitor``), the
decision is a value tested on its own (tests/serving/test_overload.py).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

LAG_SHARE = 0.2
MIN_LAG_S = 0.02
WAIT_SHARE = 0.5
PRESSURE_LOCAL = 0.5
TICK_S = 0.005
PSI_PATH = Path("/proc/pressure/cpu")


@dataclass(frozen=True)
class LoadSignals:
    loop_lag_s: float = 0.0  # the worst event-loop lag of the last second
    cpu_pressure: float = 0.0  # share of the last second some runnable task waited for a CPU (0…1)
    loop_busy: float = 0.0  # share of the last second the event loop's thread spent on the CPU: its own work


@dataclass(frozen=True)
class Blame:
    local: bool  # True: local overload, not the version's fault (no breaker strike)
    reason: str


def blame_timeout(signals: LoadSignals, waited_s: float, budget_s: float, timeout_s: float) -> Blame:
    """Whose fault is a Triton call that timed out after ``timeout_s``, for a request that had waited ``waited_s``
    of its ``budget_s`` before the call?"""
    if signals.loop_lag_s >= max(MIN_LAG_S, LAG_SHARE * timeout_s):
        return Blame(True, f"the gateway's event loop lagged {signals.loop_lag_s * 1000:.0f} ms")
    if budget_s > 0 and waited_s >= WAIT_SHARE * budget_s:
        return Blame(
            True, f"the request waited {waited_s * 1000:.0f} of its {budget_s * 1000:.0f} ms before the call"
        )
    if signals.cpu_pressure >= PRESSURE_LOCAL:
        return Blame(True, f"the machine's CPU pressure was {signals.cpu_pressure:.0%}")
    return Blame(False, f"timed out after {timeout_s * 1000:.0f} ms with the process and the machine not overloaded")


class StandingQueue:
    """Whether the gateway's event loop has a standing queue — CoDel's test on the loop itself: the load monitor's
    timer runs every ``TICK_S`` and is late by however long the callbacks ready before it took; when even the *least*
    late tick of the last ``INTERVAL_S`` was more than ``TARGET_S`` late, the loop never caught up in that interval:
    work arrives faster than it is done — if the loop's thread was on the CPU meanwhile (``BUSY``; else the machine
    starved it, and shedding would not help). While it stands, requests of a tier below the highest tier seen in the last
    ``PROTECT_S`` are shed at the door (before their body is read), so the loop's time goes to the highest tier; a
    process that serves one tier alone sheds nothing here (its deadlines and the adaptive limit bound it).
    Clock-injected for tests."""

    TARGET_S = 0.001
    INTERVAL_S = 0.1
    PROTECT_S = 5.0

    BUSY = 0.8

    def __init__(self, least_lag, busy=lambda: 1.0, clock=time.monotonic):
        self.least_lag = least_lag  # (window_s) → the least timer lag over that window, None without samples
        self.busy = busy  # () → the loop thread's share of the CPU over the last second
        self.clock = clock
        self._seen: dict[int, float] = {}  # tier rank → when a request of it last arrived

    @property
    def standing(self) -> bool:
        """A queue of the gateway's own work: the loop late through the interval *and* busy on the CPU — a loop late
        because other processes have the CPU (a starved machine) is not one: shedding would not help."""
        lag = self.least_lag(self.INTERVAL_S)
        return lag is not None and lag > self.TARGET_S and self.busy() >= self.BUSY

    def observe(self, rank: int) -> None:
        self._seen[rank] = self.clock()

    def shed(self, rank: int) -> bool:
        """Shed a request of tier ``rank`` now: a standing queue, and a higher tier (lower rank) is being served."""
        horizon = self.clock() - self.PROTECT_S
        if not any(r < rank and seen >= horizon for r, seen in self._seen.items()):
            return False
        return self.standing


def lateness(signals: LoadSignals, arrived: float, admitted_at: float | None, now: float) -> dict[str, float]:
    """Where a request past its deadline lost its time, for its exposure-log line (``late``): how long it waited
    for admission, and the process's and machine's state as it was refused — the worst event-loop lag of the last
    second, the loop thread's own share of it (near 1: the gateway's own work; near 0 with a lag: other work had the
    CPU) and the machine's CPU pressure."""
    out = {"elapsed_ms": round((now - arrived) * 1000, 1)}
    if admitted_at is not None:
        out["admission_wait_ms"] = round((admitted_at - arrived) * 1000, 1)
    out.update(loop_lag_ms=round(signals.loop_lag_s * 1000, 1), loop_busy=round(signals.loop_busy, 2),
               cpu_pressure=round(signals.cpu_pressure, 2))  # fmt: skip
    return out


def read_psi_total(path: Path = PSI_PATH) -> int | None:
    """The cumulative µs some task waited for a CPU (PSI), or None where the kernel has no PSI."""
    try:
        first = path.read_text().split("\n", 1)[0]
        return int(first.rsplit("total=", 1)[1])
    except (OSError, IndexError, ValueError):
        return None


class LoadMonitor:
    """Samples the signals on the gateway's event loop: a timer every ``TICK_S`` (how late it fires is the loop's
    lag) and the PSI counter (its growth over wall time is the CPU pressure, read every half second)."""

    def __init__(self) -> None:
        self._lags: deque[tuple[float, float]] = deque()  # (when, lag)
        self._cpu: deque[tuple[float, float]] = deque()  # (when, the loop thread's CPU time)
        self._psi: tuple[float, int] | None = None
        self.pressure = 0.0
        self._psi_checked = 0.0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def least_lag(self, window_s: float) -> float | None:
        """The least timer lag over the last ``window_s`` (None when no tick fell in it)."""
        horizon = time.monotonic() - window_s
        lags = [lag for when, lag in self._lags if when >= horizon]
        return min(lags) if lags else None

    def signals(self) -> LoadSignals:
        horizon = time.monotonic() - 1.0
        lag = max((lag for when, lag in self._lags if when >= horizon), default=0.0)
        return LoadSignals(loop_lag_s=lag, cpu_pressure=self.pressure, loop_busy=self.busy())

    def busy(self) -> float:
        """The event loop thread's CPU time over the wall time of the last second (0…1): near 1 it is the gateway's
        own work that keeps the loop late; a late loop that is not busy is a starved one (other work has the CPU)."""
        if len(self._cpu) < 2:
            return 0.0
        (t0, c0), (t1, c1) = self._cpu[0], self._cpu[-1]
        return min(1.0, (c1 - c0) / (t1 - t0)) if t1 > t0 else 0.0

    async def _run(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            self._lags.append((now, max(0.0, now - before - TICK_S)))
            self._cpu.append((now, time.thread_time()))
            while self._lags and self._lags[0][0] < now - 1.0:
                self._lags.popleft()
            while len(self._cpu) > 2 and self._cpu[0][0] < now - 1.0:
                self._cpu.popleft()
            if now - self._psi_checked >= 0.5:
                self._psi_checked = now
                self._sample_pressure(now)

    def _sample_pressure(self, now: float) -> None:
        total = read_psi_total()
        if total is None:
            cores = os.cpu_count() or 1
            self.pressure = min(1.0, max(0.0, os.getloadavg()[0] / cores - 1.0))  # runnable beyond the cores
            return
        if self._psi is not None and now - self._psi[0] >= 0.4:
            self.pressure = min(1.0, (total - self._psi[1]) / 1e6 / (now - self._psi[0]))
            self._psi = (now, total)
        elif self._psi is None:
            self._psi = (now, total)
