"""The admit stage of the request path (stages.py): the tenant's rate limit and budget (429), then a place in the
process for the model's tier — admission.py's waiting room, at the tier's share of the adaptive concurrency limit
(concurrency.py) — and a place in the request's risk lane, each waited for no longer than the request's deadline
allows; otherwise a 503 ``shed`` / ``overloaded``. ``would_shed`` asks the tier's question before the body is read.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import Any

from gpu_runtime.gateway.admission import Shed
from gpu_runtime.gateway.limits import OTHER_TENANT, RequestError
from gpu_runtime.gateway.request import RequestContext

LOWER_WAIT_SHARE = 0.1  # of its timeout, the longest a request below the highest tier waits for a place by default
TIER_SHARES = (1.0, 0.8, 0.6)  # of the adaptive concurrency limit, by tier rank (L1, L2, L3; lower ones: the last)


def tier_rank(model: Any, tier: str) -> int:
    """The tier's rank among the policy's tiers (0: the highest)."""
    return sorted(model.policy.tiers).index(tier)


def tier_limit(server: Any, model: Any, tier: str) -> tuple[int, int | None]:
    """(the tier's rank, its in-flight limit now): its share of the adaptive limit, at most the policy's cap."""
    policy = model.policy
    rank = tier_rank(model, tier)
    cap = policy.admit_in_flight.get(tier)
    if cap is None:
        return rank, None
    share = TIER_SHARES[min(rank, len(TIER_SHARES) - 1)]
    if rank > 0:  # below the highest tier: as much as the highest tier's latency allows (concurrency.TopTierGuard)
        share *= server.guard.lower_share()
    return rank, min(cap, max(1, int(server.limit.limit * share)))  # a cap of 0: no room for the tier at all


def admit_wait_s(server: Any, model: Any, tier: str, ctx: RequestContext) -> float:
    """How long a request of ``tier`` may wait for a place: its policy's ``admit_wait_ms``, never past its deadline.
    Default: the highest tier its timeout; a lower tier ``LOWER_WAIT_SHARE`` of it (a later place leaves too little
    of its deadline to be served in, and the refusal would come too late to go elsewhere) — and nothing while the
    lower tiers flood the process: a waiting room that empties every few ms lets the flood past the door."""
    rank = tier_rank(model, tier)
    if rank > 0 and server.guard.flooded():
        return 0.0
    wait_ms = model.policy.admit_wait_ms.get(tier)
    if wait_ms is None:
        share = 1.0 if rank == 0 else LOWER_WAIT_SHARE
        wait = share * model.timeout_ms() / 1000
    else:
        wait = wait_ms / 1000
    return max(0.0, min(wait, ctx.remaining_s()))


def would_shed(server: Any, model: Any, ctx: RequestContext) -> tuple[bool, int | None]:
    """Before the body is read: would this request's tier be shed at once — the event loop has a standing queue
    while a higher tier is served (overload.py), or no place and no room to wait? The route names the model, so its
    tier is known from the path alone. Returns (shed, the tier's in-flight limit it was judged by)."""
    tier = model.tier()
    rank, limit = tier_limit(server, model, tier)
    server.queue.observe(rank)
    server.guard.arrive(rank)
    if server.queue.shed(rank):
        return True, limit
    shed = server.admission.would_shed(
        tier, limit, admit_wait_s(server, model, tier, ctx), model.policy.admit_in_flight.get(tier)
    )
    return shed, limit


async def take_place(server: Any, model: Any, tier: str, ctx: RequestContext) -> int:
    """A place in the process for a request of ``tier`` (admission.py), or a 503 ``shed`` naming the tier; returns
    the tier's rank (0: the highest)."""
    rank, limit = tier_limit(server, model, tier)
    try:
        await server.admission.acquire(tier, rank, limit, admit_wait_s(server, model, tier, ctx),
                                       model.policy.admit_in_flight.get(tier))  # fmt: skip
    except Shed as shed:
        model.metrics.inc("keel_gateway_shed_total", {"tier": tier})
        raise RequestError(503, "shed", str(shed), tier=tier, in_flight_limit=shed.limit, stage="admit",
                           retry_after_s=1) from None  # fmt: skip
    model.metrics.add_gauge("keel_gateway_tier_in_flight", {"tier": tier}, 1)
    return rank


def give_place(server: Any, model: Any, tier: str) -> None:
    server.admission.release(tier)
    model.metrics.add_gauge("keel_gateway_tier_in_flight", {"tier": tier}, -1)


@asynccontextmanager
async def admitted(server: Any, model: Any, ctx: RequestContext):
    """The admit stage: tenant limits, then a place for the tier and the risk lane, held while the request is in
    flight; on the way out the request's latency goes to the adaptive limit (answers Triton gave only)."""
    ctx.check("admit")
    if not model.bucket(ctx.tenant).take():
        named = ctx.tenant if ctx.tenant in model.policy.tenant_rate_limits else OTHER_TENANT
        model.metrics.inc("keel_gateway_rate_limited_total", {"tenant": named})
        raise RequestError(429, "rate_limited", f"tenant {ctx.tenant} is over its rate limit", retry_after_s=1)
    ctx.extra_headers |= model.meter.check_budget(ctx.tenant)
    if not server.watching:  # embedded without an ASGI lifespan: nobody else follows routing and policies
        model.follow()
    tier = ctx.tier = model.tier()
    rank = await take_place(server, model, tier, ctx)
    lane = model.lanes[ctx.risk_level]
    try:
        if lane.locked():  # full: wait for a place, within the deadline
            try:
                await asyncio.wait_for(lane.acquire(), ctx.remaining_s())
            except TimeoutError:
                raise RequestError(503, "overloaded", f"risk level {ctx.risk_level} lane is full",
                                   risk_level=ctx.risk_level, stage="admit", retry_after_s=1) from None  # fmt: skip
        else:  # a place is free: take it without wait_for's task (most requests)
            await lane.acquire()
    except BaseException:
        give_place(server, model, tier)
        raise
    model.metrics.add_gauge("keel_gateway_lane_in_flight", {"risk_level": str(ctx.risk_level)}, 1)
    ctx.admitted_at = time.monotonic()
    in_flight = server.admission.in_flight
    try:
        yield
    finally:
        lane.release()
        give_place(server, model, tier)
        model.metrics.add_gauge("keel_gateway_lane_in_flight", {"risk_level": str(ctx.risk_level)}, -1)
        if ctx.scores is not None and not ctx.coarse:
            rtt = time.monotonic() - ctx.admitted_at
            server.limit.update(rtt, in_flight)
            if rank == 0:  # its whole time in the process: a wait for the loop before admission counts
                server.guard.update(time.monotonic() - ctx.arrived, server.load.busy())
