"""The gateway's decisions, as plain objects with an injectable clock: circuit breaker, token bucket, retry budget,
sticky weighted routing. Nothing here does I/O, so each decision is tested before it becomes an action."""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from keel.deploy.routing import Route, RoutingTable
from keel.policies.gateway import BreakerPolicy, RateLimit, RetryPolicy, Split

Clock = Callable[[], float]

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
STATE_CODES = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}  # the /metrics gauge


class CircuitBreaker:
    """Per model version: closed → (error share > threshold over the window, with enough requests) → open for
    ``open_s`` → half-open: ``half_open_probes`` requests go through; all succeed → closed, any fails → open again."""

    def __init__(self, policy: BreakerPolicy, clock: Clock = time.monotonic):
        self.policy = policy
        self.clock = clock
        self.state = CLOSED
        self._events: deque[tuple[float, bool]] = deque()  # (time, failed) within the window
        self._failed = 0  # failures among _events, kept as events come and go
        self._opened_at = 0.0
        self._probes_sent = 0
        self._probes_ok = 0
        self.transitions: deque[tuple[float, str]] = deque(maxlen=100)  # the latest, for tests and debugging
        self.transition_counts = {CLOSED: 0, OPEN: 0, HALF_OPEN: 0}

    def _set(self, state: str) -> None:
        self.state = state
        self.transitions.append((self.clock(), state))
        self.transition_counts[state] += 1

    def observed_state(self) -> str:
        """The state as /metrics reports it: an open breaker whose ``open_s`` has passed is half-open — it lets the
        next request through as a probe — whether or not a request has come since (``state`` moves on then)."""
        if self.state == OPEN and self.clock() - self._opened_at >= self.policy.open_s:
            return HALF_OPEN
        return self.state

    def allow(self) -> bool:
        """May a request go to this version now? (In half-open, reserves one of the probes.)"""
        if self.state == OPEN:
            if self.clock() - self._opened_at < self.policy.open_s:
                return False
            self._set(HALF_OPEN)
            self._probes_sent = self._probes_ok = 0
        if self.state == HALF_OPEN:
            if self._probes_sent >= self.policy.half_open_probes:
                return False
            self._probes_sent += 1
        return True

    def record(self, ok: bool) -> None:
        now = self.clock()
        if self.state == HALF_OPEN:
            if not ok:
                self._open(now)
                return
            self._probes_ok += 1
            if self._probes_ok >= self.policy.half_open_probes:
                self._clear()
                self._set(CLOSED)
            return
        if self.state == OPEN:
            return  # a late answer from before it opened
        self._events.append((now, not ok))
        self._failed += not ok
        horizon = now - self.policy.window_s
        while self._events and self._events[0][0] < horizon:
            self._failed -= self._events.popleft()[1]
        n = len(self._events)
        if n >= self.policy.min_requests and self._failed / n > self.policy.error_rate:
            self._open(now)

    def _open(self, now: float) -> None:
        self._opened_at = now
        self._clear()
        self._set(OPEN)

    def _clear(self) -> None:
        self._events.clear()
        self._failed = 0

    def error_rate(self) -> float:
        n = len(self._events)
        return self._failed / n if n else 0.0


class TokenBucket:
    def __init__(self, limit: RateLimit, clock: Clock = time.monotonic):
        self.rate, self.capacity = limit.rps, limit.burst
        self.clock = clock
        self.tokens = limit.burst
        self.updated = clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class RetryBudget:
    """Retries may add at most ``budget_ratio`` of the requests seen over the last 10 s, or
    ``budget_min_per_s`` per second — so a failing backend is not hammered by retries."""

    WINDOW_S = 10.0

    def __init__(self, policy: RetryPolicy, clock: Clock = time.monotonic):
        self.policy = policy
        self.clock = clock
        self._requests: deque[float] = deque()
        self._retries: deque[float] = deque()

    def _trim(self, now: float) -> None:
        for q in (self._requests, self._retries):
            while q and q[0] < now - self.WINDOW_S:
                q.popleft()

    def on_request(self) -> None:
        now = self.clock()
        self._requests.append(now)
        self._trim(now)

    def try_retry(self) -> bool:
        now = self.clock()
        self._trim(now)
        allowed = max(self.policy.budget_ratio * len(self._requests), self.policy.budget_min_per_s * self.WINDOW_S)
        if len(self._retries) < allowed:
            self._retries.append(now)
            return True
        return False


def sticky_bucket(unit_id: str, salt: str = "") -> float:
    """A unit's fixed place in [0, 1): the same unit lands in the same variant on every request."""
    digest = hashlib.sha256(f"{salt}|{unit_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass(frozen=True)
class Weighted:
    key: str
    weight: float


def pick_weighted(options: Sequence[Weighted], unit_id: str, salt: str = "") -> str:
    """The option whose cumulative-weight interval holds the unit's bucket (weights need not sum to 1)."""
    live = [o for o in options if o.weight > 0]
    if not live:
        raise ValueError("no option with a positive weight")
    total = sum(o.weight for o in live)
    point = sticky_bucket(unit_id, salt) * total
    acc = 0.0
    for o in live:
        acc += o.weight
        if point < acc:
            return o.key
    return live[-1].key


def deployment_salt(table: RoutingTable) -> str:
    """The salt of the deployment's own split: the model and the versions on its routes, so that a new deployment
    (new versions) places units afresh while one deployment keeps every unit where it was."""
    return table.model + ":" + ",".join(f"{r.name}=v{r.version}" for r in table.routes)


def choose_route(
    table: RoutingTable,
    split: Split | None,
    unit_id: str,
    experiment_id: str | None,
    experiments: dict[str, tuple[tuple[str, int, float], ...]] | None = None,
) -> tuple[Route, str, list[str]]:
    """Which route serves ``unit_id``: the ``x-experiment-id`` experiment's variant (salted by the experiment id) —
    from the routing table's experiments, else the store's live ones (``experiments``: id → (variant, version,
    weight) arms, keel.policies.gateway.live_experiments) —, else the store's split in force (salted by its own
    salt), else the deployment's weights. Sticky: the same unit under the same split always lands on the same route.
    A named experiment this gateway does not know is flagged ``unknown_experiment``; one whose chosen arm is not
    deployed here ``experiment_not_deployed`` (both then routed as if unnamed). Returns the route, the variant or
    route name, and flags."""
    flags: list[str] = []
    if experiment_id:
        variants = table.experiments.get(experiment_id)
        if variants:
            name = pick_weighted([Weighted(v.name, v.weight) for v in variants], unit_id, salt=experiment_id)
            variant = next(v for v in variants if v.name == name)
            return table.route(variant.route), name, flags
        arms = (experiments or {}).get(experiment_id)
        if arms:
            name = pick_weighted([Weighted(n, w) for n, _, w in arms], unit_id, salt=experiment_id)
            version = next(v for n, v, _ in arms if n == name)
            route = next((r for r in table.routes if r.version == version), None)
            if route is not None:
                return route, name, flags
            flags.append("experiment_not_deployed")
        else:
            flags.append("unknown_experiment")
    if split and any(split.weights.get(r.version, 0) > 0 for r in table.routes):
        options = [Weighted(r.name, split.weights.get(r.version, 0.0)) for r in table.routes]
        salt = split.salt
    else:
        options = [Weighted(r.name, r.weight) for r in table.routes]
        salt = deployment_salt(table)
    name = pick_weighted(options, unit_id, salt=salt)
    return table.route(name), name, flags
