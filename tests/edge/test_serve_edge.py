"""`python -m gpu_runtime.serve --edge` (slow: Triton and the worker processes): the real Envoy on the gateway's
port in front of two gateway workers on internal loopback ports, following the policy store — no key → 401, the key
of a tenant → its requests reach the gateway as that tenant, a body naming another tenant → 403, a worker reached
directly without the edge → 401, probes and scrapes without a key (``/metrics`` carries Envoy's stats beside keel's),
`keel tenant revoke` → the key refused once the edge follows the new version; with a second replica of the same home
and tenants' limits on the real Redis, a tenant's burst holds across the fleet and its revoked key is refused by
both edges."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import httpx
import pytest

from gpu_runtime.triton import free_port
from tests import REPO

pytestmark = pytest.mark.slow


def keel(home, *argv: str) -> str:
    done = subprocess.run([sys.executable, "-m", "keel.cli", *argv], env=os.environ | {"KEEL_HOME": str(home)},
                          capture_output=True, text=True, cwd=REPO, check=True)  # fmt: skip
    return done.stdout.strip()


REDIS = "redis://127.0.0.1:6379/0"  # the machine's real Redis (started before every session and CI run)


def start_replica(home, name: str) -> tuple[subprocess.Popen, str, dict]:
    """One runtime replica of ``home`` (``replicas/<name>/``): Triton, two workers and the edge in front, tenants'
    limits on Redis; returns the process, the edge's URL and its endpoints."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_runtime.serve", "--edge", "--workers", "2", "--gateway-port", str(port)],
        env=os.environ | {"KEEL_HOME": str(home), "KEEL_REPLICA": name, "KEEL_LIMITS_REDIS": REDIS,
                          # a busy machine's slow Redis answer is not what is tested here (its fallback is:
                          # tests/serving/test_global_limits.py)
                          "KEEL_LIMITS_REDIS_TIMEOUT_MS": "10000"}, cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    endpoints = home / "replicas" / name / "endpoints.json"
    deadline = time.monotonic() + 300
    while not endpoints.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "timeout"
        time.sleep(0.2)
    return proc, f"http://127.0.0.1:{port}", json.loads(endpoints.read_text())


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    home = tmp_path_factory.mktemp("edge-home")
    key = keel(home, "tenant", "add", "ops", "--tiers", "L1,L2", "--reason", "the edge's test tenant")
    proc, url, endpoints = start_replica(home, "a")
    yield home, url, key, endpoints
    stop(proc)


@pytest.fixture(scope="module")
def second(served):
    """Another replica of the same home (its own Triton, workers and edge): the fleet's view of one tenant."""
    proc, url, endpoints = start_replica(served[0], "b")
    yield url, endpoints
    stop(proc)


def predict(url: str, headers: dict | None = None, body: dict | None = None) -> httpx.Response:
    return httpx.post(f"{url}/v1/models/flight-delay/predict", json=body or {}, headers=headers or {}, timeout=30)


def test_only_authenticated_requests_reach_the_gateway_as_their_tenant(served):
    home, url, key, endpoints = served
    assert predict(url).status_code == 401
    answered = predict(url, {"x-api-key": key})  # reached a worker: judged there (no flight in the body)
    assert answered.status_code == 422 and answered.json()["error"]["code"] == "invalid_input"
    mismatch = predict(url, {"x-api-key": key}, {"tenant_id": "pricing"})
    assert mismatch.status_code == 403 and mismatch.json()["error"]["code"] == "tenant_mismatch"
    for port in endpoints["worker_ports"]:  # straight to a worker, a forged tenant header: refused
        direct = predict(f"http://127.0.0.1:{port}", {"x-keel-tenant": "ops"})
        assert direct.status_code == 401 and direct.json()["error"]["code"] == "unauthenticated"
    assert endpoints["edge_admin"].startswith("http://127.0.0.1:")


