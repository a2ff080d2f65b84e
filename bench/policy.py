"""Policy store speed: commits per second with fsync (WAL, synchronous=FULL), and point-in-time lookups.

One run, one file system (the directory given, default a temporary one on the same disk as the repository):

- keel: ``PolicyStore.apply`` — validation, BEGIN IMMEDIATE, the hash chain, two inserts, COMMIT with fsync;
- the floor: the same two rows inserted with plain sqlite3 in the same mode (WAL, synchronous=FULL), one
  transaction each, no validation and no hashing — what any durable SQLite log pays;
- lookups on the resulting log of N commits: ``at(timestamp)`` (the commit in force and every policy as of it),
  ``state(version)``, ``commit(version)``; p50/p99 over random points.

    .venv/bin/python bench/policy.py [--commits 2000] [--lookups 2000] [--dir DIR]
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

from keel.policies import PolicyStore  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
T0 = datetime(2013, 6, 1, tzinfo=UTC)


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
    args = parser.parse_args()
    if args.dir is None:
        with tempfile.TemporaryDirectory(prefix=".bench-policy-", dir=REPO) as tmp:  # same disk as the repo
            return run(Path(tmp), args)
    args.dir.mkdir(parents=True, exist_ok=True)
    return run(args.dir, args)


def run(root: Path, args: argparse.Namespace) -> int:
    print(f"databases in {root}")

    floor_rate = floor(root / "floor.sqlite", args.commits)
    store = PolicyStore(root / "policies.sqlite")
    t0 = time.perf_counter()
    for i in range(1, args.commits + 1):
        store.apply(
            {f"p{i % 5}": ("circuit_breaker", body(i))},
            author="bench",
            reason=f"commit {i}",
            at=T0 + timedelta(seconds=i),
        )
    keel_rate = args.commits / (time.perf_counter() - t0)

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
    ok = store.verify().ok
    store.close()

    print(f"\ncommits/s with fsync (WAL, synchronous=FULL), {args.commits} commits:")
    print(f"  keel PolicyStore.apply   {keel_rate:9.0f}/s")
    print(f"  bare sqlite3 floor       {floor_rate:9.0f}/s   floor/keel {floor_rate / keel_rate:.2f}x")
    print(f"\nlookups on a log of {args.commits} commits, {args.lookups} each (ms):")
    for name, t in times.items():
        print(f"  {name:<18} p50 {statistics.median(t):.3f}  p99 {pct(t, 0.99):.3f}")
    print(f"\nhash chain and integrity after the run: {'ok' if ok else 'BROKEN'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
