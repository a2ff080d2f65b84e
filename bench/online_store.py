"""Online store reads: the shared Redis store vs the embedded SQLite store, on the same real snapshot, one run.

The snapshot: the online views as of 2013-02-15 (real January–February flights, weather and planes), written to a
SQLite file and to a key prefix of its own on the machine's Redis server (127.0.0.1:6379). Then, interleaved, the
same requests against each store (closed loop, one at a time; p50/p99 per way):

- ``lookup_many`` of 100 distinct keys across the weather, plane and history views (what a small batch needs),
  fresh random keys each call;
- ``get_online_features`` for one flight (the gateway's batch-1 read: 5 keys in 5 views) and for 100 flights;

SQLite without its read cache (every key read from the file) and with the gateway's cache (200,000 entries, warm).
Target (issue 19): 100-key reads on Redis at p99 ≤ 2 ms.

    .venv/bin/python bench/online_store.py [--requests 2000] [--redis redis://127.0.0.1:6379/0]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import polars as pl  # noqa: E402

from keel.features.online import get_online_features  # noqa: E402
from keel.features.redis_store import RedisOnlineStore  # noqa: E402
from keel.features.sqlite_store import SQLiteOnlineStore  # noqa: E402
from usecases.flights import usecase as FLIGHTS  # noqa: E402
from usecases.flights.data import read_raw, read_raw_month  # noqa: E402
from usecases.flights.features import (  # noqa: E402
    FLIGHT_FEATURES,  # noqa: E402
    REQUEST_COLUMNS,
    build_views,
)

AS_OF = date(2013, 2, 15)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()

    refs = {"planes.tailnum": read_raw("planes")["tailnum"]}
    valid = {
        t: pl.concat([FLIGHTS.compiled_contract(t).validate(read_raw_month(t, m), references=refs).valid
                      for m in ("2013-01", "2013-02")])
        for t in ("flights", "weather")
    }  # fmt: skip
    views = build_views(valid["weather"], read_raw("planes"), valid["flights"], as_of=AS_OF)
    flights = (
        valid["flights"]
        .filter(pl.col("month") == 2)
        .with_columns(pl.date(pl.col("year"), pl.col("month"), pl.col("day")).alias("sched_date"))
    )
    rows = flights.select(REQUEST_COLUMNS).to_dicts()
    tmp = Path(tempfile.mkdtemp(prefix="keel-bench-online-"))
    sqlite = SQLiteOnlineStore(tmp / "features.sqlite", features=FLIGHT_FEATURES)
    cached = SQLiteOnlineStore(tmp / "features.sqlite", features=FLIGHT_FEATURES, cache_size=200_000)
    redis_store = RedisOnlineStore(args.redis, features=FLIGHT_FEATURES, prefix=f"keel-bench:{uuid.uuid4().hex}")
    try:
        for s in (sqlite, redis_store):
            s.write_snapshot(views, as_of=AS_OF, partition="2013-02")
        keys = {v: f["key"].to_list() for v, f in views.items()}
        rng = random.Random(2013)
        per_view = {v: min(len(k), 100 // len(keys)) for v, k in keys.items()}  # 100 distinct keys in all:
        for v in sorted(keys, key=lambda v: -len(keys[v])):  # the small views whole, the rest from the large ones
            per_view[v] += min(len(keys[v]) - per_view[v], 100 - sum(per_view.values()))
        key_sets = [{v: rng.sample(keys[v], n) for v, n in per_view.items()} for _ in range(args.requests)]
        ones = [[rows[rng.randrange(len(rows))]] for _ in range(args.requests)]
        hundreds = [rng.sample(rows, 100) for _ in range(max(100, args.requests // 10))]
        assert redis_store.lookup_many(key_sets[0]) == sqlite.lookup_many(key_sets[0])  # the same answers first
        stores = {"SQLite": sqlite, "SQLite, cache": cached, "Redis": redis_store}
        for s in stores.values():  # warm: the cache, the file's pages, the connection
            for batch in hundreds[:20]:
                get_online_features(s, batch)
        ways = {
            "lookup_many 100 keys": (key_sets, lambda s, k: s.lookup_many(k)),
            "get_online_features 1 flight": (ones, get_online_features),
            "get_online_features 100 flights": (hundreds, get_online_features),
        }
        results: dict[tuple[str, str], list[float]] = {}
        for way, (inputs, fn) in ways.items():
            for item in inputs:
                for name, s in stores.items():
                    t0 = time.perf_counter()
                    fn(s, item)
                    results.setdefault((way, name), []).append((time.perf_counter() - t0) * 1000)
            print(f"{way}: {len(inputs)} calls per store done", flush=True)
    finally:
        redis_store.drop()
        for s in (sqlite, cached, redis_store):
            s.close()

    print(f"\n{'way':<34} {'store':<14} {'p50 ms':>8} {'p99 ms':>8}")
    for (way, name), lat in results.items():
        print(f"{way:<34} {name:<14} {statistics.median(lat):>8.3f} {pct(lat, 0.99):>8.3f}")
    for way in ways:
        r, s = results[(way, "Redis")], results[(way, "SQLite")]
        print(
            f"{way}: Redis ÷ SQLite p50 {statistics.median(r) / statistics.median(s):.2f}×, "
            f"p99 {pct(r, 0.99) / pct(s, 0.99):.2f}×"
        )
    p99 = pct(results[("lookup_many 100 keys", "Redis")], 0.99)
    print(f"Redis 100-key reads p99 {p99:.3f} ms (target ≤ 2 ms: {'met' if p99 <= 2 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
