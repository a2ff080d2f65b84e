"""Cost = usage × the price table in force when the requests were answered: per-tenant overrides, CPU vs GPU
seconds, a price change mid-day, unpriced usage never costed at zero, currencies never added."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl
import pytest

from keel.metering.compute import ComputeSample, compute_deltas
from keel.metering.cost import cost_frame, price_tables, price_versions, totals
from keel.metering.usage import usage_frame
from keel.policies import PolicyStore

DAY = datetime(2013, 6, 1, 12, tzinfo=UTC).timestamp()
PRICES = {"currency": "USD", "per_1000_requests": 0.40, "per_cpu_second": 0.01, "per_gpu_second": 0.5,
          "tenants": {"pricing": {"per_1000_requests": 0.20}}}  # fmt: skip


def rec(tenant, policy, status=200, version=1):
    return {"ts": DAY, "tenant_id": tenant, "model_version": version, "status": status, "rows": 1,
            "latency_ms": 1.0, "policy_version": policy}  # fmt: skip


@pytest.fixture
def store(tmp_path):
    with PolicyStore(tmp_path / "policies.sqlite") as s:
        s.apply({"prices": ("cost", PRICES)}, author="finance", reason="June prices")  # v1
        s.apply({"limits": ("rate_limit", {"default": {"rps": 100, "burst": 100}})}, author="ops", reason="x")  # v2
        s.apply({"prices": ("cost", PRICES | {"per_1000_requests": 1.00})}, author="finance", reason="rise")  # v3
        yield s


def test_each_request_pays_the_price_in_force_when_it_was_answered(store):
    # 1,000 ops requests under store v1, 1,000 under v2 (same prices: v2 changed only limits), 2,000 under v3.
    records = [rec("ops", 1)] * 1000 + [rec("ops", 2)] * 1000 + [rec("ops", 3)] * 2000
    records += [rec("pricing", 3)] * 1000 + [rec("ops", 3, status=503)] * 50  # errors: metered, not billed
    mapping = price_versions(store, {r["policy_version"] for r in records})
    assert mapping == {None: None, 1: 1, 2: 1, 3: 3}
    u = usage_frame(
        records, compute_deltas([ComputeSample(DAY, "flight-delay", 1, 10_000_000_000, 0, 0)]), mapping.get
    )
    cost = cost_frame(u, price_tables(store, u["price_version"].to_list()))
    by = {(r["tenant_id"], r["price_version"]): r for r in cost.iter_rows(named=True)}
    assert by[("ops", 1)]["request_cost"] == pytest.approx(2 * 0.40)
    assert by[("ops", 3)]["request_cost"] == pytest.approx(2 * 1.00)  # the 50 failed requests cost nothing
    assert by[("pricing", 3)]["request_cost"] == pytest.approx(1 * 0.20)  # the tenant's override
    # 10 CPU-seconds shared by the 5,000 rows scored, at 0.01 a CPU-second
    assert cost["compute_cost"].sum() == pytest.approx(10 * 0.01)
    assert by[("ops", 1)]["compute_cost"] == pytest.approx(10 * 0.01 * 2000 / 5000)
    assert totals(cost, [])["cost"][0] == pytest.approx(0.8 + 2.0 + 0.2 + 0.1)


def test_gpu_seconds_are_priced_as_gpu_seconds(store):
    u = usage_frame([rec("ops", 1)], compute_deltas([ComputeSample(DAY, "m", 1, 2_000_000_000, 0, 0, "gpu")]))
    u = u.with_columns(pl.lit(1, pl.Int64).alias("price_version"))
    cost = cost_frame(u, price_tables(store, [1]))
    assert cost["compute_cost"][0] == pytest.approx(2 * 0.5)


def test_usage_before_any_price_table_is_unpriced_not_free(store):
    u = usage_frame([rec("ops", None)] * 3, compute_deltas([]))
    cost = cost_frame(u, {})
    assert cost["cost"].to_list() == [None]
    assert totals(cost, ["tenant_id"])["unpriced_rows"][0] == 1


def test_a_price_version_that_set_no_price_table_is_refused(store):
    with pytest.raises(ValueError, match="version 2 did not set a cost policy"):
        price_tables(store, [2])


def test_totals_never_add_two_currencies(store):
    store.apply({"prices": ("cost", PRICES | {"currency": "EUR"})}, author="finance", reason="euros")  # v4
    records = [rec("ops", 1)] * 1000 + [rec("ops", 4)] * 1000
    u = usage_frame(records, compute_deltas([]), price_versions(store, {1, 4}).get)
    t = totals(cost_frame(u, price_tables(store, [1, 4])), ["tenant_id"])
    assert dict(zip(t["currency"], t["cost"], strict=True)) == pytest.approx({"EUR": 0.40, "USD": 0.40})
