"""Issue 46 item 2: a confidence in [0, 1] on every answer, by the model's task. A binary model's is |2·p − 1|; a
regression's comes from the split-conformal interval its version carries (keel/intervals.py), and the answer shows
that interval. Through the gateway app (its ASGI interface) with no Triton listening (127.0.0.1:1): the coarse
model — a real LightGBM regression of hotels' features — answers, with the interval its registry record gave it."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import replace

import pytest

from gpu_runtime.gateway.app import Gateway, GatewayConfig
from keel.deploy.fake import FakeDeployer
from keel.deploy.routing import Route, Target
from keel.intervals import confidence
from keel.policies.gateway import DEFAULT_TIERS, GatewayPolicy
from keel.usecase import resolve
from tests.serving.asgi_gateway import body_of, small_model

HOTELS, FLIGHTS = resolve("hotels"), resolve("flights")
# Deadlines no busy machine runs into (the first coarse answer loads the booster): the answer's shape is the point.
PATIENT = GatewayPolicy(tiers={name: replace(tier, timeout_ms=60_000.0) for name, tier in DEFAULT_TIERS.items()})


def gateway_of(
    tmp_path, usecase, interval: tuple[float, float] | None, policy: GatewayPolicy = PATIENT, **config
) -> Gateway:
    """A gateway in this process with no Triton listening (the coarse model answers); ``config``: more of its
    GatewayConfig (an edge token, a policy store)."""
    model, n = usecase.model.name, len(usecase.features.names)
    deployer = FakeDeployer(tmp_path / "routing" / f"{model}.json", n_features=n)
    main = Target(Route("champion", 1, hashlib.sha256(b"main").hexdigest(), 1.0, "rel-1", interval), "main")
    text = small_model(n, usecase.features.label.task)
    coarse = Target(Route("coarse", 2, hashlib.sha256(text.encode()).hexdigest(), 0.0, "rel-1", interval), text)
    deployer.deploy(model, [main], coarse=coarse)
    return Gateway(GatewayConfig(triton_url="127.0.0.1:1", routing_path=deployer.routing_path, usecase=usecase.name,
                                 exposure_dir=tmp_path / "exposures", **config), policy)  # fmt: skip


def test_a_regression_answer_carries_its_interval_and_a_confidence_in_0_1(tmp_path):
    status, payload, _ = asyncio.run(gateway_of(tmp_path, HOTELS, (0.9, 12.5)).predict(body_of(HOTELS), {}))
    assert status == 200 and "coarse_fallback" in payload["degraded"], payload
    score = payload["score"]
    assert score > 50  # a price (the small model is fitted around 100), not a probability
    assert payload["interval"] == pytest.approx([score - 12.5, score + 12.5])
    assert payload["interval_coverage"] == 0.9
    assert 0 < payload["confidence_score"] < 1
    assert payload["confidence_score"] == pytest.approx(1 - 12.5 / score)


def test_a_regression_version_without_an_interval_claims_no_confidence(tmp_path):
    status, payload, _ = asyncio.run(gateway_of(tmp_path, HOTELS, None).predict(body_of(HOTELS), {}))
    assert status == 200 and payload["confidence_score"] == 0.0 and "interval" not in payload


def test_a_binary_answer_keeps_its_distance_from_a_coin_toss_and_has_no_interval(tmp_path):
    status, payload, _ = asyncio.run(gateway_of(tmp_path, FLIGHTS, None).predict(body_of(FLIGHTS), {}))
    assert status == 200 and 0 <= payload["score"] <= 1
    assert payload["confidence_score"] == pytest.approx(abs(2 * payload["score"] - 1))
    assert "interval" not in payload


def test_the_confidence_is_the_share_of_the_answer_its_interval_leaves_standing():
    assert confidence([120.0, 30.0, 10.0, 0.0, -40.0], 30.0).tolist() == pytest.approx([0.75, 0.0, 0.0, 0.0, 0.25])
