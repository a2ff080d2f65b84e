"""The hostile-client tests of tests/serving/test_hostile_clients.py through the edge: the real Envoy (with keel's
edge filter) on the gateway's port in front of a gateway worker, Triton behind it (``serve --edge``), every request
with the test tenant's API key. What the gateway answered directly it answers through Envoy — big batches, bad
``time_hour``, numeric text, malformed bodies, Triton failing a call — and what Envoy holds now, it holds before a
byte reaches the gateway: clients that stall mid-headers or mid-body are cut off at the edge's header timeout, and
connections past the cap are refused at accept while the open ones still answer.
"""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest

from gpu_runtime.edge import EDGE_TOKEN_ENV
from keel.exposure_log import read_exposures
from keel.home import KeelHome
from keel.policies import PolicyStore
from keel.tenants import issue_keys
from tests.serving.conftest import serving_version_1
from tests.serving.test_hostile_clients import (  # noqa: F401 - the tests (and their fixture) run here through the edge
    POLICY,
    STALL_S,
    flights,
    gauge,
    keepalive_metrics,
    metric,
    post,
    raw_connection,
    read_all,
    stall_200,
    test_1024_flight_requests_among_normal_traffic_are_all_answered_and_open_no_breaker,
    test_a_malformed_body_is_a_structured_4xx_with_its_request_id_logged,
    test_explanations_of_a_big_batch_come_from_every_chunk,
    test_numeric_text_is_accepted_for_every_numeric_field_and_scores_the_same,
    test_the_backend_error_counter_the_checks_above_read_at_zero_does_count_a_failed_call,
    test_time_hour_and_the_types_of_numbers_are_the_contracts,
)

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # floods and starves the machine (tests/parallel.py)


def behind_the_edge(home, serving_models, env: dict[str, str]):
    """serving_version_1 with the edge in front (one worker behind it) and a key of tenant ``tests``."""
    with PolicyStore(KeelHome(home).policies) as store:
        key = issue_keys(store, ["tests"], "2013-04-01T00:00:00+00:00", "tests", "the hostile clients' tenant")[
            "tests"
        ]
    env = {"KEEL_EDGE": "1", "KEEL_GATEWAY_WORKERS": "1"} | env
    return serving_version_1(home, serving_models[0], POLICY, env=env, headers={"x-api-key": key})


@pytest.fixture(scope="module")
def runtime(runtime_home, serving_models):
    env = {"KEEL_GATEWAY_HEADER_TIMEOUT_S": str(STALL_S), "KEEL_GATEWAY_BODY_TIMEOUT_S": str(STALL_S),
           "KEEL_GATEWAY_KEEPALIVE_S": "60"}  # fmt: skip
    with behind_the_edge(runtime_home, serving_models, env) as rt:
        assert rt.endpoints["edge_admin"] and rt.endpoints["worker_ports"]  # the edge is in front
        yield rt


def edge_counter(runtime, name: str) -> int:
    with httpx.Client(timeout=10) as client:
        text = client.get(f"{runtime.endpoints['edge_admin']}/stats", params={"filter": f"^{name}$"}).text
    return sum(int(line.rsplit(":", 1)[1]) for line in text.splitlines() if line.startswith(name + ":"))


def test_the_edge_is_in_front_and_the_key_is_what_lets_a_request_in(runtime, flights):  # noqa: F811
    assert post(runtime, {"flight": flights[0]}).status_code == 200
    assert httpx.post(f"{runtime.url}/v1/predict", json={"flight": flights[0]}, timeout=30).status_code == 401
    assert EDGE_TOKEN_ENV not in os.environ  # the token stays the runtime's


def test_200_stalled_connections_are_cut_off_at_the_edge_while_normal_traffic_is_answered(runtime, flights):  # noqa: F811
    """The gateway's own test answers each stalled request 408 itself; here Envoy's header timeout (the same
    ``STALL_S``) ends them first: each connection is answered 408 or closed by Envoy, and none reaches the gateway
    (no ``body_timeout`` in the exposure log, the gateway's header-timeout counter unchanged)."""
    body = json.dumps({"flight": flights[0], "tenant_id": "tests", "risk_level": 2}).encode()
    gateway_408 = metric(runtime, "keel_gateway_connection_refusals_total", '{reason="header_timeout"}')
    logged_before = sum(1 for e in read_exposures(runtime.home / "serving" / "exposures") if e.get("status") == 408)
    stalled = stall_200(runtime, body)
    started = time.monotonic()
    with httpx.Client(timeout=30) as client:
        served = [client.post(f"{runtime.url}/v1/predict", content=body,
                              headers={"content-type": "application/json"} | runtime.headers)
                  for _ in range(50)]  # fmt: skip
    assert len(served) == 50 and [r.status_code for r in served] == [200] * 50
    answers = [read_all(s) for s in stalled]  # until Envoy closes each (the socket's 60 s bound the wait)
    elapsed = time.monotonic() - started
    for s in stalled:
        s.close()
    print(f"200 stalled connections ended by the edge {elapsed:.1f} s after the last one opened")
    assert all(a == b"" or a.startswith(b"HTTP/1.1 408 ") for a in answers), {a[:60] for a in answers}
    assert metric(runtime, "keel_gateway_connection_refusals_total", '{reason="header_timeout"}') == gateway_408
    logged = sum(1 for e in read_exposures(runtime.home / "serving" / "exposures") if e.get("status") == 408)
    assert logged == logged_before  # no stalled request reached the gateway
    assert post(runtime, {"flight": flights[1]}).status_code == 200


@pytest.fixture(scope="module")
def capped(runtime_home, serving_models, tmp_path_factory):
    """A second runtime behind its own edge on a home of its own, with room for 20 connections at the edge (long
    timeouts, so that nothing closes them during the test)."""
    import shutil

    home = tmp_path_factory.mktemp("capped_edge_home")
    for part in ("online", "registry"):
        shutil.copytree(runtime_home / part, home / part)
    env = {"KEEL_GATEWAY_MAX_CONNECTIONS": "20", "KEEL_GATEWAY_HEADER_TIMEOUT_S": "600",
           "KEEL_GATEWAY_KEEPALIVE_S": "600"}  # fmt: skip
    with behind_the_edge(home, serving_models, env) as rt:
        yield rt


def test_connections_past_the_edges_cap_are_refused_at_accept_and_the_open_ones_still_answer(capped, flights):  # noqa: F811
    probe = raw_connection(capped)
    deadline = time.monotonic() + 60
    while edge_counter(capped, "http.keel_edge.downstream_cx_active") != 1:  # the start-up's clients gone
        assert time.monotonic() < deadline
        time.sleep(0.1)
    idle = [raw_connection(capped) for _ in range(19)]  # 20 open with the probe: the cap
    while edge_counter(capped, "http.keel_edge.downstream_cx_active") != 20:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    extra = [raw_connection(capped) for _ in range(5)]
    refused = [read_all(s) for s in extra]  # closed by Envoy at accept: nothing sent, the socket's end read
    assert refused == [b""] * 5
    # the main listener's own cap (L1's door has connections of its own beyond it: keel/edge/door.py)
    assert edge_counter(capped, "connection_limit.keel_edge.limited_connections") == 5
    text = keepalive_metrics(probe)  # the connections under the cap still work (metrics need no key)
    assert gauge(text, "keel_edge_up") == 1
    for s in idle + extra + [probe]:
        s.close()
    assert post(capped, {"flight": flights[0]}).status_code == 200
