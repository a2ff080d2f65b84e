"""The rooms use case (tests/usecases/rooms, installed nowhere) served beside flights by one runtime — real Triton,
real gateway —, each model by its own declaration: its contract, its memory pool, its tier, its explanations in the
label's units."""

from __future__ import annotations

import json
import time
from datetime import date

import dagster as dg
import httpx
import lightgbm as lgb
import numpy as np
import pytest

import tests.usecases.rooms as rooms
from keel.features.online import get_online_features
from keel.features.sqlite_store import SQLiteOnlineStore
from keel.registry import ModelRegistry
from tests.features.conftest import validated  # noqa: F401 - shared session fixture (serving_models uses it)
from tests.serving.conftest import (  # noqa: F401 - shared fixtures
    MODEL,
    Runtime,
    request_body,
    runtime_home,
    serving_models,
    start_serve,
    stop_serve,
)
from tests.usecases.rooms_pipeline import BASE, CITY, build

ROOMS_POOL = 4096  # bytes: the gateway policy's budget for room-price's requests in flight (× 1.2 headroom)


# -- served beside flights: one runtime, two models ------------------------------------------------------------


@pytest.fixture(scope="module")
def served(runtime_home, serving_models, tmp_path_factory):  # noqa: F811
    """The serving tests' home (flights models registered, its online store written), the rooms pipeline built on
    it through promotion, one runtime serving both use cases, flights' version 1 and rooms' champion deployed — the
    latter by its generated ``rooms/model_deployment`` asset."""
    home = runtime_home
    instance = dg.DagsterInstance.ephemeral()
    bookings, run, _ = build(home, tmp_path_factory.mktemp("rooms-data"), instance)
    run(["price_model", "model_evaluation", "model_promotion"])
    # rooms' pool is small on purpose (a 4 KiB budget: ~300 stays in flight), flights keeps its declared 64 MiB
    proc, endpoints = start_serve(
        home, {"pool_budgets": {"room-price": ROOMS_POOL}}, env={"KEEL_USECASES": "flights,tests.usecases.rooms"}
    )
    rt = Runtime(home, proc, endpoints, serving_models[0])
    try:
        rt.deployer().deploy(MODEL, [rt.target(1)])
        deployed = run(["model_deployment"])
        rt.wait_ready(timeout=60)
        yield rt, bookings, deployed
    finally:
        stop_serve(rt.proc)


def stays(n: int = 12) -> list[dict]:
    """Stays to price in January 2010 (after the store's snapshot of December's end), as a caller sends them."""
    rng = np.random.default_rng(4)
    return [
        {
            "hotel": str(rng.choice(list(BASE))),
            "city": str(rng.choice(list(CITY))),
            "year": 2010,
            "month": 1,
            "day": int(rng.integers(1, 28)),
            "nights": int(rng.integers(1, 8)),
        }
        for _ in range(n)
    ]


def in_process(home, entities: list[dict]) -> np.ndarray:
    """What the rooms champion says in this process for the same stays: the store's features (defaults where the
    store has none, as the gateway), float32 as Triton receives them."""
    fs = rooms.usecase.features
    rows = [
        {k: e[k] for k in ("hotel", "city", "nights")} | {"arrival": date(e["year"], e["month"], e["day"])}
        for e in entities
    ]
    with SQLiteOnlineStore(home / "online" / "rooms.sqlite", features=fs) as store:
        feats = get_online_features(store, rows)
    x = np.array([[np.nan if f[n] is None else f[n] for n in fs.names] for f in feats], dtype=np.float64)
    x = np.where(np.isnan(x), fs.defaults, x).astype(np.float32).astype(np.float64)
    registry = ModelRegistry(home / "registry")
    text = registry.load(registry.alias("room-price", "champion"))
    registry.close()
    return lgb.Booster(model_str=text).predict(x)


