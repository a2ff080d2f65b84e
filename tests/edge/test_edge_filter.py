"""keel's edge filter (gpu_runtime/edge_filter/keel_edge.c, built by scripts/setup) in the real Envoy: the tenant
comes from the API key, never from the request; no key or a wrong, unknown or revoked one is 401; a tier or risk
level the tenant was not given is 403; revoking or rotating is a new configuration, in force when `apply` returns.
Behind it, a stand-in worker process (tests/edge/stand_in.py) that echoes the labels it received."""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import replace

import httpx
import pytest

from gpu_runtime.edge import EnvoyEdge, edge_filter_module
from gpu_runtime.triton import free_port
from keel.edge.envoy import EdgeSpec
from keel.edge.filters import edge_filter_config
from keel.tenants import Tenant, new_key
from tests.edge.test_envoy import Worker, post

MODELS = {"flight-delay": "L2", "room-rate": "L1"}
TOKEN = "edge-token-for-tests"


@pytest.fixture
def keys():
    return {name: new_key("2013-04-01T00:00:00+00:00") for name in ("ops", "pricing", "spare")}


def tenants(keys, revoked=()) -> list[Tenant]:
    return [
        Tenant("ops", tuple(s for n, (_, s) in keys.items() if n in ("ops", "spare") and n not in revoked),
               tiers=("L1", "L2"), risk_levels=(1, 2)),
        Tenant("pricing", tuple(s for n, (_, s) in keys.items() if n == "pricing" and n not in revoked)),
    ]  # fmt: skip


@pytest.fixture
def edge(tmp_path, keys):
    (tmp_path / "workers").mkdir()
    worker = Worker(tmp_path / "workers")
    spec = EdgeSpec(port=free_port(), workers=(worker.port,), models=MODELS, wasm=edge_filter_module(),
                    filter_config=edge_filter_config(TOKEN, tenants(keys), MODELS))  # fmt: skip
    with EnvoyEdge(tmp_path / "edge", spec, token=TOKEN) as e:
        yield e
    worker.kill()


def test_the_tenant_comes_from_the_key_never_from_the_request(edge, keys):
    key = keys["pricing"][0]
    status, body = post(f"{edge.url}/v1/models/flight-delay/predict",
                        headers={"x-api-key": key, "x-keel-tenant": "ops", "x-keel-edge": "forged",
                                 "x-keel-risk-levels": "1,2,3"})  # fmt: skip
    assert status == 200
    assert body["labels"] == {"x-keel-tenant": "pricing", "x-keel-tier": "L2", "x-keel-edge": TOKEN,
                              "x-keel-risk-levels": "2,3"}  # fmt: skip
    status, body = post(
        f"{edge.url}/v1/models/room-rate/predict", headers={"authorization": f"Bearer {keys['ops'][0]}"}
    )
    assert status == 200 and body["labels"]["x-keel-tenant"] == "ops" and body["labels"]["x-keel-tier"] == "L1"


@pytest.mark.parametrize(
    "headers",
    [{}, {"x-api-key": ""}, {"authorization": "Basic b3BzOg=="}, {"x-api-key": "keel_000000000000_" + "A" * 43},
     {"x-api-key": "not-a-key"}],
)  # fmt: skip
def test_no_key_or_an_unknown_one_is_401_and_reaches_no_worker(edge, headers):
    status, body = post(f"{edge.url}/v1/models/flight-delay/predict", headers=headers)
    assert status == 401 and '"error": "unauthenticated"' in body["body"]


def test_a_wrong_secret_for_a_known_key_id_is_401(edge, keys):
    key = keys["ops"][0]
    forged = key[:-1] + ("A" if key[-1] != "A" else "B")
    status, body = post(f"{edge.url}/v1/models/flight-delay/predict", headers={"x-api-key": forged})
    assert status == 401 and "unknown or revoked API key" in body["body"]


def test_a_tenant_claims_only_the_tiers_and_risk_levels_it_was_given(edge, keys):
    pricing, ops = {"x-api-key": keys["pricing"][0]}, {"x-api-key": keys["ops"][0]}
    status, body = post(f"{edge.url}/v1/models/room-rate/predict", headers=pricing)  # an L1 model
    assert status == 403 and "tenant pricing may use tiers L2,L3, not L1" in body["body"]
    status, body = post(f"{edge.url}/v1/models/flight-delay/predict", headers={**pricing, "x-keel-tier": "L1"})
    assert status == 403 and "not L1" in body["body"]
    status, body = post(f"{edge.url}/v1/models/flight-delay/predict", headers={**pricing, "x-keel-risk-level": "1"})
    assert status == 403 and "tenant pricing may use risk levels 2,3, not 1" in body["body"]
    status, body = post(f"{edge.url}/v1/predict", headers={**ops, "x-keel-tier": "L1", "x-keel-risk-level": "1"})
    assert status == 200 and body["labels"]["x-keel-tier"] == "L1"


def test_a_revoked_or_rotated_key_is_refused_once_the_new_configuration_is_applied(edge, keys):
    url = f"{edge.url}/v1/models/flight-delay/predict"
    assert post(url, headers={"x-api-key": keys["spare"][0]})[0] == 200
    started = time.monotonic()
    edge.apply(replace(edge.spec, filter_config=edge_filter_config(TOKEN, tenants(keys, revoked={"spare"}), MODELS)))
    status, body = post(url, headers={"x-api-key": keys["spare"][0]})
    print(f"revoked and refused in {time.monotonic() - started:.3f} s")
    assert status == 401 and "revoked" in body["body"]
    assert post(url, headers={"x-api-key": keys["ops"][0]})[0] == 200  # the tenant's other key still works