def test_a_hostile_tenant_finds_no_way_in(served):
    """Issue 61 items 1 and 2, through the real Envoy and workers: an L2 tenant on every route of the L1 model (and a
    forged tier, tenant and edge token) is refused; the admin endpoint's dump holds no token and no key hash, and no
    word of it makes a worker take a forged tenant."""
    import re

    from keel.home import KeelHome
    from keel.policies import PolicyStore

    home, url, ops_key, endpoints = served
    key = keel(home, "tenant", "add", "l2only", "--tiers", "L2", "--reason", "a hostile tenant")
    deadline = time.monotonic() + 60
    while httpx.get(f"{url}/v1/predict", headers={"x-api-key": key}, timeout=30).status_code == 401:  # not taken yet
        assert time.monotonic() < deadline, "the edge did not take the new key"
        time.sleep(0.05)
    room = f"{url}/v1/models/room-rate/predict"
    for headers in (
        {},
        {"x-keel-tier": "L2"},
        {"x-keel-tier": "L1"},
        {"x-keel-tenant": "ops"},
        {"x-keel-tenant": "ops", "x-keel-edge": "forged", "x-keel-tier": "L2"},
    ):
        refused = httpx.post(room, json={}, headers={"x-api-key": key, **headers}, timeout=30)
        assert refused.status_code == 403 and "tenant l2only may use tiers L2, not L1" in refused.text, headers
    # the default route is flights' (L2): in, answered by the gateway (no model is deployed in this home)
    default = httpx.post(f"{url}/v1/predict", json={}, headers={"x-api-key": key}, timeout=30)
    assert (default.status_code, default.json()["error"]["code"]) == (503, "not_deployed"), default.text
    # L1's own door (keel/edge/door.py): the L1 model refused to the L2 tenant there too, with or without a forged
    # tier; the tenant's own L2 requests are not served there (421, by Envoy); an L1 tenant is let in
    door = f"http://{endpoints['edge_l1']}"
    for path, headers, status in (
        ("/v1/models/room-rate/predict", {}, 403),
        ("/v1/models/room-rate/predict", {"x-keel-tier": "L1"}, 403),
        ("/v1/predict", {"x-keel-tier": "L1"}, 403),
        ("/v1/predict", {}, 421),
        ("/v1/models/flight-delay/predict", {}, 421),
    ):
        refused = httpx.post(f"{door}{path}", json={}, headers={"x-api-key": key, **headers}, timeout=30)
        assert refused.status_code == status, (path, headers, refused.text)
    answered = httpx.post(f"{door}/v1/models/room-rate/predict", json={}, headers={"x-api-key": ops_key}, timeout=30)
    assert answered.status_code not in (401, 403, 421), answered.text  # the gateway's answer (no model: 503)
    dump = httpx.get(f"{endpoints['edge_admin']}/config_dump", timeout=30).text
    assert "tenant l2only L2" in dump  # the filter's configuration, as the admin endpoint shows it
    with PolicyStore(KeelHome(home).policies) as store:
        hashes = [k["sha256"] for p in store.state().values() if p.type == "tenant" for k in p.body["keys"]]
    assert len(hashes) >= 2 and not [h for h in hashes if h in dump]
    assert ops_key[len("keel_") + 13 :] not in dump and key[len("keel_") + 13 :] not in dump  # the secrets
    words = set(re.findall(r"[A-Za-z0-9_\-]{16,}", dump))  # every token-like word an attacker could try
    assert len(words) > 10
    port = endpoints["worker_ports"][0]
    for word in sorted(words):
        forged = predict(f"http://127.0.0.1:{port}", {"x-keel-edge": word, "x-keel-tenant": "ops"})
        assert forged.status_code == 401, word


def test_probes_and_scrapes_need_no_key_and_metrics_carry_envoys_stats_beside_keels(served):
    _, url, key, _ = served
    assert predict(url, {"x-api-key": key}).status_code == 422  # a request through the edge, counted by both
    ready = httpx.get(f"{url}/readyz", timeout=30)
    assert ready.status_code in (200, 503) and "ready" in ready.json()  # the gateway's answer (no model yet: 503)
    metrics = httpx.get(f"{url}/metrics", timeout=30)
    assert metrics.status_code == 200 and "keel_edge_up 1" in metrics.text
    assert "keel_gateway_policy_version" in metrics.text  # keel's series …
    assert 'envoy_cluster_upstream_rq_total{envoy_cluster_name="keel_gateway"}' in metrics.text  # … and Envoy's


def test_a_revoked_key_is_refused_once_the_edge_follows_the_store(served):
    home, url, key, _ = served
    assert predict(url, {"x-api-key": key}).status_code == 422
    keel(home, "tenant", "revoke", "ops", "--reason", "the key leaked")
    revoked_at, deadline = time.monotonic(), time.monotonic() + 30
    while predict(url, {"x-api-key": key}).status_code != 401:
        assert time.monotonic() < deadline, "the edge did not follow the revocation"
        time.sleep(0.05)
    print(f"refused {time.monotonic() - revoked_at:.2f} s after keel tenant revoke returned")


