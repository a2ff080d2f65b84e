"""The admit stage through the real gateway app (gpu_runtime/gateway/admit.py): a request its tier would shed is
answered before its body is read — by the ASGI app, and by the HTTP protocol at the door, keeping the connection —,
and how long a tier waits for a place (a lower tier a tenth of its timeout, none while the lower tiers flood)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest

from gpu_runtime.gateway import admit
from gpu_runtime.gateway.app import Gateway
from keel.exposure_log import read_exposures
from keel.policies.gateway import GatewayPolicy
from tests.serving.asgi_gateway import FLIGHTS, Asgi, body_of, deploy


async def post_with_l2_full(gateway: Gateway, asgi: Asgi):
    """A flights (L2) request while L2's two places are taken by requests in flight."""
    for _ in range(2):
        await gateway.admission.acquire("L2", 1, 2, 0)
    return await asgi.post("/v1/models/flight-delay/predict", body_of(FLIGHTS))


def test_a_request_its_tier_would_shed_is_answered_before_its_body_is_read(tmp_path):
    policy = GatewayPolicy(admit_in_flight={"L1": 4, "L2": 2, "L3": 1}, admit_wait_ms={"L2": 0})
    gateway = Gateway(deploy(tmp_path, FLIGHTS, "127.0.0.1:1"), policy)
    assert gateway.model().tier() == "L2"
    asgi = Asgi(gateway)

    status, payload, headers = asyncio.run(post_with_l2_full(gateway, asgi))
    assert status == 503 and payload["error"]["code"] == "shed" and payload["error"]["tier"] == "L2"
    assert headers["retry-after"] == "1"
    assert asgi.body_reads == 0  # refused on the route alone
    assert 'keel_gateway_shed_before_body_total{tier="L2"} 1' in gateway.render_metrics()


def test_a_lower_tier_waits_a_tenth_of_its_timeout_for_a_place_and_the_highest_tier_its_whole_timeout(tmp_path):
    """Without admit_wait_ms, an L2 request that finds no place is shed after a tenth of its timeout — not after its
    whole deadline, in a stage after admission, too late to go elsewhere — while L1 may wait its timeout."""
    policy = GatewayPolicy(admit_in_flight={"L1": 4, "L2": 2, "L3": 1})
    gateway = Gateway(deploy(tmp_path, FLIGHTS, "127.0.0.1:1"), policy)
    model = gateway.model()
    timeout_ms = model.timeout_ms()
    asgi = Asgi(gateway)

    status, payload, _ = asyncio.run(post_with_l2_full(gateway, asgi))
    assert status == 503 and payload["error"]["code"] == "shed" and payload["error"]["tier"] == "L2"
    line = read_exposures(tmp_path / "exposures")[-1]
    assert line["error"] == "shed" and line["stage"] == "admit"
    assert line["latency_ms"] >= 0.1 * timeout_ms  # it waited its tenth (how much longer: the machine's speed)
    top = Gateway(deploy(tmp_path / "l1", FLIGHTS, "127.0.0.1:1"),
                  GatewayPolicy(model_tiers={"flight-delay": "L1"})).model()  # fmt: skip
    ctx = gateway.context(top, {}, None, time.monotonic())
    assert admit.admit_wait_s(gateway, top, "L1", ctx) == pytest.approx(top.timeout_ms() / 1000, abs=0.01)
    ctx = gateway.context(model, {}, None, time.monotonic())
    assert admit.admit_wait_s(gateway, model, "L2", ctx) == pytest.approx(0.1 * timeout_ms / 1000, abs=0.001)
    for _ in range(40):  # a flood of the lower tiers: they wait no more (the door refuses them at once)
        gateway.guard.arrive(1)
    assert gateway.guard.flooded() and admit.admit_wait_s(gateway, model, "L2", ctx) == 0.0
    assert admit.admit_wait_s(gateway, top, "L1", ctx) > 0


def test_the_http_protocol_refuses_a_request_its_tier_would_shed_at_the_door_and_keeps_the_connection(tmp_path):
    """Through the real server (uvicorn + server.py's protocol) on a raw socket: a shed request is answered from its
    request line alone — the gateway's ASGI app never runs for it, its body is dropped — and the same connection
    then serves the next request; with ``connection: close`` the server closes it after the 503."""
    import uvicorn

    from gpu_runtime.gateway.server import bounded_protocol

    policy = GatewayPolicy(admit_in_flight={"L1": 4, "L2": 0, "L3": 1})  # L2: no room at all
    gateway = Gateway(deploy(tmp_path, FLIGHTS, "127.0.0.1:1"), policy)
    app_calls: list[str] = []

    async def counting(scope, receive, send):
        if scope["type"] == "http":
            app_calls.append(scope["path"])
        await gateway(scope, receive, send)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(counting, http=bounded_protocol(gateway), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.01)
        body = body_of(FLIGHTS)
        post = (f"POST /v1/models/flight-delay/predict HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n").encode()  # fmt: skip
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            reader = conn.makefile("rb")

            def answer() -> tuple[int, dict[str, str], bytes]:
                status = int(reader.readline().split()[1])
                headers = {}
                while (line := reader.readline().strip()) != b"":
                    name, value = line.decode().split(":", 1)
                    headers[name.lower()] = value.strip()
                return status, headers, reader.read(int(headers["content-length"]))

            conn.sendall(post + b"\r\n" + body)
            status, headers, payload = answer()
            assert status == 503 and headers["retry-after"] == "1" and "connection" not in headers
            assert json.loads(payload)["error"]["code"] == "shed"
            conn.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")  # the same connection, the next request
            status, _, payload = answer()
            assert status == 200 and json.loads(payload)["status"] == "ok"
            conn.sendall(post + b"connection: close\r\n\r\n" + body)
            status, headers, _ = answer()
            assert status == 503 and headers["connection"] == "close"
            assert reader.read() == b""  # closed by the server
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:  # waits for "100 Continue": none
            reader = conn.makefile("rb")
            conn.sendall(post + b"expect: 100-continue\r\n\r\n")  # the body is never sent
            status, headers, _ = answer()
            assert status == 503 and headers["connection"] == "close" and reader.read() == b""
        assert app_calls == ["/healthz"]  # the refused requests never reached the ASGI app
        lines = read_exposures(tmp_path / "exposures")
        assert [(line["status"], line["error"], line["tier"]) for line in lines] == [(503, "shed", "L2")] * 3
        assert 'keel_gateway_shed_before_body_total{tier="L2"} 3' in gateway.render_metrics()
    finally:
        server.should_exit = True
        thread.join(timeout=30)
