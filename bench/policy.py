"""Policy store speed on both control-plane backends: commits per second (durable), point-in-time lookups, and how
fast a follower learns of a commit.

One run, one machine: SQLite (the directory given, default a temporary one on the same disk as the repository) and
PostgreSQL (``--postgres URL``, default the local server; a fresh schema, dropped afterwards):

- keel: ``PolicyStore.apply`` — validation, a transaction that serializes writers (SQLite BEGIN IMMEDIATE; Postgres
  LOCK TABLE … IN EXCLUSIVE MODE), the hash chain, the inserts and the checkpoint, a durable COMMIT, then the
  published head and the journal;
- the floor of each backend: the same two rows inserted with the bare driver in the same durability (SQLite WAL +
  synchronous=FULL; Postgres synchronous_commit=on), one transaction each, no validation and no hashing — what any
  durable log on that database pays;
- lookups on the resulting log of N commits: ``at(timestamp)`` (the commit in force and every policy as of it),
  ``state(version)``, ``commit(version)``; p50/p99 over random points;
- pickup: from ``apply`` returning to a ``PolicyReader`` seeing the version — LISTEN/NOTIFY on Postgres; the
  gateway's poll (every POLICY_POLL_S = 0.5 s) on SQLite, where the expected pickup is half the poll interval.

    .venv/bin/python bench/policy.py [--commits 2000] [--lookups 2000] [--dir DIR] [--postgres URL | --no-postgres]
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from keel.policies import PolicyReader, PolicyStore  # noqa: E402
from keel.sqldb import location_of  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
T0 = datetime(2013, 6, 1, tzinfo=UTC)
POLL_S = 0.5  # how often the gateway looks at a SQLite store (gpu_runtime/gateway/following.py: POLICY_POLL_S)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def body(i: int) -> dict:
    return {"error_rate": 0.05, "window_s": 5, "min_requests": 20, "open_s": 1 + i % 60, "half_open_probes": 5}


def floor(path: Path, n: int) -> float:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE log (version INTEGER PRIMARY KEY, payload TEXT)")
    db.execute("CREATE TABLE state (name TEXT, version INTEGER, body TEXT, PRIMARY KEY (name, version))")
    t0 = time.perf_counter()
    for i in range(1, n + 1):
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO log VALUES (?, ?)", (i, json.dumps({"breaker": body(i)})))
        db.execute("INSERT INTO state VALUES (?, ?, ?)", (f"p{i % 5}", i, json.dumps(body(i))))
        db.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    db.close()
    return n / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--dir", type=Path, help="where the databases go (default: a temp dir next to the repo)")
    parser.add_argument("--pickups", type=int, default=50, help="commits whose pickup by a follower is timed")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres", help="the server")
    parser.add_argument("--no-postgres", dest="postgres", action="store_const", const=None)
    args = parser.parse_args()
    if args.dir is None:
        with tempfile.TemporaryDirectory(prefix=".bench-policy-", dir=REPO) as tmp:  # same disk as the repo
            return run(Path(tmp), args)
    args.dir.mkdir(parents=True, exist_ok=True)
    return run(args.dir, args)


def pg_floor(url: str, schema: str, n: int) -> float:
    import psycopg2

    db = psycopg2.connect(url)
    db.autocommit = True
    cur = db.cursor()
    cur.execute(f"CREATE SCHEMA {schema}; SET search_path TO {schema}")
    cur.execute("CREATE TABLE log (version BIGINT PRIMARY KEY, payload TEXT)")
    cur.execute("CREATE TABLE state (name TEXT, version BIGINT, body TEXT, PRIMARY KEY (name, version))")
    t0 = time.perf_counter()
    for i in range(1, n + 1):
        cur.execute("BEGIN")
        cur.execute("INSERT INTO log VALUES (%s, %s)", (i, json.dumps({"breaker": body(i)})))
        cur.execute("INSERT INTO state VALUES (%s, %s, %s)", (f"p{i % 5}", i, json.dumps(body(i))))
        cur.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    cur.execute(f"DROP SCHEMA {schema} CASCADE")
    db.close()
    return n / elapsed


def measure(location, args: argparse.Namespace) -> dict:
    """Commits/s, lookup times and pickup times of keel's store at ``location``."""
    store = PolicyStore(location)
    t0 = time.perf_counter()
    for i in range(1, args.commits + 1):
        store.apply(
            {f"p{i % 5}": ("circuit_breaker", body(i))},
            author="bench",
            reason=f"commit {i}",
            at=T0 + timedelta(seconds=i),
        )
    rate = args.commits / (time.perf_counter() - t0)

    rng = random.Random(7)
    ways = {
        "at(timestamp)": lambda: store.at(T0 + timedelta(seconds=rng.uniform(0, args.commits + 10))),
        "state(version)": lambda: store.state(rng.randint(1, args.commits)),
        "commit(version)": lambda: store.commit(rng.randint(1, args.commits)),
    }
    times = {k: [] for k in ways}
    for _ in range(args.lookups):
        for name, fn in ways.items():
            t = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t) * 1000)
    pickup = measure_pickup(store, location, args.pickups)
    ok = store.verify().ok
    store.close()
    return {"rate": rate, "times": times, "pickup": pickup, "ok": ok}


