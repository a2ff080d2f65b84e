"""The edge's answer to a flood of the lower tiers (issue 61, 3b): while one lasts, it lets a single lower-tier
request at a time through to the workers, so the highest tier keeps the machine.

Envoy's breakers per priority (keel/edge/envoy.py ``priority_limits``) hold the lower tiers, together, to what the
workers would admit of them (the policy's ``admit_in_flight`` × the hosts) and let a few more wait; beyond that Envoy
refuses them in C++ — a structured 503 ``shed`` from stage ``edge`` — before a worker reads a byte. That keeps a flood
out of the workers' queues, but not off their CPU: every lower-tier request the workers hold competes for the same
cores as the highest tier's, and measured on one server core beside an open-loop flood of 2,500 req/s (bench/
edge_flood.py, BENCHMARKS.md) L1 answered within its deadline 10 % of the time with a dozen lower-tier requests in
flight, 73 % with four, 88 % with two and 99 % with none.

So the edge tells a flood from ordinary traffic by what its own breakers do: a lower-tier request refused for want of
a place is a flood (ordinary traffic, even a burst or a stalled worker, fits in the places the policy gives). Then,
through Envoy's runtime (the admin port's ``/runtime_modify``, no configuration reloaded), the lower tiers get
``FLOOD_IN_FLIGHT`` request in flight (none waiting), until no lower-tier request has been refused for
``CALM_S``; then the policy's places come back. The decision is this module's value (``FloodCut.observe``), the action
gpu_runtime/edge_follower.py's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

CALM_S = 5.0  # no lower-tier refusal for this long: the flood is over, the policy's places come back
FLOOD_IN_FLIGHT = 1  # lower-tier requests in flight to the workers while a flood lasts (all hosts together)
CLUSTER = "keel_gateway"
# requests Envoy's breakers refused: no place to wait (connections), or none in flight (requests)
REFUSED_COUNTERS = (
    f"cluster.{CLUSTER}.upstream_rq_pending_overflow",
    f"cluster.{CLUSTER}.upstream_rq_active_overflow",
)
# Envoy's runtime key for the DEFAULT priority's breaker (every tier below L1): requests in flight to the workers. A
# request over it is refused at once (a place to wait comes only from the connection breaker): in a flood, waiting
# would only make the refusal later
KEYS = (f"circuit_breakers.{CLUSTER}.default.max_requests",)


def flood_cut_enabled() -> bool:
    """``KEEL_EDGE_FLOOD_CUT=0``: the edge as before issue 61 — no cut, and the lower tiers' places the policy's caps
    times the hosts with no ceiling per worker (bench/edge_flood.py's peer). On by default."""
    return os.environ.get("KEEL_EDGE_FLOOD_CUT", "1") != "0"


def flood_overrides() -> dict[str, str]:
    """The lower tiers' places while a flood lasts: ``FLOOD_IN_FLIGHT`` in flight, none waiting."""
    return {KEYS[0]: str(FLOOD_IN_FLIGHT)}


@dataclass
class FloodCut:
    """Follows Envoy's count of refused requests and says when the lower tiers' places change."""

    calm_s: float = CALM_S
    cut: bool = False
    last_refused: float | None = None
    seen: int | None = None

    def observe(self, now: float, refused_total: int) -> dict[str, str] | None:
        """Envoy's refusals so far (the sum of ``REFUSED_COUNTERS``) at ``now`` → the runtime overrides to set (an empty value
        removes one: the configured breaker is back), or None: nothing changes. The first reading only sets the
        baseline; a counter that went down (Envoy restarted) starts a new one."""
        new = 0 if self.seen is None or refused_total < self.seen else refused_total - self.seen
        self.seen = refused_total
        if new:
            self.last_refused = now
            if not self.cut:
                self.cut = True
                return flood_overrides()
            return None
        if self.cut and self.last_refused is not None and now - self.last_refused >= self.calm_s:
            self.cut = False
            return {key: "" for key in KEYS}
        return None

    def state(self) -> str:
        return f"flood: the lower tiers held to {FLOOD_IN_FLIGHT} in flight" if self.cut else "the policy's places"
