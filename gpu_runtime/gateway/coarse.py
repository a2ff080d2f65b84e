"""The coarse fallback: when no version of the model can answer — every breaker open, the retries spent, or the
model runtime down — the gateway answers from the model's coarse model (keel/training/coarse.py), a small LightGBM
scored in the gateway's own process, so the answer does not need Triton.

The routing table names it (``RoutingTable.coarse``: its ``<model>-coarse`` version and sha256); the deployment
wrote its text beside the routing tables (``keel.deploy.routing.coarse_path``). It is read when the table is, and
used only if its bytes hash to the sha256 the table names: a missing or altered file leaves the model without a
coarse answer (``keel_gateway_coarse_unusable_total``), never a wrong one.

**It costs less than the model, never more.** Each served model keeps its own loaded booster (two models in
fallback never re-read each other's file); it is scored off the event loop, on the process's coarse pool (one
thread, LightGBM with one thread: no OpenMP threads spinning against the machine's other work); at most
``MAX_WAITING`` requests wait for that pool — beyond it, and for a request whose deadline has passed by the time
its turn comes, the answer is the same fast 503 ``shed`` as any refused request. Its latency and answers are in the
metrics (``keel_gateway_coarse_seconds``, ``keel_gateway_coarse_answers_total``).

The answer says so: ``degraded: ["coarse_fallback", …]`` (with ``runtime_unavailable`` or ``breaker_open`` when
that was why), ``variant: "coarse"``, ``model_version: null`` (no version of the model answered; the canary's arms
count it as their version's failure) and ``coarse_version``. The exposure log records the same.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from gpu_runtime.gateway.limits import RequestError
from gpu_runtime.gateway.scoring import Explained
from keel.deploy.routing import Route, RoutingTable, coarse_path

RETRY_UNUSABLE_S = 30.0  # a coarse file that could not be used is looked at again after this long
MAX_WAITING = 8  # requests queued for the coarse pool beyond those it is scoring; more are shed


class CoarsePool:
    """The process's one thread for coarse scoring, shared by every served model, with a bounded queue."""

    def __init__(self, threads: int = 1, max_waiting: int = MAX_WAITING):
        self.threads = threads
        self.max_waiting = max_waiting
        self.in_flight = 0  # queued or running
        self._executor: ThreadPoolExecutor | None = None

    def full(self) -> bool:
        return self.in_flight >= self.threads + self.max_waiting

    async def run(self, fn, deadline: float):
        """``fn()`` on the pool; 503 ``shed`` when the queue is full or the deadline passes before it starts."""
        if self.full():
            raise RequestError(503, "shed", "the coarse fallback is at capacity", tier=None, retry_after_s=1)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="keel-coarse")

        def guarded():
            if time.monotonic() >= deadline:  # its turn came too late: no work for nobody
                raise TimeoutError
            return fn()

        self.in_flight += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, guarded)
        except TimeoutError:
            raise RequestError(
                503, "deadline_exceeded", "the request's deadline passed while it waited for the coarse fallback",
                stage="infer", retry_after_s=1,
            ) from None  # fmt: skip
        finally:
            self.in_flight -= 1

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


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
        self, pool: CoarsePool, booster, x: np.ndarray, explain: bool, deadline: float
    ) -> tuple[np.ndarray, Explained | None]:
        """Scores (and, when ``explain``, TreeSHAP contributions and raw scores) from the coarse model, computed on
        the coarse pool."""
        started = time.perf_counter()
        out = await pool.run(lambda: coarse_scores(booster, x, explain), deadline)
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
