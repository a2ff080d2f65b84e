"""A hostile client against the real gateway (Triton behind it, everything on 127.0.0.1): what one caller sends must
never take the service down for the others, and every refusal is the caller's structured 4xx.

- batches larger than the model takes in one Triton call, among normal traffic: all answered, no breaker opens;
- a request Triton refuses for its input: 422, no breaker strike, no retry;
- ``time_hour`` out of Python's range, or naming another moment than the scheduled date and hour; booleans sent as
  numbers; numeric text (accepted everywhere, documented);
- 200 connections that stop sending (mid-headers, short bodies, a chunked body with no last chunk) while normal
  traffic is answered: each gets 408 and is closed;
- more connections than the gateway holds: refused at once with 503, the open ones unaffected.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import numpy as np
import pytest

from keel.exposure_log import read_exposures
from tests.serving.conftest import MODEL, request_body, serving_version_1

POLICY = {
    "version": "hostile-1",
    "tenant_rate_limits": {"tests": {"rps": 100_000, "burst": 100_000}},
    # a breaker that opens quickly: if a big batch counted against the version, it would show
    "breaker": {"error_rate": 0.05, "window_s": 30, "min_requests": 5, "open_s": 30, "half_open_probes": 3},
}
STALL_S = 3.0  # the header and body timeouts of the module's gateway


@pytest.fixture(scope="module")
def runtime(runtime_home, serving_models, monkeypatch_module):
    monkeypatch_module.setenv("KEEL_GATEWAY_HEADER_TIMEOUT_S", str(STALL_S))
    monkeypatch_module.setenv("KEEL_GATEWAY_BODY_TIMEOUT_S", str(STALL_S))
    monkeypatch_module.setenv("KEEL_GATEWAY_KEEPALIVE_S", "60")
    with serving_version_1(runtime_home, serving_models[0], POLICY) as rt:
        yield rt


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def flights(serving_models):
    return [request_body(r)["flight"] for r in serving_models[1].head(1024).iter_rows(named=True)]


def metric(runtime, name: str, labels: str = "") -> float:
    text = httpx.get(f"{runtime.url}/metrics", timeout=10).text
    values = [float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name + labels)]
    return sum(values)


def post(runtime, body):
    return runtime.post(body | {"tenant_id": "tests", "risk_level": 2})


def test_1024_flight_requests_among_normal_traffic_are_all_answered_and_open_no_breaker(runtime, flights):
    """The first probe: two 1,024-flight requests used to come back 502 and open the breaker for every tenant. Now
    each is split into Triton calls of the model's max_batch_size (256) and answered as one."""
    single = {i: post(runtime, {"flight": flights[i]}).json()["score"] for i in (0, 255, 256, 1023)}
    answers: list[httpx.Response] = []

    def normal_traffic():
        with httpx.Client(timeout=30) as client:
            for i in range(200):
                answers.append(client.post(f"{runtime.url}/v1/predict", headers=runtime.headers, json={
                    "flight": flights[i % 50], "tenant_id": "tests", "risk_level": 2}))  # fmt: skip

    background = threading.Thread(target=normal_traffic)
    background.start()
    big = [post(runtime, {"flights": flights}) for _ in range(6)]
    background.join()
    assert len(answers) == 200 and len(big) == 6  # the volume, before "every answer 200"
    assert [r.status_code for r in big] == [200] * 6, [r.text[:300] for r in big if r.status_code != 200]
    assert [r.status_code for r in answers] == [200] * 200
    for r in big:
        predictions = r.json()["predictions"]
        assert len(predictions) == 1024 and r.json()["model_version"] == 1
        assert not {"breaker_open", "fallback", "retried"} & set(r.json()["degraded"])
        for i, score in single.items():  # each chunk's rows in their place
            assert predictions[i]["score"] == pytest.approx(score, abs=1e-6)
    assert metric(runtime, "keel_gateway_backend_errors_total") == 0
    assert metric(runtime, "keel_gateway_breaker_transitions", '{model_version="1",to="open"}') == 0


