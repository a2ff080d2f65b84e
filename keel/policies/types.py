"""The policy types: one class each, its schema checked in one place, registered in ``POLICY_TYPES``.

A type validates a body (every error names the violated rule: ``PolicyValidationError.rule``) and, when it shapes
the gateway, lays itself over the gateway's policy (``apply``; keel/policies/gateway.py). The store validates each
commit with it, every gateway validates again what it reads (a gateway trusts no writer), and the CLI's
``keel policy validate`` runs the same code. Adding a type is one class here (on keel/policies/base.py) and its line
in ``POLICY_TYPES`` (docs/policy.md shows one).
"""

from __future__ import annotations

import math
from typing import Any

from keel.policies.base import (
    EXPERIMENT_STATUSES,
    WEIGHT_TOLERANCE,
    PolicyType,
    VersionsOf,
    known_keys,
    number,
    registry_version,
    tenant_id,
)
from keel.policies.errors import PolicyValidationError


class AbTest(PolicyType):
    """A traffic split: variants (registry versions) with weights summing to 1, an optional experiment."""

    type = "ab_test"

    @classmethod
    def validate(cls, name: str, body: dict[str, Any], versions_of: VersionsOf | None = None) -> None:
        known_keys(name, body, {"model", "variants", "salt", "experiment", "shadow"})
        exp = body.get("experiment")
        if exp is not None:
            if not isinstance(exp, dict) or not isinstance(exp.get("id"), str):
                raise PolicyValidationError(name, "experiment_shape", "'experiment' needs id and status")
            if exp.get("status") not in EXPERIMENT_STATUSES:
                raise PolicyValidationError(
                    name, "experiment_status", f"experiment status must be one of {', '.join(EXPERIMENT_STATUSES)}"
                )
        model, variants = body.get("model"), body.get("variants")
        if not isinstance(model, str) or not model:
            raise PolicyValidationError(name, "model_present", "'model' names the registry model")
        if not isinstance(variants, list) or not variants:
            raise PolicyValidationError(name, "variants_present", "'variants' must be a non-empty list")
        seen = set()
        for i, v in enumerate(variants):
            if not isinstance(v, dict) or not isinstance(v.get("name"), str):
                raise PolicyValidationError(name, "variant_shape", f"variants[{i}] needs name, version, weight")
            if v["name"] in seen:
                raise PolicyValidationError(name, "variant_names_unique", f"variant '{v['name']}' appears twice")
            seen.add(v["name"])
            number(name, "variant_weight", v, "weight", lo=0, hi=1)
            registry_version(name, model, v.get("version"), versions_of, f"variants[{i}]")
        if body.get("shadow") is not None:  # a version scored on every request beside the served one, never served
            registry_version(name, model, body["shadow"], versions_of, "shadow")
        total = math.fsum(v["weight"] for v in variants)
        if abs(total - 1.0) > WEIGHT_TOLERANCE:
            raise PolicyValidationError(name, "weights_sum_to_1", f"variant weights sum to {total!r}, not 1 (±1e-9)")


