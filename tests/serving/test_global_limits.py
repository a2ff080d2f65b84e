"""Tenants' rate limits and budgets across replicas (gpu_runtime/gateway/global_limits.py): with
``$KEEL_LIMITS_REDIS`` naming the machine's real Redis (started before every session and CI run), two gateways —
two replicas, each its own process state — take one tenant's tokens from one bucket and judge one spend; without
it, each holds its own (the test that shows the difference can fail). A Redis that does not answer degrades the
limits to each gateway's own, never to none. Through the gateway app with no Triton listening: the coarse model
answers (tests/serving/test_answer_confidence.py's gateway)."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from gpu_runtime.gateway import global_limits
from gpu_runtime.gateway.limits import RequestError
from gpu_runtime.gateway.metering import UsageMeter
from gpu_runtime.gateway.metrics import Metrics
from keel.policies.gateway import RateLimit
from tests.serving.test_answer_confidence import HOTELS, PATIENT, gateway_of

REDIS = "redis://127.0.0.1:6379/0"
BURST = 5
PRICES = {"currency": "USD", "per_1000_requests": 400.0, "per_cpu_second": 0.0, "per_gpu_second": 0.0}


@pytest.fixture(autouse=True)
def own_keys(monkeypatch):
    """Keys of this test alone on the shared server, and no cached clients from another test."""
    monkeypatch.setattr(global_limits, "PREFIX", f"keel:test:{uuid.uuid4().hex}:")
    monkeypatch.setattr(global_limits, "_SPEND", {})


def replica(tmp_path, name: str):
    """A gateway of its own (its own directory, logs and buckets) where tenant ops may send BURST requests (the
    bucket refills one token in 1,000 s: no refill within any test, however slow the machine)."""
    policy = replace(PATIENT, tenant_rate_limits={"ops": RateLimit(rps=0.001, burst=BURST)})
    return gateway_of(tmp_path / name, HOTELS, (0.9, 12.5), policy)


def body() -> bytes:
    values = dict(zip(HOTELS.features.names, HOTELS.features.defaults.tolist(), strict=True))
    return json.dumps({"features": values, "unit_id": "u1", "tenant_id": "ops"}).encode()


def statuses(gateways, n: int) -> list[int]:
    """``n`` requests of tenant ops, alternating between the gateways."""

    async def run():
        return [(await gateways[i % len(gateways)].predict(body(), {}))[0] for i in range(n)]

    return asyncio.run(run())


def test_a_tenants_burst_holds_across_two_replicas_on_redis(tmp_path, monkeypatch):
    monkeypatch.setenv(global_limits.LIMITS_ENV, REDIS)
    a, b = replica(tmp_path, "a"), replica(tmp_path, "b")
    got = statuses([a, b], 4 * BURST)
    assert got.count(200) == BURST and got[:BURST] == [200] * BURST  # one bucket for both
    assert set(got[BURST:]) == {429}


def test_without_redis_each_replica_holds_its_own_bucket(tmp_path, monkeypatch):
    monkeypatch.delenv(global_limits.LIMITS_ENV, raising=False)
    got = statuses([replica(tmp_path, "a"), replica(tmp_path, "b")], 4 * BURST)
    assert got.count(200) == 2 * BURST  # the fleet lets through twice the tenant's burst


def test_a_redis_that_does_not_answer_leaves_each_replica_its_own_limit(tmp_path, monkeypatch):
    monkeypatch.setenv(global_limits.LIMITS_ENV, "redis://127.0.0.1:1/0")  # nothing listens there
    a = replica(tmp_path, "a")
    got = statuses([a], 3 * BURST)
    assert got.count(200) == BURST and set(got[BURST:]) == {429}  # limited, never unlimited
    assert 'keel_gateway_global_limits_errors_total{what="rate_limit"}' in a.metrics.render()


def meter_at(tmp_path, clock: list[float]) -> UsageMeter:
    meter = UsageMeter(compute_dir=None, interval_s=5, device="cpu", exposure_dir=tmp_path / "none", metrics=Metrics(),
                       now=lambda: clock[0], client=lambda: None, routing=lambda: None, reader=lambda: None)  # fmt: skip
    meter.prices = PRICES
    meter.budget = {"currency": "USD", "period": "day", "tenants": {"ops": {"limit": 1.0}}}
    meter._seed_spend()
    return meter


def test_a_tenant_over_its_budget_on_one_replica_is_refused_on_the_other(tmp_path, monkeypatch):
    monkeypatch.setenv(global_limits.LIMITS_ENV, REDIS)
    clock = [datetime(2013, 6, 1, 12, tzinfo=UTC).timestamp()]
    a, b = meter_at(tmp_path, clock), meter_at(tmp_path, clock)
    answered = {"tenant_id": "ops", "status": 200, "model_version": 1, "rows": 1, "ts": clock[0]}
    a.check_budget("ops"), b.check_budget("ops")  # both start with nothing spent (and have synced)
    for _ in range(3):  # 0.40 USD each: 1.20 of a 1.00 budget, all on replica a
        a.meter(answered)
    assert b.spend["ops"] == 0.0  # b served none of it …
    b._synced = a._synced = float("-inf")  # (the next check syncs: what SYNC_S would do on a real clock)
    with pytest.raises(RequestError) as refused_a:
        a.check_budget("ops")
    with pytest.raises(RequestError) as refused_b:
        b.check_budget("ops")  # … and refuses ops all the same
    assert refused_a.value.status == refused_b.value.status == 429
    assert refused_b.value.code == "budget_exceeded" and refused_b.value.details["spend"] == pytest.approx(1.2)


def test_without_redis_a_replica_judges_only_its_own_spend(tmp_path, monkeypatch):
    monkeypatch.delenv(global_limits.LIMITS_ENV, raising=False)
    clock = [datetime(2013, 6, 1, 12, tzinfo=UTC).timestamp()]
    a, b = meter_at(tmp_path, clock), meter_at(tmp_path, clock)
    for _ in range(3):
        a.meter({"tenant_id": "ops", "status": 200, "model_version": 1, "rows": 1, "ts": clock[0]})
    with pytest.raises(RequestError):
        a.check_budget("ops")
    assert b.check_budget("ops") == {}  # b does not know: the spend is per replica
