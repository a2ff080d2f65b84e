"""The price table as a policy (issue 18, its first part): validated like every type — each error names its rule —,
versioned in the store (the prices at time T are a point-in-time read), per-tenant overrides, and no effect on what
a gateway enforces."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from keel.policies import PolicyStore
from keel.policies.errors import PolicyValidationError
from keel.policies.gateway import GatewayPolicy, effective_policy
from keel.policies.types import Cost, validate_policy

PRICES = {"currency": "USD", "per_1000_requests": 0.40, "per_cpu_second": 0.00005, "per_gpu_second": 0.0009,
          "tenants": {"acme": {"per_1000_requests": 0.30}}}  # fmt: skip


def test_a_tenant_pays_the_table_with_its_overrides():
    assert Cost.prices_for(PRICES, "acme") == {"per_1000_requests": 0.30, "per_cpu_second": 0.00005,
                                               "per_gpu_second": 0.0009}  # fmt: skip
    assert Cost.prices_for(PRICES, "replay")["per_1000_requests"] == 0.40


@pytest.mark.parametrize(
    "body, rule",
    [
        (PRICES | {"currency": "dollars"}, "currency"),
        ({k: v for k, v in PRICES.items() if k != "per_gpu_second"}, "price_present"),
        (PRICES | {"per_cpu_second": -1}, "price_range"),
        (PRICES | {"per_cpu_second": float("nan")}, "price_number"),
        (PRICES | {"tenants": {"acme": {"per_request": 1}}}, "known_fields"),
        (PRICES | {"tenants": {"acme": {}}}, "override_shape"),
        (PRICES | {"discount": 0.1}, "known_fields"),
    ],
)
def test_each_broken_rule_is_named(body, rule):
    with pytest.raises(PolicyValidationError) as err:
        validate_policy("prices", "cost", body)
    assert err.value.rule == rule


def test_prices_are_versioned_and_read_as_of_a_time(tmp_path):
    t0, t1 = datetime(2013, 6, 1, tzinfo=UTC), datetime(2013, 7, 1, tzinfo=UTC)
    with PolicyStore(tmp_path / "policies.sqlite") as store:
        store.apply({"prices": ("cost", PRICES)}, author="finance", reason="2013 prices", at=t0)
        store.apply(
            {"prices": ("cost", PRICES | {"per_1000_requests": 0.50})}, author="finance", reason="rise", at=t1
        )
        _, june = store.at(datetime(2013, 6, 15, tzinfo=UTC))
        _, july = store.at(datetime(2013, 7, 15, tzinfo=UTC))
        state = store.state()
    assert Cost.prices_for(june["prices"].body, "replay")["per_1000_requests"] == 0.40
    assert Cost.prices_for(july["prices"].body, "replay")["per_1000_requests"] == 0.50
    policy, split, notes = effective_policy(GatewayPolicy(), state, "flight-delay", {1}, 2)
    base = GatewayPolicy()
    assert replace(policy, version=base.version) == base and split is None and notes == []  # prices shape no gateway


@pytest.mark.parametrize("type_", ["rate_limit", "cost", "budget"])
@pytest.mark.parametrize("tenant", ["ops.team", "../ops", "a/b", "a:b", ""])
def test_every_policy_that_names_tenants_takes_only_the_tenant_id_alphabet(type_, tenant):
    """The gateway refuses such a tenant_id (422); a policy naming one could never apply — it is refused too."""
    bodies = {
        "rate_limit": {"default": {"rps": 10, "burst": 10}, "tenants": {tenant: {"rps": 1, "burst": 1}}},
        "cost": {
            "currency": "EUR",
            "per_1000_requests": 0.1,
            "per_cpu_second": 0.01,
            "per_gpu_second": 0.1,
            "tenants": {tenant: {"per_1000_requests": 0.2}},
        },
        "budget": {"currency": "EUR", "period": "day", "tenants": {tenant: {"limit": 5}}},
    }
    with pytest.raises(PolicyValidationError, match="is not a tenant id"):
        validate_policy("p", type_, bodies[type_])
    good = {k: v for k, v in bodies[type_].items() if k != "tenants"} | {
        "tenants": {"ops-team_2": next(iter(bodies[type_]["tenants"].values()))}
    }
    validate_policy("p", type_, good)
