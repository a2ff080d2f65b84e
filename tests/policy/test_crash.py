"""Crash and concurrency tests with real processes, on each control-plane backend (a SQLite file, a schema of the real
Postgres server): kill -9 of the writer, and two writers at once."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import time

import pytest

from keel.policies import PolicyStore
from tests.control_plane import env_for, url_of

pytestmark = pytest.mark.slow

WRITER = textwrap.dedent(
    """
    import sys
    from keel.policies import PolicyStore
    store = PolicyStore(sys.argv[1])
    who, count = sys.argv[2], int(sys.argv[3])
    for i in range(count):
        body = {"error_rate": 0.05, "window_s": 5, "min_requests": 20, "open_s": 1 + (i % 50),
                "half_open_probes": 5}
        c = store.apply({f"breaker-{who}": ("circuit_breaker", body)}, author=who, reason=f"{who} {i}")
        print(f"ACK {c.version} {who} {i} {c.hash}", flush=True)  # acknowledged: apply returned
    """
)


def acks(text: str) -> list[tuple[int, str, int, str]]:
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0] == "ACK":
            out.append((int(parts[1]), parts[2], int(parts[3]), parts[4]))
    return out


def test_kill_9_of_the_writer_200_times_loses_no_acknowledged_commit(location):
    path, env = url_of(location), os.environ | env_for(location)
    rng = random.Random(2013)
    acknowledged = []
    waited_for = 0
    for _ in range(200):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, path, "w", "100000"], stdout=subprocess.PIPE, text=True, env=env
        )
        # Wait for k acknowledged commits (the event, not a clock: any machine speed), then kill within a few
        # milliseconds — in start-up (k = 0), inside a transaction, an fsync, or between commits.
        k, seen, deadline = rng.randint(0, 4), [], time.monotonic() + 120
        while len(seen) < k and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen += acks(line)
        time.sleep(rng.uniform(0, 0.005))
        proc.kill()  # SIGKILL: no clean-up of any kind
        out, _ = proc.communicate()
        assert len(seen) == k, f"the writer died before {k} commits: {out[-2000:]}"
        waited_for += k
        acknowledged += seen + acks(out)
    store = PolicyStore(location)
    result = store.verify()  # hash chain, gap-free versions, policy rows = commits, (SQLite) PRAGMA integrity_check
    assert result.ok, result.problems
    log = {c.version: c for c in store.log()}
    assert len(acknowledged) >= waited_for > 200  # the kills landed among real commits, not only at start-up
    for version, _who, i, h in acknowledged:
        assert version in log and log[version].hash == h and log[version].reason == f"w {i}"
    store.close()


def test_two_writers_2000_commits_each_gap_free_and_never_locked(location):
    path, env = url_of(location), os.environ | env_for(location)
    PolicyStore(location).close()  # create the schema once
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, path, who, "2000"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for who in ("a", "b")
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and "locked" not in err, err[-2000:]
    got = acks(outs[0][0]) + acks(outs[1][0])
    assert len(got) == 4000
    store = PolicyStore(location)
    versions = [c.version for c in store.log()]
    assert versions == list(range(1, 4001))  # gap-free, each acknowledged version exactly once
    assert sorted(v for v, *_ in got) == versions
    assert store.verify().ok
    per_writer = {w: [i for _v, who, i, _h in sorted(got) if who == w] for w in ("a", "b")}
    assert per_writer["a"] == list(range(2000)) and per_writer["b"] == list(range(2000))  # each in its own order
    final = store.state()  # each writer's policy holds its last write (i = 1999: open_s = 1 + 1999 % 50)
    for who in ("a", "b"):
        assert final[f"breaker-{who}"].body["open_s"] == 1 + 1999 % 50
        assert final[f"breaker-{who}"].version == max(v for v, w, *_ in got if w == who)
    store.close()