def test_explanations_of_a_big_batch_come_from_every_chunk(runtime, flights):
    resp = post(runtime, {"flights": flights[:600], "explain": 2})
    assert resp.status_code == 200, resp.text[:300]
    predictions = resp.json()["predictions"]
    assert len(predictions) == 600 and all(len(p["explanation"]["contributions"]) == 2 for p in predictions)
    for p in predictions[::97]:
        e = p["explanation"]
        total = e["base_value"] + sum(t["contribution"] for t in e["contributions"]) + e["rest"]
        assert total == pytest.approx(e["raw_score"], abs=1e-6)


def test_an_input_triton_refuses_is_a_422_with_no_breaker_strike_and_no_retry(runtime, serving_models, tmp_path):
    """The gateway in-process on the real Triton, told (wrongly) that the version takes 100,000 rows a call: Triton
    itself refuses the 1,024-row call (INVALID_ARGUMENT). That is the request's fault, not the version's."""
    from gpu_runtime.gateway.app import Gateway, GatewayConfig
    from gpu_runtime.repository import triton_name
    from usecases.flights.features import FEATURE_NAMES, FEATURES

    gateway = Gateway(
        GatewayConfig(
            triton_url=runtime.endpoints["triton_grpc"],
            routing_path=runtime.home / "serving" / "routing" / f"{MODEL}.json",
            usecase="flights",
            exposure_dir=tmp_path / "exposures",
        ),
    )
    scorer = gateway.model().scorer
    scorer.max_batch_of[triton_name("flight-delay", 1)] = 100_000
    rows = serving_models[1].head(1024).select(FEATURE_NAMES).to_numpy().astype(np.float64)
    x = np.where(np.isnan(rows), [f.default for f in FEATURES], rows).tolist()
    body = json.dumps({"features": {"columns": list(FEATURE_NAMES), "rows": x}, "unit_id": "u1"}).encode()

    async def run():
        try:
            return await gateway.predict(body, {})
        finally:
            await gateway.close()

    status, payload, _ = asyncio.run(run())
    assert status == 422 and payload["error"]["code"] == "input_refused_by_model", payload
    assert "batch" in payload["error"]["message"]
    assert not scorer.breaker(1)._events  # no strike
    assert "keel_gateway_backend_errors_total" not in gateway.metrics.render()
    assert scorer.retry_budget._retries == type(scorer.retry_budget._retries)()  # no retry


@pytest.mark.parametrize(
    ("change", "rules"),
    [
        ({"time_hour": "0000-06-30T09:00:00Z"}, {"schema_type_time_hour", "schema_not_null_time_hour"}),
        ({"time_hour": "1999-02-15T14:00:00Z"}, {"time_hour_is_the_scheduled_hour"}),
        ({"hour": True}, {"schema_type_hour", "schema_not_null_hour"}),
        ({"distance": False}, {"schema_type_distance", "schema_not_null_distance"}),
        ({"year": 2014}, {"time_hour_is_the_scheduled_hour"}),
    ],
)
def test_time_hour_and_the_types_of_numbers_are_the_contracts(runtime, flights, change, rules):
    resp = post(runtime, {"flight": flights[0] | change})
    assert resp.status_code == 422, resp.text
    [violation] = resp.json()["error"]["violations"]
    assert set(violation["rules"]) == rules


def test_numeric_text_is_accepted_for_every_numeric_field_and_scores_the_same(runtime, flights):
    """Decided once, for every numeric field of the request contract (docs/serving.md): text that spells the number
    is the number — as in CSV deliveries through the same contract engine."""
    flight = flights[3]
    plain = post(runtime, {"flight": flight})
    numeric = [k for k in flight if isinstance(flight[k], int | float) and not isinstance(flight[k], bool)]
    assert set(numeric) == {"flight", "year", "month", "day", "hour", "distance"}
    texts = post(runtime, {"flight": flight | {k: str(flight[k]) for k in numeric}})
    assert plain.status_code == texts.status_code == 200, texts.text
    assert texts.json()["score"] == plain.json()["score"]
    assert post(runtime, {"flight": flight | {"hour": "5.5"}}).status_code == 422  # no silent truncation


