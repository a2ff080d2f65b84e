"""Behind the edge (GatewayConfig.edge_token, docs/serving.md "The edge"): the gateway takes the tenant from the edge
filter's x-keel-tenant, trusted only with the edge's token; a request that did not come through the edge is 401, a
body tenant_id naming another tenant 403, and the exposure log bills the authenticated tenant. Through the gateway
app with no Triton listening: the coarse model answers (tests/serving/test_answer_confidence.py's gateway)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

from keel.exposure_log import read_exposures
from tests.serving.test_answer_confidence import HOTELS, gateway_of

TOKEN = "edge-token"


def edged(tmp_path):
    gateway = gateway_of(tmp_path, HOTELS, (0.9, 12.5))
    for model in gateway.models.values():
        model.config = replace(model.config, edge_token=TOKEN)
    return gateway


def body(**extra) -> bytes:
    values = dict(zip(HOTELS.features.names, HOTELS.features.defaults.tolist(), strict=True))
    return json.dumps({"features": values, "unit_id": "u1", **extra}).encode()


def test_the_tenant_is_the_edges_and_a_body_naming_another_is_403(tmp_path):
    gateway = edged(tmp_path)
    through_edge = {"x-keel-edge": TOKEN, "x-keel-tenant": "ops"}
    status, payload, _ = asyncio.run(gateway.predict(body(tenant_id="pricing"), through_edge))
    assert status == 403 and payload["error"]["code"] == "tenant_mismatch"
    assert "tenant ops's; the body names pricing" in payload["error"]["message"]
    status, _, _ = asyncio.run(gateway.predict(body(tenant_id="ops"), through_edge))
    assert status == 200
    # the risk level in the body is held to the tenant's (the edge filter passes them: x-keel-risk-levels)
    limited = through_edge | {"x-keel-risk-levels": "2,3"}
    status, payload, _ = asyncio.run(gateway.predict(body(risk_level=1), limited))
    assert status == 403 and payload["error"]["message"] == "tenant ops may use risk levels 2,3, not 1"
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # as Envoy passes it (and logs it)
    edge_ids = through_edge | {"x-request-id": "5c7d4a2e-1111-4e0f-9bd3-4b4b2f2a9e01", "traceparent": trace}
    status, _, _ = asyncio.run(gateway.predict(body(), edge_ids))  # no tenant in the body: the key's
    assert status == 200
    for headers in ({}, {"x-keel-tenant": "ops"}, {"x-keel-edge": "guessed", "x-keel-tenant": "ops"},
                    {"x-keel-edge": TOKEN}):  # fmt: skip
        status, payload, _ = asyncio.run(gateway.predict(body(tenant_id="ops"), headers))
        assert status == 401 and payload["error"]["code"] == "unauthenticated", headers
    answered = [e for e in read_exposures(tmp_path / "exposures") if e["status"] == 200]
    assert [e["tenant_id"] for e in answered] == ["ops", "ops"]
    # one id from the edge to the exposure log: Envoy's request id and the caller's trace context
    assert answered[1]["request_id"] == edge_ids["x-request-id"] and answered[1]["traceparent"] == trace
    assert "traceparent" not in answered[0]


def test_without_an_edge_the_body_names_the_tenant_as_before(tmp_path):
    gateway = gateway_of(tmp_path, HOTELS, (0.9, 12.5))
    status, _, _ = asyncio.run(gateway.predict(body(tenant_id="pricing"), {"x-keel-tenant": "ops",
                                                                          "traceparent": "00-bogus\n"}))  # fmt: skip
    assert status == 200
    [logged] = read_exposures(tmp_path / "exposures")
    assert logged["tenant_id"] == "pricing" and "traceparent" not in logged  # a malformed trace context is not kept


def test_behind_the_edge_the_gateway_holds_the_models_tier_to_the_tenants_own(tmp_path):
    """Issue 61 item 1, defence in depth: a request that reached a worker with the edge's token but without the edge's
    tier check (the default route's gap) is refused by the gateway itself, from the tenants in the policy store it
    follows — room-rate is L1: pricing (L2, L3) is 403, ops (L1, L2) is answered, a tenant not in force is 403."""
    from keel.policies import PolicyStore
    from keel.tenants import Tenant, new_key

    store_path = tmp_path / "policies.sqlite"
    with PolicyStore(store_path) as store:
        store.apply(
            {
                name: ("tenant", Tenant(name, (new_key("2016-07-01T00:00:00+00:00")[1],), tiers).as_body())
                for name, tiers in (("ops", ("L1", "L2")), ("pricing", ("L2", "L3")))
            },
            author="tests",
            reason="two tenants",
        )
    gateway = gateway_of(tmp_path, HOTELS, (0.9, 12.5), edge_token=TOKEN, policy_store_path=store_path)
    assert gateway.default.tier() == "L1"

    def ask(tenant: str):
        return asyncio.run(gateway.predict(body(), {"x-keel-edge": TOKEN, "x-keel-tenant": tenant}))

    status, payload, _ = ask("pricing")
    assert status == 403 and payload["error"]["message"] == "tenant pricing may use tiers L2, L3, not L1"
    status, payload, _ = ask("ghost")
    assert status == 403 and payload["error"]["message"].startswith("tenant ghost is not in force at policy version")
    assert ask("ops")[0] == 200
