"""The inference gateway: an ASGI app in front of Triton.

``POST /v1/predict`` with a JSON body::

    {"flight": {"carrier": "UA", "flight": 1545, "origin": "EWR", "dest": "IAH", "tailnum": "N14228",
                "year": 2013, "month": 6, "day": 1, "hour": 5, "distance": 1400, "time_hour": "2013-06-01T09:00:00Z"},
     "tenant_id": "ops", "risk_level": 2, "unit_id": "flight-UA1545"}

(``flights``: a list of such objects scores a batch; ``features``: {name: value} gives all model features directly
instead of reading them from the online store.) What happens to a request, in order:

1. the body is parsed; the tenant's token bucket admits it or the answer is 429 ``rate_limited``;
2. it enters its risk level's lane (separate concurrency limits: level 1 never queues behind 2 or 3);
3. each flight is validated with contract ``predict_request`` (the single-record path of keel's contract engine):
   a missing or out-of-range field is 422 ``invalid_input`` with the rule ids, or — when the policy says
   ``invalid_input: default`` — served with the reference defaults and flagged ``degraded``;
4. features are read from the online store (frozen features come back flagged);
5. routing: the ``x-experiment-id`` header picks an experiment's variant, else the weighted split — both sticky on
   ``unit_id``; a version whose circuit breaker is open is replaced by the fallback;
6. Triton scores it (timeout: the route's, else the model's SLA tier's); a failed call is retried within the retry budget, on the
   fallback when there is one;
7. the answer — score, confidence_score, model_version, release_id, request_id, degraded flags, header
   ``x-model-signature`` (the model's sha256) — and one line in the append-only exposure log.

``GET /metrics`` (Prometheus text), ``/healthz`` (the process is up), ``/readyz`` (routing loaded and every routed
version ready in Triton).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from gpu_runtime.gateway.control import (
    STATE_CODES,
    CircuitBreaker,
    RetryBudget,
    TokenBucket,
    choose_route,
)
from gpu_runtime.gateway.limits import (
    MAX_BODY_BYTES,
    MAX_TENANT_BUCKETS,
    OTHER_TENANT,
    BodyTooLarge,
    BoundedLRU,
    RequestError,
    decode_headers,
    identifier,
    read_body,
)
from gpu_runtime.gateway.metrics import Metrics
from gpu_runtime.pools import PoolBudgetExceeded, PoolRegistry
from gpu_runtime.repository import triton_name
from keel.deploy.routing import Route, RoutingTable
from keel.exposure_log import ExposureLog
from keel.features.definitions import FEATURE_NAMES, FEATURES
from keel.flight_key import flight_key
from keel.kernels import numpy_backend
from keel.policies import PolicyReader
from keel.policies.gateway import GatewayPolicy, PolicyError, Split, effective_policy

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONTRACT = REPO_ROOT / "assets" / "contracts" / "predict_request.yaml"
MAX_BATCH = 1024
POLICY_POLL_S = 0.5  # a committed policy is in force within this (plus one request) — under the 1 s promise


@dataclass(frozen=True)
class GatewayConfig:
    triton_url: str  # host:port of Triton's gRPC endpoint
    routing_path: Path
    exposure_dir: Path
    online_store_path: Path | None = None
    contract_path: Path = DEFAULT_CONTRACT
    online_cache_size: int = 200_000
    policy_store_path: Path | None = None  # the versioned policy store this gateway follows (keel.policies)
    max_body_bytes: int = MAX_BODY_BYTES  # a larger request body is answered 413
    max_tenant_buckets: int = MAX_TENANT_BUCKETS  # token buckets kept for tenants the policy does not name


class Gateway:
    def __init__(self, config: GatewayConfig, policy: GatewayPolicy | None = None, runtime=None):
        from keel.contracts.engine import CompiledContract
        from keel.contracts.spec import load_contract

        self.config = config
        self.runtime = runtime  # the supervisor's RuntimeStatus (None: nobody supervises Triton in this process)
        self.base_policy = policy or GatewayPolicy()  # the file's (or built-in) settings; the store overrides them
        self.policy = self.base_policy
        self.policy_version = 0  # the store version in force (0: none)
        self._policy_seen = 0  # the newest store version looked at, good or not
        self._policy_checked = 0.0
        self.split: Split | None = None  # the store's ab_test split in force: weights by model version, salt
        self._policy_reader = PolicyReader(config.policy_store_path) if config.policy_store_path else None
        self.policy_error: str | None = None  # why the newest store version was refused
        self.policy_regressed_to: int | None = None  # the store's version when it went below the applied one
        self.policy_notes: list[
            str
        ] = []  # what of the policy in force is not applied (a split to undeployed versions)
        self._watcher: asyncio.Task | None = None
        self.contract = CompiledContract(load_contract(config.contract_path))
        self.metrics = Metrics()
        self.exposures = ExposureLog(config.exposure_dir)
        self.routing: RoutingTable | None = None
        self._routing_mtime = 0.0
        self._routing_checked = 0.0
        self.breakers: dict[int, CircuitBreaker] = {}
        self.buckets: dict[str, TokenBucket] = {}  # tenants the policy names
        self.other_buckets: BoundedLRU[str, TokenBucket] = BoundedLRU(config.max_tenant_buckets)  # all others
        self.retry_budget = RetryBudget(self.policy.retry)
        self.lanes = {level: asyncio.Semaphore(n) for level, n in self.policy.lanes.items()}
        # Host-memory pools: Triton scores on its own device, the gateway only holds request matrices.
        self.pools = PoolRegistry(self.policy.pool_budgets, array_backend=numpy_backend())
        self._store = None
        self._client = None
        self._ready_cache: tuple[float, bool] = (0.0, False)
        self.defaults = np.array([f.default for f in FEATURES], dtype=np.float32)
        self.lo = np.array([f.lo for f in FEATURES])
        self.hi = np.array([f.hi for f in FEATURES])
        self.reload_routing(force=True)

    # -- plumbing -------------------------------------------------------------------------------------------------

    @property
    def client(self):
        if self._client is None:
            import tritonclient.grpc.aio as aio

            self._client = aio.InferenceServerClient(self.config.triton_url)
        return self._client

    @property
    def store(self):
        if self._store is None and self.config.online_store_path is not None:
            from keel.features.online import SQLiteOnlineStore

            if Path(self.config.online_store_path).exists():
                self._store = SQLiteOnlineStore(
                    self.config.online_store_path, cache_size=self.config.online_cache_size
                )
        return self._store

    def reload_routing(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._routing_checked < self.policy.routing_poll_s:
            return
        self._routing_checked = now
        try:
            mtime = self.config.routing_path.stat().st_mtime_ns
        except FileNotFoundError:
            return
        if force or mtime != self._routing_mtime:
            table = RoutingTable.read(self.config.routing_path)
            if table is not None and (self.routing is None or table.generation >= self.routing.generation):
                if (
                    self.routing is None
                    or table.versions() != self.routing.versions()
                    or table.model != self.routing.model
                ):
                    self._policy_seen, self._policy_checked = (
                        0,
                        0.0,
                    )  # a split may apply (or not) to what is served now
                self.routing = table
                self.metrics.set_gauge("keel_gateway_routing_generation", {}, table.generation)
            self._routing_mtime = mtime

    def reload_policies(self, force: bool = False) -> None:
        """Follow the policy store: a newer version is validated again and applied; an invalid one is refused and
        the last good policy stays (counted in keel_gateway_policy_rejected_total)."""
        now = time.monotonic()
        if self._policy_reader is None or (not force and now - self._policy_checked < POLICY_POLL_S):
            return
        self._policy_checked = now
        latest = self._policy_reader.version()
        if latest < self.policy_version:
            # The store lost versions this gateway already applied (newest entries removed, or an older copy put
            # back): keep the last good policy and say so, never follow the store backwards.
            if self.policy_regressed_to != latest:
                self.metrics.inc("keel_gateway_policy_store_regressions_total", {})
                self.policy_regressed_to = latest
            self.metrics.set_gauge("keel_gateway_policy_store_version", {}, latest)
            self.policy_error = (
                f"the policy store went back from version {self.policy_version} to {latest} (newest versions "
                f"removed?): refused, version {self.policy_version} stays in force; run `keel policy verify`"
            )
            return
        self.policy_regressed_to = None
        if latest <= self._policy_seen:
            return
        self._policy_seen = latest
        table = self.routing
        try:
            policy, split, notes = effective_policy(
                self.base_policy,
                self._policy_reader.state(latest),
                table.model if table else None,
                set(table.versions()) if table else set(),
                latest,
            )
        except (PolicyError, KeyError, TypeError, ValueError) as exc:
            self.metrics.inc("keel_gateway_policy_rejected_total", {"version": str(latest)})
            self.policy_error = f"policy version {latest} refused: {exc}"
            return
        self.policy, self.split, self.policy_version = policy, split, latest
        self.policy_error, self.policy_notes = None, notes
        for b in self.breakers.values():
            b.policy = policy.breaker
        self.buckets.clear()  # new limits apply from the next request
        self.other_buckets.clear()
        self.retry_budget.policy = policy.retry
        self.metrics.set_gauge("keel_gateway_policy_version", {}, latest)

    def breaker(self, version: int) -> CircuitBreaker:
        b = self.breakers.get(version)
        if b is None:
            b = self.breakers[version] = CircuitBreaker(self.policy.breaker)
        return b

    # -- ASGI -----------------------------------------------------------------------------------------------------

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self._watcher = asyncio.create_task(self._watch())
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path == "/v1/predict" and method == "POST":
            headers: dict[str, str] = {}
            try:
                headers = decode_headers(scope.get("headers", []))
                body: bytes | RequestError = await read_body(
                    receive, self.config.max_body_bytes, headers.get("content-length")
                )
            except RequestError as err:
                body = err
            except BodyTooLarge as exc:
                body = RequestError(
                    413, "body_too_large", f"the request body is over the gateway's limit of {exc.limit:,} bytes",
                    limit_bytes=exc.limit,
                )  # fmt: skip
            status, payload, extra = await self.predict(body, headers)
            await _respond(send, status, payload, extra)
        elif path == "/metrics" and method == "GET":
            self._export_breakers()
            self._export_pools()
            self._export_sla()
            self._export_runtime()
            await _respond_text(send, 200, self.metrics.render(), "text/plain; version=0.0.4")
        elif path == "/healthz" and method == "GET":
            up = self.runtime is None or self.runtime.up
            await _respond(
                send,
                200 if up else 503,
                {
                    "status": "ok" if up else "runtime_unavailable",
                    "runtime": self.runtime.as_dict() if self.runtime is not None else None,
                    "exposure_log": self.exposure_health(),
                },
            )
        elif path == "/readyz" and method == "GET":
            ready, detail = await self.ready()
            await _respond(send, 200 if ready else 503, {"ready": ready, **detail})
        else:
            await _respond(send, 404, {"error": {"code": "not_found", "message": f"no route {method} {path}"}})

    async def _watch(self) -> None:
        """Follow routing and policies even when no request comes: a commit is in force within POLICY_POLL_S."""
        while True:
            try:
                self.reload_routing()
                self.reload_policies()
            except Exception:  # noqa: BLE001 - a bad file or a locked store must not stop the watcher
                self.metrics.inc("keel_gateway_watch_errors_total", {})
            await asyncio.sleep(POLICY_POLL_S / 2)

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        if self._policy_reader is not None:
            self._policy_reader.close()
        if self._client is not None:
            await self._client.close()
        self.exposures.close()

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
            "policy_version": self.policy_version,
            "policy_error": self.policy_error,
            "policy_notes": self.policy_notes,
        }

    def exposure_health(self) -> dict[str, Any]:
        """Whether every answered request reached the exposure log (experiments and canaries are judged on it)."""
        lost = self.exposures.failures
        return {"ok": lost == 0, "lost_records": lost, "last_error": self.exposures.last_error}

    def _export_runtime(self) -> None:
        if self.runtime is not None:
            self.metrics.set_gauge("keel_gateway_runtime_up", {}, 1 if self.runtime.up else 0)
            self.metrics.set_gauge("keel_gateway_runtime_restarts_total", {}, self.runtime.restarts)

    def _export_sla(self) -> None:
        if self.routing is None:
            return
        model = self.routing.model
        name = self.policy.model_tiers.get(model, "L2")
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
            self.metrics.set_gauge("keel_gateway_breaker_state", labels, STATE_CODES[b.state])
            for state, n in b.transition_counts.items():
                self.metrics.set_gauge("keel_gateway_breaker_transitions", labels | {"to": state}, n)

    # -- predict --------------------------------------------------------------------------------------------------

    async def predict(
        self, body: bytes | RequestError, headers: dict[str, str]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Answer one request and log it: every answer, errors included, is one exposure-log line with its
        request_id and model_version (null when none was chosen). ``body`` may already be the error that reading
        the request ended in (too large, a bad header)."""
        started = time.perf_counter()
        request_id = uuid.uuid4().hex
        record: dict[str, Any] = {"request_id": request_id, "ts": time.time(), "model_version": None}
        try:
            given = headers.get("x-request-id")
            if given is not None:  # the caller's id is used and echoed, once it is known to be safe to log
                request_id = record["request_id"] = identifier(given, "header x-request-id")
            if isinstance(body, RequestError):
                raise body
            status, payload, extra = await self._predict(body, headers, request_id, record)
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
        version = str(record["model_version"]) if record.get("model_version") is not None else "none"
        self.metrics.inc("keel_gateway_requests_total", {"model_version": version, "status": str(status)})
        self.metrics.observe("keel_gateway_request_duration_seconds", {"model_version": version}, latency)
        if status >= 400:
            self.metrics.inc(
                "keel_gateway_errors_total", {"model_version": version, "code": str(record.get("error", status))}
            )
        return status, payload, extra

    async def _predict(
        self, body: bytes, headers: dict[str, str], request_id: str, record: dict[str, Any]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        req = _parse(body)
        tenant = identifier(req["tenant_id"], "tenant_id") if req.get("tenant_id") is not None else "default"
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

        if self._watcher is None:  # embedded without an ASGI lifespan: nobody else follows routing and policies
            self.reload_routing()
            self.reload_policies()
        if self.routing is None:  # the first deployment may be newer than the watcher's last look
            self.reload_routing(force=True)
        if self.routing is None:
            raise RequestError(503, "not_deployed", "no model is deployed yet (no routing table)")
        table = self.routing
        if self.runtime is not None and not self.runtime.up:
            return self._runtime_unavailable(req, table, request_id, record)
        tier = self.policy.tier_of(table.model)
        timeout = tier.timeout_ms / 1000
        lane = self.lanes[risk]
        try:
            if lane.locked():  # full: wait for a place, up to the timeout
                await asyncio.wait_for(lane.acquire(), timeout)
            else:  # a place is free: take it without wait_for's task (most requests)
                await lane.acquire()
        except TimeoutError:
            raise RequestError(503, "overloaded", f"risk level {risk} lane is full", risk_level=risk) from None
        self.metrics.add_gauge("keel_gateway_lane_in_flight", {"risk_level": str(risk)}, 1)
        try:
            x, degraded = self._features(req, record)
            x = self._pooled(table.model, x)
            route, variant, flags = choose_route(table, self.split, unit_id, experiment_id)
            degraded += flags
            record.update(variant=variant, routed_version=route.version)  # who was asked, before any fallback
            self.retry_budget.on_request()
            try:
                scores, route, more = await self._score(table, route, x, timeout)
            except RequestError as err:
                if err.code == "backend_error" and self.runtime is not None and not self.runtime.up:
                    return self._runtime_unavailable(req, table, request_id, record)  # it died under this request
                raise
            degraded += more
        finally:
            lane.release()
            self.metrics.add_gauge("keel_gateway_lane_in_flight", {"risk_level": str(risk)}, -1)
        confidence = np.abs(2.0 * scores - 1.0)
        record.update(
            model=table.model,
            model_version=route.version,
            sha256=route.sha256,
            release_id=route.release_id,
            score=float(scores[0]) if len(scores) == 1 else np.round(scores, 6).tolist(),
            degraded=sorted(set(degraded)) or None,
        )
        predictions = [
            {"score": s, "confidence_score": c} for s, c in zip(scores.tolist(), confidence.tolist(), strict=True)
        ]
        payload = {
            "request_id": request_id,
            "model": table.model,
            "model_version": route.version,
            "release_id": route.release_id,
            "variant": variant,
            "degraded": sorted(set(degraded)),
            "score": predictions[0]["score"],
            "confidence_score": predictions[0]["confidence_score"],
            **({"predictions": predictions} if len(predictions) > 1 else {}),
        }
        return 200, payload, {"x-model-signature": route.sha256, "x-request-id": request_id}

    def _runtime_unavailable(
        self, req: dict[str, Any], table: RoutingTable, request_id: str, record: dict[str, Any]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Triton is down (the supervisor is restarting it): the policy's last-resort score flagged
        ``runtime_unavailable``, or a structured 503 — never a bare error."""
        self.metrics.inc("keel_gateway_runtime_unavailable_total", {})
        score = self.policy.last_resort_score
        if score is None:
            raise RequestError(
                503, "runtime_unavailable",
                f"the model runtime is {self.runtime.state} ({self.runtime.last_failure}); retry shortly",
                retry_after_s=1,
            )  # fmt: skip
        n = len(req["flights"]) if isinstance(req.get("flights"), list) else 1
        record.update(model=table.model, score=score, degraded=["runtime_unavailable"], variant=None)
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

    def _features(self, req: dict[str, Any], record: dict[str, Any] | None = None) -> tuple[np.ndarray, list[str]]:
        """The [batch, n_features] float32 matrix for the request, and degraded flags. For one flight, its key goes
        into the exposure record so that outcomes can be joined later (canary quality, experiments)."""
        if "features" in req:
            return self._direct_features(req["features"]), []
        flights = req.get("flights") if "flights" in req else [req.get("flight")]
        if not isinstance(flights, list) or not flights or len(flights) > MAX_BATCH:
            raise RequestError(422, "invalid_input", f"'flights' must be a list of 1…{MAX_BATCH} flight objects")
        degraded: list[str] = []
        entities, invalid = [], []
        for i, flight in enumerate(flights):
            if not isinstance(flight, dict):
                raise RequestError(422, "invalid_input", "each flight must be a JSON object", index=i)
            verdict = self.contract.validate_record(flight)
            if verdict.sink != "valid":
                invalid.append({"index": i, "rules": list(verdict.failed_rules)})
                entities.append(None)
                continue
            r = verdict.record
            try:
                entities.append(r | {"sched_date": date(r["year"], r["month"], r["day"])})
            except ValueError as exc:  # each field in range, the date impossible (2013-02-31)
                invalid.append(
                    {"index": i, "rules": ["calendar_date"], "field": "day",
                     "message": f"flight.day {r['day']} of {r['year']}-{r['month']:02d}: {exc}"}
                )  # fmt: skip
                entities.append(None)
        if record is not None and len(entities) == 1 and entities[0] is not None:
            record["flight_key"] = flight_key(entities[0])
        if invalid and self.policy.invalid_input == "reject":
            raise RequestError(
                422, "invalid_input", "the request breaks contract predict_request", violations=invalid
            )
        x = np.tile(self.defaults, (len(flights), 1))
        good = [i for i, e in enumerate(entities) if e is not None]
        if invalid:
            degraded.append("invalid_input_defaults")
        if good:
            store = self.store
            if store is None:
                degraded.append("no_online_store")
            else:
                from keel.features.online import get_online_features

                batch = get_online_features(store, [entities[i] for i in good])
                m = batch.matrix.T  # flights × features
                missing = np.isnan(m)
                if missing.any():
                    degraded.append("missing_features_defaulted")
                    m = np.where(missing, self.defaults, m)
                x[good] = m
                degraded += [f"frozen:{name}" for name in batch.degraded]
        return x.astype(np.float32), degraded

    def _pooled(self, model: str, x: np.ndarray) -> np.ndarray:
        """The request matrix, held in the model's memory pool while the request is in flight."""
        if model not in self.pools:
            return x
        try:
            return self.pools[model].asarray(x, dtype=np.float32)
        except PoolBudgetExceeded as exc:
            raise RequestError(503, "memory_budget_exceeded", str(exc), model=model) from None

    def _direct_features(self, given: Any) -> np.ndarray:
        """Feature values sent with the request: one object {name: value}, a list of them, or the columnar form
        {"columns": [names], "rows": [[values], …]} (the cheapest to send and to parse for big batches)."""
        if isinstance(given, dict) and "rows" in given:
            columns, rows = given.get("columns"), given.get("rows")
            if not isinstance(rows, list) or not isinstance(columns, list):
                raise RequestError(422, "invalid_input", "columnar features need 'columns' and 'rows' lists")
            absent = [n for n in FEATURE_NAMES if n not in columns]
            if absent:
                raise RequestError(422, "missing_input", f"features missing: {', '.join(absent)}", missing=absent)
            order = [columns.index(n) for n in FEATURE_NAMES]
        else:
            rows = given if isinstance(given, list) else [given]
            order = None
        if not rows or len(rows) > MAX_BATCH:
            raise RequestError(422, "invalid_input", f"'features' must hold 1…{MAX_BATCH} rows")
        try:
            if order is None:
                x = np.array([[row[n] for n in FEATURE_NAMES] for row in rows], dtype=np.float64)
            else:
                x = np.array(rows, dtype=np.float64)
                if x.ndim != 2 or x.shape[1] != len(columns):
                    raise ValueError("ragged rows")
                x = x[:, order]
        except (KeyError, TypeError, ValueError, IndexError):
            raise self._explain_features(rows, order) from None
        bad = (x < self.lo) | (x > self.hi) | ~np.isfinite(x)
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise RequestError(
                422,
                "out_of_range",
                f"feature {FEATURE_NAMES[j]} = {x[i, j]} is outside [{self.lo[j]:g}, {self.hi[j]:g}]",
                index=int(i),
                feature=FEATURE_NAMES[j],
            )
        return x.astype(np.float32)

    @staticmethod
    def _explain_features(rows: list[Any], order: list[int] | None) -> RequestError:
        """The slow path, only for a bad request: which row, and what is wrong with it."""
        for i, row in enumerate(rows):
            if order is None:
                if not isinstance(row, dict):
                    return RequestError(422, "invalid_input", "each features entry must be a JSON object", index=i)
                absent = [n for n in FEATURE_NAMES if n not in row]
                if absent:
                    return RequestError(
                        422, "missing_input", f"features missing: {', '.join(absent)}", index=i, missing=absent
                    )
                values = [row[n] for n in FEATURE_NAMES]
            else:
                if not isinstance(row, list) or len(row) <= max(order):
                    return RequestError(422, "invalid_input", "each row must list a value per column", index=i)
                values = [row[j] for j in order]
            if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
                return RequestError(422, "invalid_input", "feature values must be numbers", index=i)
        return RequestError(422, "invalid_input", "features must be numbers")

    def _alternatives(self, table: RoutingTable, failed: Route) -> list[Route]:
        out = [table.fallback] if table.fallback and table.fallback.version != failed.version else []
        out += [r for r in table.routes if r.version != failed.version and r not in out]
        return out

    async def _score(
        self, table: RoutingTable, route: Route, x: np.ndarray, timeout: float
    ) -> tuple[np.ndarray, Route, list[str]]:
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
                scores = await self._infer(table.model, route.version, x, limit / 1000 if limit else timeout)
                self.breaker(route.version).record(True)
                if attempts > 1:
                    flags.append("retried")
                return scores, route, flags
            except Exception as exc:  # noqa: BLE001 - every Triton failure counts against the version
                last = exc
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

    async def _infer(self, model: str, version: int, x: np.ndarray, timeout: float) -> np.ndarray:
        import tritonclient.grpc.aio as aio

        inp = aio.InferInput("features", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        result = await self.client.infer(
            triton_name(model, version),
            [inp],
            model_version=str(version),
            outputs=[aio.InferRequestedOutput("score")],
            client_timeout=timeout,
        )
        return result.as_numpy("score")[:, 0].astype(np.float64)


def _parse(body: bytes) -> dict[str, Any]:
    try:
        req = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(400, "bad_json", f"the body is not JSON: {exc}") from None
    if not isinstance(req, dict):
        raise RequestError(400, "bad_json", "the body must be a JSON object")
    return req


async def _respond(send: Any, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    data = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


async def _respond_text(send: Any, status: int, text: str, content_type: str) -> None:
    data = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})