def raw_connection(runtime) -> socket.socket:
    host, port = runtime.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=60)


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (the socket's timeout bounds the wait)."""
    chunks = []
    while True:
        data = sock.recv(65536)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def stall_200(runtime, body: bytes) -> list[socket.socket]:
    """200 connections that stop sending: 100 mid-headers, 99 with a body shorter than its content-length, one
    chunked with no last chunk (with the runtime's key headers, if it has any)."""
    head = b"POST /v1/predict HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
    head += b"".join(f"{k}: {v}\r\n".encode() for k, v in runtime.headers.items())
    stalled = []
    for i in range(200):
        sock = raw_connection(runtime)
        if i < 100:  # stops mid-headers
            sock.sendall(head + b"x-partial: yes")
        elif i < 199:  # a body shorter than its content-length
            sock.sendall(head + f"content-length: {len(body)}\r\n\r\n".encode() + body[:20])
        else:  # chunked, no last chunk
            sock.sendall(head + b"transfer-encoding: chunked\r\n\r\n" + f"{20:x}\r\n".encode() + body[:20] + b"\r\n")
        stalled.append(sock)
    return stalled


def test_200_stalled_connections_get_408_and_are_closed_while_normal_traffic_is_answered(runtime, flights):
    body = json.dumps({"flight": flights[0], "tenant_id": "tests", "risk_level": 2}).encode()
    before_408 = metric(runtime, "keel_gateway_connection_refusals_total", '{reason="header_timeout"}')
    stalled = stall_200(runtime, body)
    started = time.monotonic()
    with httpx.Client(timeout=30) as client:
        served = [client.post(f"{runtime.url}/v1/predict", content=body,
                              headers={"content-type": "application/json"}) for _ in range(50)]  # fmt: skip
    assert len(served) == 50 and [r.status_code for r in served] == [200] * 50
    answers = [read_all(s) for s in stalled]
    elapsed = time.monotonic() - started
    for s in stalled:
        s.close()
    print(f"200 stalled connections answered and closed {elapsed:.1f} s after the last one opened")
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), {a[:40] for a in answers}
    assert all(b"connection: close" in a.lower() for a in answers)
    assert sum(b'"header_timeout"' in a for a in answers) == 100
    assert sum(b'"body_timeout"' in a for a in answers) == 100
    after_408 = metric(runtime, "keel_gateway_connection_refusals_total", '{reason="header_timeout"}')
    assert after_408 - before_408 == 100
    timed_out = [
        e for e in read_exposures(runtime.home / "serving" / "exposures") if e.get("error") == "body_timeout"
    ]
    assert len(timed_out) == 100 and {e["status"] for e in timed_out} == {408}  # logged like every answer
    assert post(runtime, {"flight": flights[1]}).status_code == 200


@pytest.fixture(scope="module")
def capped(runtime_home, serving_models, tmp_path_factory):
    """A second gateway process on the same home with room for 20 connections (long timeouts, so that nothing
    closes them during the test)."""
    import os
    import shutil

    home = tmp_path_factory.mktemp("capped_home")
    for part in ("online", "registry"):
        shutil.copytree(runtime_home / part, home / part)
    env = {"KEEL_GATEWAY_MAX_CONNECTIONS": "20", "KEEL_GATEWAY_HEADER_TIMEOUT_S": "600",
           "KEEL_GATEWAY_KEEPALIVE_S": "600"}  # fmt: skip
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with serving_version_1(home, serving_models[0], POLICY) as rt:
            yield rt
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def keepalive_metrics(sock: socket.socket) -> str:
    """GET /metrics on an open keep-alive connection; its body."""
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
    while len(rest) < length:
        rest += sock.recv(65536)
    return rest.decode()


