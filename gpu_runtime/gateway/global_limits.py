"""Tenants' rate limits and budgets that hold across replicas: on a Redis server, when ``$KEEL_LIMITS_REDIS`` names
one (``redis://host:port/db``; a password in the URL or ``KEEL_REDIS_PASSWORD``). Unset — the embedded default —
they hold across the workers of one machine (shared.py's table; the edge's per-tenant buckets) and each replica
holds its own.

- **Rate limits** (``RedisBuckets``, the interface of shared.py's ``SharedBuckets``): one token bucket per model and
  tenant in a Redis hash, taken by a Lua script — atomic, on the Redis server's clock (``TIME``), so every worker of
  every replica takes from the same bucket: a tenant's burst is its burst across the fleet.
- **Budgets** (``GlobalSpend``): each budgeted tenant's spend in the period is one Redis number. A gateway adds what
  it metered (its increments, flushed with the read at most every ``SYNC_S``) and reads the fleet's total; when a
  budget comes into force, the spend so far read from the gateway's logs seeds the number if no gateway has (``SET
  NX``). A tenant over a hard budget on one replica is refused on every replica within ``SYNC_S``.

Redis on the request path is bounded: a call that fails or takes over ``TIMEOUT_S`` (50 ms;
``$KEEL_LIMITS_REDIS_TIMEOUT_MS``) falls back to the local table
(the machine's buckets, the gateway's own spend) for ``BACKOFF_S`` and is counted
(``keel_gateway_global_limits_errors_total``): limits degrade to per replica, never to none, and never stall answers.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from gpu_runtime.gateway.control import TokenBucket
from gpu_runtime.gateway.limits import BoundedLRU
from keel.policies.gateway import RateLimit

LIMITS_ENV = "KEEL_LIMITS_REDIS"
TIMEOUT_S = 0.05  # a Redis call on the request path; $KEEL_LIMITS_REDIS_TIMEOUT_MS for a slower network
TIMEOUT_ENV = "KEEL_LIMITS_REDIS_TIMEOUT_MS"
BACKOFF_S = 1.0
SYNC_S = 0.25
PREFIX = "keel:limits:"

TAKE = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) + tonumber(now_parts[2]) / 1000000
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'updated')
local tokens, updated = tonumber(state[1]), tonumber(state[2])
if tokens == nil then tokens, updated = burst, now end
tokens = math.min(burst, tokens + math.max(0, now - updated) * rate)
local ok = 0
if tokens >= 1 then tokens = tokens - 1; ok = 1 end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'updated', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / math.max(rate, 0.000001)) + 60)
return ok
"""


def _client(url: str):
    import redis

    raw = os.environ.get(TIMEOUT_ENV)
    try:
        timeout = float(raw) / 1000 if raw else TIMEOUT_S
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV} must be a number of milliseconds, got {raw!r}") from None
    return redis.Redis.from_url(url, password=os.environ.get("KEEL_REDIS_PASSWORD") or None,
                                socket_timeout=timeout, socket_connect_timeout=timeout)  # fmt: skip


class _Guarded:
    """A Redis client used only while it answers: after a failure, none for ``BACKOFF_S``."""

    def __init__(self, url: str, metrics: Any = None):
        self.client, self.metrics = _client(url), metrics
        self.errors, self._down_until = 0, 0.0

    def usable(self) -> bool:
        return time.monotonic() >= self._down_until

    def failed(self, what: str) -> None:
        self.errors += 1
        self._down_until = time.monotonic() + BACKOFF_S
        if self.metrics is not None:
            self.metrics.inc("keel_gateway_global_limits_errors_total", {"what": what})


class LocalBuckets:
    """This process's own buckets, taken as shared.py's table takes them (the fallback of a single-process gateway):
    the gateway's ``TokenBucket`` per key in a bounded LRU, re-parameterized when the policy's rate changes."""

    def __init__(self, capacity: int = 4096) -> None:
        self.buckets: BoundedLRU[str, TokenBucket] = BoundedLRU(capacity)

    def take(self, key: str, rate: float, burst: float) -> bool:
        bucket = self.buckets.get_or_create(key, lambda: TokenBucket(RateLimit(rps=rate, burst=burst)))
        bucket.rate, bucket.capacity = rate, burst
        return bucket.take()


class RedisBuckets(_Guarded):
    """Token buckets on Redis shared by every gateway that names the same server; ``fallback`` while it fails."""

    def __init__(self, url: str, fallback: Any, metrics: Any = None):
        super().__init__(url, metrics)
        self.fallback = fallback
        self._take = self.client.register_script(TAKE)

    def take(self, key: str, rate: float, burst: float) -> bool:
        if self.usable():
            try:
                return bool(self._take(keys=[f"{PREFIX}bucket:{key}"], args=[repr(float(rate)), repr(float(burst))]))
            except Exception:  # noqa: BLE001 - any failure of the server or the connection: the local table
                self.failed("rate_limit")
        return self.fallback.take(key, rate, burst)


class GlobalSpend(_Guarded):
    """Budgeted tenants' spend in a period, one Redis number each (``<prefix>spend:<currency>:<period>:<tenant>``)."""

    TTL_S = 40 * 86400  # longer than any budget period

    def _key(self, period: str, tenant: str) -> str:
        return f"{PREFIX}spend:{period}:{tenant}"

    def seed(self, period: str, spend: dict[str, float]) -> None:
        """The spend read from this gateway's logs, for the tenants no gateway has counted in ``period`` yet."""
        if not self.usable():
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            for tenant, amount in spend.items():
                pipe.set(self._key(period, tenant), repr(float(amount)), nx=True, ex=self.TTL_S)
            pipe.execute()
        except Exception:  # noqa: BLE001
            self.failed("budget")

    def sync(self, period: str, pending: dict[str, float], tenants: list[str]) -> dict[str, float] | None:
        """Add ``pending`` (tenant → spend metered here since the last sync) and read every tenant's total; None
        when Redis did not answer (the caller keeps its pending spend and its own view)."""
        if not self.usable():
            return None
        try:
            pipe = self.client.pipeline(transaction=False)
            for tenant, amount in pending.items():
                pipe.incrbyfloat(self._key(period, tenant), amount)
                pipe.expire(self._key(period, tenant), self.TTL_S)
            pipe.mget([self._key(period, t) for t in tenants])
            totals = pipe.execute()[-1]
        except Exception:  # noqa: BLE001
            self.failed("budget")
            return None
        return {t: float(v) for t, v in zip(tenants, totals, strict=True) if v is not None}


_SPEND: dict[str, GlobalSpend] = {}


def bucket_table(workers: Path | None, metrics: Any = None) -> Any:
    """The table the tenants' buckets are taken from: Redis when ``$KEEL_LIMITS_REDIS`` names one (the local table
    while it fails), else the local table — the workers' shared one (``workers``: their directory), or None for a
    single process (the model's own buckets)."""
    from gpu_runtime.gateway.shared import SharedBuckets

    local = SharedBuckets(workers / "buckets.bin") if workers is not None else None
    url = os.environ.get(LIMITS_ENV)
    if not url:
        return local
    return RedisBuckets(url, local if local is not None else LocalBuckets(), metrics)


def global_spend(metrics: Any = None) -> GlobalSpend | None:
    """The process's ``GlobalSpend`` when ``$KEEL_LIMITS_REDIS`` names a server, else None."""
    url = os.environ.get(LIMITS_ENV)
    if not url:
        return None
    if url not in _SPEND:
        _SPEND[url] = GlobalSpend(url, metrics)
    return _SPEND[url]
