"""What a gateway reports about itself: readiness (``/readyz``: runtime up, routing loaded, every routed version ready
in Triton, the policy in force), the exposure log's health, and what ``/metrics`` renders (breakers, memory pools,
SLA targets, the runtime's restarts, the features served frozen and the answers served degraded).

A mixin of ``Gateway`` (gpu_runtime/gateway/app.py), which owns the state it reads.
"""

from __future__ import annotations

from typing import Any

from gpu_runtime.gateway.control import STATE_CODES
from gpu_runtime.repository import triton_name


class ReportsHealth:
    async def ready(self) -> tuple[bool, dict[str, Any]]:
        if self.runtime is not None and not self.runtime.up:
            return False, {"reason": f"model runtime {self.runtime.state}: {self.runtime.last_failure}",
                           "runtime": self.runtime.as_dict()}  # fmt: skip
        self.reload_routing()
        if self.routing is None:
            return False, {"reason": f"no routing table at {self.config.routing_path}"}
        try:
            for v in self.routing.versions():
                if not await self.client.is_model_ready(triton_name(self.routing.model, v), str(v)):
                    return False, {"reason": f"{self.routing.model} version {v} is not ready in Triton"}
        except Exception as exc:  # noqa: BLE001 - any failure to reach Triton means not ready
            return False, {"reason": f"Triton at {self.config.triton_url}: {exc}"}
        return True, {
            "exposure_log": self.exposure_health(),
            "runtime": self.runtime.as_dict() if self.runtime is not None else None,
            "generation": self.routing.generation,
            "versions": self.routing.versions(),
            "coarse_version": self.routing.coarse.version if self.routing.coarse else None,
            "policy_version": self.policy_version,
            "policy_applied_at": self.policy_applied_at,
            "policy_error": self.policy_error,
            "coarse_error": self.coarse_error,
            "policy_notes": self.policy_notes,
        }

    def exposure_health(self) -> dict[str, Any]:
        """Whether every answered request reached the exposure log (experiments and canaries are judged on it)."""
        lost = self.exposures.failures
        return {"ok": lost == 0, "lost_records": lost, "last_error": self.exposures.last_error}

    def _count_degraded(self, flags: list[str]) -> None:
        """One count per answered request and flag (``frozen:<feature>``, ``missing_features_defaulted``, ...): the
        flags are a fixed vocabulary and the served features, so the label set stays bounded."""
        for flag in set(flags):
            self.metrics.inc("keel_gateway_degraded_answers_total", {"flag": flag})

    def _export_freezes(self) -> None:
        """``keel_features_frozen{feature}``: 1 while the online store serves the feature with its freeze value (every
        served feature is listed, 0 when live), read from the store at scrape time."""
        store = self.store
        if store is None:
            return
        try:
            frozen = store.frozen()
        except Exception:  # noqa: BLE001 - a busy or missing store must not break /metrics
            return
        for name in self.features.names:
            self.metrics.set_gauge("keel_features_frozen", {"feature": name}, 1 if name in frozen else 0)

    def _export_runtime(self) -> None:
        if self.runtime is not None:
            self.metrics.set_gauge("keel_gateway_runtime_up", {}, 1 if self.runtime.up else 0)
            self.metrics.set_gauge("keel_gateway_runtime_restarts_total", {}, self.runtime.restarts)

    def _export_sla(self) -> None:
        if self.routing is None:
            return
        model = self.routing.model
        name = self.policy.tier_name(model, self.usecase.serving.tier)
        tier = self.policy.tiers[name]
        labels = {"model": model, "tier": name}
        self.metrics.set_gauge("keel_gateway_sla_target_p99_seconds", labels, tier.p99_ms / 1000)
        self.metrics.set_gauge("keel_gateway_sla_target_availability", labels, tier.availability)

    def _export_pools(self) -> None:
        for model, pool in self.pools.items():
            labels = {"model": model, "device": "gpu" if pool.on_gpu else "cpu"}
            self.metrics.set_gauge("keel_gpu_pool_bytes_in_use", labels, pool.bytes_in_use())
            self.metrics.set_gauge("keel_gpu_pool_limit_bytes", labels, pool.limit_bytes)

    def _export_breakers(self) -> None:
        for version, b in self.breakers.items():
            labels = {"model_version": str(version)}
            self.metrics.set_gauge("keel_gateway_breaker_state", labels, STATE_CODES[b.observed_state()])
            for state, n in b.transition_counts.items():
                self.metrics.set_gauge("keel_gateway_breaker_transitions", labels | {"to": state}, n)