class Canary(PolicyType):
    """A progressive rollout of a challenger: steps, interval, thresholds, and its state (keel/canary.py)."""

    type = "canary"

    @classmethod
    def validate(cls, name: str, body: dict[str, Any], versions_of: VersionsOf | None = None) -> None:
        known_keys(
            name,
            body,
            {
                "model",
                "champion_version",
                "challenger_version",
                "steps",
                "interval_s",
                "min_samples",
                "error_ratio",
                "latency_ratio",
                "alpha",
                "max_log_loss_increase",
                "loss",
                "min_labelled",
                "progress_deadline_s",
                "on_breach",
                "state",
                "origin",
                "shadow",
                "shadow_max_s",
                "paired",
                "estimate",
                "gate_judged",
            },
        )
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise PolicyValidationError(name, "model_present", "'model' names the registry model")
        registry_version(name, model, body.get("champion_version"), versions_of, "champion_version")
        registry_version(name, model, body.get("challenger_version"), versions_of, "challenger_version")
        if body.get("champion_version") == body.get("challenger_version"):
            raise PolicyValidationError(
                name, "distinct_versions", "champion and challenger must be different versions"
            )
        steps = body.get("steps", [1, 10, 30, 50, 100])
        shadow = body.get("shadow")
        first = 0 if shadow is not None else 1e-12  # a shadow canary starts at 0 % (its shadow step)
        if (
            not isinstance(steps, list)
            or not steps
            or not all(isinstance(s, int | float) and not isinstance(s, bool) and 0 <= s <= 100 for s in steps)
            or not all(s >= first for s in steps)
        ):
            raise PolicyValidationError(
                name, "steps_percentages",
                f"steps are percentages in (0, 100] (a first 0: the shadow step, with 'shadow'), got {steps!r}",
            )  # fmt: skip
        for flag in ("paired", "gate_judged"):
            if not isinstance(body.get(flag, False), bool):
                raise PolicyValidationError(
                    name, f"{flag}_bool", f"'{flag}' is true or false, got {body.get(flag)!r}"
                )
        if shadow is not None:
            allowed = {"margin", "alpha", "min_labelled", "min_clusters"}
            if not isinstance(shadow, dict) or set(shadow) - allowed:
                raise PolicyValidationError(
                    name, "shadow_shape", f"'shadow' holds {', '.join(sorted(allowed))}, got {shadow!r}"
                )
            if steps[0] != 0:
                raise PolicyValidationError(name, "shadow_step", f"a shadow canary's first step is 0, got {steps!r}")
            number(name, "shadow_max", body, "shadow_max_s", lo=0, lo_open=True, required=False)
        estimate = body.get("estimate")
        if estimate is not None and (
            not isinstance(estimate, dict)
            or estimate.get("metric") not in ("auc", "log_loss", "rmse", "mae")
            or set(estimate) - {"metric", "margin", "alpha", "trust"}
        ):
            raise PolicyValidationError(
                name,
                "estimate_shape",
                f"'estimate' holds metric (auc|log_loss|rmse|mae), margin, alpha, trust: {estimate!r}",
            )
        if estimate is not None:
            number(name, "estimate_margin", estimate, "margin", lo=0)
            number(name, "estimate_alpha", estimate, "alpha", lo=0, hi=0.5, lo_open=True)
        if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
            raise PolicyValidationError(name, "steps_increasing", f"steps must increase, got {steps!r}")
        if steps[-1] != 100:
            raise PolicyValidationError(name, "steps_end_at_100", f"the last step must be 100, got {steps[-1]!r}")
        number(name, "interval", body, "interval_s", lo=0, lo_open=True)
        number(name, "min_samples", body, "min_samples", lo=1, integer=True, required=False)
        number(name, "error_ratio", body, "error_ratio", lo=1, required=False)
        number(name, "latency_ratio", body, "latency_ratio", lo=1, required=False)
        number(name, "alpha", body, "alpha", lo=0, hi=0.5, lo_open=True, required=False)
        number(name, "max_log_loss_increase", body, "max_log_loss_increase", lo=0, required=False)
        number(name, "min_labelled", body, "min_labelled", lo=1, integer=True, required=False)
        number(name, "progress_deadline", body, "progress_deadline_s", lo=0, lo_open=True, required=False)
        if body.get("loss", "log-loss") not in ("log-loss", "squared-error"):
            raise PolicyValidationError(
                name, "loss_known", f"'loss' is log-loss or squared-error, got {body.get('loss')!r}"
            )
        origin = body.get("origin")
        if origin is not None and not isinstance(origin, dict):
            raise PolicyValidationError(
                name, "origin_mapping", "'origin' (what led to this canary: drift report, runs, gate) is a mapping"
            )
        rollout = body.get("state")
        if rollout is not None:
            if not isinstance(rollout, dict) or rollout.get("status") not in (
                "running",
                "promoted",
                "rolled_back",
                "paused",
            ):
                raise PolicyValidationError(
                    name,
                    "state_status",
                    f"state.status must be running, promoted, rolled_back or paused, got {rollout!r}",
                )
            number(name, "state_step", rollout, "step", lo=0, hi=len(steps) - 1, integer=True)
            number(name, "state_started", rollout, "started_at", lo=0)
            number(name, "state_step_started", rollout, "step_started_at", lo=0)
            if not isinstance(rollout.get("quality_judged", False), bool):
                raise PolicyValidationError(name, "state_quality_judged", "state.quality_judged is true or false")
        if body.get("on_breach", "rollback") not in ("rollback", "pause"):
            raise PolicyValidationError(
                name, "on_breach", f"on_breach is rollback or pause, got {body.get('on_breach')!r}"
            )


class CircuitBreaker(PolicyType):
    """When a model version's breaker opens and for how long (the gateway's ``breaker``)."""

    type = "circuit_breaker"
    shapes_gateway = True

    @classmethod
    def apply(cls, gateway: dict[str, Any], body: dict[str, Any]) -> None:
        gateway["breaker"] = dict(body)

    @classmethod
    def validate(cls, name: str, body: dict[str, Any], versions_of: VersionsOf | None = None) -> None:
        known_keys(name, body, {"error_rate", "window_s", "min_requests", "open_s", "half_open_probes"})
        number(name, "error_rate", body, "error_rate", lo=0, hi=1, lo_open=True)
        number(name, "window", body, "window_s", lo=0, lo_open=True)
        number(name, "min_requests", body, "min_requests", lo=1, integer=True)
        number(name, "open", body, "open_s", lo=0, lo_open=True)
        number(name, "half_open_probes", body, "half_open_probes", lo=1, integer=True)


