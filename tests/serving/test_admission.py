"""Tier admission across models (gpu_runtime/gateway/admission.py), on a real event loop: which request gets a place
is decided by tier and order, never by timing — every test releases places itself, and waits are either zero or
far longer than the test needs."""

from __future__ import annotations

import asyncio

import pytest

from gpu_runtime.gateway.admission import Shed, TierAdmission

LIMITS = {"L1": 4, "L2": 2, "L3": 1}
RANK = {"L1": 0, "L2": 1, "L3": 2}
LONG = 60.0  # a wait no test reaches: places are granted by releases, not by time


async def settle() -> None:
    """Let every ready task run to its next wait (a granted place takes a few loop turns to reach its caller)."""
    for _ in range(50):
        await asyncio.sleep(0)


def acquire(adm: TierAdmission, tier: str, wait_s: float = LONG):
    return adm.acquire(tier, RANK[tier], LIMITS[tier], wait_s)


def test_lower_tiers_leave_room_that_only_higher_tiers_may_take():
    async def scenario():
        adm = TierAdmission()
        await acquire(adm, "L2")
        await acquire(adm, "L2")  # L2's limit: 2 in flight
        with pytest.raises(Shed, match="tier L3 is over its share"):
            await acquire(adm, "L3", 0)  # L3 does not wait: shed at once
        with pytest.raises(Shed):
            await acquire(adm, "L2", 0)
        await acquire(adm, "L1")
        await acquire(adm, "L1")  # the two places above L2's limit are L1's alone
        assert adm.in_flight == 4 and adm.by_tier == {"L1": 2, "L2": 2}
        assert adm.shed == {"L3": 1, "L2": 1} and adm.admitted == {"L1": 2, "L2": 2}

    asyncio.run(scenario())


def test_a_freed_place_goes_to_the_highest_waiting_tier_first_then_in_arrival_order():
    async def scenario():
        adm = TierAdmission()
        for _ in range(4):
            await acquire(adm, "L1")  # full for everyone
        started: list[str] = []

        async def request(name: str, tier: str) -> None:
            await acquire(adm, tier)
            started.append(name)

        tasks = [asyncio.create_task(request(n, t)) for n, t in (("a", "L2"), ("b", "L1"), ("c", "L2"), ("d", "L1"))]
        await settle()  # every request is waiting now
        assert adm.waiting() == {"L1": 2, "L2": 2} and started == []
        adm.release("L1")  # 3 in flight: only an L1 may start (L2's limit is 2)
        await settle()
        assert started == ["b"]
        adm.release("L1")
        await settle()
        assert started == ["b", "d"]
        adm.release("L1")
        await settle()
        assert started == ["b", "d"]  # 3 in flight still (b and d took places): no L2 yet
        adm.release("L1")  # 2 in flight: still L2's limit
        await settle()
        assert started == ["b", "d"]
        adm.release("L1")  # 1 in flight: an L2 may start, the first to come
        await settle()
        assert started == ["b", "d", "a"]
        adm.release("L2")  # a is done: c, in arrival order
        await settle()
        await asyncio.gather(*tasks)
        assert started == ["b", "d", "a", "c"] and adm.waiting() == {}

    asyncio.run(scenario())


def test_a_wait_that_runs_out_is_shed_and_its_place_is_not_lost():
    async def scenario():
        adm = TierAdmission()
        await acquire(adm, "L2")
        await acquire(adm, "L2")
        with pytest.raises(Shed) as shed:
            await acquire(adm, "L2", wait_s=0.01)  # nobody releases: it runs out
        assert shed.value.tier == "L2" and shed.value.limit == 2
        assert adm.waiting() == {} and adm.in_flight == 2
        adm.release("L2")
        await acquire(adm, "L2", 0)  # the freed place is there for the next one
        assert adm.in_flight == 2

    asyncio.run(scenario())


def test_a_caller_that_goes_away_while_waiting_leaves_no_place_behind():
    async def scenario():
        adm = TierAdmission()
        for _ in range(4):
            await acquire(adm, "L1")
        waiting = asyncio.create_task(acquire(adm, "L1"))
        await settle()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        for _ in range(4):
            adm.release("L1")
        assert adm.in_flight == 0 and adm.waiting() == {}

    asyncio.run(scenario())


def test_an_unlimited_tier_always_gets_a_place():
    async def scenario():
        adm = TierAdmission()
        for _ in range(10):
            await adm.acquire("custom", 0, None, 0)
        assert adm.in_flight == 10

    asyncio.run(scenario())
