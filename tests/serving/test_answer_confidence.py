"""Issue 46 item 2: a confidence in [0, 1] on every answer, by the model's task. A binary model's is |2·p − 1|; a
regression's comes from the split-conformal interval its version carries (keel/intervals.py), and the answer shows
that interval. Through the gateway app (its ASGI interface) with no Triton listening (127.0.0.1:1): the coarse
model — a real LightGBM regression of hotels' features — answers, with the interval its registry record gave it."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import replace

import numpy as np
import pytest

from gpu_runtime.gateway.answers import scored
from gpu_runtime.gateway.app import Gateway, GatewayConfig
from keel.deploy.fake import FakeDeployer
from keel.deploy.routing import Route, Target
from keel.features.spec import FeatureSpecError, LabelDomain
from keel.intervals import bounds, clip_scores, confidence, label_spread
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
    return Gateway(
        GatewayConfig(
            triton_url="127.0.0.1:1",
            routing_path=deployer.routing_path,
            usecase=usecase.name,
            exposure_dir=tmp_path / "exposures",
            **config,
        ),
        policy,
    )


def test_a_regression_answer_carries_its_interval_and_a_confidence_in_0_1(tmp_path):
    status, payload, _ = asyncio.run(gateway_of(tmp_path, HOTELS, (0.9, 12.5, 100.0)).predict(body_of(HOTELS), {}))
    assert status == 200 and "coarse_fallback" in payload["degraded"], payload
    score = payload["score"]
    assert score > 50  # a price (the small model is fitted around 100), not a probability
    assert payload["interval"] == pytest.approx([score - 12.5, score + 12.5])
    assert payload["interval_coverage"] == 0.9
    assert payload["confidence_score"] == pytest.approx(1 - 2 * 12.5 / 100.0)  # a quarter of the usual range ruled in


def test_a_regression_version_without_an_interval_claims_no_confidence(tmp_path):
    status, payload, _ = asyncio.run(gateway_of(tmp_path, HOTELS, None).predict(body_of(HOTELS), {}))
    assert status == 200 and payload["confidence_score"] == 0.0 and "interval" not in payload


def test_a_binary_answer_keeps_its_distance_from_a_coin_toss_and_has_no_interval(tmp_path):
    status, payload, _ = asyncio.run(gateway_of(tmp_path, FLIGHTS, None).predict(body_of(FLIGHTS), {}))
    assert status == 200 and 0 <= payload["score"] <= 1
    assert payload["confidence_score"] == pytest.approx(abs(2 * payload["score"] - 1))
    assert "interval" not in payload


def test_the_confidence_is_the_share_of_the_labels_usual_range_the_interval_rules_out():
    """Issue 61 item 7: 1 − q/|ŷ| was 0 for every answer with |ŷ| ≤ q (a night's bike count) and ranked answers by
    |ŷ| alone. Now 1 − 2q / spread: the same for every answer of a version (one interval width), 0 when the interval
    is as wide as the labels' own 5th–95th percentile range, none claimed without a spread."""
    scores = [120.0, 30.0, 10.0, 0.0, -40.0]
    assert confidence(scores, 30.0, 240.0).tolist() == pytest.approx([0.75] * 5)
    assert confidence(scores, 30.0, 60.0).tolist() == [0.0] * 5  # the interval spans the usual range: nothing known
    assert confidence(scores, 30.0, None).tolist() == [0.0] * 5
    assert label_spread(np.arange(101.0)) == pytest.approx(90.0)


def test_a_counts_answer_and_interval_stay_in_its_domain():
    """Issue 61 item 7: a count's interval went negative ([-83.5, 170.8] for an hourly bike count). Held to the
    label's domain: never below 0, whole numbers inwards; a score under 0 is 0."""
    count = LabelDomain(lower=0, integer=True)
    lo, hi = bounds(np.array([43.6, 2.0, -3.0]), 127.2, count)
    assert lo.tolist() == [0.0, 0.0, 0.0] and hi.tolist() == [170.0, 129.0, 124.0]
    assert clip_scores(np.array([-3.0, 4.5]), count).tolist() == [0.0, 4.5]
    share = LabelDomain(lower=0, upper=1)
    assert bounds(np.array([0.95]), 0.2, share)[1].tolist() == [1.0]
    rows = scored(
        "regression", np.array([-3.0, 50.0]), Route("champion", 1, "a" * 64, 1.0, None, (0.9, 10.0, 80.0)), count
    )
    assert [r["score"] for r in rows] == [0.0, 50.0] and [r["interval"] for r in rows] == [[0.0, 10.0], [40.0, 60.0]]
    with pytest.raises(FeatureSpecError, match="lower must be under upper"):
        LabelDomain(lower=1, upper=0)
