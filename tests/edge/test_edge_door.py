"""L1's own door at the edge (keel/edge/door.py): its routes are the top tier's alone, and against the real Envoy
(stand-in workers, tests/edge/test_envoy.py) an L1 request is served through it while the lower tiers' connections
fill all the main listener may hold — where an L1 connection is refused (before, the cap every tier shared)."""

from __future__ import annotations

import socket
import time
from dataclasses import replace

import pytest

from gpu_runtime.edge import EnvoyEdge
from gpu_runtime.triton import free_port
from keel.edge.door import HEADROOM, PRIORITY_LISTENER_NAME, door_routes, global_connections, listeners
from keel.edge.envoy import LISTENER_NAME, EdgeLimits, EdgeSpec
from tests.edge.test_envoy import MODELS, post, workers  # noqa: F401 - the fixtures

LIMITS = EdgeLimits(max_connections=4, priority_connections=4)  # the main listener's 4, the door's 4 more


def test_the_door_routes_the_top_tier_and_answers_everything_else_itself():
    spec = EdgeSpec(port=1, workers=(2,), models=MODELS, priority_port=3)
    by_name = {r["name"]: r for r in door_routes(spec)}
    assert by_name["model:room-rate"]["route"]["priority"] == "HIGH"  # L1's model: to the workers
    assert by_name["elsewhere:flight-delay"]["direct_response"]["status"] == 421  # L2's: never forwarded
    assert by_name["predict:L1"]["match"]["headers"] == [{"name": "x-keel-tier", "string_match": {"exact": "L1"}}]
    assert by_name["elsewhere"]["direct_response"]["status"] == 421
    assert [r["name"] for r in door_routes(spec)][-1] == "elsewhere"  # the catch-all last
    main, door = listeners(spec)
    assert (main["name"], door["name"]) == (LISTENER_NAME, PRIORITY_LISTENER_NAME)
    cap = {x["name"]: x["filter_chains"][0]["filters"][0]["typed_config"]["max_connections"] for x in (main, door)}
    assert cap == {LISTENER_NAME: 1024, PRIORITY_LISTENER_NAME: 256}  # each listener within its own cap …
    assert global_connections(spec) == 1024 + 256 + HEADROOM  # … and the global one over both, with room to spare
    alone = replace(spec, priority_port=None)
    assert [x["name"] for x in listeners(alone)] == [LISTENER_NAME]  # no door: the global cap alone, as before
    assert "connection_limit" not in str(listeners(alone)) and global_connections(alone) == 1024
    with pytest.raises(ValueError, match="L1's door holds 0 connections: it needs at least one"):
        listeners(replace(spec, limits=EdgeLimits(priority_connections=0)))


def refused_at_accept(port: int) -> bool:
    """A new connection to ``port`` that Envoy closes without an answer (the overload manager at accept)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /v1/models/room-rate/predict HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
            return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


@pytest.fixture
def door_edge(tmp_path, workers):  # noqa: F811
    spec = EdgeSpec(
        port=free_port(),
        workers=tuple(w.port for w in workers),
        models=MODELS,
        limits=LIMITS,
        priority_port=free_port(),
    )
    with EnvoyEdge(tmp_path, spec) as e:
        yield e


def test_l1_is_served_at_its_door_while_the_lower_tiers_hold_every_connection_they_may(door_edge, workers):  # noqa: F811
    assert post(f"{door_edge.url}/v1/models/room-rate/predict")[0] == 200  # the main door serves L1 too
    held: list[socket.socket] = []
    try:
        # the lower tiers' connections, idle, until the next one is refused at accept (a connection Envoy is still
        # closing counts a moment longer: hold one more until the cap refuses)
        while not refused_at_accept(door_edge.spec.port):
            assert len(held) < 4 * LIMITS.max_connections, "the main listener's cap never refused a connection"
            held.append(socket.create_connection(("127.0.0.1", door_edge.spec.port), timeout=5))
            time.sleep(0.05)
        assert door_edge.counter("connection_limit.keel_edge.limited_connections") >= 1  # the main listener's cap
        # the main door is full: L1 at its own door is served all the same, on more connections than it holds at once
        for _ in range(2 * LIMITS.priority_connections + 2):
            status, body = post(f"{door_edge.priority_url}/v1/models/room-rate/predict")
            assert status == 200 and body["path"] == "/v1/models/room-rate/predict"
        assert refused_at_accept(door_edge.spec.port)  # the main door full all along: L1's closing gave it nothing
    finally:
        for s in held:
            s.close()
    # the lower tiers' requests at L1's door are answered by Envoy, never forwarded
    seen = sum(w.seen() for w in workers)
    status, body = post(f"{door_edge.priority_url}/v1/models/flight-delay/predict")
    assert status == 421, (status, body)
    assert "wrong_door" in body["body"] and "main port" in body["body"]
    assert post(f"{door_edge.priority_url}/v1/predict")[0] == 421  # no L1 tier set by the edge filter
    assert post(f"{door_edge.priority_url}/readyz")[0] == 421
    assert sum(w.seen() for w in workers) == seen