class RateLimitType(PolicyType):
    """Requests per second and burst: the default for every tenant, and per named tenant."""

    type = "rate_limit"
    shapes_gateway = True

    @classmethod
    def apply(cls, gateway: dict[str, Any], body: dict[str, Any]) -> None:
        gateway["default_rate_limit"] = dict(body["default"])
        gateway["tenant_rate_limits"] = {k: dict(v) for k, v in (body.get("tenants") or {}).items()}

    @classmethod
    def validate(cls, name: str, body: dict[str, Any], versions_of: VersionsOf | None = None) -> None:
        known_keys(name, body, {"default", "tenants"})
        for tenant in body.get("tenants") if isinstance(body.get("tenants"), dict) else {}:
            tenant_id(name, tenant)
        limits = {"default": body.get("default")} | {
            f"tenants.{k}": v for k, v in (body.get("tenants") or {}).items()
        }
        for where, lim in limits.items():
            if not isinstance(lim, dict):
                raise PolicyValidationError(name, "limit_shape", f"'{where}' needs rps and burst")
            number(name, "rps", lim, "rps", lo=0, lo_open=True)
            burst = number(name, "burst", lim, "burst", lo=1)
            if burst is not None and burst < 1:
                raise PolicyValidationError(name, "burst_range", f"'{where}.burst' must be ≥ 1")


class SlaTierType(PolicyType):
    """Latency, availability and timeout targets by tier, which tier each model is in, and optionally the tiers'
    admission across models (``admit_in_flight``, ``admit_wait_ms``: keel/policies/gateway.py)."""

    type = "sla_tier"
    shapes_gateway = True

    @classmethod
    def apply(cls, gateway: dict[str, Any], body: dict[str, Any]) -> None:
        gateway["tiers"] = {k: dict(v) for k, v in body["tiers"].items()}
        gateway["model_tiers"] = dict(body.get("models") or {})
        for key in ("admit_in_flight", "admit_wait_ms"):
            if key in body:
                gateway[key] = dict(body[key])

    @classmethod
    def validate(cls, name: str, body: dict[str, Any], versions_of: VersionsOf | None = None) -> None:
        known_keys(name, body, {"tiers", "models", "admit_in_flight", "admit_wait_ms"})
        tiers = body.get("tiers")
        if not isinstance(tiers, dict) or not tiers:
            raise PolicyValidationError(name, "tiers_present", "'tiers' maps tier names to targets")
        for t, target in tiers.items():
            if not isinstance(target, dict):
                raise PolicyValidationError(name, "tier_shape", f"tiers.{t} needs p99_ms, availability, timeout_ms")
            number(name, "p99", target, "p99_ms", lo=0, lo_open=True)
            number(name, "availability", target, "availability", lo=0, hi=1, lo_open=True)
            number(name, "timeout", target, "timeout_ms", lo=0, lo_open=True)
        for model, t in (body.get("models") or {}).items():
            if t not in tiers:
                raise PolicyValidationError(name, "tier_known", f"models.{model} names unknown tier {t!r}")
        for key, integer in (("admit_in_flight", True), ("admit_wait_ms", False)):
            table = body.get(key, {})
            if not isinstance(table, dict):
                raise PolicyValidationError(name, "admission_shape", f"'{key}' maps tier names to numbers")
            for t in table:
                if t not in tiers:
                    raise PolicyValidationError(name, "tier_known", f"{key}.{t} names unknown tier {t!r}")
                number(name, "admission", table, t, lo=0, integer=integer)


PRICE_KEYS = ("per_1000_requests", "per_cpu_second", "per_gpu_second")


class Cost(PolicyType):
    """The price table (issue 18's metering reads it; it shapes no gateway): prices per 1,000 requests, per CPU-second
    and per GPU-second of model compute, in one currency, with per-tenant overrides of any of them. Being a policy, it
    is versioned with the others and part of each release's policy manifest: "what did it cost at time T, and why"
    is a point-in-time question to the store (``Cost.prices_for`` on the body in force then)."""

    type = "cost"

    @classmethod
    def validate(cls, name: str, body: dict[str, Any], versions_of: VersionsOf | None = None) -> None:
        known_keys(name, body, {"currency", "tenants", *PRICE_KEYS})
        currency = body.get("currency")
        if not (isinstance(currency, str) and len(currency) == 3 and currency.isascii() and currency.isupper()):
            raise PolicyValidationError(
                name, "currency", f"'currency' is an ISO 4217 code such as USD, got {currency!r}"
            )
        for key in PRICE_KEYS:
            number(name, "price", body, key, lo=0)
        tenants = body.get("tenants") or {}
        if not isinstance(tenants, dict):
            raise PolicyValidationError(name, "tenants_shape", "'tenants' maps tenant ids to price overrides")
        for tenant, override in tenants.items():
            tenant_id(name, tenant)
            if not isinstance(override, dict) or not override:
                raise PolicyValidationError(
                    name, "override_shape", f"tenants.{tenant} overrides some of {PRICE_KEYS}"
                )
            known_keys(name, override, set(PRICE_KEYS))
            for key in override:
                number(name, "price", override, key, lo=0)

    @staticmethod
    def prices_for(body: dict[str, Any], tenant: str) -> dict[str, float]:
        """The prices a tenant pays under ``body``: the table's, with the tenant's overrides."""
        prices = {k: float(body[k]) for k in PRICE_KEYS}
        return prices | {k: float(v) for k, v in ((body.get("tenants") or {}).get(tenant) or {}).items()}


