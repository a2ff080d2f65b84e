"""The edge's HTTP filters before the router (keel/edge/envoy.py puts them in the listener): keel's edge filter — the
proxy-wasm module that authenticates the API key and sets the business labels (gpu_runtime/edge_filter/keel_edge.c)
— with its configuration from the tenants in force, and each tenant's rate at the edge (Envoy's local rate limit,
one token bucket per tenant) — and how Envoy words its own answers (``local_replies``). Pure: values in, Envoy v3
resources out.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from keel.policies.gateway import GatewayPolicy, RateLimit

WASM = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
STRING_VALUE = "type.googleapis.com/google.protobuf.StringValue"
LOCAL_RATE_LIMIT = "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit"
# The edge's token reaches the filter through Envoy's own environment, by this name: the admin endpoint's
# /config_dump shows the name, never the value (issue 61 item 2).
EDGE_TOKEN_ENV = "KEEL_EDGE_TOKEN"


def _seconds(ms: float) -> str:
    return f"{ms / 1000:.3f}s"


def wasm_filter(module: str, configuration: str) -> dict[str, Any]:
    """keel's edge filter (gpu_runtime/edge_filter/keel_edge.c) on Envoy's V8 runtime: authenticates the key, sets
    the tenant and the tier. ``fail_open`` false: a filter that cannot run answers 503, it never lets a request
    through unauthenticated. The VM sees one variable of Envoy's environment, the edge's token (``EDGE_TOKEN_ENV``):
    the configuration holds no secret, since Envoy's admin endpoint dumps it."""
    return {
        "name": "envoy.filters.http.wasm",
        "typed_config": {
            "@type": WASM,
            "config": {
                "name": "keel_edge",
                "root_id": "keel_edge",
                "fail_open": False,
                "configuration": {"@type": STRING_VALUE, "value": configuration},
                "vm_config": {"vm_id": "keel_edge", "runtime": "envoy.wasm.runtime.v8",
                              "code": {"local": {"filename": module}},
                              "environment_variables": {"host_env_keys": [EDGE_TOKEN_ENV]}},
            },
        },
    }  # fmt: skip


def token_bucket(limit: RateLimit) -> dict[str, Any]:
    """Envoy's token bucket for ``limit``: ``burst`` tokens, refilled at ``rps`` (in tenths of a second from 10/s up,
    a token at a time below)."""
    if limit.rps >= 10:
        fill_ms, per_fill = 100, max(1, round(limit.rps / 10))
    else:
        fill_ms, per_fill = max(50, round(1000 / limit.rps)), 1
    return {"max_tokens": max(1, int(limit.burst)), "tokens_per_fill": per_fill, "fill_interval": _seconds(fill_ms)}


def tenant_rate_limit(limits: dict[str, RateLimit]) -> dict[str, Any]:
    """Each tenant's rate at the edge (after the edge filter has set ``x-keel-tenant`` from the key): one token
    bucket per tenant, shared by Envoy's threads, 429 before a worker sees the request. A request without a tenant
    (the operations' reads) takes no token: the filter-wide bucket is never the one that refuses."""
    unlimited = {"max_tokens": 1_000_000_000, "tokens_per_fill": 1_000_000_000, "fill_interval": "1s"}
    always = {"default_value": {"numerator": 100, "denominator": "HUNDRED"}}
    return {
        "name": "envoy.filters.http.local_ratelimit",
        "typed_config": {
            "@type": LOCAL_RATE_LIMIT,
            "stat_prefix": "keel_tenant_rate_limit",
            "token_bucket": unlimited,
            "filter_enabled": always | {"runtime_key": "keel_tenant_rate_limit_enabled"},
            "filter_enforced": always | {"runtime_key": "keel_tenant_rate_limit_enforced"},
            "rate_limits": [{"actions": [{"request_headers": {"header_name": "x-keel-tenant",
                                                              "descriptor_key": "tenant"}}]}],
            "descriptors": [
                {"entries": [{"key": "tenant", "value": name}], "token_bucket": token_bucket(limit)}
                for name, limit in sorted(limits.items())
            ],
            "response_headers_to_add": [{"header": {"key": "retry-after", "value": "1"}}],
            "local_rate_limit_per_downstream_connection": False,
        },
    }  # fmt: skip