def test_each_tenant_has_its_own_rate_at_the_edge_and_probes_need_no_key(edge, keys):
    """pricing's bucket at the edge holds 3 requests and refills one every 10 s: of 20 sent at once, at most 3 plus
    one per 10 s elapsed pass (the rest 429 from Envoy, never reaching a worker); ops, unlimited here, is not
    touched by pricing's refusals. The operations' reads pass without a key and take no tenant's token."""
    from keel.edge.filters import tenant_rate_limit, token_bucket
    from keel.policies.gateway import RateLimit

    limits = {"pricing": RateLimit(rps=0.1, burst=3), "ops": RateLimit(rps=100_000, burst=100_000)}
    assert token_bucket(limits["pricing"]) == {"max_tokens": 3, "tokens_per_fill": 1, "fill_interval": "10.000s"}
    assert tenant_rate_limit(limits)["typed_config"]["descriptors"][1]["entries"] == [
        {"key": "tenant", "value": "pricing"}
    ]
    edge.apply(replace(edge.spec, tenant_limits=limits))
    url = f"{edge.url}/v1/models/flight-delay/predict"
    started = time.monotonic()
    statuses = [post(url, headers={"x-api-key": keys["pricing"][0]})[0] for _ in range(20)]
    elapsed = time.monotonic() - started
    assert set(statuses) <= {200, 429} and statuses[:1] == [200]
    assert 1 <= statuses.count(200) <= 3 + int(elapsed / 10) + 1, (statuses, elapsed)
    assert edge.counter("keel_tenant_rate_limit.http_local_rate_limit.rate_limited") == statuses.count(429)
    for _ in range(5):  # Envoy's 429 in keel's shape (past a token refilled meanwhile, if the machine was slow)
        refused = httpx.post(url, content=b"{}", headers={"x-api-key": keys["pricing"][0]}, timeout=10)
        if refused.status_code == 429:
            break
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "rate_limited" and refused.json()["error"]["stage"] == "edge"
    assert all(post(url, headers={"x-api-key": keys["ops"][0]})[0] == 200 for _ in range(10))
    for path in ("/readyz", "/healthz", "/metrics"):
        with urllib.request.urlopen(f"{edge.url}{path}", timeout=10) as resp:  # noqa: S310 - loopback
            assert resp.status == 200 and json.loads(resp.read())["labels"]["x-keel-tenant"] is None
    assert post(f"{edge.url}/readyz")[0] == 401  # a POST is not a probe


def test_a_models_tier_is_held_to_the_tenants_on_every_route(edge, keys):
    """Issue 61 item 1: ``POST /v1/predict`` (the default model's route) checked no tier, and a tier asked for
    (``x-keel-tier``) replaced the model's. Now the model's tier is held to the tenant's on every route, and an
    asked tier besides it."""
    pricing = {"x-api-key": keys["pricing"][0]}  # tiers L2, L3
    edge.apply(
        replace(edge.spec, filter_config=edge_filter_config(TOKEN, tenants(keys), MODELS, default="room-rate"))
    )
    status, body = post(f"{edge.url}/v1/predict", headers=pricing)  # the default model is L1 now
    assert status == 403 and "tenant pricing may use tiers L2,L3, not L1" in body["body"]
    assert post(f"{edge.url}/v1/predict?debug=1", headers=pricing)[0] == 403
    status, body = post(f"{edge.url}/v1/models/room-rate/predict", headers={**pricing, "x-keel-tier": "L2"})
    assert status == 403 and "not L1" in body["body"]  # asking a tier it has does not buy the model's
    status, body = post(f"{edge.url}/v1/predict", headers={"x-api-key": keys["ops"][0]})
    assert status == 200 and body["labels"]["x-keel-tier"] == "L1"
    assert post(f"{edge.url}/v1/models/flight-delay/predict", headers=pricing)[0] == 200


def test_the_admin_endpoint_shows_no_token_and_no_key_hash(edge, keys):
    """Issue 61 item 2: Envoy's admin ``/config_dump`` (unauthenticated, on loopback) held the edge's token and the
    keys' stored hashes inline in the filter's configuration. Now the token is in Envoy's environment only (the dump
    names the variable) and a key's record is keyed by it; authentication still works."""
    dump = urllib.request.urlopen(f"{edge.admin_url}/config_dump?include_eds", timeout=10).read().decode()  # noqa: S310
    assert "keel_edge" in dump and "KEEL_EDGE_TOKEN" in dump  # the filter's configuration is there, by name
    assert TOKEN not in dump
    stored = [s for t in tenants(keys) for s in t.keys]
    assert len(stored) == 3 and not [s.key_id for s in stored if s.sha256 in dump]
    assert not [k for k, _ in keys.values() if k[len("keel_") + 13 :] in dump]  # keel_<12 hex>_<secret>
    status, body = post(f"{edge.url}/v1/models/flight-delay/predict", headers={"x-api-key": keys["ops"][0]})
    assert status == 200 and body["labels"]["x-keel-edge"] == TOKEN  # the workers still get the token


def test_a_configuration_that_goes_back_to_an_earlier_one_is_in_force(edge, keys):
    """A model moved to L2 and back to L1 (a revert): Envoy reuses a plugin whose configuration it has seen, and the
    filter keeps one configuration per VM — without the version line the edge stayed at L2. Each version's
    configuration is its own."""
    pricing = {"x-api-key": keys["pricing"][0]}
    url = f"{edge.url}/v1/models/room-rate/predict"
    for version, tier, status in ((1, "L1", 403), (2, "L2", 200), (3, "L1", 403), (4, "L2", 200)):
        models = MODELS | {"room-rate": tier}
        config = edge_filter_config(TOKEN, tenants(keys), models, version=version)
        edge.apply(replace(edge.spec, models=models, filter_config=config))
        assert post(url, headers=pricing)[0] == status, (version, tier)
