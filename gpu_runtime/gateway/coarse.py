"""The coarse fallback: when no version of the model can answer — every breaker open, the retries spent, or the
model runtime down — the gateway answers from the model's coarse model (keel/training/coarse.py), a small LightGBM
scored in the gateway's own process, so the answer does not need Triton.

The routing table names it (``RoutingTable.coarse``: its ``<model>-coarse`` version and sha256); the deployment
wrote its text beside the routing tables (``keel.deploy.routing.coarse_path``). It is read when the table is, and
used only if its bytes hash to the sha256 the table names: a missing or altered file leaves the model without a
coarse answer (``keel_gateway_coarse_unusable_total``), never a wrong one.

**It costs less than the model, never more.** Each served model keeps its own loaded booster (two models in
fallback never re-read each other's file); it is scored off the event loop, on the process's coarse pool (one
thread, LightGBM with one thread: no OpenMP threads spinning against the machine's other work), highest tier first;
at most ``MAX_WAITING`` requests wait for that pool (a lower tier's only while ``MAX_WAITING_LOWER`` do) — beyond it, and for a request whose deadline has passed by the time
its turn comes, the answer is the same fast 503 ``shed`` as any refused request. Its latency and answers are in the
metrics (``keel_gateway_coarse_seconds``, ``keel_gateway_coarse_answers_total``).

The answer says so: ``degraded: ["coarse_fallback", …]`` (with ``runtime_unavailable`` or ``breaker_open`` when
that was why), ``variant: "coarse"``, ``model_version: null`` (no version of the model answered; the canary's arms
count it as their version's failure) and ``coarse_version``. The exposure log records the same.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import itertools
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpu_runtime.gateway.limits import RequestError
from gpu_runtime.gateway.scoring import Explained
from keel.deploy.routing import Route, RoutingTable, coarse_path

RETRY_UNUSABLE_S = 30.0  # a coarse file that could not be used is looked at again after this long
MAX_WAITING = 8  # requests queued for the coarse pool beyond those it is scoring; more are shed
MAX_WAITING_LOWER = 2  # …of which a tier below the highest may take only so many


class CoarsePool:
    """The process's one thread for coarse scoring, shared by every served model, with a bounded queue taken in the
    order of the requests' tiers: the highest tier's request (rank 0) is scored before any lower tier's, whenever
    they arrived, and a lower tier may queue only while ``max_waiting_lower`` wait at most — during a flood of a
    lower tier whose timeouts fall back here, the top tier's fallback must not wait behind the flood's."""

    def __init__(self, threads: int = 1, max_waiting: int = MAX_WAITING, max_waiting_lower: int = MAX_WAITING_LOWER):
        self.threads = threads
        self.max_waiting = max_waiting
        self.max_waiting_lower = max_waiting_lower
        self.in_flight = 0  # queued or running
        self._queue: list[tuple[int, int, Any]] = []  # heap of (rank, arrival, job)
        self._arrivals = itertools.count()
        self._ready = threading.Condition()
        self._workers: list[threading.Thread] = []
        self._closed = False

    def full(self, rank: int = 0) -> bool:
        waiting = max(0, self.in_flight - self.threads)
        return waiting >= (self.max_waiting if rank == 0 else self.max_waiting_lower)

    async def run(self, fn, deadline: float, rank: int = 0):
        """``fn()`` on the pool; 503 ``shed`` when the queue is full for the request's tier ``rank``, 503
        ``deadline_exceeded`` when its deadline passes before its turn."""
        if self.full(rank):
            raise RequestError(503, "shed", "the coarse fallback is at capacity", tier=None, retry_after_s=1)
        self._start()
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def job() -> None:
            if time.monotonic() >= deadline:  # its turn came too late: no work for nobody
                outcome: tuple[bool, Any] = (False, TimeoutError())
            else:
                try:
                    outcome = (True, fn())
                except Exception as exc:  # noqa: BLE001 - handed to the waiting request
                    outcome = (False, exc)
            loop.call_soon_threadsafe(_settle, done, outcome)

        self.in_flight += 1
        with self._ready:
            heapq.heappush(self._queue, (rank, next(self._arrivals), job))
            self._ready.notify()
        try:
            return await done
        except TimeoutError:
            raise RequestError(
                503, "deadline_exceeded", "the request's deadline passed while it waited for the coarse fallback",
                stage="infer", retry_after_s=1,
            ) from None  # fmt: skip
        finally:
            self.in_flight -= 1

    def _start(self) -> None:
        while len(self._workers) < self.threads:
            worker = threading.Thread(target=self._work, name=f"keel-coarse-{len(self._workers)}", daemon=True)
            self._workers.append(worker)
            worker.start()

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
                _, _, job = heapq.heappop(self._queue)
            job()

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._queue.clear()
            self._ready.notify_all()


def _settle(done: asyncio.Future, outcome: tuple[bool, Any]) -> None:
    if done.cancelled():  # the request has gone
        return
    ok, value = outcome
    if ok:
        done.set_result(value)
    else:
        done.set_exception(value)


class CoarseModel:
    """One served model's coarse model: the booster the routing table names, loaded once and kept."""

    def __init__(self, routing_path: Path, n_features: int, metrics: Any):
        self.routing_path = routing_path
        self.n_features = n_features
        self.metrics = metrics
        self.loads = 0  # times a coarse file was read and parsed (tests: once per model and sha256)
        self.error: str | None = None  # why the routed coarse model is not usable
        self._booster: tuple[str, Any] | None = None  # (sha256, lightgbm.Booster)
        self._unusable: dict[str, float] = {}  # sha256 → when it was found unusable (monotonic)

    def booster(self, table: RoutingTable | None):
        """The loaded coarse model of ``table`` (a lightgbm.Booster), or None when it names none or its file is not
        usable."""
        route = table.coarse if table is not None else None
        if route is None:
            return None
        if self._booster is not None and self._booster[0] == route.sha256:
            return self._booster[1]
        failed = self._unusable.get(route.sha256)
        if failed is not None and time.monotonic() - failed < RETRY_UNUSABLE_S:
            return None
        return self._load(route)

    def _load(self, route: Route):
        import lightgbm as lgb

        path = coarse_path(self.routing_path, route.sha256)
        try:
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != route.sha256:
                raise ValueError(f"{path} does not hash to the sha256 the routing table names")
            booster = lgb.Booster(model_str=data.decode())
            if booster.num_feature() != self.n_features:
                raise ValueError(f"{path} takes {booster.num_feature()} features, the model {self.n_features}")
        except Exception as exc:  # noqa: BLE001 - no coarse answer, said in the metrics; never a wrong one
            self._unusable[route.sha256] = time.monotonic()
            self.metrics.inc("keel_gateway_coarse_unusable_total", {"coarse_version": str(route.version)})
            self.error = f"coarse model v{route.version}: {exc}"
            return None
        self.loads += 1
        self._booster = (route.sha256, booster)
        self._unusable.pop(route.sha256, None)
        self.error = None
        return booster

    async def score(
        self, pool: CoarsePool, booster, x: np.ndarray, explain: bool, deadline: float, rank: int = 0
    ) -> tuple[np.ndarray, Explained | None]:
        """Scores (and, when ``explain``, TreeSHAP contributions and raw scores) from the coarse model, computed on
        the coarse pool (``rank``: the request's tier's, 0 the highest — scored first)."""
        started = time.perf_counter()
        out = await pool.run(lambda: coarse_scores(booster, x, explain), deadline, rank)
        self.metrics.observe("keel_gateway_coarse_seconds", {}, time.perf_counter() - started)
        return out


def coarse_scores(booster, x: np.ndarray, explain: bool) -> tuple[np.ndarray, Explained | None]:
    """The coarse model's scores for ``x`` with one LightGBM thread (runs on the coarse pool's thread)."""
    scores = np.asarray(booster.predict(x, num_threads=1), dtype=np.float64)
    if not explain:
        return scores, None
    contrib = np.asarray(booster.predict(x, pred_contrib=True, num_threads=1), dtype=np.float64)
    raw = np.asarray(booster.predict(x, raw_score=True, num_threads=1), dtype=np.float64)
    return scores, Explained(contrib, raw)
