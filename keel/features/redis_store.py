"""The online store on Redis, for many machines: the same answers as the embedded SQLite store (the parity tests run
against both), freezes included, with an explicit expiry policy.

Layout, under a key prefix (default ``keel:online``; one prefix per deployment):

- ``<prefix>:view:<view>`` — a hash per view: entity key → its values packed as little-endian float64s (NaN for
  a missing value), in the view's field order (``features.view_fields``);
- ``<prefix>:meta`` — last_write_at, as_of, partition of the snapshot in force;
- ``<prefix>:freezes`` — feature → {"value", "reason", "frozen_at"} (JSON); ``<prefix>:freeze_log`` — a list of
  JSON events, oldest first.

**A snapshot is atomic**: each view is written into ``<prefix>:next:<view>`` first, then one MULTI/EXEC renames every
view over the one in force and sets meta, so a reader (one pipelined round trip of HMGETs) sees the old snapshot or
the new one, never half. **Expiry is explicit, never Redis's defaults**: the snapshot's hashes expire
``snapshot_ttl_s`` after they were written (default 40 days: a store the pipeline stopped feeding for longer than a
month and a bit answers "missing" — flagged — rather than months-old values; ``None`` keeps them until the next
snapshot); freezes and their log never expire (PERSIST). A server whose ``maxmemory-policy`` may evict keys that have
no TTL (``allkeys-*``) could drop a freeze silently: the store refuses it (``allow_eviction=True`` to accept).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from datetime import UTC, date, datetime
from typing import Any

import polars as pl

from keel.features.online import FreezeEvent, OnlineStore, OnlineStoreError, StoreHealth
from keel.features.spec import FeatureSet

DEFAULT_PREFIX = "keel:online"
DEFAULT_SNAPSHOT_TTL_S = 40 * 86_400
EVICTING = ("allkeys-lru", "allkeys-lfu", "allkeys-random")
_PACKERS = {n: struct.Struct(f"<{n}d") for n in range(1, 6)}


def _pack(values: tuple) -> bytes:
    return _PACKERS[len(values)].pack(*(math.nan if v is None else float(v) for v in values))


def _unpack(data: bytes, n: int) -> tuple:
    return tuple(None if math.isnan(v) else v for v in _PACKERS[n].unpack(data))


class RedisOnlineStore(OnlineStore):
    """The online store on a Redis server (``url``: ``redis://host:port/db``; a password comes from the URL or, better,
    ``KEEL_REDIS_PASSWORD`` in the environment — never a file in the repository)."""

    def __init__(
        self,
        url: str,
        *,
        features: FeatureSet,
        prefix: str = DEFAULT_PREFIX,
        snapshot_ttl_s: int | None = DEFAULT_SNAPSHOT_TTL_S,
        allow_eviction: bool = False,
        socket_timeout_s: float = 5.0,
    ):
        import os

        import redis

        self.features = features
        self.url, self.prefix, self.snapshot_ttl_s = url, prefix, snapshot_ttl_s
        self._errors = (redis.RedisError, OSError)
        try:
            self._r = redis.Redis.from_url(
                url, password=os.environ.get("KEEL_REDIS_PASSWORD") or None, socket_timeout=socket_timeout_s,
                socket_connect_timeout=socket_timeout_s,
            )  # fmt: skip
            policy = self._r.config_get("maxmemory-policy").get("maxmemory-policy", "noeviction")
        except self._errors as exc:
            raise OnlineStoreError(f"online store {self._where()}: {exc}") from None
        if policy in EVICTING and not allow_eviction:
            raise OnlineStoreError(
                f"online store {self._where()}: the server's maxmemory-policy is {policy}, which may evict freezes "
                "(keys without a TTL) under memory pressure; set it to noeviction or volatile-*, or pass "
                "allow_eviction=True"
            )
        self.eviction_policy = policy

    def _where(self) -> str:
        host = self.url.split("@")[-1]  # never a password in a message
        return f"redis://{host.removeprefix('redis://')} ({self.prefix})"

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def close(self) -> None:
        self._r.close()

    # -- snapshots ------------------------------------------------------------------------------------------------

    def write_snapshot(self, views: Mapping[str, pl.DataFrame], *, as_of: date, partition: str) -> None:
        now = datetime.now(UTC).isoformat()
        try:
            staging = self._r.pipeline(transaction=False)
            for view, frame in views.items():
                fields = self.features.view_fields[view]
                nxt = self._key("next", view)
                staging.delete(nxt)
                mapping = {key: _pack(values) for key, *values in frame.select("key", *fields).iter_rows()}
                items = list(mapping.items())
                for start in range(0, len(items), 10_000):
                    staging.hset(nxt, mapping=dict(items[start : start + 10_000]))
            staging.execute()
            switch = self._r.pipeline(transaction=True)  # MULTI/EXEC: every view switches at once
            for view, frame in views.items():
                current = self._key("view", view)
                if frame.height:
                    switch.rename(self._key("next", view), current)
                    if self.snapshot_ttl_s is None:
                        switch.persist(current)
                    else:
                        switch.expire(current, self.snapshot_ttl_s)
                else:
                    switch.delete(current)
            switch.hset(self._key("meta"), mapping={"last_write_at": now, "as_of": as_of.isoformat(),
                                                     "partition": partition})  # fmt: skip
            switch.execute()
        except self._errors as exc:
            raise OnlineStoreError(f"online store {self._where()}: writing the snapshot failed: {exc}") from None

    def lookup(self, view: str, keys: list[str]) -> dict[str, dict[str, Any]]:
        fields = self.features.view_fields[view]
        found = self.lookup_many({view: keys})[view]
        return {k: dict(zip(fields, v, strict=True)) for k, v in found.items()}

    def lookup_many(self, requests: Mapping[str, list[str]]) -> dict[str, dict[str, tuple]]:
        """Every view's keys in one pipelined round trip (an HMGET per view)."""
        asked = [(view, list(dict.fromkeys(keys))) for view, keys in requests.items() if keys]
        out: dict[str, dict[str, tuple]] = {view: {} for view in requests}
        if not asked:
            return out
        try:
            pipe = self._r.pipeline(transaction=False)
            for view, keys in asked:
                pipe.hmget(self._key("view", view), keys)
            answers = pipe.execute()
        except self._errors as exc:
            raise OnlineStoreError(f"online store {self._where()}: {exc}") from None
        for (view, keys), values in zip(asked, answers, strict=True):
            n = len(self.features.view_fields[view])
            out[view] = {k: _unpack(v, n) for k, v in zip(keys, values, strict=True) if v is not None}
        return out

    def health(self) -> StoreHealth:
        try:
            pipe = self._r.pipeline(transaction=False)
            pipe.hgetall(self._key("meta"))
            for view in self.features.view_fields:
                pipe.hlen(self._key("view", view))
            meta_raw, *counts = pipe.execute()
        except self._errors as exc:
            return StoreHealth(False, None, None, {}, str(exc))
        meta = {k.decode(): v.decode() for k, v in meta_raw.items()}
        return StoreHealth(
            reachable=True,
            last_write_at=datetime.fromisoformat(meta["last_write_at"]) if "last_write_at" in meta else None,
            as_of=date.fromisoformat(meta["as_of"]) if "as_of" in meta else None,
            rows_per_view={v: int(c) for v, c in zip(self.features.view_fields, counts, strict=True) if c},
        )

    # -- freezes ----------------------------------------------------------------------------------------------

    def freeze(self, feature: str, reason: str, value: float | None = None, at: datetime | None = None) -> None:
        default = self.feature_default(feature)  # an unknown feature is an error even with a value
        value = default if value is None else value
        now = (at or datetime.now(UTC)).isoformat()
        event = {"feature": feature, "action": "freeze", "reason": reason, "at": now, "value": value}
        try:
            pipe = self._r.pipeline(transaction=True)
            pipe.hset(self._key("freezes"), feature, json.dumps({"value": value, "reason": reason, "frozen_at": now}))
            pipe.rpush(self._key("freeze_log"), json.dumps(event))
            pipe.persist(self._key("freezes"))
            pipe.persist(self._key("freeze_log"))
            pipe.execute()
        except self._errors as exc:
            raise OnlineStoreError(f"online store {self._where()}: freezing {feature} failed: {exc}") from None

    def unfreeze(self, feature: str, reason: str, at: datetime | None = None) -> None:
        now = (at or datetime.now(UTC)).isoformat()
        event = json.dumps({"feature": feature, "action": "unfreeze", "reason": reason, "at": now, "value": None})
        # Removed and logged in one step, only when it was frozen (a Lua script: atomic on the server).
        script = (
            "if redis.call('HDEL', KEYS[1], ARGV[1]) == 1 then redis.call('RPUSH', KEYS[2], ARGV[2]) return 1 end "
            "return 0"
        )
        try:
            self._r.eval(script, 2, self._key("freezes"), self._key("freeze_log"), feature, event)
        except self._errors as exc:
            raise OnlineStoreError(f"online store {self._where()}: unfreezing {feature} failed: {exc}") from None

    def frozen(self) -> dict[str, float]:
        try:
            raw = self._r.hgetall(self._key("freezes"))
        except self._errors as exc:
            raise OnlineStoreError(f"online store {self._where()}: {exc}") from None
        return {k.decode(): json.loads(v)["value"] for k, v in raw.items()}

    def freeze_log(self) -> list[FreezeEvent]:
        try:
            raw = self._r.lrange(self._key("freeze_log"), 0, -1)
        except self._errors as exc:
            raise OnlineStoreError(f"online store {self._where()}: {exc}") from None
        events = [json.loads(e) for e in raw]
        return [
            FreezeEvent(e["feature"], e["action"], e["reason"], datetime.fromisoformat(e["at"]), e["value"])
            for e in events
        ]

    def drop(self) -> None:
        """Delete every key under the prefix (tests, or retiring a deployment's store)."""
        keys = list(self._r.scan_iter(match=f"{self.prefix}:*", count=1000))
        if keys:
            self._r.delete(*keys)
