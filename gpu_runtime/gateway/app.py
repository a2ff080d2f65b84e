"""The inference gateway: an ASGI server in front of Triton, serving one model per declared use case (keel/usecase.py).

``POST /v1/models/{model}/predict`` with a JSON body::

    {"entities": [{...}, ...], "tenant_id": "ops", "risk_level": 2, "unit_id": "u-1545"}

each entity an object of the use case's request contract (``features``: {name: value} instead gives all model
features directly, not read from the online store). An unknown model is 404 ``unknown_model`` whose ``models``
lists the served ones. ``POST /v1/predict`` is the first use case's alias route: its ``serving.alias`` field holds one
entity and the plural (``alias`` + ``s``) a list. A request passes the stages of stages.py (parse → admit → validate →
features → route → infer or coarse → answer → log) under a deadline (request.py); a request its tier would shed is
answered before its body is read.

``GET /metrics`` (Prometheus text), ``/healthz`` (the process is up), ``/readyz`` (routing loaded and every routed
version ready in Triton, for every model).

``Gateway`` is the process-level server: the routes, what every model shares — tier admission under the adaptive
concurrency limit (admission.py, concurrency.py), the load monitor (overload.py), the coarse pool (coarse.py), the
exposure log, the metrics registry — and one ``ServedModel`` per model (model.py).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_runtime.gateway.admission import TierAdmission
from gpu_runtime.gateway.admit import would_shed
from gpu_runtime.gateway.answers import refusal
from gpu_runtime.gateway.coarse import CoarsePool
from gpu_runtime.gateway.collector import CollectionTimer
from gpu_runtime.gateway.concurrency import GradientLimit, TopTierGuard
from gpu_runtime.gateway.following import POLICY_POLL_S
from gpu_runtime.gateway.global_limits import bucket_table
from gpu_runtime.gateway.health import export_model, export_runtime, exposure_health, ready
from gpu_runtime.gateway.incident import OverloadRecorder
from gpu_runtime.gateway.limits import (
    BodyTooLarge,
    RequestError,
    decode_headers,
    identifier,
    read_body,
    respond,
    respond_text,
)
from gpu_runtime.gateway.metrics import LabelledMetrics, Metrics, edge_scrape
from gpu_runtime.gateway.model import GatewayConfig, ServedModel
from gpu_runtime.gateway.overload import LoadMonitor, StandingQueue
from gpu_runtime.gateway.request import Answer, RequestContext, client_budget_ms
from gpu_runtime.gateway.shared import MetricsExchange
from gpu_runtime.gateway.stages import handle, log
from keel.exposure_log import ExposureLog
from keel.policies.gateway import GatewayPolicy
from keel.usecase import only, resolve

__all__ = ["Gateway", "GatewayConfig"]


def _model_route(path: str) -> str | None:
    """``model`` of ``/v1/models/{model}/predict``; None for any other path."""
    if path.startswith("/v1/models/") and path.endswith("/predict"):
        model = path[len("/v1/models/") : -len("/predict")]
        return model if model and "/" not in model else None
    return None


@dataclass(frozen=True)
class WorkerShare:
    """This process is worker ``index`` of a gateway of several processes sharing ``directory`` (shared.py)."""

    index: int
    directory: Path
    edge_admin: str | None = None  # behind the edge: Envoy's admin, whose stats /metrics carries beside keel's


class Gateway:
    """The ASGI app. ``config``: the first model's (its use case has the alias route); ``also``: the configs of
    further use cases served beside it, each a ``ServedModel`` of its own; ``worker``: set when this process is one
    of several gateway workers (shared.py: what they share)."""

    def __init__(
        self, config: GatewayConfig, policy: GatewayPolicy | None = None, runtime=None, *,
        also: tuple[GatewayConfig, ...] = (), worker: WorkerShare | None = None,
    ):  # fmt: skip
        self.config = config
        self.runtime = runtime  # the supervisor's RuntimeStatus (None: nobody supervises Triton in this process)
        self.worker = worker
        self.metrics = Metrics()
        self.exposures = ExposureLog(config.exposure_dir, worker=worker.index if worker else None)
        self.exchange = MetricsExchange(worker.directory, worker.index) if worker else None
        shared_buckets = bucket_table(worker.directory if worker else None, self.metrics)
        self.admission = TierAdmission()  # one for every model of the process
        self.limit = GradientLimit()
        self.guard = TopTierGuard()
        self.load = LoadMonitor()
        # the loop's own work keeps it late: its thread on the CPU, or — on cores a flood's senders and Triton share,
        # where the thread is runnable but off the CPU much of the time — a flood of the lower tiers arriving
        self.queue = StandingQueue(self.load.least_lag, lambda: 1.0 if self.guard.flooded() else self.load.busy())
        self.coarse_pool = CoarsePool()
        self._gc_watch: CollectionTimer | None = None  # the garbage collector's timer while watching
        self.open_connections: set | None = None  # the HTTP server's open connections (gateway/server.py)
        self.watching = False
        self._watcher: asyncio.Task | None = None
        where = config.exposure_dir.parent.name  # serving, or the replica's name
        self.overload = OverloadRecorder(config.incidents_path, config.clock_path, where) if config.incidents_path \
            else None  # fmt: skip
        self._overload_checked = 0.0
        base = policy or GatewayPolicy()
        self.models: dict[str, ServedModel] = {}
        for cfg in (config, *also):
            name = (resolve(cfg.usecase) if cfg.usecase else only()).model.name
            if name in self.models:
                raise ValueError(f"model {name} is served twice by this gateway")
            metrics = LabelledMetrics(self.metrics, {"model": name}) if also else self.metrics
            self.models[name] = ServedModel(cfg, base, runtime, metrics, self.load.signals, shared_buckets)
        self.default = next(iter(self.models.values()))

    def served_models(self) -> list[str]:
        return list(self.models)

    def model(self, name: str | None = None) -> ServedModel:
        """The served model ``name`` (None: the first, the alias route's)."""
        return self.default if name is None else self.models[name]

    # -- the request path ---------------------------------------------------------------------------------------

    def context(self, model: ServedModel, headers: dict[str, str], asked: str | None, arrived: float,
                client_gone=None) -> RequestContext:  # fmt: skip
        """A new request's context: its id and its deadline (its tier's timeout, or the client's when shorter)."""
        budget = model.timeout_ms()
        ctx = RequestContext(
            request_id=uuid.uuid4().hex, arrived=arrived, budget_ms=budget, ts=model.now(),
            policy_version=model.follower.policy_version, generic=asked is not None, headers=headers,
            asked_model=asked,
        )  # fmt: skip
        if client_gone is not None:
            ctx.client_gone = client_gone
        return ctx

    async def predict(
        self, body: bytes | RequestError, headers: dict[str, str], model: str | None = None,
        arrived: float | None = None, client_gone=None,
    ) -> tuple[int, dict[str, Any], dict[str, str]]:  # fmt: skip
        """Answer one request and log it (the ASGI route's work, callable in process: tests, benchmarks)."""
        served = self.models.get(model, self.default) if model is not None else self.default
        ctx = self.context(served, headers, model, time.monotonic() if arrived is None else arrived, client_gone)
        result = await self._answer(served, ctx, body)
        if result is None:
            return ctx.status, {}, {}
        return result.status, result.payload, result.headers

    async def _answer(self, model: ServedModel, ctx: RequestContext, body: bytes | RequestError) -> Answer | None:
        try:
            given = ctx.headers.get("x-request-id")
            if given is not None:  # the caller's id is used and echoed, once it is known to be safe to log
                ctx.request_id = identifier(given, "header x-request-id")
            client = client_budget_ms(ctx.headers)
            if client is not None and client < ctx.budget_ms:
                ctx.budget_ms = client
        except RequestError as err:
            body = err
        return await handle(self, model, ctx, body)

    def shed_before_body(self, model: ServedModel, ctx: RequestContext) -> Answer | None:
        """The 503 for a request its tier would shed now, before its body is read (logged like any answer)."""
        if ctx.asked_model is not None and ctx.asked_model not in self.models:
            return None
        shed, limit = would_shed(self, model, ctx)
        if not shed:
            return None
        tier = ctx.tier = model.tier()
        model.metrics.inc("keel_gateway_shed_total", {"tier": tier})
        model.metrics.inc("keel_gateway_shed_before_body_total", {"tier": tier})
        ctx.stage = "admit"
        answer = refusal(ctx, RequestError(
            503, "shed", f"tier {tier} is over its share of the model runtime ({limit} requests in flight)",
            tier=tier, in_flight_limit=limit, stage="admit", retry_after_s=1,
        ))  # fmt: skip
        log(self, model, ctx)
        return answer

    def door(self, url: bytes, method: bytes, arrived: float) -> Answer | None:
        """The 503 for a request its tier would shed now, decided by the HTTP protocol from the request line alone
        (server.py), before any ASGI task exists or a header is decoded — the cheapest refusal there is; logged and
        counted like any other. None: the request goes on (its route is not a model's, or its tier has room)."""
        if method != b"POST":
            return None
        path = url.split(b"?", 1)[0]
        if path == b"/v1/predict":
            asked, model = None, self.default
        else:
            asked = _model_route(path.decode("latin-1"))
            model = self.models.get(asked) if asked is not None else None
            if model is None:  # not a model's route, or an unknown model: the ASGI path answers it
                return None
        return self.shed_before_body(model, self.context(model, {}, asked, arrived))

    # -- ASGI ---------------------------------------------------------------------------------------------------

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self.start_watching()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        asked = _model_route(path)
        if (path == "/v1/predict" or asked is not None) and method == "POST":
            await self._predict_route(scope, receive, send, asked)
        elif path == "/metrics" and method == "GET":
            text = self.render_metrics() + await edge_scrape(self.worker and self.worker.edge_admin)  # Envoy's too
            await respond_text(send, 200, text, "text/plain; version=0.0.4")
        elif path == "/healthz" and method == "GET":
            up = self.runtime is None or self.runtime.up
            await respond(send, 200 if up else 503, {
                "status": "ok" if up else "runtime_unavailable",
                "runtime": self.runtime.as_dict() if self.runtime is not None else None,
                "exposure_log": exposure_health(self.exposures),
            })  # fmt: skip
        elif path == "/readyz" and method == "GET":
            ok, detail = await self.ready_all()
            await respond(send, 200 if ok else 503, {"ready": ok, **detail})
        else:
            await respond(send, 404, {"error": {"code": "not_found", "message": f"no route {method} {path}"}})

    async def _predict_route(self, scope: dict, receive: Any, send: Any, asked: str | None) -> None:
        state = scope.get("state") or {}
        arrived = state.get("keel_arrived") or time.monotonic()  # when the protocol saw the first byte
        model = self.models.get(asked, self.default) if asked is not None else self.default
        headers: dict[str, str] = {}
        try:
            headers = decode_headers(scope.get("headers", []))
        except RequestError as err:
            body: bytes | RequestError = err
        else:
            body = b""
        ctx = self.context(model, headers, asked, arrived, state.get("keel_client_gone"))
        if not isinstance(body, RequestError):
            # (the protocol has asked already when it put the request through its door: server.py)
            early = None if state.get("keel_door_checked") else self.shed_before_body(model, ctx)
            if early is not None:
                await respond(send, early.status, early.payload, early.headers)
                return
            try:
                body = await read_body(receive, model.config.max_body_bytes, headers.get("content-length"),
                                       model.config.body_timeout_s)  # fmt: skip
            except RequestError as err:
                body = err
            except BodyTooLarge as exc:
                body = RequestError(
                    413, "body_too_large", f"the request body is over the gateway's limit of {exc.limit:,} bytes",
                    limit_bytes=exc.limit,
                )  # fmt: skip
        result = await self._answer(model, ctx, body)
        if result is None:  # the client has gone: nothing to send
            return
        extra = result.headers
        if isinstance(body, RequestError) and body.code in ("body_timeout", "incomplete_body"):
            extra = extra | {"connection": "close"}  # the client stopped sending: its connection ends
        await respond(send, result.status, result.payload, extra)

    def render_metrics(self) -> str:
        self.refresh_gauges()
        if self.exchange is not None:  # one of several workers: the others' series too
            self.exchange.publish(self.metrics)  # first: a counter never falls between scrapes (shared.py)
            return self.metrics.render(self.exchange.others(), self.worker.index)
        return self.metrics.render()

    def refresh_gauges(self) -> None:
        """The gauges computed when they are read: each model's breakers, pools, SLA, freezes, budgets; the
        process's limits and load."""
        if self._gc_watch is not None:
            self._gc_watch.flush()
        for model in self.models.values():
            export_model(model)
        export_runtime(self.runtime, self.metrics)
        self.metrics.set_gauge("keel_gateway_concurrency_limit", {}, self.limit.limit)
        self.metrics.set_gauge("keel_gateway_in_flight", {}, self.admission.in_flight)
        self.metrics.set_gauge("keel_gateway_lower_tier_share", {}, self.guard.lower_share())
        signals = self.load.signals()
        self.metrics.set_gauge("keel_gateway_loop_lag_seconds", {}, signals.loop_lag_s)
        self.metrics.set_gauge("keel_gateway_cpu_pressure", {}, signals.cpu_pressure)
        self.metrics.set_gauge("keel_gateway_loop_busy", {}, signals.loop_busy)
        self.metrics.set_gauge("keel_gateway_coarse_in_flight", {}, self.coarse_pool.in_flight)
        self.metrics.set_gauge("keel_gateway_triton_abandoned", {},
                               sum(m.scorer.abandoned for m in self.models.values()))  # fmt: skip
        self.metrics.set_gauge("keel_gateway_standing_queue", {}, 1 if self.queue.standing else 0)
        if self.open_connections is not None:
            self.metrics.set_gauge("keel_gateway_connections_open", {}, len(self.open_connections))

    async def ready_all(self) -> tuple[bool, dict[str, Any]]:
        if len(self.models) == 1:
            return await ready(self.default, self.exposures)
        models, all_ready = {}, True
        for name, model in self.models.items():
            ok, more = await ready(model, self.exposures)
            models[name] = {"ready": ok, **more}
            all_ready = all_ready and ok
        return all_ready, {"models": models}

    # -- following routing and policies --------------------------------------------------------------------------

    def start_watching(self) -> None:
        self.watching = True
        self.load.start()
        self._gc_watch = CollectionTimer(self.metrics)
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        """Follow routing and policies even when no request comes: a commit is in force within POLICY_POLL_S."""
        first = self.default.follower
        while True:
            try:
                for model in self.models.values():
                    model.follow()
                    await model.meter.sample_compute()
                if self.exchange is not None and self.exchange.due():
                    self.refresh_gauges()  # what the others show of this worker is as fresh as its counters
                    self.exchange.publish(self.metrics)
                await self._watch_overload()
                first.listen_for_policies()  # one listening connection: a commit wakes every model's follower
            except Exception:  # noqa: BLE001 - a bad file or a locked store must not stop the watcher
                self.metrics.inc("keel_gateway_watch_errors_total", {})
            try:
                await first.wait_for_policy_change(POLICY_POLL_S / 2)
                for model in list(self.models.values())[1:]:
                    model.follower.reload_policies(force=True)
            except Exception:  # noqa: BLE001 - a store that cannot be read now is looked at again next round
                self.metrics.inc("keel_gateway_watch_errors_total", {})

    async def _watch_overload(self) -> None:
        """Once a second: the overload evidence; an incident opened or recovered (written off the event loop)."""
        now = time.monotonic()
        if self.overload is None or now - self._overload_checked < 1.0:
            return
        self._overload_checked = now
        evidence = self.overload.evidence(self.metrics, self.guard.lower_share(), self.load.pressure,
                                          self.admission.in_flight)  # fmt: skip
        transition = self.overload.watch.update(evidence)
        if transition is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(None, self.overload.record, transition)
            except Exception:  # noqa: BLE001 - an incident log that cannot be written must not stop the watcher
                self.metrics.inc("keel_gateway_watch_errors_total", {})

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        self.load.stop()
        for model in self.models.values():
            await model.close()
        self.coarse_pool.close()
        self.exposures.close()
        if self._gc_watch is not None:
            self._gc_watch.close()
            self._gc_watch = None
