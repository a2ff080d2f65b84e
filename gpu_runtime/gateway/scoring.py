"""Scoring a request on Triton: the circuit breaker of each model version (an open one sends traffic to the
fallback), retries within the retry budget (on another version first when the version itself failed), and the gRPC
call with the route's or the SLA tier's timeout.

A request larger than the model's ``max_batch_size`` (read from Triton's model config once per version) is split into
several Triton calls and answered as one. A call that Triton refuses because of what it was sent (gRPC
``INVALID_ARGUMENT``: a shape or size the model does not take) is the caller's error — 422, never a breaker strike
or a retry: one client's odd request must not open the breaker that every tenant goes through.

A failure while the model runtime is down (or its process has just died) is not the version's fault: it is not
counted by the version's breaker, and the request is answered ``runtime_unavailable``; when the supervisor has
restarted Triton, the breakers start afresh.

A mixin of ``Gateway`` (gpu_runtime/gateway/app.py), which owns ``client``, ``breakers``, ``policy``,
``retry_budget``, ``routing`` (``reload_routing``), ``runtime`` and ``metrics``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from gpu_runtime.gateway.control import CircuitBreaker
from gpu_runtime.gateway.limits import RequestError
from gpu_runtime.repository import triton_name
from keel.deploy.routing import Route, RoutingTable

RUNTIME_GONE_GRACE_S = 0.2
DEFAULT_MAX_BATCH = 256  # ServingConfig's default, used when Triton's model config cannot be read


def refused_as_input(exc: Exception) -> bool:
    """Did Triton refuse the call because of its input (not because the version is broken)?"""
    status = getattr(exc, "status", None)
    return callable(status) and "INVALID_ARGUMENT" in str(status())


@dataclass(frozen=True)
class Explained:
    """What Triton computed for an explained request: TreeSHAP contributions [batch, n_features + 1] (the last column
    is the base value; all in raw-score units, log-odds) and the raw scores [batch] from the model's own predict."""

    contrib: np.ndarray
    raw_score: np.ndarray


