"""The request path of the gateway: a prediction request from its body to its answer and its exposure-log line.

A mixin of ``Gateway`` (app.py), which owns the configuration, the policy in force, the lanes, the breakers and the
exposure log; building the inputs is inputs.py's, scoring on Triton scoring.py's.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import numpy as np

from gpu_runtime.gateway.admission import Shed
from gpu_runtime.gateway.control import TokenBucket, choose_route
from gpu_runtime.gateway.explain import explanations, requested_top_k
from gpu_runtime.gateway.limits import OTHER_TENANT, RequestError, identifier, parse_json, tenant_identifier
from keel.deploy.routing import Route, RoutingTable


class Predicts:
    async def predict(
        self, body: bytes | RequestError, headers: dict[str, str], model: str | None = None
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Answer one request and log it: every answer, errors included, is one exposure-log line with its
        request_id and model_version (null when none was chosen). ``body`` may already be the error that reading
        the request ended in (too large, a bad header). ``model``: the model the route names
        (``/v1/models/{model}/predict``); None on the use case's alias route (``/v1/predict``)."""
        started = time.perf_counter()
        request_id = uuid.uuid4().hex
        record: dict[str, Any] = {
            "request_id": request_id, "ts": self.now(), "model_version": None, "policy_version": self.policy_version,
        }  # fmt: skip
        try:
            given = headers.get("x-request-id")
            if given is not None:  # the caller's id is used and echoed, once it is known to be safe to log
                request_id = record["request_id"] = identifier(given, "header x-request-id")
            if isinstance(body, RequestError):
                raise body
            if model is not None:
                self._served_model(model)
            status, payload, extra = await self._predict(body, headers, request_id, record, model is not None)
        except RequestError as err:
            status, payload, extra = err.status, err.body(request_id), {"x-request-id": request_id}
            record.update(status=status, error=err.code)
        except Exception as exc:  # noqa: BLE001 - the gateway answers 500 and logs, never drops a request silently
            status, payload, extra = (
                500,
                {"request_id": request_id, "error": {"code": "internal", "message": str(exc)}},
                {"x-request-id": request_id},
            )
            record.update(status=500, error="internal")
        latency = time.perf_counter() - started
        record.setdefault("status", status)
        record["latency_ms"] = round(latency * 1000, 3)
        if not self.exposures.append(record):  # the answer stands; the lost record is counted and reported
            self.metrics.inc("keel_gateway_exposure_write_failures_total", {})
        self._meter(record)
        version = str(record["model_version"]) if record.get("model_version") is not None else "none"
        self.metrics.inc("keel_gateway_requests_total", {"model_version": version, "status": str(status)})
        self.metrics.observe("keel_gateway_request_duration_seconds", {"model_version": version}, latency)
        if status >= 400:
            self.metrics.inc(
                "keel_gateway_errors_total", {"model_version": version, "code": str(record.get("error", status))}
            )
        return status, payload, extra

    def _served_model(self, model: str) -> None:
        """404 ``unknown_model`` (listing the served models) unless this gateway serves ``model``."""
        served = self.served_models()
        if model not in served:
            shown = model if len(model) <= 64 else model[:64] + "…"
            raise RequestError(404, "unknown_model", f"no model {shown!r} is served here", models=served)

    async def _predict(
        self, body: bytes, headers: dict[str, str], request_id: str, record: dict[str, Any], generic: bool
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        req = parse_json(body)
        entities = self._entities_of(req, generic)
        tenant = tenant_identifier(req["tenant_id"]) if req.get("tenant_id") is not None else "default"
        record["tenant_id"] = tenant
        risk = req.get("risk_level", 3)
        if not isinstance(risk, int) or isinstance(risk, bool) or risk not in self.lanes:
            raise RequestError(
                422, "invalid_risk_level", f"risk_level must be one of {sorted(self.lanes)}", value=str(risk)[:40]
            )
        unit_id = identifier(req["unit_id"], "unit_id") if req.get("unit_id") is not None else request_id
        experiment_id = headers.get("x-experiment-id")
        if experiment_id is not None:
            experiment_id = identifier(experiment_id, "header x-experiment-id")
        record.update(risk_level=risk, unit_id=unit_id, experiment_id=experiment_id)

        if not self._bucket(tenant).take():
            named = tenant if tenant in self.policy.tenant_rate_limits else OTHER_TENANT
            self.metrics.inc("keel_gateway_rate_limited_total", {"tenant": named})
            raise RequestError(429, "rate_limited", f"tenant {tenant} is over its rate limit")
        budget_headers = self._check_budget(tenant)

        if self._watcher is None:  # embedded without an ASGI lifespan: nobody else follows routing and policies
            self.reload_routing()
            self.reload_policies()
        if self.routing is None:  # the first deployment may be newer than the watcher's last look
            self.reload_routing(force=True)
        if self.routing is None:
            raise RequestError(503, "not_deployed", "no model is deployed yet (no routing table)")
        table = self.routing
        if self.runtime is not None and not self.runtime.up:
            return self._runtime_unavailable(req, entities, table, request_id, record, budget_headers)
        if self.runtime is not None and self.runtime.restarts != self._restarts_seen:
            self._after_restart()
        tier_name = self.policy.tier_name(table.model, self.usecase.serving.tier)
        tier = self.policy.tiers[tier_name]
        timeout = tier.timeout_ms / 1000
        record["tier"] = tier_name
        await self._admit(tier_name, timeout)
        lane = self.lanes[risk]
        try:
            if lane.locked():  # full: wait for a place, up to the timeout
                await asyncio.wait_for(lane.acquire(), timeout)
            else:  # a place is free: take it without wait_for's task (most requests)
                await lane.acquire()
        except TimeoutError:
            self.admission.release(tier_name)
            raise RequestError(503, "overloaded", f"risk level {risk} lane is full", risk_level=risk) from None
        except BaseException:
            self.admission.release(tier_name)
            raise
        self.metrics.add_gauge("keel_gateway_lane_in_flight", {"risk_level": str(risk)}, 1)
        try:
            top_k = requested_top_k(req, self.features.names)
            x, degraded = self._features(req, entities, record)
            record["rows"] = len(x)
            if top_k is not None:
                record["explain"] = top_k
            values = x  # what the explanation shows (the pooled copy goes back to the pool)
            x = self._pooled(table.model, x)
            route, variant, flags = choose_route(table, self.split, unit_id, experiment_id)
            degraded += flags
            record.update(variant=variant, routed_version=route.version)  # who was asked, before any fallback
            self.retry_budget.on_request()
            shadow = self._start_shadow(table, route.version, np.asarray(values, dtype=np.float32), timeout)
            try:
                scores, route, more, explained = await self._score(table, route, x, timeout, top_k is not None)
            except RequestError as err:
                if shadow is not None:
                    shadow[1].cancel()  # no answer of the served model: nothing to compare the shadow with
                if (
                    err.code == "backend_error"
                    and self.runtime is not None
                    and (not self.runtime.up or self.runtime.died())
                ):  # it died under this request
                    return self._runtime_unavailable(
                        req, entities, table, request_id, record, budget_headers, (values, degraded, top_k)
                    )
                booster = self.coarse_model(table) if err.code in ("backend_error", "no_healthy_model") else None
                if booster is None:
                    raise
                why = "breaker_open" if err.code == "no_healthy_model" else "backend_error"
                return self._coarse_answer(
                    booster, table, values, [*degraded, why], top_k, request_id, record, budget_headers
                )
            degraded += more
        finally:
            lane.release()
            self.admission.release(tier_name)
            self.metrics.add_gauge("keel_gateway_lane_in_flight", {"risk_level": str(risk)}, -1)
            self.metrics.add_gauge("keel_gateway_tier_in_flight", {"tier": tier_name}, -1)
        await self._finish_shadow(shadow, route.version, record)
        return self._answer(table, route, variant, scores, degraded, explained, values, top_k, request_id, record,
                            budget_headers)  # fmt: skip

    def _answer(
        self, table: RoutingTable, route: Route, variant: str | None, scores: np.ndarray, degraded: list[str],
        explained, values: np.ndarray, top_k: int | None, request_id: str, record: dict[str, Any],
        headers: dict[str, str], coarse: bool = False,
    ) -> tuple[int, dict[str, Any], dict[str, str]]:  # fmt: skip
        """The 200 answer for ``scores`` from ``route`` (a coarse answer: ``coarse``) and its exposure record."""
        confidence = np.abs(2.0 * scores - 1.0)
        version = None if coarse else route.version  # no version of the model answered
        record.update(
            model=table.model,
            model_version=version,
            sha256=route.sha256,
            release_id=route.release_id,
            score=float(scores[0]) if len(scores) == 1 else np.round(scores, 6).tolist(),
            degraded=sorted(set(degraded)) or None,
            **({"variant": "coarse", "coarse_version": route.version} if coarse else {}),
        )
        self._count_degraded(degraded)
        predictions = [
            {"score": s, "confidence_score": c} for s, c in zip(scores.tolist(), confidence.tolist(), strict=True)
        ]
        if explained is not None:
            for p, e in zip(
                predictions,
                explanations(
                    self.features.names,
                    values,
                    explained.contrib,
                    explained.raw_score,
                    top_k,
                    self._explained_units(),
                ),
                strict=True,
            ):
                p["explanation"] = e
        payload = {
            "request_id": request_id,
            "model": table.model,
            "model_version": version,
            "release_id": route.release_id,
            "variant": "coarse" if coarse else variant,
            "degraded": sorted(set(degraded)),
            "score": predictions[0]["score"],
            "confidence_score": predictions[0]["confidence_score"],
            **({"coarse_version": route.version} if coarse else {}),
            **({"explanation": predictions[0]["explanation"]} if explained is not None else {}),
            **({"predictions": predictions} if len(predictions) > 1 else {}),
        }
        return 200, payload, {"x-model-signature": route.sha256, "x-request-id": request_id, **headers}

    def _coarse_answer(
        self, booster, table: RoutingTable, values: np.ndarray, degraded: list[str], top_k: int | None,
        request_id: str, record: dict[str, Any], headers: dict[str, str],
    ) -> tuple[int, dict[str, Any], dict[str, str]]:  # fmt: skip
        """The answer from the model's coarse model (coarse.py), flagged ``coarse_fallback``."""
        scores, explained = self._coarse_scores(booster, values, top_k is not None)
        self.metrics.inc("keel_gateway_coarse_answers_total", {"model": table.model})
        return self._answer(table, table.coarse, None, scores, [*degraded, "coarse_fallback"], explained, values,
                            top_k, request_id, record, headers, coarse=True)  # fmt: skip

    def _explained_units(self) -> str:
        """What an explanation's contributions are in: log-odds for a binary label, else the label's own units."""
        label = self.features.label
        return "log-odds" if label.task == "binary" else f"{label.column} ({label.description or 'the label'})"

    async def _admit(self, tier: str, timeout: float) -> None:
        """A place for the request in its tier (admission.py), across every model of the process; a structured 503
        ``shed`` naming the tier when none comes within the tier's wait (at most its timeout)."""
        ranks = sorted(self.policy.tiers)
        wait_ms = self.policy.admit_wait_ms.get(tier)
        wait = timeout if wait_ms is None else min(wait_ms / 1000, timeout)
        try:
            await self.admission.acquire(tier, ranks.index(tier), self.policy.admit_in_flight.get(tier), wait)
        except Shed as shed:
            self.metrics.inc("keel_gateway_shed_total", {"tier": tier})
            raise RequestError(
                503, "shed", str(shed), tier=tier, in_flight_limit=shed.limit, retry_after_s=1
            ) from None
        self.metrics.add_gauge("keel_gateway_tier_in_flight", {"tier": tier}, 1)

    def _runtime_unavailable(
        self, req: dict[str, Any], entities: list[Any] | None, table: RoutingTable, request_id: str,
        record: dict[str, Any], headers: dict[str, str], built: tuple[np.ndarray, list[str], int | None] | None = None,
    ) -> tuple[int, dict[str, Any], dict[str, str]]:  # fmt: skip
        """Triton is down (the supervisor is restarting it): the coarse model's answer when the model has one, else
        the policy's last-resort score — both flagged ``runtime_unavailable`` — or a structured 503, never a bare
        error. ``built``: the request's inputs, degraded flags and explanation size when already built."""
        self.metrics.inc("keel_gateway_runtime_unavailable_total", {})
        booster = self.coarse_model(table)
        if booster is not None:
            if built is None:
                x, degraded = self._features(req, entities, record)
                top_k = requested_top_k(req, self.features.names)
                record["rows"] = len(x)
            else:
                x, degraded, top_k = built
            return self._coarse_answer(booster, table, x, [*degraded, "runtime_unavailable"], top_k, request_id,
                                       record, headers)  # fmt: skip
        score = self.policy.last_resort_score
        if score is None:
            raise RequestError(
                503, "runtime_unavailable",
                (f"the model runtime is {self.runtime.state} ({self.runtime.last_failure}); retry shortly"
                 if not self.runtime.up else "the model runtime's process has exited; it is being restarted, retry "
                 "shortly"),
                retry_after_s=1,
            )  # fmt: skip
        n = len(entities) if entities else 1
        record.update(model=table.model, score=score, degraded=["runtime_unavailable"], variant=None, rows=n)
        self._count_degraded(["runtime_unavailable"])
        payload = {
            "request_id": request_id, "model": table.model, "model_version": None, "release_id": None,
            "variant": None, "degraded": ["runtime_unavailable"], "score": score,
            "confidence_score": abs(2 * score - 1),
            **({"predictions": [{"score": score, "confidence_score": abs(2 * score - 1)}] * n} if n > 1 else {}),
        }  # fmt: skip
        return 200, payload, {"x-request-id": request_id}

    def _bucket(self, tenant: str) -> TokenBucket:
        """The tenant's token bucket: its own for tenants the policy names, else one from a bounded LRU — state
        does not grow with the tenant names callers invent."""
        if tenant in self.policy.tenant_rate_limits:
            bucket = self.buckets.get(tenant)
            if bucket is None:
                bucket = self.buckets[tenant] = TokenBucket(self.policy.rate_limit_of(tenant))
            return bucket
        return self.other_buckets.get_or_create(tenant, lambda: TokenBucket(self.policy.default_rate_limit))