def measure_pickup(store: PolicyStore, location, n: int) -> list[float]:
    """ms from ``apply`` returning to a follower seeing the version: a listening reader (Postgres), or the
    gateway's poll of a SQLite store (a reader polling every POLL_S, started at a random phase)."""
    import select

    reader = PolicyReader(location)
    fd = reader.listen()
    out = []
    rng = random.Random(11)
    for i in range(n):
        if fd is None:  # SQLite: the poller's phase is random relative to the commit
            next_poll = time.perf_counter() + rng.uniform(0, POLL_S)
        store.apply({"pickup": ("circuit_breaker", body(i))}, author="bench", reason=f"pickup {i}")
        returned = time.perf_counter()
        want = store.version()
        if fd is not None:
            while reader.version() < want:
                select.select([fd], [], [], 1.0)
                reader.notified()
        else:
            while True:
                time.sleep(max(next_poll - time.perf_counter(), 0))
                if reader.version() >= want:
                    break
                next_poll += POLL_S
        out.append((time.perf_counter() - returned) * 1000)
    reader.close()
    return out


def report(name: str, m: dict, floor_rate: float) -> None:
    print(f"\n{name}: {len(m['times']['at(timestamp)'])} lookups of each kind")
    print(f"  keel PolicyStore.apply   {m['rate']:9.0f}/s")
    print(f"  bare driver floor        {floor_rate:9.0f}/s   floor/keel {floor_rate / m['rate']:.2f}x")
    for way, t in m["times"].items():
        print(f"  {way:<18} p50 {statistics.median(t):.3f} ms  p99 {pct(t, 0.99):.3f} ms")
    p = m["pickup"]
    print(
        f"  pickup by a follower     p50 {statistics.median(p):.2f} ms  p99 {pct(p, 0.99):.2f} ms  ({len(p)} commits)"
    )
    print(f"  hash chain and integrity after the run: {'ok' if m['ok'] else 'BROKEN'}")


def run(root: Path, args: argparse.Namespace) -> int:
    print(f"SQLite databases in {root}")
    results = {"sqlite": measure(root / "policies.sqlite", args)}
    floors = {"sqlite": floor(root / "floor.sqlite", args.commits)}
    report("SQLite (WAL, synchronous=FULL; follower polls every 0.5 s)", results["sqlite"], floors["sqlite"])
    if args.postgres:
        import os

        import psycopg2

        os.environ.setdefault("KEEL_CHAIN_KEY", "bench-policy-key")
        schema = f"keel_bench_{os.getpid()}"
        location = location_of(f"{args.postgres}?schema={schema}")
        print(f"\nPostgres: {location.shown()}")
        try:
            results["postgres"] = measure(location, args)
            floors["postgres"] = pg_floor(location.url, f"{schema}_floor", args.commits)
        finally:
            conn = psycopg2.connect(location.url)
            conn.autocommit = True
            conn.cursor().execute(
                f"DROP SCHEMA IF EXISTS {schema} CASCADE; DROP SCHEMA IF EXISTS {schema}_witness CASCADE"
            )
            conn.close()
        report("Postgres (synchronous_commit=on; follower LISTENs)", results["postgres"], floors["postgres"])
        s, p = results["sqlite"], results["postgres"]
        print("\nPostgres / SQLite:")
        print(f"  commits/s                {p['rate'] / s['rate']:.2f}x")
        for way in s["times"]:
            print(f"  {way:<18} p50 {statistics.median(p['times'][way]) / statistics.median(s['times'][way]):.2f}x")
        print(f"  pickup p50               {statistics.median(p['pickup']) / statistics.median(s['pickup']):.3f}x")
    return 0 if all(m["ok"] for m in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