def test_one_runtime_serves_both_models_each_by_its_own_declaration(served, serving_models):  # noqa: F811
    rt, _, deployed = served
    [event] = deployed.get_asset_materialization_events()
    assert event.asset_key == dg.AssetKey(["rooms", "model_deployment"])
    ready = httpx.get(f"{rt.url}/readyz", timeout=10).json()
    assert ready["ready"] and set(ready["models"]) == {MODEL, "room-price"}
    assert all(m["ready"] for m in ready["models"].values())
    # rooms: a batch of stays, scored by its champion on its features, the same as in this process
    entities = stays()
    r = httpx.post(f"{rt.url}/v1/models/room-price/predict", json={"entities": entities, "tenant_id": "tests"})
    assert r.status_code == 200, r.text
    answer = r.json()
    predictions = answer["predictions"]
    assert (answer["model"], answer["model_version"], len(predictions)) == ("room-price", 1, len(entities))
    assert [p["score"] for p in predictions] == pytest.approx(list(in_process(rt.home, entities)), rel=1e-5)
    assert all(50 < p["score"] < 500 for p in predictions)  # prices, not probabilities
    # flights, beside it on the same gateway: the same answer as its alias route
    _, feb = serving_models
    body = request_body(feb.row(7, named=True))
    alias = rt.post(body).json()
    generic = httpx.post(
        f"{rt.url}/v1/models/{MODEL}/predict", json={"entities": [body.pop("flight")], **body}, timeout=10
    ).json()
    assert (generic["model"], generic["model_version"], generic["score"]) == (MODEL, 1, alias["score"])
    # the exposure log names each answer's model
    day = sorted((rt.home / "serving" / "exposures").glob("exposures-*.jsonl"))[-1]
    logged = {line.split('"model":')[1].split(",")[0].strip(' "') for line in day.read_text().splitlines()}
    assert {"room-price", MODEL} <= logged


def test_each_model_refuses_by_its_own_contract_and_an_unknown_model_lists_both(served, serving_models):  # noqa: F811
    rt, _, _ = served
    good = stays(1)[0]
    broken = httpx.post(
        f"{rt.url}/v1/models/room-price/predict", json={"entities": [good, good | {"nights": 0}]}, timeout=10
    )
    assert broken.status_code == 422, broken.text
    error = broken.json()["error"]
    assert "contract price_request" in error["message"] and [v["index"] for v in error["violations"]] == [1]
    # a flight is not a stay: the rooms contract refuses it, naming the missing fields
    _, feb = serving_models
    flight = request_body(feb.row(3, named=True))["flight"]
    assert httpx.post(f"{rt.url}/v1/models/room-price/predict", json={"entities": [flight]}).status_code == 422
    wrong = httpx.post(f"{rt.url}/v1/models/no-such-model/predict", json={"entities": [good]}, timeout=10)
    assert wrong.status_code == 404 and wrong.json()["error"]["models"] == [MODEL, "room-price"]
    metrics = httpx.get(f"{rt.url}/metrics", timeout=10).text
    assert 'model="room-price"' in metrics and f'model="{MODEL}"' in metrics


def test_one_model_over_its_memory_pool_is_refused_and_the_other_model_is_unaffected(served, serving_models):  # noqa: F811
    """Rooms' 4 KiB pool holds ~300 stays (4 float32 features each, × 1.2): a 1,000-stay batch is refused with a
    structured 503 naming the model, while flights' 300-flight batches, sent at the same moment, are all answered;
    afterwards rooms' pool is empty again and a normal batch is priced."""
    from concurrent.futures import ThreadPoolExecutor

    rt, _, _ = served
    _, feb = serving_models
    flights = [request_body(feb.row(i, named=True))["flight"] for i in range(300)]
    big = stays(1000)

    def rooms_big():
        return httpx.post(f"{rt.url}/v1/models/room-price/predict", json={"entities": big}, timeout=60)

    def flights_batch():
        return httpx.post(f"{rt.url}/v1/models/{MODEL}/predict", json={"entities": flights}, timeout=60)

    with ThreadPoolExecutor(max_workers=6) as pool:
        refused = [pool.submit(rooms_big) for _ in range(3)]
        answered = [pool.submit(flights_batch) for _ in range(3)]
        refused, answered = [f.result() for f in refused], [f.result() for f in answered]
    for r in refused:
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["code"] == "memory_budget_exceeded" and error["model"] == "room-price", error
    for r in answered:
        assert r.status_code == 200, r.text
        assert len(r.json()["predictions"]) == len(flights)
    metrics = httpx.get(f"{rt.url}/metrics", timeout=10).text
    limit = int(ROOMS_POOL * 1.2)
    assert f'keel_gpu_pool_limit_bytes{{device="cpu",model="room-price"}} {limit}' in metrics
    assert 'keel_gpu_pool_bytes_in_use{device="cpu",model="room-price"} 0' in metrics  # nothing held after
    small = httpx.post(f"{rt.url}/v1/models/room-price/predict", json={"entities": stays(12)}, timeout=10)
    assert small.status_code == 200, small.text