def gauge(text: str, name: str) -> float:
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(name))


def test_connections_past_the_cap_are_refused_at_once_and_the_open_ones_still_answer(capped):
    probe = raw_connection(capped)
    deadline = time.monotonic() + 60
    while gauge(keepalive_metrics(probe), "keel_gateway_connections_open") != 1:  # the start-up's clients gone
        assert time.monotonic() < deadline
        time.sleep(0.1)
    idle = [raw_connection(capped) for _ in range(19)]  # 20 open with the probe: the cap
    while gauge(keepalive_metrics(probe), "keel_gateway_connections_open") != 20:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    extra = [raw_connection(capped) for _ in range(5)]
    refused = [read_all(s) for s in extra]
    assert all(r.startswith(b"HTTP/1.1 503 ") and b"too_many_connections" in r for r in refused), refused
    text = keepalive_metrics(probe)  # the connections under the cap still work
    assert gauge(text, 'keel_gateway_connection_refusals_total{reason="too_many_connections"}') == 5
    assert gauge(text, "keel_gateway_connections_open") == 20
    for s in idle + extra + [probe]:
        s.close()
    assert np.isfinite(capped.post(_feature_body()).json()["score"])


def _feature_body() -> dict:
    from usecases.flights.features import FEATURES

    return {"features": {f.name: f.default for f in FEATURES}, "tenant_id": "tests", "risk_level": 2}


MALFORMED = [
    b"", b"null", b"[]", b'"flight"', b"{", b'{"flight": ', b"\xff\xfe{}", b'{"flight": null}', b'{"flight": []}',
    b'{"flights": []}', b'{"flights": {}}', b'{"flights": [1, 2]}', b'{"features": "x"}', b'{"features": []}',
    b'{"features": {"columns": "a", "rows": 1}}', b'{"risk_level": "1", "features": {}}', b'{"risk_level": true}',
    b'{"tenant_id": {"a": 1}}', b'{"unit_id": 1.5}', b'{"explain": "yes", "features": {}}',
    b'{"flight": {"carrier": "UA"}}', b'{"flight": {"year": 1e400}}', b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}",
]  # fmt: skip


@pytest.mark.parametrize("body", MALFORMED, ids=range(len(MALFORMED)))
def test_a_malformed_body_is_a_structured_4xx_with_its_request_id_logged(runtime, body):
    resp = httpx.post(f"{runtime.url}/v1/predict", content=body,
                      headers={"content-type": "application/json"} | runtime.headers, timeout=30)  # fmt: skip
    assert 400 <= resp.status_code < 500, resp.text[:300]
    payload = resp.json()
    assert payload["error"]["code"] and payload["error"]["message"] and payload["request_id"]
    lines = [
        e for e in read_exposures(runtime.home / "serving" / "exposures") if e["request_id"] == payload["request_id"]
    ]
    assert [e["status"] for e in lines] == [resp.status_code]


def test_the_backend_error_counter_the_checks_above_read_at_zero_does_count_a_failed_call(runtime, flights):
    """The first test's ``keel_gateway_backend_errors_total == 0`` must be able to fail: the same ``metric`` reads
    the counter positive once Triton fails a call for real (the fault file of the native backend, named as such)."""
    fault = runtime.home / "fault-{version}"
    runtime.deployer(keel_fault_file=str(fault)).deploy(MODEL, [runtime.target(1)])
    runtime.wait_ready()
    before = metric(runtime, "keel_gateway_backend_errors_total")
    (runtime.home / "fault-1").touch()
    try:
        failed = post(runtime, {"flights": flights[:1]})
    finally:
        (runtime.home / "fault-1").unlink()
    assert failed.status_code in (502, 503), failed.text[:300]
    assert metric(runtime, "keel_gateway_backend_errors_total") > before
    runtime.deployer().deploy(MODEL, [runtime.target(1)])
