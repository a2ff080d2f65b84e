"""The process's concurrency limit, adapted to observed latency: Netflix concurrency-limits' **Gradient2** algorithm.

A fixed in-flight limit is tuned on one machine at one load; on a starved machine it admits more than can be
answered in time, on a big one it sheds what could have been. Gradient2 compares the latency of recent requests
(``short``: the average of the current window) with a slow average of the latency seen so far (``long``, an
exponential average over ``LONG_WINDOW`` windows: the no-load latency while there is no queue):

    gradient = clamp(tolerance · long / short, 0.5, 1)      (1: no queueing; < 1: latency grew with load)
    new      = limit · gradient + queue_size               (queue_size: room to probe for more)
    limit    = limit · (1 − smoothing) + new · smoothing,  clamped to [min_limit, max_limit]

It does not grow while the service is app-limited (fewer than half the limit in flight), and when the long average
is more than twice the short one (latency back to normal after a long overload) the long average decays, so the
limit recovers. Why Gradient2 and not AIMD or Envoy's adaptive-concurrency filter: AIMD needs a drop signal (a
timeout) before it backs off — the queue has already formed; Envoy's gradient controller measures its no-load
latency by pinning the limit low for a sampling window every few seconds, which sheds L1 on a schedule. Gradient2
reacts to the latency growth itself and needs no pinning.

Pure and clock-injected: the gateway feeds it one sample per answered request (``update``); tests drive it by hand.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

LONG_WINDOW = 600  # windows in the long (no-load) average
WINDOW_S = 0.1  # a window closes after this long …
WINDOW_SAMPLES = 10  # … and at least this many samples


class GradientLimit:
    def __init__(
        self,
        initial: float = 32,
        min_limit: float = 8,
        max_limit: float = 1024,
        tolerance: float = 1.5,
        smoothing: float = 0.2,
        queue_size: Callable[[float], float] = lambda limit: max(4.0, math.sqrt(limit)),
        clock: Callable[[], float] = time.monotonic,
    ):
        self.limit = float(initial)
        self.min_limit, self.max_limit = float(min_limit), float(max_limit)
        self.tolerance, self.smoothing, self.queue_size = tolerance, smoothing, queue_size
        self.clock = clock
        self.long_rtt: float | None = None
        self._windows = 0
        self._window_start = clock()
        self._sum = 0.0
        self._n = 0
        self._max_in_flight = 0

    def update(self, rtt_s: float, in_flight: int) -> float:
        """One answered request's latency (from admission to its answer) and the requests in flight when it
        started; returns the limit (changed when a window closes)."""
        self._sum += rtt_s
        self._n += 1
        self._max_in_flight = max(self._max_in_flight, in_flight)
        now = self.clock()
        if self._n < WINDOW_SAMPLES or now - self._window_start < WINDOW_S:
            return self.limit
        short = self._sum / self._n
        in_window = self._max_in_flight
        self._window_start, self._sum, self._n, self._max_in_flight = now, 0.0, 0, 0
        self._close_window(short, in_window)
        return self.limit

    def _close_window(self, short: float, in_flight: int) -> None:
        if short <= 0:
            return
        self._windows += 1
        if self.long_rtt is None:
            self.long_rtt = short
        else:
            weight = 2.0 / (min(self._windows, LONG_WINDOW) + 1)
            self.long_rtt += (short - self.long_rtt) * weight
        if self.long_rtt / short > 2:  # latency is back to normal after a long overload: let the baseline follow
            self.long_rtt *= 0.95
        if in_flight < self.limit / 2:  # app-limited: no evidence that more would be served well
            return
        gradient = max(0.5, min(1.0, self.tolerance * self.long_rtt / short))
        new = self.limit * gradient + self.queue_size(self.limit)
        new = self.limit * (1 - self.smoothing) + new * self.smoothing
        self.limit = max(self.min_limit, min(self.max_limit, new))


class TopTierGuard:
    """How much of the limit the lower tiers may use, decided by the highest tier's own latency: AIMD on a share.

    Gradient2 keeps the process's latency near where it has been; it does not know that one tier's latency is the
    one to protect. So the highest tier served (rank 0: L1) is watched on its own: every ``WINDOW_SAMPLES`` of its
    answers (or ``WINDOW_S``), their mean latency is compared with its no-load latency (the least window mean seen,
    drifting up by ``DRIFT`` per window so a lasting change is accepted in time). Above ``tolerance`` × no-load, the
    lower tiers' share is cut by ``backoff`` — only when the lower tiers' own work is what slows it: the event loop
    is busy with the process's own work (``busy`` ≥ ``BUSY``: its thread on the CPU most of the time), or the lower
    tiers arrive at ``FLOOD_RATIO`` × the highest tier's rate or more (a flood: on a machine whose cores the flood's
    senders and Triton share, the loop's thread is runnable but off the CPU much of the time, so ``busy`` alone
    misses it) — then at once down to ``min_share``, not by ``backoff`` per window: the flood does its harm in the
    windows a gradual cut would take. The no-load latency is the least window mean seen or ``FASTEST_FACTOR`` × the
    fastest single answer, whichever is less: a process that starts under a flood never sees a quiet window. A top
    tier slowed by a machine that other processes starve, under ordinary traffic, would not get faster for refusing
    the lower tiers: then, as at or below the tolerance, the share grows by ``step`` back towards 1 (a cut made by a
    passing burst does not outlive it on a busy machine — it once held flights at 2 % for a whole busy year). Without answers of the highest tier for ``IDLE_S`` the share is 1: nothing to protect.
    The latency watched is the top tier's whole time in the process — from its first byte read, so a request that
    waited for the loop before it was admitted counts that wait.
    """

    WINDOW_SAMPLES = 10
    WINDOW_S = 0.5
    IDLE_S = 5.0
    DRIFT = 1.002
    BUSY = 0.7
    FLOOD_RATIO = 4.0
    RATE_TAU_S = 0.5
    FASTEST_FACTOR = 1.5  # the no-load mean is at most this × the fastest single answer
    MIN_TOP_RATE = 2.0

    def __init__(
        self,
        tolerance: float = 1.5,
        backoff: float = 0.7,
        step: float = 0.05,
        min_share: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.tolerance, self.backoff, self.step, self.min_share = tolerance, backoff, step, min_share
        self.clock = clock
        self.share = 1.0
        self.noload: float | None = None
        self.fastest: float | None = None  # the fastest single answer of the top tier (drifting up as noload does)
        self._sum, self._n = 0.0, 0
        self._window_start = clock()
        self._last_top = -float("inf")
        self._rates = [0.0, 0.0]  # [highest tier, lower tiers] arrivals per second, decayed
        self._rates_at = clock()

    def arrive(self, rank: int) -> None:
        """A request arrived (before its body is read): of the highest tier (rank 0) or a lower one."""
        self._decay()
        self._rates[rank > 0] += 1.0 / self.RATE_TAU_S

    def flooded(self) -> bool:
        """Do the lower tiers arrive at ``FLOOD_RATIO`` × the highest tier's rate or more (rates decayed over
        ``RATE_TAU_S``; the top tier counted at ``MIN_TOP_RATE`` at least)?"""
        self._decay()
        top, lower = self._rates
        return lower >= self.FLOOD_RATIO * max(top, self.MIN_TOP_RATE)

    def _decay(self) -> None:
        now = self.clock()
        if now != self._rates_at:
            factor = math.exp(-(now - self._rates_at) / self.RATE_TAU_S)
            self._rates = [r * factor for r in self._rates]
            self._rates_at = now

    def update(self, rtt_s: float, busy: float = 1.0) -> None:
        """One answer of the highest tier; ``busy``: the event loop thread's share of the CPU just now."""
        now = self.clock()
        self._last_top = now
        self._sum += rtt_s
        self._n += 1
        self.fastest = rtt_s if self.fastest is None else min(self.fastest, rtt_s)
        if self._n < self.WINDOW_SAMPLES and now - self._window_start < self.WINDOW_S:
            return
        mean = self._sum / self._n
        flooded = self.flooded()
        self._sum, self._n, self._window_start = 0.0, 0, now
        self.noload = mean if self.noload is None else min(self.noload * self.DRIFT, mean)
        self.fastest *= self.DRIFT
        # a process that started under a flood never saw a quiet window: its fastest single answers say what the top
        # tier takes unloaded (cutting still needs a flood or a busy loop, so an idle spread of latencies cuts nothing)
        reference = min(self.noload, self.FASTEST_FACTOR * self.fastest)
        slow = mean > self.tolerance * reference
        if slow and flooded:  # a flood of the lower tiers: give way at once (a halving per window is seconds of harm)
            self.share = self.min_share
        elif slow and busy >= self.BUSY:
            self.share = max(self.min_share, self.share * self.backoff)
        else:  # fast again, or slow for a reason refusing the lower tiers does not remove: their share comes back
            self.share = min(1.0, self.share + self.step)

    def lower_share(self) -> float:
        """The share of their limit the lower tiers may use now."""
        if self.clock() - self._last_top > self.IDLE_S:
            return 1.0
        return self.share