def test_the_overload_drill_takes_keys_of_its_own_behind_the_edge_and_revokes_them(served, monkeypatch):
    from gpu_runtime.overload_drill import DRILL_TENANTS, drill_keys
    from keel.exposure_log import read_exposures
    from keel.home import KeelHome
    from keel.policies import PolicyStore
    from keel.tenants import revoke_keys

    home, url, _, _ = served
    monkeypatch.setenv("KEEL_HOME", str(home))
    monkeypatch.setenv("KEEL_REPLICA", "a")  # the replica drilled (its endpoints name its edge)
    keys = drill_keys(url)  # returns once the edge takes them
    assert sorted(keys) == sorted(DRILL_TENANTS) and len(keys) == 65
    logged = [e for d in KeelHome(home).exposure_dirs() for e in read_exposures(d)]
    assert logged  # the module's earlier requests are there …
    probes = [e for e in logged if e.get("tenant_id") == "drill-probe"]
    assert probes == []  # … the wait for the key asked no model: nothing logged (it is written before the answer)
    flood = {"x-api-key": keys["drill-flood-7"]}
    assert predict(url, flood, {"tenant_id": "drill-flood-7"}).status_code == 422  # in: judged by the gateway
    with PolicyStore(KeelHome(home).policies) as store:
        revoke_keys(store, list(keys), "tests", "the drill is over")
    deadline = time.monotonic() + 30
    while predict(url, flood).status_code != 401:
        assert time.monotonic() < deadline, "the edge did not follow the revocation"
        time.sleep(0.05)


def policy_versions(worker_ports) -> list[int]:
    """The policy version each gateway worker applied (its own ``/metrics``, read on its loopback port)."""
    out = []
    for port in worker_ports:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        out += [int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
                if line.startswith("keel_gateway_policy_version")]  # fmt: skip
    return out


def test_a_tenants_rate_holds_across_replicas_and_its_revocation_on_every_edge(served, second):
    """Two replicas, each an edge in front of two workers, limits on the real Redis: a tenant allowed a burst of 5
    gets 5 requests in across the fleet, whichever edge it goes through (each edge holds its own bucket of 5 too:
    without Redis the fleet would let 10 in); its revoked key is refused by both edges."""
    from keel.home import KeelHome
    from keel.policies import PolicyStore
    from keel.tenants import RISK_LEVELS, TIERS, Tenant, new_key, revoke_keys
    from tests.serving.asgi_gateway import FLIGHTS, body_of

    home, url_a, _, endpoints_a = served
    url_b, endpoints_b = second
    tenant = f"fleet-{uuid.uuid4().hex[:8]}"  # its own buckets on the shared Redis
    key, stored = new_key("2013-02-15T00:00:00+00:00")
    with PolicyStore(KeelHome(home).policies) as store:  # the tenant and its limit in one version
        store.apply({tenant: ("tenant", Tenant(tenant, (stored,), TIERS, RISK_LEVELS).as_body()),
                     f"{tenant}-limit": ("rate_limit", {"default": {"rps": 500, "burst": 1000},
                                                            "tenants": {tenant: {"rps": 0.001, "burst": 5}}})},
                    author="tests", reason="a tenant of the fleet test")  # fmt: skip
        version = store.version()
    # wait until both edges and every gateway worker apply that version — on their admin and metrics, not with a
    # request of the tenant (one would take a token before the test starts counting)
    workers = [*endpoints_a["worker_ports"], *endpoints_b["worker_ports"]]
    deadline = time.monotonic() + 60
    while not (all(f"tenant {tenant} " in httpx.get(f"{e['edge_admin']}/config_dump", timeout=30).text
                   for e in (endpoints_a, endpoints_b)) and min(policy_versions(workers)) >= version):  # fmt: skip
        assert time.monotonic() < deadline, "the edges or the gateways did not follow the policy store"
        time.sleep(0.1)
    body = json.loads(body_of(FLIGHTS)) | {"tenant_id": tenant}
    got = [predict((url_a, url_b)[i % 2], {"x-api-key": key}, body) for i in range(20)]
    refused = [r for r in got if r.status_code == 429]
    # in: past both limits (no model is deployed in this home: 503 not_deployed once admitted)
    admitted = [r.json()["error"]["code"] for r in got if r.status_code != 429]
    assert admitted == ["not_deployed"] * 5, [r.text for r in got]
    assert len(refused) == 15 and {r.json()["error"]["code"] for r in refused} == {"rate_limited"}
    with PolicyStore(KeelHome(home).policies) as store:
        revoke_keys(store, [tenant], "tests", "the key leaked")
    for url in (url_a, url_b):
        deadline = time.monotonic() + 30
        while predict(url, {"x-api-key": key}).status_code != 401:
            assert time.monotonic() < deadline, f"the edge at {url} did not follow the revocation"
            time.sleep(0.05)
