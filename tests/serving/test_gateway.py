"""Triton and the gateway, for real: tritonclient against Triton, HTTP against the gateway process."""

from __future__ import annotations

import time

import httpx
import lightgbm as lgb
import numpy as np
import pytest

from gpu_runtime.repository import triton_name
from gpu_runtime.triton import TritonError
from keel.exposure_log import read_exposures
from keel.features.online import get_online_features
from keel.features.sqlite_store import SQLiteOnlineStore
from tests.serving.conftest import MODEL, request_body, serving_version_1
from usecases.flights.features import FEATURE_NAMES, FEATURES, FLIGHT_FEATURES

POLICY = {
    "version": "test-1",
    "tenant_rate_limits": {"tiny": {"rps": 0.5, "burst": 2}},
    "breaker": {"error_rate": 0.05, "window_s": 5, "min_requests": 10, "open_s": 2, "half_open_probes": 3},
}


@pytest.fixture(scope="module")
def runtime(runtime_home, serving_models):
    with serving_version_1(runtime_home, serving_models[0], POLICY) as rt:
        yield rt


def test_triton_serves_the_registered_model_exactly(runtime, serving_models):
    """tritonclient → Triton: the served version scores like the same LightGBM text in-process."""
    _, feb = serving_models
    rows = feb.head(256)
    x = local_x(rows)
    served = runtime.control.infer(triton_name(MODEL, 1), 1, x)
    expected = lgb.Booster(model_str=runtime.texts[0]).predict(x.astype(np.float64))
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-6)
    assert runtime.control.loaded_versions(MODEL) == [1]


def local_x(rows):
    x = rows.select(FEATURE_NAMES).to_numpy().astype(np.float64)
    return np.where(np.isnan(x), [f.default for f in FEATURES], x).astype(np.float32)


def test_gateway_answers_with_online_features_and_says_which_model(runtime, serving_models):
    _, feb = serving_models
    row = feb.row(10, named=True)
    resp = runtime.post(request_body(row))
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["model_version"] == 1 and body["release_id"] == "rel-test-v1"
    assert resp.headers["x-model-signature"] == runtime.shas[0]
    assert 0 <= body["score"] <= 1 and 0 <= body["confidence_score"] <= 1
    assert body["confidence_score"] == pytest.approx(abs(2 * body["score"] - 1))
    # The same flight through the online store and the model in-process gives the same score.
    store = SQLiteOnlineStore(runtime.home / "online" / "flights.sqlite", features=FLIGHT_FEATURES)
    batch = get_online_features(store, [row])
    store.close()
    x = np.where(np.isnan(batch.matrix.T), [f.default for f in FEATURES], batch.matrix.T).astype(np.float32)
    expected = lgb.Booster(model_str=runtime.texts[0]).predict(x.astype(np.float64))[0]
    assert body["score"] == pytest.approx(expected, abs=1e-6)
    # …and the exposure log has the request, attributed to the version that answered.
    [line] = [
        e for e in read_exposures(runtime.home / "serving" / "exposures") if e["request_id"] == body["request_id"]
    ]
    assert line["model_version"] == 1 and line["sha256"] == runtime.shas[0] and line["status"] == 200
    assert line["unit_id"] == row["flight_id"] and line["latency_ms"] > 0
    assert line["routed_version"] == 1 and line["entity_key"].startswith(f"{row['carrier']}-")


def test_a_batch_scores_every_flight(runtime, serving_models):
    _, feb = serving_models
    rows = [request_body(r)["flight"] for r in feb.head(64).iter_rows(named=True)]
    resp = runtime.post({"flights": rows, "unit_id": "batch-1"})
    assert resp.status_code == 200
    assert len(resp.json()["predictions"]) == 64


