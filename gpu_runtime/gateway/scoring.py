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

A call that runs out of time is **abandoned, never cancelled**: the gateway stops waiting for it (``asyncio.wait_for``
over a shielded call) but lets the gRPC call finish in the background. Triton 2.51 (the build nvidia-pytriton ships)
crashes with SIGSEGV on a race between a request's cancellation and its completion (triton-inference-server/server
#7368, #8034; fixed upstream after 2.51) — a gRPC deadline or a cancelled task would send exactly those cancellations,
hundreds a second under overload. Triton's own work for an abandoned call stays bounded: each call carries its
time as Triton's per-request queue timeout (the version's dynamic batcher rejects a request that waited longer,
repository.py ``default_queue_policy``), and a generous gRPC deadline (``ABANDON_BACKSTOP_S``) ends a call Triton never
answers at all (a hung process). ``keel_gateway_triton_abandoned`` is the number of such calls still in flight.

A **timeout** counts against the version only when the process and the
machine were not overloaded (overload.py ``blame_timeout``): a starved machine's timeouts are answered 503
``deadline_exceeded`` with no strike and no retry (a retry would only add load), counted in
``keel_gateway_local_timeouts_total``.

``TritonScorer`` is the infer stage's Triton side for one served model: its gRPC client, breakers, retry budget and
the batch sizes its versions take.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_runtime.gateway.control import CircuitBreaker, RetryBudget
from gpu_runtime.gateway.limits import RequestError
from gpu_runtime.gateway.overload import LoadSignals, blame_timeout
from gpu_runtime.repository import triton_name
from keel.deploy.routing import CHAMPION, Route, RoutingTable
from keel.policies.gateway import GatewayPolicy

RUNTIME_GONE_GRACE_S = 0.2
ABANDON_BACKSTOP_S = 30.0  # the gRPC deadline of every call: only a Triton that never answers meets it
DEFAULT_MAX_BATCH = 256  # ServingConfig's default, used when Triton's model config cannot be read


def refused_as_input(exc: Exception) -> bool:
    """Did Triton refuse the call because of its input (not because the version is broken)?"""
    status = getattr(exc, "status", None)
    return callable(status) and "INVALID_ARGUMENT" in str(status())


def timed_out(exc: Exception) -> bool:
    """Did the call fail because its time ran out — the gateway stopped waiting (TimeoutError), the gRPC deadline
    passed (DEADLINE_EXCEEDED), or Triton's queue policy rejected a request that waited past its timeout?"""
    if isinstance(exc, TimeoutError):
        return True
    status = getattr(exc, "status", None)
    if not callable(status):
        return False
    code = str(status())
    return "DEADLINE_EXCEEDED" in code or ("UNAVAILABLE" in code and "timeout" in _message(exc).lower())


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


@dataclass(frozen=True)
class Explained:
    """What Triton computed for an explained request: TreeSHAP contributions [batch, n_features + 1] (the last column
    is the base value; all in raw-score units, log-odds) and the raw scores [batch] from the model's own predict."""

    contrib: np.ndarray
    raw_score: np.ndarray


