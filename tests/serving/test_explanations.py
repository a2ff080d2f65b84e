"""Explained predictions, for real: ``"explain"`` in a request to the gateway → TreeSHAP computed inside the Triton
model → contributions that add up to the model's raw score."""

from __future__ import annotations

import asyncio

import httpx
import lightgbm as lgb
import numpy as np
import pytest

from keel.exposure_log import read_exposures
from tests.serving.conftest import request_body, serving_version_1
from usecases.flights.features import FEATURE_NAMES

# The 10,000 requests go as fast as 8 connections carry them: on a fast machine past the gateway's default tenant
# limit (500 req/s, burst 1,000), which would answer 429 — limits are tests/serving/test_gateway_limits.py's subject.
POLICY = {"version": "explain-tests", "default_rate_limit": {"rps": 1_000_000, "burst": 1_000_000}}


@pytest.fixture(scope="module")
def runtime(runtime_home, serving_models):
    with serving_version_1(runtime_home, serving_models[0], POLICY) as rt:
        yield rt


def values_of(explanation: dict) -> np.ndarray:
    by_name = {c["feature"]: c["value"] for c in explanation["contributions"]}
    return np.array([[by_name[n] for n in FEATURE_NAMES]])


async def explained_answers(url: str, bodies: list[dict], concurrency: int = 8) -> list[dict]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def one(body: dict) -> dict:
            async with sem:
                resp = await client.post("/v1/predict", json=body)
                assert resp.status_code == 200, resp.text
                return resp.json()

        return await asyncio.gather(*(one(b) for b in bodies))


@pytest.mark.slow
def test_contributions_add_up_to_the_raw_score_on_10000_real_requests(runtime, serving_models):
    """10,000 real February flights, one request each, through the online store and Triton: for every answer, base
    value + contributions = the raw score within 1e-6, the raw score is the model's (scored again here, in
    process, on the feature values the answer shows), the contributions are LightGBM's exact TreeSHAP of those
    values, and the score is the raw score's sigmoid."""
    _, feb = serving_models
    rows = [feb.row(i % feb.height, named=True) for i in range(10_000)]
    answers = asyncio.run(explained_answers(runtime.url, [request_body(r, explain=True) for r in rows]))
    booster = lgb.Booster(model_str=runtime.texts[0])
    x = np.vstack([values_of(a["explanation"]) for a in answers]).astype(np.float32).astype(np.float64)
    local_raw = booster.predict(x, raw_score=True)
    local_contrib = booster.predict(x, pred_contrib=True)
    worst = 0.0
    for a, raw, contrib in zip(answers, local_raw, local_contrib, strict=True):
        e = a["explanation"]
        assert len(e["contributions"]) == len(FEATURE_NAMES) and e["rest"] == 0.0
        total = e["base_value"] + sum(c["contribution"] for c in e["contributions"])
        worst = max(worst, abs(total - e["raw_score"]))
        assert e["raw_score"] == pytest.approx(raw, abs=1e-6)
        got = {c["feature"]: c["contribution"] for c in e["contributions"]}
        np.testing.assert_allclose([got[n] for n in FEATURE_NAMES], contrib[:-1], atol=1e-9)
        assert e["base_value"] == pytest.approx(contrib[-1], abs=1e-9)
        assert a["score"] == pytest.approx(1 / (1 + np.exp(-e["raw_score"])), abs=1e-6)
    assert worst <= 1e-6, f"the largest |base + Σ contributions − raw score| was {worst:.3g}"


def test_a_top_k_keeps_the_largest_contributions_and_the_rest_adds_up(runtime, serving_models):
    _, feb = serving_models
    rows = [feb.row(i, named=True) for i in range(0, 400, 4)]
    answers = asyncio.run(explained_answers(runtime.url, [request_body(r, explain=3) for r in rows]))
    for a in answers:
        e = a["explanation"]
        assert len(e["contributions"]) == 3 and e["units"] == "log-odds"
        sizes = [abs(c["contribution"]) for c in e["contributions"]]
        assert sizes == sorted(sizes, reverse=True)
        total = e["base_value"] + sum(c["contribution"] for c in e["contributions"]) + e["rest"]
        assert total == pytest.approx(e["raw_score"], abs=1e-6)


def test_a_batch_explains_every_flight_and_plain_requests_carry_no_explanation(runtime, serving_models):
    _, feb = serving_models
    flights = [request_body(r)["flight"] for r in feb.head(16).iter_rows(named=True)]
    resp = runtime.post({"flights": flights, "tenant_id": "tests", "explain": 2})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert len(body["predictions"]) == 16
    for p in body["predictions"]:
        e = p["explanation"]
        total = e["base_value"] + sum(c["contribution"] for c in e["contributions"]) + e["rest"]
        assert total == pytest.approx(e["raw_score"], abs=1e-6)
        assert p["score"] == pytest.approx(1 / (1 + np.exp(-e["raw_score"])), abs=1e-6)
    plain = runtime.post({"flights": flights, "tenant_id": "tests"}).json()
    assert "explanation" not in plain and all("explanation" not in p for p in plain["predictions"])
    assert [p["score"] for p in plain["predictions"]] == [p["score"] for p in body["predictions"]]
    # the exposure log says how many rows were scored and that they were explained
    [line] = [
        e for e in read_exposures(runtime.home / "serving" / "exposures") if e["request_id"] == body["request_id"]
    ]
    assert line["rows"] == 16 and line["explain"] == 2


@pytest.mark.parametrize("value", ["yes", 0, len(FEATURE_NAMES) + 1, 2.5, [3]])
def test_a_bad_explain_value_is_422_naming_the_field(runtime, serving_models, value):
    _, feb = serving_models
    resp = runtime.post(request_body(feb.row(0, named=True), explain=value))
    assert resp.status_code == 422, resp.text
    err = resp.json()["error"]
    assert err["code"] == "invalid_input" and err["field"] == "explain"
