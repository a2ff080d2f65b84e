"""The gateway process on the shared Redis online store (``KEEL_ONLINE_STORE=redis://…``): the same features, so the
same scores, as from the embedded SQLite store; a freeze written to Redis is served by the gateway."""

from __future__ import annotations

import os
import uuid

import lightgbm as lgb
import numpy as np
import pytest

from keel.features.online import get_online_features
from keel.features.redis_store import RedisOnlineStore
from keel.features.sqlite_store import SQLiteOnlineStore
from tests.features.conftest import REDIS_URL
from tests.serving.conftest import AS_OF, request_body, serving_version_1
from usecases.flights.features import FEATURES, FLIGHT_FEATURES, build_views


@pytest.fixture(scope="module")
def redis_store(validated):  # noqa: F811 - the session fixture
    store = RedisOnlineStore(REDIS_URL, features=FLIGHT_FEATURES, prefix=f"keel-test:{uuid.uuid4().hex}")
    store.write_snapshot(
        build_views(validated["weather"], validated["planes"], validated["flights"], as_of=AS_OF),
        as_of=AS_OF,
        partition="2013-02",
    )
    yield store
    store.drop()
    store.close()


@pytest.fixture(scope="module")
def runtime(runtime_home, serving_models, redis_store):
    saved = {k: os.environ.get(k) for k in ("KEEL_ONLINE_STORE", "KEEL_ONLINE_PREFIX")}
    os.environ.update(KEEL_ONLINE_STORE=REDIS_URL, KEEL_ONLINE_PREFIX=redis_store.prefix)
    try:
        with serving_version_1(runtime_home, serving_models[0]) as rt:
            yield rt
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.update({k: v})


def test_the_gateway_on_redis_scores_as_on_sqlite(runtime, serving_models):
    _, feb = serving_models
    rows = [feb.row(i, named=True) for i in range(0, 600, 12)]
    scores, defaulted = [], []
    for row in rows:
        resp = runtime.post(request_body(row))
        assert resp.status_code == 200, resp.text
        scores.append(resp.json()["score"])
        defaulted.append("missing_features_defaulted" in resp.json()["degraded"])
    with SQLiteOnlineStore(runtime.home / "online" / "flights.sqlite", features=FLIGHT_FEATURES) as sqlite:
        batch = get_online_features(sqlite, rows)
    # the same flights miss the same values (a tailnum absent from planes) — and most miss none
    assert defaulted == list(np.isnan(batch.matrix).any(axis=0)) and defaulted.count(False) > len(rows) / 2
    x = np.where(np.isnan(batch.matrix.T), [f.default for f in FEATURES], batch.matrix.T).astype(np.float32)
    expected = lgb.Booster(model_str=runtime.texts[0]).predict(x.astype(np.float64))
    np.testing.assert_allclose(scores, expected, atol=1e-6)


def test_a_freeze_in_redis_is_served(runtime, serving_models, redis_store):
    _, feb = serving_models
    body = request_body(feb.row(3, named=True))
    redis_store.freeze("temp", reason="test: drift", value=41.5)
    try:
        resp = runtime.post(body)
        assert resp.status_code == 200 and "frozen:temp" in resp.json()["degraded"]
    finally:
        redis_store.unfreeze("temp", reason="test done")
    assert "frozen:temp" not in runtime.post(body).json()["degraded"]
