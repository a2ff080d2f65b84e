"""Shadow scoring on the real model runtime (gpu_runtime/gateway/shadow.py): a version the policy store names as a
split's ``shadow`` scores every request beside the champion — its score is in the exposure log, never in the answer —
and a shadow that cannot be scored is named, not scored."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

from keel.exposure_log import read_exposures
from keel.policies import PolicyStore
from tests.serving.conftest import MODEL, PATIENT, local_scores, serving_version_1
from usecases.flights.features import FEATURE_NAMES


@pytest.fixture(scope="module")
def runtime(runtime_home, serving_models):
    with serving_version_1(runtime_home, serving_models[0], PATIENT) as rt:
        report = rt.deployer().deploy(MODEL, [rt.target(1), rt.target(2, "challenger", 0.0)])
        assert set(report.loaded) <= {1, 2}  # loaded now (2), or already (1)
        rt.wait_ready()
        yield rt


def commit_split(rt, shadow: int) -> int:
    split = {
        "model": MODEL,
        "salt": "shadow-test",
        "shadow": shadow,
        "variants": [
            {"name": "champion", "version": 1, "weight": 1.0},
            {"name": "challenger", "version": 2, "weight": 0.0},
        ],
    }
    with PolicyStore(rt.home / "policies.sqlite") as store:
        version = store.apply({f"{MODEL}.loop-v2.split": ("ab_test", split)}, author="loop", reason="shadow").version
    deadline = time.monotonic() + 60
    while httpx.get(f"{rt.url}/readyz", timeout=5).json().get("policy_version") != version:
        assert time.monotonic() < deadline, "the gateway did not apply the commit"
        time.sleep(0.05)
    return version


def ask(rt, rows, tag: str) -> list[dict]:
    answers = []
    for i, row in enumerate(rows.iter_rows(named=True)):
        features = {n: (None if row[n] is None else float(row[n])) for n in FEATURE_NAMES}
        r = rt.post({"features": features, "unit_id": f"{tag}-{i}", "risk_level": 2}, {"x-request-id": f"{tag}-{i}"})
        assert r.status_code == 200, r.text
        answers.append(r.json())
    return answers


def test_the_shadow_scores_every_request_and_serves_none(runtime, serving_models):
    texts, feb = serving_models
    rows = feb.head(20)
    commit_split(runtime, shadow=2)
    answers = ask(runtime, rows, "shadowed")
    served, shadowed = local_scores(texts[0], rows), local_scores(texts[1], rows)
    assert not np.allclose(served, shadowed, atol=1e-3)  # two models that disagree: the test can tell them apart
    for answer, score in zip(answers, served, strict=True):
        assert answer["model_version"] == 1 and answer["score"] == pytest.approx(score, abs=1e-6)
        assert not any("shadow" in k for k in answer)  # the caller never sees the shadow
    log = {r["request_id"]: r for r in read_exposures(runtime.home / "serving" / "exposures")}
    for i, score in enumerate(shadowed):
        record = log[f"shadowed-{i}"]
        assert record["model_version"] == 1 and record["shadow_version"] == 2
        assert record["shadow_score"] == pytest.approx(score, abs=1e-6)  # the challenger's own answer, logged
    metrics = httpx.get(f"{runtime.url}/metrics", timeout=5).text
    assert 'keel_gateway_shadow_scores_total{model_version="2"} 20' in metrics


def test_a_shadow_version_that_is_not_deployed_is_not_scored(runtime, serving_models):
    rows = serving_models[1].head(3)
    commit_split(runtime, shadow=3)  # registered, not loaded in Triton
    ask(runtime, rows, "undeployed")
    log = [r for r in read_exposures(runtime.home / "serving" / "exposures") if r["request_id"].startswith("undep")]
    assert len(log) == 3 and not any("shadow_version" in r for r in log)
    notes = httpx.get(f"{runtime.url}/readyz", timeout=5).json()["policy_notes"]
    assert any("shadow version 3" in n and "not deployed" in n for n in notes)  # the note says why