def test_under_a_tier_policy_with_no_room_for_l2_the_l1_model_is_answered_and_l2_is_shed_with_a_structured_503(
    served,
    serving_models,  # noqa: F811
):
    """Tier admission across the models of one runtime, through the real gateway and the policy store: rooms is put
    in L1, and L2 (flights' declared tier) gets no place (admit_in_flight 0, no wait) — a runtime with all its room
    reserved for L1. Flights' requests are shed with 503 ``shed`` naming the tier, logged as such; rooms' are priced.
    (Which request gets a place when places free up is tested on the admission itself, tests/serving/test_admission.py.)
    Runs last here; the policy is set back to the default tiers afterwards."""
    from keel.policies import PolicyStore
    from keel.policies.gateway import DEFAULT_TIERS

    rt, _, _ = served
    tiers = {name: {"p99_ms": t.p99_ms, "availability": t.availability, "timeout_ms": t.timeout_ms}
             for name, t in DEFAULT_TIERS.items()}  # fmt: skip

    def set_tiers(body: dict, reason: str) -> None:
        store = PolicyStore(rt.home / "policies.sqlite")
        applied = store.apply({"tiers": ("sla_tier", body)}, author="tests", reason=reason).version
        store.close()
        deadline = time.monotonic() + 60
        while {m["policy_version"] for m in httpx.get(f"{rt.url}/readyz", timeout=5).json()["models"].values()} != {
            applied
        }:  # every model's context follows the store
            assert time.monotonic() < deadline, f"the gateway did not follow the policy store to version {applied}"
            time.sleep(0.05)

    set_tiers(
        {
            "tiers": tiers,
            "models": {"room-price": "L1"},
            "admit_in_flight": {"L1": 256, "L2": 0, "L3": 0},
            "admit_wait_ms": {"L2": 0, "L3": 0},
        },
        "all room to L1",
    )
    try:
        _, feb = serving_models
        flight = request_body(feb.row(5, named=True))["flight"]
        shed = httpx.post(f"{rt.url}/v1/models/{MODEL}/predict", json={"entities": [flight]}, timeout=10)
        assert shed.status_code == 503, shed.text
        error = shed.json()["error"]
        assert (error["code"], error["tier"], error["in_flight_limit"]) == ("shed", "L2", 0)
        priced = httpx.post(f"{rt.url}/v1/models/room-price/predict", json={"entities": stays(3)}, timeout=10)
        assert priced.status_code == 200, priced.text
        day = sorted((rt.home / "serving" / "exposures").glob("exposures-*.jsonl"))[-1]
        lines = [json.loads(x) for x in day.read_text().splitlines()]
        by_id = {x["request_id"]: x for x in lines}
        assert by_id[shed.json()["request_id"]]["error"] == "shed"
        assert by_id[shed.json()["request_id"]]["tier"] == "L2"
        assert by_id[priced.json()["request_id"]]["tier"] == "L1"
        metrics = httpx.get(f"{rt.url}/metrics", timeout=10).text
        assert f'keel_gateway_shed_total{{model="{MODEL}",tier="L2"}} 1' in metrics
    finally:
        set_tiers({"tiers": tiers, "models": {}}, "back to the default tiers")
    answered = httpx.post(f"{rt.url}/v1/models/{MODEL}/predict", json={"entities": [flight]}, timeout=10)
    assert answered.status_code == 200, answered.text


def test_a_regression_answer_is_explained_in_the_labels_units_and_the_contributions_add_up_to_the_price(served):
    """TreeSHAP of the rooms model, from the Triton model that answered: base value + contributions = the raw
    score, which for a regression is the predicted price itself — and the champion in this process agrees."""
    rt, _, _ = served
    entities = stays(20)
    r = httpx.post(f"{rt.url}/v1/models/room-price/predict", json={"entities": entities, "explain": True}, timeout=10)
    assert r.status_code == 200, r.text
    answers = r.json()["predictions"]
    local = in_process(rt.home, entities)
    for answer, price in zip(answers, local, strict=True):
        e = answer["explanation"]
        assert e["units"] == "label_price (price paid)"
        total = e["base_value"] + sum(c["contribution"] for c in e["contributions"]) + e["rest"]
        assert total == pytest.approx(e["raw_score"], abs=1e-6)
        assert answer["score"] == pytest.approx(e["raw_score"], abs=1e-4) == pytest.approx(price, rel=1e-5)
        assert {c["feature"] for c in e["contributions"]} == set(rooms.usecase.features.names)
