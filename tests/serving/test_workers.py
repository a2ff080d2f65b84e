"""The gateway as several worker processes on one port (``gpu_runtime.serve --workers 2``; gpu_runtime/workers.py,
gpu_runtime/gateway/shared.py), on the real Triton: connections spread over both, every request answered and logged
once, /metrics adds the workers' counts up, a tenant's rate limit is the tenant's whichever worker it reaches, and a
worker that dies is started again while the other one serves."""

from __future__ import annotations

import os
import re
import signal
import time

import httpx
import pytest

from keel.exposure_log import read_exposures
from tests.serving.conftest import MODEL, Runtime, request_body, start_serve, stop_serve

pytestmark = pytest.mark.slow

POLICY = {"tenant_rate_limits": {"capped": {"rps": 0.001, "burst": 5}}}


@pytest.fixture(scope="module")
def two_workers(runtime_home, serving_models):
    proc, endpoints = start_serve(runtime_home, POLICY, env={"KEEL_GATEWAY_WORKERS": "2"})
    rt = Runtime(runtime_home, proc, endpoints, serving_models[0])
    try:
        rt.deployer().deploy(MODEL, [rt.target(1)])
        ok = 0
        deadline = time.monotonic() + 60
        while ok < 20:  # twenty ready answers in a row, each on a new connection: both workers follow the table
            r = httpx.get(f"{rt.url}/readyz", timeout=5)
            ok = ok + 1 if r.status_code == 200 and r.json().get("versions") == [1] else 0
            assert time.monotonic() < deadline, r.text
        yield rt
    finally:
        stop_serve(rt.proc)


def requests_total(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in re.finditer(r'^keel_gateway_requests_total\{[^}]*status="200"[^}]*\} (\S+)$',
                                                      text, re.M))  # fmt: skip


def test_connections_spread_over_the_workers_and_every_answer_is_logged_and_counted_once(two_workers, serving_models):
    rt = two_workers
    assert len(rt.endpoints["workers"]) == 2
    body = request_body(serving_models[1].row(0, named=True))
    answers = [httpx.post(f"{rt.url}/v1/predict", json=body, timeout=10) for _ in range(100)]  # a connection each
    assert [r.status_code for r in answers] == [200] * 100
    ids = {r.json()["request_id"] for r in answers}
    logged = [e for e in read_exposures(rt.home / "serving" / "exposures") if e["request_id"] in ids]
    assert len(logged) == 100  # each once
    files = {p.name.rsplit("-", 1)[-1] for p in (rt.home / "serving" / "exposures").glob("exposures-*-w*.jsonl")}
    assert files == {"w0.jsonl", "w1.jsonl"}  # both workers answered (a 2^-99 chance that one got none)
    deadline = time.monotonic() + 30
    while requests_total(rt.url) < 100:  # the others' counts arrive within a second
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert requests_total(rt.url) == 100


def test_a_counter_never_falls_between_two_scrapes_whichever_worker_answers(two_workers, serving_models):
    """Each scrape is a new connection (either worker); requests go on meanwhile. A fall would read as a restart."""
    rt = two_workers
    body = request_body(serving_models[1].row(3, named=True))
    seen = []
    with httpx.Client(timeout=10) as client:  # one kept connection for the traffic: one worker counts it live
        for _ in range(40):
            for _ in range(3):
                assert client.post(f"{rt.url}/v1/predict", json=body).status_code == 200
            seen.append(requests_total(rt.url))
    assert seen == sorted(seen) and seen[-1] > seen[0], seen


def test_a_tenants_rate_limit_holds_across_the_workers(two_workers, serving_models):
    body = request_body(serving_models[1].row(1, named=True), tenant_id="capped")
    codes = [httpx.post(f"{two_workers.url}/v1/predict", json=body, timeout=10).status_code for _ in range(30)]
    assert codes.count(200) == 5 and codes.count(429) == 25  # its burst, once, whichever worker each one reached


def test_a_worker_that_dies_is_started_again_while_the_other_serves(two_workers, serving_models):
    rt = two_workers
    body = request_body(serving_models[1].row(2, named=True))
    victim = rt.endpoints["workers"][0]
    up = rt.home / "serving" / "workers" / "w0.up"
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while up.exists() and up.read_text() == str(victim):  # the pool notices and starts worker 0 again
        assert time.monotonic() < deadline
        time.sleep(0.1)
    codes = [httpx.post(f"{rt.url}/v1/predict", json=body, timeout=10).status_code for _ in range(50)]
    assert codes == [200] * 50
    while not up.exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert int(up.read_text()) != victim
