"""L1's own door: a second listener of the edge, for the top tier's requests only, whose connections no other tier
can take (docs/serving.md, "L1's own door").

Envoy caps the open downstream connections of its listeners together (the overload manager's
``global_downstream_max_connections``, ``EdgeLimits.max_connections``): one more is refused at accept, before a byte
of it is read — before Envoy could know its tenant or its tier. A flood of the lower tiers on a starved machine holds
thousands of connections (each a client waiting for its answer, or its refusal), and an L1 client's new connection
met the cap and was reset (bench/edge_flood.py: one in a run beside a live platform). Priorities within the
listener cannot help there: the connection is refused before a request exists.

So L1 comes in by a listener of its own (``EdgeSpec.priority_port``) with connections reserved for it: the main
listener holds at most ``max_connections`` (Envoy's connection-limit network filter: one more is closed as it is
accepted), L1's door at most ``priority_connections``, and the global cap is their sum and ``HEADROOM`` — so the
flood's connections can never take the ones L1's door holds. (Envoy's ``ignore_global_conn_limit`` would have put
the door outside the global cap instead; in the pinned Envoy a closed connection of such a listener is taken off
the global count it was never on, so every L1 connection that closed gave the flood one more —
tests/edge/test_edge_door.py shows the reservation holds.) Its routes are the top tier's
alone — the top tier's models, and ``/v1/predict`` when the edge filter set ``x-keel-tier: L1`` (its tenant was
given L1; the filter refuses a forged tier with 403 before routing). Anything else is answered ``421 wrong_door`` by
Envoy itself, never forwarded: the lower tiers cannot borrow L1's door for a request the workers would serve. The
edge filter, the tenants' rate limits and the body limit are the same as on the main listener.

What it does not do: an authenticated tenant who sends the lower tiers' requests at L1's door to fill its
connections is refused each (421, or 403 from the filter) but holds a connection while it is; the door's cap bounds
what that costs, and the tenant's own rate limit and key say who it was.
"""

from __future__ import annotations

import json
from typing import Any

from keel.edge.envoy import LISTENER_NAME, PRIORITY, EdgeSpec, listener, routes

PRIORITY_LISTENER_NAME = "keel_edge_l1"
# the global cap's connections kept free beyond L1's: the flood's connections the main listener closes as it accepts
# them are on the global count for that moment
HEADROOM = 16
CONNECTION_LIMIT = "type.googleapis.com/envoy.extensions.filters.network.connection_limit.v3.ConnectionLimit"


def top_tiers(spec: EdgeSpec) -> set[str]:
    """The tiers the door serves: those at Envoy priority HIGH (L1)."""
    return {t for t in spec.policy.tiers if PRIORITY.get(t) == "HIGH"}


def wrong_door(message: str) -> dict[str, Any]:
    """Envoy's own answer at the door to what is not the top tier's, in the shape of the gateway's errors."""
    body = {"error": {"code": "wrong_door", "message": message, "stage": "edge"}}
    return {
        "direct_response": {"status": 421, "body": {"inline_string": json.dumps(body)}},
        "response_headers_to_add": [
            {
                "header": {"key": "content-type", "value": "application/json"},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            }
        ],
    }


def door_routes(spec: EdgeSpec) -> list[dict[str, Any]]:
    """The top tier's routes of the main listener, and ``421 wrong_door`` for everything else."""
    top = top_tiers(spec)
    by_name = {r["name"]: r for r in routes(spec)}
    elsewhere = f"this port is the {'/'.join(sorted(top))} tier's door: send other requests to the edge's main port"
    out = [by_name[f"model:{m}"] for m, tier in sorted(spec.models.items()) if tier in top]
    out += [
        {"name": f"elsewhere:{m}", "match": {"prefix": f"/v1/models/{m}/"}} | wrong_door(elsewhere)
        for m, tier in sorted(spec.models.items())
        if tier not in top
    ]
    out.append(by_name["predict:L1"])  # the body-routed predict whose tenant the edge filter let claim L1
    out.append({"name": "elsewhere", "match": {"prefix": "/"}} | wrong_door(elsewhere))
    return out


def limited(resource: dict[str, Any], name: str, max_connections: int) -> dict[str, Any]:
    """``resource`` (a listener) with Envoy's connection-limit filter first in its filter chain."""
    limit = {"@type": CONNECTION_LIMIT, "stat_prefix": name, "max_connections": max_connections}
    [chain] = resource["filter_chains"]
    chain = chain | {
        "filters": [{"name": "envoy.filters.network.connection_limit", "typed_config": limit}, *chain["filters"]]
    }
    return resource | {"filter_chains": [chain]}


def priority_listener(spec: EdgeSpec) -> dict[str, Any]:
    """L1's listener on ``spec.priority_port``: its own routes, at most ``limits.priority_connections``."""
    if spec.priority_port is None:
        raise ValueError("the edge has no L1 door: EdgeSpec.priority_port is None")
    door = listener(spec, PRIORITY_LISTENER_NAME, spec.priority_port, door_routes(spec))
    return limited(door, PRIORITY_LISTENER_NAME, spec.limits.priority_connections)


def listeners(spec: EdgeSpec) -> list[dict[str, Any]]:
    """The edge's listeners: the main one, and — when the spec has its port — L1's door, each within its own cap
    (the main one ``limits.max_connections``, the door ``limits.priority_connections``), both within the global
    one (``global_connections``)."""
    if spec.priority_port is None:
        return [listener(spec)]
    if spec.limits.priority_connections < 1:
        raise ValueError(f"L1's door holds {spec.limits.priority_connections} connections: it needs at least one")
    main = limited(listener(spec), LISTENER_NAME, spec.limits.max_connections)
    return [main, priority_listener(spec)]


def global_connections(spec: EdgeSpec) -> int:
    """Envoy's global cap over its listeners (the overload manager's): the main listener's connections, and with
    L1's door its own and ``HEADROOM`` more — so the lower tiers' connections never take the door's."""
    lim = spec.limits
    return lim.max_connections + (lim.priority_connections + HEADROOM if spec.priority_port is not None else 0)