def edge_limits(tenants, policy: GatewayPolicy) -> dict[str, RateLimit]:
    """Each tenant's rate at the edge: the policy's rate limit for it (its own, else the default) times its quota
    share — the share of that rate it is given (1.0: all of it)."""
    out = {}
    for t in tenants:
        base = policy.rate_limit_of(t.name)
        out[t.name] = RateLimit(rps=base.rps * t.quota_share, burst=max(1.0, base.burst * t.quota_share))
    return out


def keyed_hash(token: str, sha256_hex: str) -> str:
    """What the edge filter's configuration holds for a key: HMAC-SHA256 under the edge's ``token`` of the store's
    ``sha256(salt ‖ secret)`` — the filter computes the same from the key a caller sends; without the token (Envoy's
    environment, the workers') it proves nothing and cannot be tested against a guess."""
    return hmac.new(token.encode(), bytes.fromhex(sha256_hex), hashlib.sha256).hexdigest()


def edge_filter_config(
    token: str, tenants, models: dict[str, str], default: str | None = None, version: int | None = None
) -> str:
    """The edge filter's configuration from the tenants in force (keel.tenants.Tenant: their keys' salted hashes,
    tiers, risk levels), the served models' tiers and the ``default`` model (``POST /v1/predict``'s; None: the first
    of ``models``). It holds no secret — Envoy's admin ``/config_dump`` shows it to any local process: ``token``
    (what the filter sets as ``x-keel-edge``, read from Envoy's environment) only keys the keys' hashes
    (``keyed_hash``). ``version``: the policy version it comes from, its first line — every version's configuration
    differs from every earlier one's, so Envoy configures the filter anew even when a version goes back to an earlier
    state (Envoy reuses a plugin whose configuration it has seen, and the filter keeps one configuration per VM: a
    model moved to L2 and back to L1 stayed L2 at the edge)."""
    lines = [f"version {version}"] if version is not None else []
    for t in sorted(tenants, key=lambda t: t.name):
        lines.append(f"tenant {t.name} {','.join(t.tiers)} {','.join(map(str, t.risk_levels))}")
        lines += [f"key {k.key_id} {t.name} {k.salt} {keyed_hash(token, k.sha256)}" for k in t.keys]
    lines += [f"model {m} {tier}" for m, tier in sorted(models.items())]
    default = default or next(iter(models), None)
    if default is not None:
        lines.append(f"default model {default}")
    return "\n".join(lines) + "\n"


# Envoy's own refusals, by response flag, as keel's structured answers: (flags, status, code, message)
EDGE_REFUSALS = (
    (["UO"], 503, "shed", "the edge refused it: its priority's requests in flight are at the workers' limit"),
    (["UT"], 504, "edge_timeout", "no worker answered within the route's timeout"),
    (["UF", "UH", "URX", "UC", "UR", "NC"], 503, "runtime_unavailable", "no gateway worker could be reached"),
    # (matched by its status: the local rate limit's reply is mapped before its flag is set)
    (["RL"], 429, "rate_limited", "the tenant is over its rate at the edge"),
)


def local_replies() -> dict[str, Any]:
    """Envoy's own answers (a refusal at the edge, a worker that did not answer) in the shape of the gateway's —
    ``{"request_id", "error": {"code", "message", "stage": "edge"}}`` with ``retry-after`` — never Envoy's plain
    text. The edge filter's answers (401, 403) are its own JSON already and carry none of these flags."""
    mappers = []
    for flags, status, code, message in EDGE_REFUSALS:
        mappers.append({
            "filter": {"status_code_filter": {"comparison": {"op": "EQ", "value": {
                "default_value": 429, "runtime_key": "keel_edge_rate_limited_status"}}}}
            if flags == ["RL"] else {"response_flag_filter": {"flags": flags}},
            "status_code": status,
            "body_format_override": {"json_format": {
                "request_id": "%REQ(X-REQUEST-ID)%",
                "error": {"code": code, "message": message, "stage": "edge", "details": "%RESPONSE_CODE_DETAILS%"}}},
            "headers_to_add": [{"header": {"key": "retry-after", "value": "1"},
                                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}],
        })  # fmt: skip
    return {"mappers": mappers}
