"""Admission by service tier, across every model one gateway process serves.

A request of tier T starts only while fewer than ``limit[T]`` requests — of any model, any tier — are in flight in
the process (the policy's ``admit_in_flight``). L1's limit is the highest, L3's the lowest, so the places between
two limits can only ever go to the higher tiers: under overload L1 is admitted first, L2 waits for a place up to its
``admit_wait_ms`` and L3, which does not wait, is shed at once. When a place frees, it goes to the waiter of the
highest tier that may take it (first come, first served within a tier); a newcomer never overtakes a waiter of its
own tier, because a waiter exists only while its tier's limit is reached. A request that gets no place in time is
shed: the gateway answers 503 ``shed`` naming its tier — a structured answer, never a bare 5xx.

The waiting room is bounded too: a request may wait only while fewer than its tier's limit are already waiting in
its tier (more could not be served within a deadline anyway); otherwise it is shed at once. ``would_shed``
asks the same question without taking a place, so the gateway can refuse a request before reading its body.

One event loop owns it (the gateway's): no locks, only futures.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from dataclasses import dataclass, field


class Shed(Exception):
    """No place for the request's tier in time."""

    def __init__(self, tier: str, limit: int, waited_s: float):
        super().__init__(f"tier {tier} is over its share of the model runtime ({limit} requests in flight)")
        self.tier, self.limit, self.waited_s = tier, limit, waited_s


@dataclass(order=True)
class _Waiter:
    rank: int
    seq: int
    tier: str = field(compare=False)
    limit: int = field(compare=False)
    future: asyncio.Future = field(compare=False)


class TierAdmission:
    def __init__(self) -> None:
        self.in_flight = 0
        self.by_tier: Counter[str] = Counter()  # in flight, per tier
        self.admitted: Counter[str] = Counter()
        self.shed: Counter[str] = Counter()
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()

    async def acquire(
        self, tier: str, rank: int, limit: int | None, wait_s: float, max_waiting: int | None = None
    ) -> None:
        """Take a place for a request of ``tier`` (``rank``: 0 for the highest tier), waiting up to ``wait_s``;
        raises ``Shed`` when none came. ``limit`` None: the tier is not limited here (a place at once).
        ``max_waiting``: requests of the tier that may wait at once (default: ``limit``)."""
        if limit is None or self.in_flight < limit:
            self._start(tier)
            return
        if wait_s <= 0 or self.waiting_in(tier) >= (limit if max_waiting is None else max_waiting):
            self.shed[tier] += 1
            raise Shed(tier, limit, 0.0)
        waiter = _Waiter(rank, next(self._seq), tier, limit, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter.future, wait_s)  # a place granted as the wait ran out is kept
        except TimeoutError:
            self._forget(waiter)
            self.shed[tier] += 1
            raise Shed(tier, limit, wait_s) from None
        except asyncio.CancelledError:  # the caller went away: give back a place granted meanwhile
            self._forget(waiter)
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(tier)
            raise

    def release(self, tier: str) -> None:
        """The request of ``tier`` is done: its place goes to the best waiter that may take it."""
        self.in_flight -= 1
        self.by_tier[tier] -= 1
        while self._waiters:
            eligible = [w for w in self._waiters if self.in_flight < w.limit]
            if not eligible:
                return
            best = min(eligible)
            self._forget(best)
            if best.future.done():  # it timed out or was cancelled just now
                continue
            self._start(best.tier)
            best.future.set_result(None)
            return

    def would_shed(self, tier: str, limit: int | None, wait_s: float, max_waiting: int | None = None) -> bool:
        """Would a request of ``tier`` be shed at once now (no place, and no room or no time to wait)?"""
        if limit is None or self.in_flight < limit:
            return False
        return wait_s <= 0 or self.waiting_in(tier) >= (limit if max_waiting is None else max_waiting)

    def waiting_in(self, tier: str) -> int:
        return sum(1 for w in self._waiters if w.tier == tier)

    def waiting(self) -> Counter[str]:
        return Counter(w.tier for w in self._waiters)

    def _start(self, tier: str) -> None:
        self.in_flight += 1
        self.by_tier[tier] += 1
        self.admitted[tier] += 1

    def _forget(self, waiter: _Waiter) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