def test_direct_features_are_range_checked(runtime, serving_models):
    _, feb = serving_models
    feats = {
        k: (0.0 if v is None else float(v)) for k, v in feb.select(list(FEATURE_NAMES)).row(0, named=True).items()
    }
    ok = runtime.post({"features": feats, "unit_id": "u1"})
    assert ok.status_code == 200
    x = np.array([[feats[n] for n in list(FEATURE_NAMES)]], dtype=np.float32).astype(np.float64)
    expected = lgb.Booster(model_str=runtime.texts[0]).predict(x)[0]
    assert ok.json()["score"] == pytest.approx(expected, abs=1e-6)
    names = list(reversed(list(FEATURE_NAMES)))  # any column order
    columnar = runtime.post({"features": {"columns": names, "rows": [[feats[n] for n in names]] * 3}})
    assert columnar.status_code == 200
    assert [p["score"] for p in columnar.json()["predictions"]] == pytest.approx([expected] * 3, abs=1e-6)
    ragged = runtime.post({"features": {"columns": names, "rows": [[feats[n] for n in names], [1.0]]}})
    assert ragged.status_code == 422 and ragged.json()["error"]["index"] == 1
    bad = runtime.post({"features": feats | {"wind_speed": 1048.0}, "unit_id": "u1"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "out_of_range"
    assert bad.json()["error"]["feature"] == "wind_speed"
    missing = runtime.post({"features": {k: v for k, v in feats.items() if k != "temp"}})
    assert missing.status_code == 422 and missing.json()["error"]["missing"] == ["temp"]


def test_invalid_requests_get_structured_errors(runtime, serving_models):
    _, feb = serving_models
    good = request_body(feb.row(0, named=True))
    bad_origin = runtime.post(good | {"flight": good["flight"] | {"origin": "XXX", "hour": 25}})
    assert bad_origin.status_code == 422
    err = bad_origin.json()["error"]
    assert err["code"] == "invalid_input" and set(err["violations"][0]["rules"]) == {
        "origin_airport", "hour_of_day", "time_hour_is_the_scheduled_hour"}  # fmt: skip
    reasons = dict(zip(err["violations"][0]["rules"], err["violations"][0]["reasons"], strict=True))
    assert "hour" in reasons["hour_of_day"] and "23" in reasons["hour_of_day"], reasons  # why, not only which
    no_distance = runtime.post(good | {"flight": {k: v for k, v in good["flight"].items() if k != "distance"}})
    assert (
        no_distance.status_code == 422
        and "schema_not_null_distance" in no_distance.json()["error"]["violations"][0]["rules"]
    )
    not_json = httpx.post(f"{runtime.url}/v1/predict", content=b"{nope", timeout=5)
    assert not_json.status_code == 400 and not_json.json()["error"]["code"] == "bad_json"
    bad_level = runtime.post(good | {"risk_level": 9})
    assert bad_level.status_code == 422 and bad_level.json()["error"]["code"] == "invalid_risk_level"


def test_tenant_rate_limit(runtime, serving_models):
    _, feb = serving_models
    body = request_body(feb.row(1, named=True), tenant_id="tiny")
    codes = [runtime.post(body).status_code for _ in range(4)]
    assert codes[:2] == [200, 200] and codes[2:] == [429, 429]
    assert runtime.post(request_body(feb.row(1, named=True), tenant_id="other")).status_code == 200
    metrics = httpx.get(f"{runtime.url}/metrics", timeout=5).text
    assert 'keel_gateway_rate_limited_total{tenant="tiny"} 2' in metrics


def test_corrupt_model_fails_to_load_and_the_old_version_keeps_serving(runtime, serving_models):
    _, feb = serving_models
    body = request_body(feb.row(2, named=True))
    tampered = runtime.texts[1].replace("num_leaves", "num_leaveZ", 1)  # registered sha256 no longer matches
    with pytest.raises(TritonError, match="corrupt or tampered"):
        runtime.deployer().deploy(MODEL, [runtime.target(2, text=tampered)])
    resp = runtime.post(body)
    assert resp.status_code == 200 and resp.json()["model_version"] == 1
    assert runtime.control.ready(triton_name(MODEL, 1), 1)
    # The bad directory stays out of service; a later good deploy of another version works.
    report = runtime.deployer().deploy(MODEL, [runtime.target(3)])
    assert report.loaded == (3,) and report.unloaded == (1,) and report.cold_start_s[3] < 5
    deadline = time.monotonic() + 5
    while runtime.post(body).json()["model_version"] != 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert runtime.control.loaded_versions(MODEL) == [3]
    runtime.deployer().deploy(MODEL, [runtime.target(1)])  # back to version 1 for the other tests


def test_metrics_and_health(runtime, serving_models):
    assert runtime.post(request_body(serving_models[1].row(7, named=True))).status_code == 200
    health = httpx.get(f"{runtime.url}/healthz", timeout=5).json()
    assert health["status"] == "ok" and health["exposure_log"] == {"ok": True, "lost_records": 0, "last_error": None}
    ready = httpx.get(f"{runtime.url}/readyz", timeout=5).json()
    assert ready["ready"] is True and ready["versions"] == [1]
    text = httpx.get(f"{runtime.url}/metrics", timeout=5).text
    assert "# TYPE keel_gateway_request_duration_seconds histogram" in text
    assert 'keel_gateway_requests_total{model_version="1",status="200"}' in text
    limit = int(64 * 2**20 * 1.2)  # the default budget × headroom
    assert f'keel_gpu_pool_limit_bytes{{device="cpu",model="flight-delay"}} {limit}' in text
    assert 'keel_gpu_pool_bytes_in_use{device="cpu",model="flight-delay"} 0' in text  # nothing in flight now
    assert 'keel_gateway_sla_target_p99_seconds{model="flight-delay",tier="L2"} 0.05' in text


def metric(runtime, name: str, **labels) -> float:
    text = httpx.get(f"{runtime.url}/metrics", timeout=5).text
    want = "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    for line in text.splitlines():
        if line.startswith(name + want + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_circuit_breaker_opens_falls_back_and_recovers_through_half_open(runtime, serving_models):
    """Version 1 starts failing for real (Triton answers errors): its breaker opens within 5 s, version 2 (the
    fallback) answers meanwhile, and once version 1 is healthy again the breaker closes through half-open."""
    _, feb = serving_models
    fault = runtime.home / "fault-{version}"
    deployer = runtime.deployer(keel_fault_file=str(fault))
    deployer.deploy(MODEL, [runtime.target(1)], fallback=runtime.target(2, name="fallback"))
    bodies = [request_body(r) for r in feb.head(200).iter_rows(named=True)]
    assert runtime.post(bodies[0]).json()["model_version"] == 1

    (runtime.home / "fault-1").touch()
    failing_since = time.monotonic()
    statuses, opened_after = [], None
    while time.monotonic() - failing_since < 8:
        resp = runtime.post(bodies[len(statuses) % len(bodies)])
        statuses.append(resp.status_code)
        if "breaker_open" in resp.json().get("degraded", []):
            opened_after = time.monotonic() - failing_since
            assert resp.json()["model_version"] == 2 and "fallback" in resp.json()["degraded"]
            break
    assert opened_after is not None and opened_after < 5, (
        f"breaker did not open within 5 s ({len(statuses)} requests)"
    )
    assert set(statuses) == {200}  # every request before it opened was retried on the fallback
    assert metric(runtime, "keel_gateway_breaker_state", model_version=1) == 2
    # In the exposure log these answers stay attributable: routed to version 1, answered by version 2.
    fell_back = [
        e for e in read_exposures(runtime.home / "serving" / "exposures") if "fallback" in (e.get("degraded") or [])
    ]
    assert fell_back and all(e["routed_version"] == 1 and e["model_version"] == 2 for e in fell_back)

    (runtime.home / "fault-1").unlink()
    deadline = time.monotonic() + 10
    while True:  # open for open_s = 2 s, then half-open probes (3) go to version 1 and succeed
        body = runtime.post(bodies[0]).json()
        if body["model_version"] == 1 and not body["degraded"]:
            break
        assert time.monotonic() < deadline, body
        time.sleep(0.1)
    for b in bodies[:5]:
        assert runtime.post(b).json()["model_version"] == 1
    assert metric(runtime, "keel_gateway_breaker_state", model_version=1) == 0
    assert metric(runtime, "keel_gateway_breaker_transitions", model_version=1, to="half_open") >= 1
    assert metric(runtime, "keel_gateway_breaker_transitions", model_version=1, to="closed") >= 1
    runtime.deployer().deploy(MODEL, [runtime.target(1)])


def test_risk_level_1_never_queues_behind_lower_levels(runtime, serving_models):
    """Lane 3 full (its one slot held by a request in flight): a level-3 request waits its timeout and is refused,
    a level-1 request is answered at once — through the real gateway app on the real Triton."""
    import asyncio

    from gpu_runtime.gateway.app import Gateway, GatewayConfig
    from keel.policies.gateway import GatewayPolicy

    _, feb = serving_models
    serving = runtime.home / "serving"
    gateway = Gateway(
        GatewayConfig(
            triton_url=runtime.endpoints["triton_grpc"],
            routing_path=serving / "routing" / f"{MODEL}.json",
            usecase="flights",
            exposure_dir=runtime.home / "lanes-exposures",
            online_store_path=runtime.home / "online" / "flights.sqlite",
        ),
        GatewayPolicy(lanes={1: 1, 3: 1}),
    )
    body = request_body(feb.row(3, named=True))

    async def scenario():
        transport = httpx.ASGITransport(app=gateway)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            await gateway.model().lanes[3].acquire()  # a level-3 request holds the only level-3 slot
            try:
                low, high = await asyncio.gather(
                    client.post("/v1/predict", json=body | {"risk_level": 3}),
                    client.post("/v1/predict", json=body | {"risk_level": 1}),
                )
            finally:
                gateway.model().lanes[3].release()
            after = await client.post("/v1/predict", json=body | {"risk_level": 3})
        await gateway.close()
        return low, high, after

    low, high, after = asyncio.run(scenario())
    assert high.status_code == 200
    assert low.status_code == 503 and low.json()["error"]["code"] == "overloaded"
    assert after.status_code == 200


def test_weighted_split_and_experiments_are_sticky_per_unit(runtime, serving_models):
    """Champion and challenger at 70/30, and experiment exp-1 at 50/50 between them: each unit always lands on the
    same version, the shares follow the weights, and the header picks the experiment's assignment."""
    from keel.deploy.routing import Variant

    _, feb = serving_models
    body = request_body(feb.row(4, named=True))
    experiments = {"exp-1": (Variant("control", "champion", 0.5), Variant("treatment", "challenger", 0.5))}
    runtime.deployer().deploy(
        MODEL,
        [runtime.target(1, "champion", 0.7), runtime.target(2, "challenger", 0.3)],
        experiments=experiments,
    )
    deadline = time.monotonic() + 30  # the gateway re-reads routing every 0.1 s: wait until it serves both
    while httpx.get(f"{runtime.url}/readyz", timeout=5).json().get("versions") != [1, 2]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    units = [f"unit-{i}" for i in range(300)]
    split = {u: runtime.post(body | {"unit_id": u}).json() for u in units}
    assert all(
        split[u]["model_version"] == runtime.post(body | {"unit_id": u}).json()["model_version"] for u in units[:50]
    )
    share = sum(a["model_version"] == 2 for a in split.values()) / len(units)
    assert 0.2 < share < 0.4
    assert {a["variant"] for a in split.values() if a["model_version"] == 2} == {"challenger"}
    exp = {u: runtime.post(body | {"unit_id": u}, {"x-experiment-id": "exp-1"}).json() for u in units}
    assert {a["variant"] for a in exp.values()} == {"control", "treatment"}
    assert all((a["variant"] == "treatment") == (a["model_version"] == 2) for a in exp.values())
    assert 0.4 < sum(a["variant"] == "treatment" for a in exp.values()) / len(units) < 0.6
    unknown = runtime.post(body | {"unit_id": "u"}, {"x-experiment-id": "nope"}).json()
    assert "unknown_experiment" in unknown["degraded"] and unknown["model_version"] in (1, 2)
    lines = [e for e in read_exposures(runtime.home / "serving" / "exposures") if e.get("experiment_id") == "exp-1"]
    assert len(lines) == len(units) and {e["variant"] for e in lines} == {"control", "treatment"}
    runtime.deployer().deploy(MODEL, [runtime.target(1)])


def test_a_frozen_feature_shows_in_metrics_and_counts_degraded_answers(runtime, serving_models):
    """Served degradation is observable: /metrics lists the frozen features and counts the answers flagged by it."""
    body = request_body(serving_models[1].row(11, named=True))
    assert metric(runtime, "keel_features_frozen", feature="temp") == 0
    before = metric(runtime, "keel_gateway_degraded_answers_total", flag="frozen:temp")
    store = SQLiteOnlineStore(runtime.home / "online" / "flights.sqlite", features=FLIGHT_FEATURES)
    store.freeze("temp", reason="test: drift in 2013-07", value=41.5)
    try:
        deadline = time.monotonic() + 30  # the gateway's store reader follows the new freeze
        while "frozen:temp" not in (answer := runtime.post(body).json())["degraded"]:
            assert time.monotonic() < deadline, answer
            time.sleep(0.05)
        runtime.post(body)
        assert metric(runtime, "keel_features_frozen", feature="temp") == 1
        assert metric(runtime, "keel_features_frozen", feature="wind_speed") == 0
        assert metric(runtime, "keel_gateway_degraded_answers_total", flag="frozen:temp") >= before + 2
    finally:
        store.unfreeze("temp", reason="test done")
        store.close()
    deadline = time.monotonic() + 30
    while "frozen:temp" in runtime.post(body).json()["degraded"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert metric(runtime, "keel_features_frozen", feature="temp") == 0


def test_the_generic_route_answers_real_flights_as_the_alias_route_does(runtime, serving_models):
    """POST /v1/models/flight-delay/predict with entities: the same score, model and version as /v1/predict for the
    same flight; a batch of 40 scores each flight as one-flight requests do."""
    _, feb = serving_models
    rows = [feb.row(i, named=True) for i in range(100, 140)]
    url = f"{runtime.url}/v1/models/{MODEL}/predict"
    for row in rows[:5]:
        alias = runtime.post(request_body(row)).json()
        body = request_body(row)
        generic = httpx.post(url, json={"entities": [body.pop("flight")], **body}, timeout=10)
        assert generic.status_code == 200, generic.text
        got = generic.json()
        assert (got["model"], got["model_version"]) == (alias["model"], alias["model_version"]) == (MODEL, 1)
        assert got["score"] == alias["score"]
    singles = [runtime.post(request_body(r)).json()["score"] for r in rows]
    entities = [request_body(r)["flight"] for r in rows]
    batch = httpx.post(url, json={"entities": entities, "tenant_id": "tests"}, timeout=10)
    assert batch.status_code == 200, batch.text
    assert [p["score"] for p in batch.json()["predictions"]] == pytest.approx(singles, rel=1e-6)


def test_the_generic_route_refuses_an_unknown_model_and_a_request_that_breaks_the_contract(runtime, serving_models):
    _, feb = serving_models
    flight = request_body(feb.row(3, named=True))["flight"]
    wrong = httpx.post(f"{runtime.url}/v1/models/no-such-model/predict", json={"entities": [flight]}, timeout=10)
    assert wrong.status_code == 404, wrong.text
    error = wrong.json()["error"]
    assert error["code"] == "unknown_model" and error["models"] == [MODEL]
    url = f"{runtime.url}/v1/models/{MODEL}/predict"
    broken = httpx.post(url, json={"entities": [flight, flight | {"carrier": "u9", "hour": 99}]}, timeout=10)
    assert broken.status_code == 422, broken.text
    violations = broken.json()["error"]["violations"]
    assert [v["index"] for v in violations] == [1] and violations[0]["rules"]
    assert "contract predict_request" in broken.json()["error"]["message"]
    for bad in ({"entities": []}, {"entities": flight}, {"flight": flight}):
        r = httpx.post(url, json=bad, timeout=10)
        assert r.status_code == 422 and "'entities' must be a list" in r.json()["error"]["message"], r.text


def test_a_version_at_weight_zero_never_answers_for_a_failing_champion(runtime, serving_models):
    """Issue 46 item 1: a challenger deployed at weight 0 (reachable only on purpose) is no stand-in. The champion
    (v1) fails for real: its requests are retried on the champion or refused — version 2 never answers, and with no
    fallback and no coarse model each failure is a structured 502/503, not v2's score."""
    _, feb = serving_models
    fault = runtime.home / "fault-{version}"
    deployer = runtime.deployer(keel_fault_file=str(fault))
    deployer.deploy(MODEL, [runtime.target(1), runtime.target(2, name="challenger", weight=0.0)])
    bodies = [request_body(r) for r in feb.head(40).iter_rows(named=True)]
    assert runtime.post(bodies[0]).json()["model_version"] == 1
    (runtime.home / "fault-1").touch()
    try:
        answers = [runtime.post(b) for b in bodies]
    finally:
        (runtime.home / "fault-1").unlink()
    assert all(a.status_code in (502, 503) for a in answers), [a.status_code for a in answers]
    assert not [a for a in answers if a.json().get("model_version") == 2]
    ids = {a.headers["x-request-id"] for a in answers}
    logged = [e for e in read_exposures(runtime.home / "serving" / "exposures") if e["request_id"] in ids]
    assert len(logged) == len(answers) and all(e.get("model_version") != 2 for e in logged)
    # a failed request names the model it was for: what answered (keel/serving_health.py) counts it against it
    assert all(e["model"] == MODEL and e["status"] in (502, 503) for e in logged), logged[:2]
    deployer.deploy(MODEL, [runtime.target(1)])
