"""The inference gateway: an ASGI app in front of Triton, serving a use case's model (keel/usecase.py).

``POST /v1/models/{model}/predict`` with a JSON body::

    {"entities": [{...}, ...], "tenant_id": "ops", "risk_level": 2, "unit_id": "u-1545"}

each entity an object of the use case's request contract (``features``: {name: value} instead gives all model
features directly, not read from the online store). An unknown model is 404 ``unknown_model`` whose ``models``
lists the served ones. ``POST /v1/predict`` is the use case's alias route: its ``serving.alias`` field holds one
entity and the plural (``alias`` + ``s``) a list. What happens to a request, in order:

1. the body is parsed; the tenant's token bucket admits it or the answer is 429 ``rate_limited``;
2. it enters its risk level's lane (separate concurrency limits: level 1 never queues behind 2 or 3);
3. each entity is validated with the request contract (the single-record path of keel's contract engine):
   a missing or out-of-range field is 422 ``invalid_input`` with the rule ids, or — when the policy says
   ``invalid_input: default`` — served with the reference defaults and flagged ``degraded``;
4. features are read from the online store (frozen features come back flagged);
5. routing: the ``x-experiment-id`` header picks an experiment's variant, else the weighted split — both sticky on
   ``unit_id``; a version whose circuit breaker is open is replaced by the fallback;
6. Triton scores it (timeout: the route's, else the model's SLA tier's); a failed call is retried within the retry budget, on the
   fallback when there is one; when no version can answer (breakers open, retries spent, the runtime down), the
   model's coarse model answers in this process, flagged ``coarse_fallback`` (coarse.py);
7. the answer — score, confidence_score, model_version, release_id, request_id, degraded flags, header
   ``x-model-signature`` (the model's sha256) — and one line in the append-only exposure log.

``GET /metrics`` (Prometheus text), ``/healthz`` (the process is up), ``/readyz`` (routing loaded and every routed
version ready in Triton).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from gpu_runtime.gateway.admission import TierAdmission
from gpu_runtime.gateway.coarse import AnswersCoarse
from gpu_runtime.gateway.control import (
    CircuitBreaker,
    RetryBudget,
    TokenBucket,
)
from gpu_runtime.gateway.following import POLICY_POLL_S, FollowsRoutingAndPolicies
from gpu_runtime.gateway.health import ReportsHealth
from gpu_runtime.gateway.inputs import BuildsInputs
from gpu_runtime.gateway.limits import (
    BODY_TIMEOUT_S,
    MAX_BODY_BYTES,
    MAX_TENANT_BUCKETS,
    BodyTooLarge,
    BoundedLRU,
    RequestError,
    decode_headers,
    read_body,
    respond,
    respond_text,
)
from gpu_runtime.gateway.metering import METER_INTERVAL_S, MetersUsage
from gpu_runtime.gateway.metrics import Metrics
from gpu_runtime.gateway.predict import Predicts
from gpu_runtime.gateway.scoring import ScoresOnTriton
from gpu_runtime.gateway.several import ServesSeveral
from gpu_runtime.gateway.shadow import ScoresInShadow
from gpu_runtime.pools import PoolRegistry
from keel.clock import ClockError, ClockState, SimClock
from keel.deploy.routing import RoutingTable
from keel.exposure_log import ExposureLog
from keel.kernels import numpy_backend
from keel.policies import PolicyReader
from keel.policies.gateway import GatewayPolicy, Split
from keel.sqldb import PgLocation
from keel.usecase import UseCase, only, resolve


@dataclass(frozen=True)
class GatewayConfig:
    triton_url: str  # host:port of Triton's gRPC endpoint
    routing_path: Path
    exposure_dir: Path
    online_store_path: Path | None = None
    online_store_url: str | None = None  # a redis:// URL: the shared Redis store instead of the SQLite file
    online_store_prefix: str = "keel:online"
    contract_path: Path | None = None  # None: the use case's request contract (keel/usecase.py)
    usecase: str | None = None  # the use case served (None: the one installed)
    online_cache_size: int = 200_000
    policy_store_path: Path | PgLocation | None = None  # the policy store this gateway follows (keel.policies)
    max_body_bytes: int = MAX_BODY_BYTES  # a larger request body is answered 413
    body_timeout_s: float = BODY_TIMEOUT_S  # a body not complete this long after its headers is answered 408
    max_tenant_buckets: int = MAX_TENANT_BUCKETS  # token buckets kept for tenants the policy does not name
    # The shared simulated clock of a live replay (keel/clock.py): exposure timestamps are its time, so the canary
    # controller and label arrival agree with them. Absent file (or None): the wall clock.
    clock_path: Path | None = None
    # Metering (gateway/metering.py): where Triton's compute statistics are sampled to (None: not sampled), how
    # often, and which price applies to them (cpu: per_cpu_second; gpu: per_gpu_second).
    compute_dir: Path | None = None
    meter_interval_s: float = METER_INTERVAL_S
    compute_device: str = "cpu"


def _model_route(path: str) -> str | None:
    """``model`` of ``/v1/models/{model}/predict``; None for any other path."""
    if path.startswith("/v1/models/") and path.endswith("/predict"):
        model = path[len("/v1/models/") : -len("/predict")]
        return model if model and "/" not in model else None
    return None


def triton_channel_args() -> list[tuple[str, int]]:
    """tritonclient's defaults, plus: a subchannel pool of the channel's own (gRPC shares connections between channels
    to one address by default, so a new channel after a Triton restart would inherit the old one's reconnect back-off
    and fail for seconds), and a reconnect back-off of at most a second."""
    from tritonclient.grpc import MAX_GRPC_MESSAGE_SIZE, KeepAliveOptions

    keepalive = KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


class Gateway(
    FollowsRoutingAndPolicies,
    Predicts,
    BuildsInputs,
    ScoresOnTriton,
    ScoresInShadow,
    AnswersCoarse,
    ReportsHealth,
    MetersUsage,
    ServesSeveral,
):
    """The ASGI app: the request path (``predict``), health, readiness and metrics. Following routing and policies,
    building inputs, scoring on Triton, reporting health, metering and serving several models are its mixins
    (following.py, inputs.py, scoring.py, health.py, metering.py, several.py). ``also``: the configs of further
    use cases this gateway serves beside its own, each in a context of its own (several.py)."""

    def __init__(
        self,
        config: GatewayConfig,
        policy: GatewayPolicy | None = None,
        runtime=None,
        *,
        also: tuple[GatewayConfig, ...] = (),
        _shared: tuple[Metrics, ExposureLog, TierAdmission] | None = None,
    ):
        from keel.contracts.engine import CompiledContract
        from keel.contracts.spec import load_contract

        self.config = config
        self.runtime = runtime  # the supervisor's RuntimeStatus (None: nobody supervises Triton in this process)
        self._restarts_seen = runtime.restarts if runtime is not None else 0
        self.base_policy = policy or GatewayPolicy()  # the file's (or built-in) settings; the store overrides them
        self.policy = self.base_policy
        self.policy_version = 0  # the store version in force (0: none)
        self._policy_seen = 0  # the newest store version looked at, good or not
        self._policy_checked = 0.0
        self.split: Split | None = None  # the store's ab_test split in force: weights by model version, salt
        self._policy_reader = PolicyReader(config.policy_store_path) if config.policy_store_path else None
        self._policy_wake = asyncio.Event()  # set when the store announces a commit (following.py)
        self._listen_retry_at = 0.0
        self.policy_applied_at: float | None = None
        self.policy_error: str | None = None  # why the newest store version was refused
        self.policy_regressed_to: int | None = None  # the store's version when it went below the applied one
        self.policy_notes: list[
            str
        ] = []  # what of the policy in force is not applied (a split to undeployed versions)
        self._watcher: asyncio.Task | None = None
        self.usecase: UseCase = resolve(config.usecase) if config.usecase else only()
        self.features = self.usecase.features
        request_contract = self.usecase.contract_path(self.usecase.serving.request_contract)
        self.contract = CompiledContract(load_contract(config.contract_path or request_contract))
        # a further model's context shares the process's metrics registry and exposure log (several.py)
        self.metrics = _shared[0] if _shared else Metrics()
        self.exposures = _shared[1] if _shared else ExposureLog(config.exposure_dir)
        self.admission = _shared[2] if _shared else TierAdmission()  # one for every model of the process
        self.routing: RoutingTable | None = None
        self._routing_mtime = 0.0
        self._routing_checked = 0.0
        self.breakers: dict[int, CircuitBreaker] = {}
        self._max_batch: dict[str, int] = {}  # Triton model → its max_batch_size (scoring.py)
        self.open_connections: set | None = None  # the HTTP server's open connections (gateway/server.py)
        self.buckets: dict[str, TokenBucket] = {}  # tenants the policy names
        self.other_buckets: BoundedLRU[str, TokenBucket] = BoundedLRU(config.max_tenant_buckets)  # all others
        self.retry_budget = RetryBudget(self.policy.retry)
        self.lanes = {level: asyncio.Semaphore(n) for level, n in self.policy.lanes.items()}
        # Host-memory pools: Triton scores on its own device, the gateway only holds request matrices.
        budgets = {self.usecase.model.name: self.usecase.serving.pool_budget_bytes} | self.policy.pool_budgets
        self.pools = PoolRegistry(budgets, array_backend=numpy_backend())
        self._store = None
        self._client = None
        self._background: set = set()  # tasks that must outlive the request that started them
        self._ready_cache: tuple[float, bool] = (0.0, False)
        self.defaults = self.features.defaults.astype(np.float32)
        self.lo = np.array([f.lo for f in self.features.features])
        self.hi = np.array([f.hi for f in self.features.features])
        self._clock = SimClock(config.clock_path, self.usecase.name) if config.clock_path else None
        self._clock_state: ClockState | None = None
        self._clock_checked = 0.0
        self._clock_stat: tuple[int, int] | None = None  # the stepped clock file's (inode, mtime) last seen
        self._init_meter()
        self._init_coarse()
        self.coarse_error: str | None = None  # why the routed coarse model is not usable (coarse.py)
        self.reload_routing(force=True)
        self._init_several(also)

    def now(self) -> float:
        """Epoch seconds of an exposure: the simulated clock's when a live replay runs, else the wall clock's. The
        clock file is read again at most every POLICY_POLL_S (a speed change or a pause is followed within it)."""
        if self._clock is None:
            return time.time()
        mono = time.monotonic()
        if mono - self._clock_checked >= POLICY_POLL_S or self._stepped_clock_moved():
            self._clock_checked = mono
            before = self._clock_state
            try:
                self._clock_state = self._clock.state()
            except ClockError:  # a corrupt clock file: keep the last good state, count it
                self.metrics.inc("keel_gateway_clock_errors_total", {})
            after = self._clock_state
            if after is not None and after.stepped and (before is None or (before.step, before.phase) !=
                                                         (after.step, after.phase)):  # fmt: skip
                # A stepped clock's new phase: what settling deployed and committed is in force from its first
                # request on, not a poll later (keel/clock.py: the same answers on every machine).
                self.reload_routing(force=True)
                self.reload_policies(force=True)
        if self._clock_state is None:
            return time.time()
        return self._clock_state.now(datetime.now(UTC)).timestamp()

    def _stepped_clock_moved(self) -> bool:
        """On a stepped clock, has its file been replaced since the last look (a stat per request, stepped only)?"""
        if self._clock_state is None or not self._clock_state.stepped:
            return False
        try:
            st = self._clock.path.stat()
        except FileNotFoundError:
            return False
        seen, self._clock_stat = self._clock_stat, (st.st_ino, st.st_mtime_ns)
        return seen != self._clock_stat

    # -- plumbing -------------------------------------------------------------------------------------------------

    @property
    def client(self):
        if self._client is None:
            import tritonclient.grpc.aio as aio

            self._client = aio.InferenceServerClient(self.config.triton_url, channel_args=triton_channel_args())
        return self._client

    def _after_restart(self) -> None:
        """Triton was restarted by the supervisor: what the breakers counted is history, and the gRPC channel to the
        dead process is replaced (left alone it reconnects with a back-off of seconds, failing every call meanwhile).
        Calls in flight on the old channel finish before it is closed."""
        self._restarts_seen = self.runtime.restarts
        self.breakers.clear()
        self._max_batch.clear()
        old, self._client = self._client, None
        if old is not None:

            async def close_later() -> None:
                await asyncio.sleep(30)
                await old.close()

            task = asyncio.get_running_loop().create_task(close_later())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    @property
    def store(self):
        if self._store is None and self.config.online_store_url is not None:
            from keel.features.redis_store import RedisOnlineStore

            self._store = RedisOnlineStore(
                self.config.online_store_url, features=self.features, prefix=self.config.online_store_prefix
            )
        elif self._store is None and self.config.online_store_path is not None:
            from keel.features.sqlite_store import SQLiteOnlineStore

            if Path(self.config.online_store_path).exists():
                self._store = SQLiteOnlineStore(
                    self.config.online_store_path, features=self.features, cache_size=self.config.online_cache_size
                )
        return self._store

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
        model = _model_route(path)
        if (path == "/v1/predict" or model is not None) and method == "POST":
            context = self.context_of(model)
            headers: dict[str, str] = {}
            try:
                headers = decode_headers(scope.get("headers", []))
                body: bytes | RequestError = await read_body(
                    receive, self.config.max_body_bytes, headers.get("content-length"), self.config.body_timeout_s
                )
            except RequestError as err:
                body = err
            except BodyTooLarge as exc:
                body = RequestError(
                    413, "body_too_large", f"the request body is over the gateway's limit of {exc.limit:,} bytes",
                    limit_bytes=exc.limit,
                )  # fmt: skip
            status, payload, extra = await context.predict(body, headers, model)
            if isinstance(body, RequestError) and body.code in ("body_timeout", "incomplete_body"):
                extra = extra | {"connection": "close"}  # the client stopped sending: its connection ends
            await respond(send, status, payload, extra)
        elif path == "/metrics" and method == "GET":
            self._export_breakers()
            self._export_pools()
            self._export_sla()
            self._export_runtime()
            self._export_freezes()
            self._export_budgets()
            self.export_others()
            if self.open_connections is not None:
                self.metrics.set_gauge("keel_gateway_connections_open", {}, len(self.open_connections))
            await respond_text(send, 200, self.metrics.render(), "text/plain; version=0.0.4")
        elif path == "/healthz" and method == "GET":
            up = self.runtime is None or self.runtime.up
            await respond(
                send,
                200 if up else 503,
                {
                    "status": "ok" if up else "runtime_unavailable",
                    "runtime": self.runtime.as_dict() if self.runtime is not None else None,
                    "exposure_log": self.exposure_health(),
                },
            )
        elif path == "/readyz" and method == "GET":
            ready, detail = await self.ready_all()
            await respond(send, 200 if ready else 503, {"ready": ready, **detail})
        else:
            await respond(send, 404, {"error": {"code": "not_found", "message": f"no route {method} {path}"}})

    async def _watch(self) -> None:
        """Follow routing and policies even when no request comes: a commit is in force within POLICY_POLL_S."""
        while True:
            try:
                self.reload_routing()
                self.reload_policies()
                self.follow_others()
                self.listen_for_policies()
                await self._sample_compute()
            except Exception:  # noqa: BLE001 - a bad file or a locked store must not stop the watcher
                self.metrics.inc("keel_gateway_watch_errors_total", {})
            try:
                await self.wait_for_policy_change(POLICY_POLL_S / 2)
            except Exception:  # noqa: BLE001 - a store that cannot be read now is looked at again next round
                self.metrics.inc("keel_gateway_watch_errors_total", {})

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        await self.close_others()
        if self._client is not None:
            try:
                await self._sample_compute(force=True)  # the last interval's compute, before the channel closes
            except Exception:  # noqa: BLE001 - Triton already gone: its last interval is not sampled
                self.metrics.inc("keel_gateway_watch_errors_total", {})
            await self._client.close()
        if self._policy_reader is not None:
            self._policy_reader.close()
        self.exposures.close()
        if self.compute_log is not None:
            self.compute_log.close()
