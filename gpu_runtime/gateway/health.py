"""What a gateway reports about itself: readiness (``/readyz``: runtime up, routing loaded, every routed version ready
in Triton, the policy in force), the exposure log's health, and what ``/metrics`` renders (breakers, memory pools,
SLA targets, the runtime's restarts, the features served frozen and the answers served degraded).

Functions of a served model (model.py) and of the process's exposure log; app.py calls them.
"""

from __future__ import annotations

from typing import Any

from gpu_runtime.gateway.control import STATE_CODES
from gpu_runtime.repository import triton_name
from keel.exposure_log import ExposureLog


async def ready(model: Any, exposures: ExposureLog) -> tuple[bool, dict[str, Any]]:
    """``/readyz`` for one served model: runtime up, routing loaded, every routed version ready in Triton."""
    runtime = model.runtime
    if runtime is not None and not runtime.up:
        return False, {
            "reason": f"model runtime {runtime.state}: {runtime.last_failure}",
            "runtime": runtime.as_dict(),
        }
    follower = model.follower
    follower.reload_routing()
    table = follower.routing
    if table is None:
        return False, {"reason": f"no routing table at {model.config.routing_path}"}
    try:
        for v in table.versions():
            if not await model.scorer.client.is_model_ready(triton_name(table.model, v), str(v)):
                return False, {"reason": f"{table.model} version {v} is not ready in Triton"}
    except Exception as exc:  # noqa: BLE001 - any failure to reach Triton means not ready
        return False, {"reason": f"Triton at {model.config.triton_url}: {exc}"}
    return True, {
        "exposure_log": exposure_health(exposures),
        "runtime": runtime.as_dict() if runtime is not None else None,
        "generation": table.generation,
        "versions": table.versions(),
        "coarse_version": table.coarse.version if table.coarse else None,
        "policy_version": follower.policy_version,
        "policy_applied_at": follower.policy_applied_at,
        "policy_error": follower.policy_error,
        "coarse_error": model.coarse.error,
        "policy_notes": follower.policy_notes,
    }


def exposure_health(exposures: ExposureLog) -> dict[str, Any]:
    """Whether every answered request reached the exposure log (experiments and canaries are judged on it)."""
    lost = exposures.failures
    return {"ok": lost == 0, "lost_records": lost, "last_error": exposures.last_error}


def count_degraded(metrics: Any, flags: list[str]) -> None:
    """One count per answered request and flag (``frozen:<feature>``, ``missing_features_defaulted``, ...): the flags
    are a fixed vocabulary and the served features, so the label set stays bounded."""
    for flag in set(flags):
        metrics.inc("keel_gateway_degraded_answers_total", {"flag": flag})


def export_model(model: Any) -> None:
    """What /metrics shows of one served model, computed at scrape time."""
    _export_breakers(model)
    _export_pools(model)
    _export_sla(model)
    _export_freezes(model)
    model.meter.export_budgets()


def _export_freezes(model: Any) -> None:
    """``keel_features_frozen{feature}``: 1 while the online store serves the feature with its freeze value (every
    served feature is listed, 0 when live), read from the store at scrape time."""
    store = model.store
    if store is None:
        return
    try:
        frozen = store.frozen()
    except Exception:  # noqa: BLE001 - a busy or missing store must not break /metrics
        return
    for name in model.features.names:
        model.metrics.set_gauge("keel_features_frozen", {"feature": name}, 1 if name in frozen else 0)


def export_runtime(runtime: Any, metrics: Any) -> None:
    if runtime is not None:
        metrics.set_gauge("keel_gateway_runtime_up", {}, 1 if runtime.up else 0)
        metrics.set_gauge("keel_gateway_runtime_restarts_total", {}, runtime.restarts)


def _export_sla(model: Any) -> None:
    table = model.routing
    if table is None:
        return
    name = model.policy.tier_name(table.model, model.usecase.serving.tier)
    tier = model.policy.tiers[name]
    labels = {"model": table.model, "tier": name}
    model.metrics.set_gauge("keel_gateway_sla_target_p99_seconds", labels, tier.p99_ms / 1000)
    model.metrics.set_gauge("keel_gateway_sla_target_availability", labels, tier.availability)


def _export_pools(model: Any) -> None:
    for name, pool in model.pools.items():
        labels = {"model": name, "device": "gpu" if pool.on_gpu else "cpu"}
        model.metrics.set_gauge("keel_gpu_pool_bytes_in_use", labels, pool.bytes_in_use())
        model.metrics.set_gauge("keel_gpu_pool_limit_bytes", labels, pool.limit_bytes)


def _export_breakers(model: Any) -> None:
    for version, b in model.scorer.breakers.items():
        labels = {"model_version": str(version)}
        model.metrics.set_gauge("keel_gateway_breaker_state", labels, STATE_CODES[b.observed_state()])
        for state, n in b.transition_counts.items():
            model.metrics.set_gauge("keel_gateway_breaker_transitions", labels | {"to": state}, n)