class ScoresOnTriton:
    def breaker(self, version: int) -> CircuitBreaker:
        b = self.breakers.get(version)
        if b is None:
            b = self.breakers[version] = CircuitBreaker(self.policy.breaker)
        return b

    def _alternatives(self, table: RoutingTable, failed: Route) -> list[Route]:
        out = [table.fallback] if table.fallback and table.fallback.version != failed.version else []
        out += [r for r in table.routes if r.version != failed.version and r not in out]
        return out

    async def _score(
        self, table: RoutingTable, route: Route, x: np.ndarray, timeout: float, explain: bool = False
    ) -> tuple[np.ndarray, Route, list[str], Explained | None]:
        """Scores from ``route`` (or the version that stood in for it), its degraded flags and, when ``explain``,
        the TreeSHAP contributions and raw scores of the version that answered."""
        flags: list[str] = []
        if not self.breaker(route.version).allow():
            flags.append("breaker_open")
            alt = next((r for r in self._alternatives(table, route) if self.breaker(r.version).allow()), None)
            if alt is None:
                raise RequestError(503, "no_healthy_model", f"every version of {table.model} has an open breaker")
            route = alt
            flags.append("fallback")
        attempts = 0
        last: Exception | None = None
        while attempts < self.policy.retry.max_attempts:
            attempts += 1
            try:
                limit = self.policy.route_timeout_ms.get(route.name)
                scores, explained = await self._infer(
                    table.model, route.version, x, limit / 1000 if limit else timeout, explain
                )
                self.breaker(route.version).record(True)
                if attempts > 1:
                    flags.append("retried")
                return scores, route, flags, explained
            except RequestError:
                raise
            except Exception as exc:  # noqa: BLE001 - every other Triton failure counts against the version
                last = exc
                if refused_as_input(exc):
                    raise RequestError(
                        422, "input_refused_by_model",
                        f"{table.model} v{route.version} refused the request's input: {_message(exc)}",
                        model_version=route.version,
                    ) from None  # fmt: skip
                if await self._runtime_gone(exc):
                    break  # the runtime died, not the version: no breaker strike, no retry (runtime_unavailable)
                self.breaker(route.version).record(False)
                self.metrics.inc("keel_gateway_backend_errors_total", {"model_version": str(route.version)})
                if attempts >= self.policy.retry.max_attempts or not self.retry_budget.try_retry():
                    break
                self.reload_routing(force=True)  # a swap may have retired the version we picked
                fresh = self.routing or table
                if route.version in fresh.versions():  # the version itself failed: another one first
                    candidates = [*self._alternatives(fresh, route), route]
                else:  # a swap retired it: what now serves its route, then the others
                    candidates = [r for r in fresh.routes if r.name == route.name] + self._alternatives(fresh, route)
                nxt = next((r for r in candidates if self.breaker(r.version).allow()), None)
                if nxt is None:
                    break
                if nxt.version != route.version:
                    flags.append("fallback")
                route, table = nxt, fresh
        raise RequestError(502, "backend_error", f"Triton failed for {table.model} v{route.version}: {last}")

    async def _runtime_gone(self, exc: Exception) -> bool:
        """Did this call fail because the runtime is down or its process died? A call cut off by a SIGKILL can fail
        a few milliseconds before the process is seen to exit: on a connection-level failure (gRPC UNAVAILABLE),
        look again for up to ``RUNTIME_GONE_GRACE_S`` before blaming the version."""
        if self.runtime is None:
            return False
        if not self.runtime.up or self.runtime.died():
            return True
        status = getattr(exc, "status", None)
        if not (callable(status) and "UNAVAILABLE" in str(status())):
            return False
        for _ in range(int(RUNTIME_GONE_GRACE_S / 0.02)):
            await asyncio.sleep(0.02)
            if not self.runtime.up or self.runtime.died():
                return True
        return False

    async def max_batch(self, model: str, version: int) -> int:
        """The largest batch the version takes in one call (its Triton config's ``max_batch_size``), read once."""
        name = triton_name(model, version)
        size = self._max_batch.get(name)
        if size is None:
            try:
                config = await self.client.get_model_config(name, str(version), as_json=True, client_timeout=5)
                size = int(config.get("config", config).get("max_batch_size") or 0) or DEFAULT_MAX_BATCH
            except Exception:  # noqa: BLE001 - not readable now: the default, asked again next time
                return DEFAULT_MAX_BATCH
            self._max_batch[name] = size
        return size

    async def _infer(
        self, model: str, version: int, x: np.ndarray, timeout: float, explain: bool = False
    ) -> tuple[np.ndarray, Explained | None]:
        """One answer for the whole matrix: Triton calls of at most the version's ``max_batch_size`` rows each, in
        flight together (its dynamic batcher sees them as any other requests)."""
        size = await self.max_batch(model, version) if len(x) > 1 else 1  # a batching model takes one row
        if len(x) <= size:
            return await self._infer_call(model, version, x, timeout, explain)
        parts = await asyncio.gather(
            *(self._infer_call(model, version, x[i : i + size], timeout, explain) for i in range(0, len(x), size))
        )
        scores = np.concatenate([p[0] for p in parts])
        if not explain:
            return scores, None
        return scores, Explained(
            np.concatenate([p[1].contrib for p in parts]), np.concatenate([p[1].raw_score for p in parts])
        )

    async def _infer_call(
        self, model: str, version: int, x: np.ndarray, timeout: float, explain: bool
    ) -> tuple[np.ndarray, Explained | None]:
        import tritonclient.grpc.aio as aio

        inp = aio.InferInput("features", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        names = ("score", "contrib", "raw_score") if explain else ("score",)
        result = await self.client.infer(
            triton_name(model, version),
            [inp],
            model_version=str(version),
            outputs=[aio.InferRequestedOutput(n) for n in names],
            client_timeout=timeout,
        )
        scores = result.as_numpy("score")[:, 0].astype(np.float64)
        if not explain:
            return scores, None
        return scores, Explained(result.as_numpy("contrib"), result.as_numpy("raw_score")[:, 0])


def _message(exc: Exception) -> str:
    message = getattr(exc, "message", None)
    text = message() if callable(message) else str(exc)
    return str(text)[:300]
