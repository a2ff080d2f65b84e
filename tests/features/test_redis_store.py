"""The Redis online store on the machine's real Redis server: what it guarantees beyond the parity tests — the same
lookups as SQLite key for key, atomic snapshots under concurrent reads, the explicit expiry policy, a refused
evicting server, errors that never show a password."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import redis

from keel.features.online import OnlineStoreError
from keel.features.redis_store import RedisOnlineStore
from tests.features.conftest import REDIS_URL, online_store
from tests.features.test_parity import DAY
from usecases.flights.features import FLIGHT_FEATURES, build_views


@pytest.fixture(scope="module")
def views(validated):
    return build_views(validated["weather"], validated["planes"], validated["flights"], as_of=DAY)


def every_key(views) -> dict[str, list[str]]:
    return {view: frame["key"].to_list() for view, frame in views.items()}


def test_every_key_reads_back_as_sqlite_reads_it(views, tmp_path):
    with online_store("sqlite", tmp_path) as sqlite, online_store("redis", tmp_path) as red:
        for s in (sqlite, red):
            s.write_snapshot(views, as_of=DAY, partition="2013-02")
        keys = every_key(views) | {"weather": every_key(views)["weather"] + ["EWR|2030-01-01T00:00:00+00:00"]}
        assert red.lookup_many(keys) == sqlite.lookup_many(keys)
        assert red.lookup("plane", keys["plane"][:50]) == sqlite.lookup("plane", keys["plane"][:50])
        h_red, h_sql = red.health(), sqlite.health()
        assert h_red.rows_per_view == h_sql.rows_per_view and h_red.as_of == h_sql.as_of == DAY
        assert h_red.reachable and h_red.last_write_at is not None


def test_a_reader_sees_the_old_snapshot_or_the_new_one_never_half(validated, views, tmp_path):
    later = DAY + timedelta(days=7)
    newer = build_views(validated["weather"], validated["planes"], validated["flights"], as_of=later)
    history = [v for v in FLIGHT_FEATURES.view_fields if v not in ("weather", "plane")]
    probe = {v: views[v]["key"].head(200).to_list() for v in history}  # rates differ between the two days
    with online_store("redis", tmp_path) as s:
        s.write_snapshot(views, as_of=DAY, partition="2013-02")
        old = s.lookup_many(probe)
        reads, stop = [], threading.Event()

        def read() -> None:
            reader = RedisOnlineStore(REDIS_URL, features=FLIGHT_FEATURES, prefix=s.prefix)
            while not stop.is_set():
                reads.append(reader.lookup_many(probe))
            reader.close()

        t = threading.Thread(target=read)
        t.start()
        for _ in range(5):  # back and forth: every switch happens under the reader
            s.write_snapshot(newer, as_of=later, partition="2013-02")
            s.write_snapshot(views, as_of=DAY, partition="2013-02")
        s.write_snapshot(newer, as_of=later, partition="2013-02")
        stop.set()
        t.join(timeout=60)
        new = s.lookup_many(probe)
    assert new != old and len(reads) > 10
    mixed = [r for r in reads if r not in (old, new)]
    assert not mixed, f"{len(mixed)} of {len(reads)} reads saw part of a snapshot"


def test_snapshots_expire_as_configured_and_freezes_never(views, tmp_path):
    with online_store("redis", tmp_path) as s:
        s.write_snapshot(views, as_of=DAY, partition="2013-02")
        s.freeze("temp", reason="drift")
        raw = redis.Redis.from_url(REDIS_URL)
        assert 0 < raw.ttl(s._key("view", "weather")) <= 40 * 86_400
        assert raw.ttl(s._key("freezes")) == -1 and raw.ttl(s._key("freeze_log")) == -1  # no expiry
        short = RedisOnlineStore(REDIS_URL, features=FLIGHT_FEATURES, prefix=s.prefix, snapshot_ttl_s=1)
        short.write_snapshot(views, as_of=DAY, partition="2013-02")
        key = views["weather"]["key"][0]
        deadline = time.monotonic() + 30
        while short.lookup("weather", [key]):  # wait for the expiry itself, however long the server takes
            assert time.monotonic() < deadline, "the snapshot did not expire"
            time.sleep(0.2)
        assert short.frozen() == {"temp": 55.0}  # the freeze outlived the snapshot
        forever = RedisOnlineStore(REDIS_URL, features=FLIGHT_FEATURES, prefix=s.prefix, snapshot_ttl_s=None)
        forever.write_snapshot(views, as_of=DAY, partition="2013-02")
        assert raw.ttl(s._key("view", "weather")) == -1
        for store in (short, forever):
            store.close()
        raw.close()


def test_a_server_that_may_evict_freezes_is_refused(tmp_path):
    raw = redis.Redis.from_url(REDIS_URL)
    before = raw.config_get("maxmemory-policy")["maxmemory-policy"]
    try:
        raw.config_set("maxmemory-policy", "allkeys-lru")
        with pytest.raises(OnlineStoreError, match="maxmemory-policy is allkeys-lru"):
            RedisOnlineStore(REDIS_URL, features=FLIGHT_FEATURES, prefix="keel-test:evicting")
        RedisOnlineStore(
            REDIS_URL, features=FLIGHT_FEATURES, prefix="keel-test:evicting", allow_eviction=True
        ).close()
    finally:
        raw.config_set("maxmemory-policy", before)
        raw.close()


def test_an_unreachable_server_is_a_clear_error_without_the_password():
    with pytest.raises(OnlineStoreError) as err:
        RedisOnlineStore("redis://:s3cret@127.0.0.1:1/0", features=FLIGHT_FEATURES, socket_timeout_s=1)
    assert "127.0.0.1:1/0" in str(err.value) and "s3cret" not in str(err.value)