class TritonScorer:
    def __init__(
        self, triton_url: str, runtime: Any, metrics: Any, policy: Callable[[], GatewayPolicy],
        load: Callable[[], LoadSignals] = LoadSignals,
    ):  # fmt: skip
        self.triton_url = triton_url
        self.runtime = runtime  # the supervisor's RuntimeStatus (None: nobody supervises Triton in this process)
        self.metrics = metrics
        self.policy = policy
        self.load = load
        self.breakers: dict[int, CircuitBreaker] = {}
        self.retry_budget = RetryBudget(policy().retry)
        self.max_batch_of: dict[str, int] = {}  # Triton model → its max_batch_size
        self.restarts_seen = runtime.restarts if runtime is not None else 0
        self._client = None
        self._background: set = set()
        self.abandoned = 0  # calls the gateway stopped waiting for that Triton has not answered yet

    @property
    def client(self):
        if self._client is None:
            import tritonclient.grpc.aio as aio

            self._client = aio.InferenceServerClient(self.triton_url, channel_args=triton_channel_args())
        return self._client

    def on_policy(self, policy: GatewayPolicy) -> None:
        for b in self.breakers.values():
            b.policy = policy.breaker
        self.retry_budget.policy = policy.retry

    def follow_restarts(self) -> None:
        """Triton was restarted by the supervisor: what the breakers counted is history, and the gRPC channel to the
        dead process is replaced (left alone it reconnects with a back-off of seconds, failing every call meanwhile).
        Calls in flight on the old channel finish before it is closed."""
        if self.runtime is None or self.runtime.restarts == self.restarts_seen:
            return
        self.restarts_seen = self.runtime.restarts
        self.breakers.clear()
        self.max_batch_of.clear()
        old, self._client = self._client, None
        if old is not None:

            async def close_later() -> None:
                await asyncio.sleep(30)
                await old.close()

            task = asyncio.get_running_loop().create_task(close_later())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    def breaker(self, version: int) -> CircuitBreaker:
        b = self.breakers.get(version)
        if b is None:
            b = self.breakers[version] = CircuitBreaker(self.policy().breaker)
        return b

    def _alternatives(self, table: RoutingTable, failed: Route) -> list[Route]:
        """Where a failed version's request goes instead: the previous champion (the fallback), then the champion —
        never a challenger, an experiment's arm or any route at weight 0 (a model that is only reachable on purpose
        does not answer by accident; past these the coarse model answers)."""
        out = [table.fallback] if table.fallback and table.fallback.version != failed.version else []
        out += [r for r in table.routes if r.name == CHAMPION and r.version != failed.version and r not in out]
        return out

    async def score(
        self, table: RoutingTable, route: Route, x: np.ndarray, explain: bool, deadline: float,
        fresh_table: Callable[[], RoutingTable | None], budget_s: float, reserve_s: float = 0.0,
    ) -> tuple[np.ndarray, Route, list[str], Explained | None]:  # fmt: skip
        """Scores from ``route`` (or the version that stood in for it), its degraded flags and, when ``explain``,
        the TreeSHAP contributions and raw scores of the version that answered. Each call's timeout is the route's
        (policy ``route_timeout_ms``) or what is left of the request's ``deadline`` (time.monotonic()) less
        ``reserve_s`` (kept for the coarse fallback), whichever is shorter; ``budget_s``: the request's whole budget
        (how long it waited before the call is judged against it, overload.py); ``fresh_table``: the routing table
        now (a swap may have retired a version)."""
        flags: list[str] = []
        policy = self.policy()
        if not self.breaker(route.version).allow():
            flags.append("breaker_open")
            alt = next((r for r in self._alternatives(table, route) if self.breaker(r.version).allow()), None)
            if alt is None:
                raise RequestError(503, "no_healthy_model", f"every version of {table.model} has an open breaker")
            route = alt
            flags.append("fallback")
        attempts = 0
        last: Exception | None = None
        while attempts < policy.retry.max_attempts:
            left = deadline - reserve_s - time.monotonic()
            if left <= 0:  # no time for (another) call: the caller answers from the coarse model, or refuses
                if last is None:
                    raise RequestError(503, "deadline_exceeded", "the request's deadline passed before the call to "
                                       "Triton", stage="infer", retry_after_s=1)  # fmt: skip
                break
            attempts += 1
            waited_s = budget_s - (deadline - time.monotonic())  # of its budget, before this call
            limit = policy.route_timeout_ms.get(route.name)
            call_timeout = min(limit / 1000, left) if limit else left
            try:
                scores, explained = await self.infer(table.model, route.version, x, call_timeout, explain)
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
                if await self._runtime_gone(exc, deadline - reserve_s):
                    break  # the runtime died, not the version: no breaker strike, no retry (runtime_unavailable)
                if timed_out(exc):
                    blame = blame_timeout(self.load(), waited_s, budget_s, call_timeout)
                    if blame.local:  # a busy machine, not a broken version: no strike, no retry
                        self.metrics.inc("keel_gateway_local_timeouts_total", {"model_version": str(route.version)})
                        raise RequestError(
                            503, "deadline_exceeded", f"{table.model} v{route.version} did not answer within "
                            f"{call_timeout * 1000:.0f} ms: local overload ({blame.reason})",
                            stage="infer", retry_after_s=1, local_overload=True,
                        ) from None  # fmt: skip
                self.breaker(route.version).record(False)
                self.metrics.inc("keel_gateway_backend_errors_total", {"model_version": str(route.version)})
                if attempts >= policy.retry.max_attempts or not self.retry_budget.try_retry():
                    break
                fresh = fresh_table() or table  # a swap may have retired the version we picked
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
        if last is not None and timed_out(last) and deadline - reserve_s - time.monotonic() <= 0:
            # the version was slow (its strike is counted above) and the request's time is up: its answer is the
            # deadline's, as for every request past its deadline — the coarse model's, else a 503 with Retry-After
            raise RequestError(
                503, "deadline_exceeded", f"{table.model} v{route.version} did not answer within the request's "
                "deadline", stage="infer", retry_after_s=1, version_timeout=True,
            )  # fmt: skip
        raise RequestError(502, "backend_error", f"Triton failed for {table.model} v{route.version}: {last}")

    async def _runtime_gone(self, exc: Exception, until: float) -> bool:
        """Did this call fail because the runtime is down or its process died? A call cut off by a SIGKILL can fail
        a few milliseconds before the process is seen to exit: on a connection-level failure (gRPC UNAVAILABLE),
        look again for up to ``RUNTIME_GONE_GRACE_S`` — never past ``until`` (the request's deadline less the time
        kept for the coarse model, which answers meanwhile) — before blaming the version."""
        if self.runtime is None:
            return False
        if not self.runtime.up or self.runtime.died():
            return True
        status = getattr(exc, "status", None)
        if timed_out(exc) or not (callable(status) and "UNAVAILABLE" in str(status())):
            return False
        give_up = min(time.monotonic() + RUNTIME_GONE_GRACE_S, until)
        while time.monotonic() < give_up:
            await asyncio.sleep(0.02)
            if not self.runtime.up or self.runtime.died():
                return True
        return False

    def abandon(self, call: asyncio.Future) -> None:
        """Stop waiting for ``call`` and let it finish by itself (its result or error is dropped)."""
        self.abandoned += 1
        self._background.add(call)  # held: the loop keeps only a weak reference to a task

        def done(fut: asyncio.Future) -> None:
            self.abandoned -= 1
            self._background.discard(fut)
            if not fut.cancelled():
                fut.exception()  # retrieved: no "exception was never retrieved" warning

        call.add_done_callback(done)

    async def max_batch(self, model: str, version: int) -> int:
        """The largest batch the version takes in one call (its Triton config's ``max_batch_size``), read once."""
        name = triton_name(model, version)
        size = self.max_batch_of.get(name)
        if size is None:
            try:
                config = await self.client.get_model_config(name, str(version), as_json=True, client_timeout=5)
                size = int(config.get("config", config).get("max_batch_size") or 0) or DEFAULT_MAX_BATCH
            except Exception:  # noqa: BLE001 - not readable now: the default, asked again next time
                return DEFAULT_MAX_BATCH
            self.max_batch_of[name] = size
        return size

    async def infer(
        self, model: str, version: int, x: np.ndarray, timeout: float, explain: bool = False
    ) -> tuple[np.ndarray, Explained | None]:
        """One answer for the whole matrix: Triton calls of at most the version's ``max_batch_size`` rows each, in
        flight together (its dynamic batcher sees them as any other requests)."""
        size = await self.max_batch(model, version) if len(x) > 1 else 1  # a batching model takes one row
        if len(x) <= size:
            return await self.infer_call(model, version, x, timeout, explain)
        parts = await asyncio.gather(
            *(self.infer_call(model, version, x[i : i + size], timeout, explain) for i in range(0, len(x), size))
        )
        scores = np.concatenate([p[0] for p in parts])
        if not explain:
            return scores, None
        return scores, Explained(
            np.concatenate([p[1].contrib for p in parts]), np.concatenate([p[1].raw_score for p in parts])
        )

    async def infer_call(
        self, model: str, version: int, x: np.ndarray, timeout: float, explain: bool
    ) -> tuple[np.ndarray, Explained | None]:
        import tritonclient.grpc.aio as aio

        inp = aio.InferInput("features", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        names = ("score", "contrib", "raw_score") if explain else ("score",)
        call = asyncio.ensure_future(self.client.infer(
            triton_name(model, version),
            [inp],
            model_version=str(version),
            outputs=[aio.InferRequestedOutput(n) for n in names],
            timeout=max(1, int(timeout * 1e6)),  # Triton's queue timeout for this request, in microseconds
            client_timeout=max(timeout, ABANDON_BACKSTOP_S),
        ))  # fmt: skip
        try:
            result = await asyncio.wait_for(asyncio.shield(call), timeout)
        except (TimeoutError, asyncio.CancelledError):
            self.abandon(call)  # never cancelled: see the module's docstring
            raise
        scores = result.as_numpy("score")[:, 0].astype(np.float64)
        if not explain:
            return scores, None
        return scores, Explained(result.as_numpy("contrib"), result.as_numpy("raw_score")[:, 0])


def _message(exc: Exception) -> str:
    message = getattr(exc, "message", None)
    text = message() if callable(message) else str(exc)
    return str(text)[:300]
