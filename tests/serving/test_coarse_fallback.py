"""The coarse fallback in the gateway (gpu_runtime/gateway/coarse.py): when no version of the model can answer,
the model's coarse model answers in the gateway's own process, flagged ``coarse_fallback``.

Triton here is 127.0.0.1:1, where nothing listens: every call fails as against a runtime that does not answer (the
real gRPC client, the real breakers and retries). The routing table and the coarse model's file are what a
deployment writes (``FakeDeployer``, a named fake of the model runtime, writes the same files the Triton deployer
does). The drill against the running platform is tests/test_live_drills.py (``coarse-fallback``)."""

from __future__ import annotations

import asyncio
import hashlib
import json

import lightgbm as lgb
import numpy as np
import polars as pl
import pytest

from gpu_runtime.gateway.app import Gateway, GatewayConfig
from gpu_runtime.supervisor import DOWN, RuntimeStatus
from keel.deploy.fake import FakeDeployer
from keel.deploy.routing import Route, Target, coarse_path
from keel.exposure_log import read_exposures
from tests.serving.conftest import local_scores
from usecases.flights.features import FEATURE_NAMES, FLIGHT_FEATURES

MODEL = "flight-delay"


@pytest.fixture(scope="module")
def coarse(serving_models):
    """A small LightGBM (7 leaves, 20 trees) fitted on February's rows, and three of those rows to ask about."""
    feb = serving_models[1]
    x = feb.select([pl.col(n).cast(pl.Float64) for n in FEATURE_NAMES]).to_numpy()
    y = feb[FLIGHT_FEATURES.label.column].to_numpy().astype(np.float64)
    params = {"objective": "binary", "num_leaves": 7, "verbose": -1, "seed": 1, "deterministic": True,
              "num_threads": 1}  # fmt: skip
    text = lgb.train(
        params, lgb.Dataset(x, y, feature_name=list(FEATURE_NAMES)), num_boost_round=20
    ).model_to_string()
    return text, feb.head(3)


def deployed(tmp_path, text: str | None) -> GatewayConfig:
    deployer = FakeDeployer(tmp_path / "routing" / f"{MODEL}.json", n_features=len(FEATURE_NAMES))
    champion = Target(Route("champion", 1, hashlib.sha256(b"main").hexdigest(), 1.0, "rel-1"), "main")
    c = None
    if text is not None:
        c = Target(Route("coarse", 4, hashlib.sha256(text.encode()).hexdigest(), 0.0, "rel-1"), text)
    deployer.deploy(MODEL, [champion], coarse=c)
    return GatewayConfig(triton_url="127.0.0.1:1", routing_path=deployer.routing_path, usecase="flights",
                         exposure_dir=tmp_path / "exposures")  # fmt: skip


def body(row: dict, **extra) -> bytes:
    features = {n: (None if row[n] is None else float(row[n])) for n in FEATURE_NAMES}
    return json.dumps({"features": features, "unit_id": "u1", **extra}).encode()


def test_when_the_version_fails_the_coarse_model_answers_and_the_exposure_log_says_so(tmp_path, coarse):
    text, rows = coarse
    gateway = Gateway(deployed(tmp_path, text))
    expected = local_scores(text, rows)
    answers = [asyncio.run(gateway.predict(body(row), {})) for row in rows.iter_rows(named=True)]
    for (status, payload, headers), score in zip(answers, expected, strict=True):
        assert status == 200, payload
        assert payload["variant"] == "coarse" and payload["model_version"] is None and payload["coarse_version"] == 4
        assert "coarse_fallback" in payload["degraded"]
        assert payload["score"] == pytest.approx(score, abs=1e-6)  # the coarse model's own answer for these features
        assert headers["x-model-signature"] == hashlib.sha256(text.encode()).hexdigest()
    # the retries failed first, then the breaker opened: later answers skip Triton altogether
    assert "backend_error" in answers[0][1]["degraded"]
    for _ in range(30):
        status, payload, _ = asyncio.run(gateway.predict(body(rows.row(0, named=True)), {}))
        assert status == 200 and "coarse_fallback" in payload["degraded"]
    assert gateway.model().scorer.breaker(1).state == "open" and "breaker_open" in payload["degraded"]
    logged = read_exposures(tmp_path / "exposures")
    assert {(e["status"], e["variant"], e["model_version"], e["coarse_version"]) for e in logged} == {
        (200, "coarse", None, 4)
    }
    assert all(e["routed_version"] == 1 for e in logged)  # who was asked: the canary counts it as v1's failure
    assert 'keel_gateway_coarse_answers_total{model="flight-delay"} 33' in gateway.metrics.render()


def test_without_a_coarse_model_the_same_failure_is_a_structured_502(tmp_path, coarse):
    gateway = Gateway(deployed(tmp_path, None))
    status, payload, _ = asyncio.run(gateway.predict(body(coarse[1].row(0, named=True)), {}))
    assert status == 502 and payload["error"]["code"] == "backend_error"


def test_while_the_runtime_is_down_the_coarse_model_answers_instead_of_a_503(tmp_path, coarse):
    text, rows = coarse
    down = RuntimeStatus(state=DOWN, last_failure="tritonserver stopped answering its liveness check")
    gateway = Gateway(deployed(tmp_path, text), runtime=down)
    status, payload, _ = asyncio.run(gateway.predict(body(rows.row(1, named=True), explain=3), {}))
    assert status == 200 and payload["degraded"] == ["coarse_fallback", "runtime_unavailable"]
    assert payload["score"] == pytest.approx(local_scores(text, rows[1:2])[0], abs=1e-6)
    # an explanation from the model that answered: the coarse model's TreeSHAP, its three largest contributions
    assert len(payload["explanation"]["contributions"]) == 3


def test_a_coarse_file_that_does_not_match_the_routing_table_is_never_used(tmp_path, coarse):
    text, rows = coarse
    config = deployed(tmp_path, text)
    sha = hashlib.sha256(text.encode()).hexdigest()
    coarse_path(config.routing_path, sha).write_text(text.replace("leaf_value=", "leaf_value=1 ", 1))  # altered
    gateway = Gateway(config)
    status, payload, _ = asyncio.run(gateway.predict(body(rows.row(0, named=True)), {}))
    assert status == 502 and payload["error"]["code"] == "backend_error"  # no coarse answer rather than a wrong one
    assert "does not hash to the sha256" in gateway.model().coarse.error
    assert 'keel_gateway_coarse_unusable_total{coarse_version="4"}' in gateway.metrics.render()
