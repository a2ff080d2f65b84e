"""One served model: everything the request path needs for it, in one object (KServe's one-object-per-model shape).

A ``ServedModel`` holds its use case's request contract and features (``inputs``), its routing table and the policy in
force (``follower``), its Triton client, breakers and retry budget (``scorer``), its coarse model (``coarse``), its
memory pool, its tenants' token buckets and risk lanes, its usage meter and its use case's simulated clock. The
process-level server (app.py) owns one per served model; adding a model adds an object, not a branch. Nothing here
is shared between models: one model's failures and overload never reach another model's requests — what the
process shares (tier admission, the concurrency limit, the coarse pool, the exposure log, /metrics) is the server's.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from gpu_runtime.gateway.coarse import CoarseModel
from gpu_runtime.gateway.control import TokenBucket
from gpu_runtime.gateway.following import POLICY_POLL_S, Follower
from gpu_runtime.gateway.inputs import InputBuilder
from gpu_runtime.gateway.limits import BODY_TIMEOUT_S, MAX_BODY_BYTES, MAX_TENANT_BUCKETS, BoundedLRU, RequestError
from gpu_runtime.gateway.metering import METER_INTERVAL_S, UsageMeter
from gpu_runtime.gateway.overload import LoadSignals
from gpu_runtime.gateway.scoring import TritonScorer
from gpu_runtime.gateway.shared import SharedBucket
from gpu_runtime.pools import PoolBudgetExceeded, PoolRegistry
from keel.clock import ClockError, ClockState, SimClock
from keel.kernels import numpy_backend
from keel.policies.gateway import GatewayPolicy
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
    # Where this gateway records an overload as an incident (keel/incidents.py; gateway/incident.py). None: not.
    incidents_path: Path | None = None
    # Behind keel's edge (gpu_runtime/edge.py): the token its filter sets as ``x-keel-edge``. Set, the tenant is the
    # edge's ``x-keel-tenant`` (from the caller's API key), a request without the token is refused 401 (it did not
    # come through the edge) and a body ``tenant_id`` naming another tenant 403. None: no edge, the body's tenant_id.
    edge_token: str | None = None


class ServedModel:
    def __init__(self, config: GatewayConfig, policy: GatewayPolicy, runtime: Any, metrics: Any,
                 load: Any = LoadSignals, shared_buckets: Any = None):  # fmt: skip
        from keel.contracts.engine import CompiledContract
        from keel.contracts.spec import load_contract

        self.config = config
        self.runtime = runtime  # the supervisor's RuntimeStatus (None: nobody supervises Triton in this process)
        self.metrics = metrics
        self.usecase: UseCase = resolve(config.usecase) if config.usecase else only()
        self.name = self.usecase.model.name
        self.features = self.usecase.features
        request_contract = self.usecase.contract_path(self.usecase.serving.request_contract)
        contract = CompiledContract(load_contract(config.contract_path or request_contract))
        self._store = None
        self.inputs = InputBuilder(self.usecase, contract, lambda: self.store)
        self.follower = Follower(config.routing_path, config.policy_store_path, policy, metrics,
                                 on_routing=self._on_routing, on_policy=self._on_policy)  # fmt: skip
        self.scorer = TritonScorer(config.triton_url, runtime, metrics, lambda: self.follower.policy, load)
        self.coarse = CoarseModel(config.routing_path, len(self.features.names), metrics)
        self.shared_buckets = shared_buckets  # the workers' table (shared.py); None: this process's own buckets
        self.buckets: dict[str, TokenBucket] = {}  # tenants the policy names
        self.other_buckets: BoundedLRU[str, TokenBucket] = BoundedLRU(config.max_tenant_buckets)  # all others
        self.lanes = {level: asyncio.Semaphore(n) for level, n in policy.lanes.items()}
        # Host-memory pools: Triton scores on its own device, the gateway only holds request matrices.
        budgets = {self.name: self.usecase.serving.pool_budget_bytes} | policy.pool_budgets
        self.pools = PoolRegistry(budgets, array_backend=numpy_backend())
        self.meter = UsageMeter(
            compute_dir=config.compute_dir, interval_s=config.meter_interval_s, device=config.compute_device,
            exposure_dir=config.exposure_dir, metrics=metrics, now=self.now, client=lambda: self.scorer.client,
            routing=lambda: self.follower.routing, reader=lambda: self.follower.reader,
        )  # fmt: skip
        self._clock = SimClock(config.clock_path, self.usecase.name) if config.clock_path else None
        self._clock_state: ClockState | None = None
        self._clock_checked = 0.0
        self._clock_stat: tuple[int, int] | None = None  # the stepped clock file's (inode, mtime) last seen
        self.follower.reload_routing(force=True)

    # -- what the stages read ---------------------------------------------------------------------------------------

    @property
    def policy(self) -> GatewayPolicy:
        return self.follower.policy

    @property
    def routing(self):
        return self.follower.routing

    def tier(self) -> str:
        """The service tier this model is served in (the policy's word for it, else its use case's)."""
        return self.policy.tier_name(self.name, self.usecase.serving.tier)

    def timeout_ms(self) -> float:
        return self.policy.tiers[self.tier()].timeout_ms

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

    def bucket(self, tenant: str) -> TokenBucket:
        """The tenant's token bucket: its own for tenants the policy names, else one from a bounded LRU — state
        does not grow with the tenant names callers invent. With several workers, the bucket in their shared table."""
        policy = self.policy
        if self.shared_buckets is not None:
            limit = policy.rate_limit_of(tenant)
            return SharedBucket(self.shared_buckets, f"{self.name}|{tenant}", limit.rps, limit.burst)
        if tenant in policy.tenant_rate_limits:
            bucket = self.buckets.get(tenant)
            if bucket is None:
                bucket = self.buckets[tenant] = TokenBucket(policy.rate_limit_of(tenant))
            return bucket
        return self.other_buckets.get_or_create(tenant, lambda: TokenBucket(policy.default_rate_limit))

    def pooled(self, x: np.ndarray) -> np.ndarray:
        """The request matrix, held in the model's memory pool while the request is in flight."""
        if self.name not in self.pools:
            return x
        try:
            return self.pools[self.name].asarray(x, dtype=np.float32)
        except PoolBudgetExceeded as exc:
            raise RequestError(503, "memory_budget_exceeded", str(exc), model=self.name) from None

    def follow(self) -> None:
        """Routing and policies now (the watcher calls it each round; a request without a watcher, each time)."""
        self.follower.reload_routing()
        self.follower.reload_policies()

    # -- the clock ---------------------------------------------------------------------------------------------

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
                self.follower.reload_routing(force=True)
                self.follower.reload_policies(force=True)
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

    # -- following -----------------------------------------------------------------------------------------------

    def _on_routing(self, table) -> None:
        self.coarse.booster(table)  # read now, not when the first request needs it

    def _on_policy(self, policy: GatewayPolicy, state: dict[str, Any]) -> None:
        self.meter.apply_policies(state)  # prices and budgets (metering.py)
        self.scorer.on_policy(policy)
        self.buckets.clear()  # new limits apply from the next request
        self.other_buckets.clear()

    async def close(self) -> None:
        if self.scorer._client is not None:
            try:
                await self.meter.sample_compute(force=True)  # the last interval's compute, before the channel closes
            except Exception:  # noqa: BLE001 - Triton already gone: its last interval is not sampled
                self.metrics.inc("keel_gateway_watch_errors_total", {})
        await self.scorer.close()
        self.follower.close()
        if self.meter.compute_log is not None:
            self.meter.compute_log.close()