BUDGET_PERIODS = ("day", "month")


class Budget(PolicyType):
    """Per-tenant spending budgets over a period (a UTC day or month of the gateway's clock), in the price table's
    currency: at ``soft_share`` of the limit an alert (and a warning header on answers); at the limit, when ``hard``
    (the default), the tenant's requests are answered 429 ``budget_exceeded`` until the period ends or the budget is
    raised. Spend is usage × the ``cost`` policy (keel/metering); the decision is keel/metering/budget.py."""

    type = "budget"

    @classmethod
    def validate(cls, name: str, body: dict[str, Any], versions_of: VersionsOf | None = None) -> None:
        known_keys(name, body, {"currency", "period", "tenants"})
        currency = body.get("currency")
        if not (isinstance(currency, str) and len(currency) == 3 and currency.isascii() and currency.isupper()):
            raise PolicyValidationError(
                name, "currency", f"'currency' is an ISO 4217 code such as USD, got {currency!r}"
            )
        if body.get("period", "day") not in BUDGET_PERIODS:
            raise PolicyValidationError(
                name, "period", f"'period' is one of {', '.join(BUDGET_PERIODS)}, got {body.get('period')!r}"
            )
        tenants = body.get("tenants")
        if not isinstance(tenants, dict) or not tenants:
            raise PolicyValidationError(name, "tenants_present", "'tenants' maps tenant ids to their budgets")
        for tenant, spec in tenants.items():
            tenant_id(name, tenant)
            if not isinstance(spec, dict):
                raise PolicyValidationError(name, "budget_shape", f"tenants.{tenant} needs a limit")
            known_keys(name, spec, {"limit", "soft_share", "hard"})
            number(name, "limit", spec, "limit", lo=0)
            number(name, "soft_share", spec, "soft_share", lo=0, hi=1, lo_open=True, required=False)
            if not isinstance(spec.get("hard", True), bool):
                raise PolicyValidationError(name, "hard_bool", f"tenants.{tenant}.hard is true or false")


class TenantType(PolicyType):
    """A tenant that authenticates (keel/tenants.py): named by its tenant id, its API keys as salted hashes (never a
    secret), the tiers and risk levels it may claim, its quota share. `keel tenant add | rotate | revoke` commit it."""

    type = "tenant"

    @classmethod
    def validate(cls, name: str, body: dict[str, Any], versions_of: VersionsOf | None = None) -> None:
        from keel.tenants import body_problems

        problems = body_problems(name, body)
        if problems:
            rule, _, message = problems[0].partition(": ")
            raise PolicyValidationError(name, rule, message)


# Types that existed once: the store refuses new commits of them, gateways skip committed ones with a note.
RETIRED_TYPES = {
    "feature_freeze": "freezes are the drift sensor's, in the online store (docs/drift.md); nothing read this type",
}

POLICY_TYPES: dict[str, type[PolicyType]] = {
    t.type: t for t in (AbTest, Canary, CircuitBreaker, RateLimitType, SlaTierType, Cost, Budget, TenantType)
}


def validate_policy(name: str, type_: str, body: Any, versions_of: VersionsOf | None = None) -> None:
    """Raise PolicyValidationError naming the violated rule; return None when the policy is valid."""
    if not isinstance(name, str) or not name or len(name) > 128:
        raise PolicyValidationError(str(name), "name", "a policy needs a name of 1–128 characters")
    if type_ in RETIRED_TYPES:
        raise PolicyValidationError(name, "known_type", f"type {type_} is retired: {RETIRED_TYPES[type_]}")
    if type_ not in POLICY_TYPES:
        raise PolicyValidationError(
            name, "known_type", f"type must be one of {', '.join(POLICY_TYPES)}, got {type_!r}"
        )
    if not isinstance(body, dict):
        raise PolicyValidationError(name, "body_mapping", "the policy body must be a mapping")
    POLICY_TYPES[type_].validate(name, body, versions_of)
