"""What the gateway's worker processes share on one machine (``python -m gpu_runtime.serve --workers N``), through
files in ``<serving>/workers/``:

- **the runtime's state** (``runtime.json``): the serving process supervises Triton and writes its state there on
  every change (``RuntimeStatusWriter``); each worker reads it (``SharedRuntimeStatus``, the interface of the
  supervisor's ``RuntimeStatus``), so every worker answers ``runtime_unavailable`` while Triton restarts and drops
  its breakers and channel after a restart;
- **tenants' rate limits** (``buckets.bin``): one token bucket per model and tenant in a memory-mapped table, taken
  under an exclusive ``flock`` (``SharedBuckets``) — a tenant's limit is the tenant's, whichever worker its
  connection landed on;
- **metrics** (``metrics-w<i>.json``): each worker writes its series every ``METRICS_EVERY_S``, and again just
  before it answers ``/metrics``, where it adds the others' counters and histograms to its own and shows their
  gauges with a ``worker`` label (``MetricsExchange``): a counter never falls between two scrapes, whichever
  workers answer them.

What stays each worker's own: its event loop, tier admission and adaptive limits, breakers (each worker judges the
calls it made), the coarse pool, routing and policy following (each follows the same files and store within a
poll), and its exposure log file (``exposures-YYYYMMDD-w<i>.jsonl``: one writer per file; readers take every file of
the directory). Across replicas (several machines) the rate limits are still per replica (issue 48).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import mmap
import os
import struct
import time
from pathlib import Path
from typing import Any

from keel.storage import write_json_atomic

SLOTS = 4096
PROBE = 16
SLOT = struct.Struct("<Qddd")  # key hash (0: empty), tokens, updated (monotonic), last used (monotonic)
METRICS_EVERY_S = 1.0
STALE_S = 10.0  # a worker's metrics older than this (it died) are not added


class SharedBuckets:
    """Token buckets shared by the workers: ``take(key, rate, burst)`` under the table's lock. The table is bounded
    (``SLOTS``); a full probe sequence evicts its least recently used bucket, as the single-process LRU does."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self.fd).st_size < SLOTS * SLOT.size:
            os.ftruncate(self.fd, SLOTS * SLOT.size)
        self.map = mmap.mmap(self.fd, SLOTS * SLOT.size)

    def take(self, key: str, rate: float, burst: float) -> bool:
        h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") or 1
        now = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the machine
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            at, tokens, updated = self._find(h, now, burst)
            tokens = min(burst, tokens + (now - updated) * rate)
            ok = tokens >= 1.0
            SLOT.pack_into(self.map, at, h, tokens - 1.0 if ok else tokens, now, now)
            return ok
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _find(self, h: int, now: float, burst: float) -> tuple[int, float, float]:
        first = h % SLOTS
        oldest, oldest_used = None, float("inf")
        for i in range(PROBE):
            at = ((first + i) % SLOTS) * SLOT.size
            key, tokens, updated, used = SLOT.unpack_from(self.map, at)
            if key == h:
                return at, tokens, updated
            if key == 0:
                return at, burst, now  # a new bucket starts full
            if used < oldest_used:
                oldest, oldest_used = at, used
        return oldest, burst, now

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


class SharedBucket:
    """One model's and tenant's bucket in the shared table, shaped like ``control.TokenBucket``."""

    def __init__(self, table: SharedBuckets, key: str, rate: float, burst: float):
        self.table, self.key, self.rate, self.capacity = table, key, rate, burst

    def take(self) -> bool:
        return self.table.take(self.key, self.rate, self.capacity)


class RuntimeStatusWriter:
    """The serving process's side: the supervisor's ``RuntimeStatus`` and Triton's pid into ``runtime.json``."""

    def __init__(self, path: Path, status: Any, pid: Any):
        self.path, self.status, self.pid = path, status, pid
        self._last: dict | None = None

    def write_if_changed(self) -> None:
        data = self.status.as_dict() | {"pid": self.pid()}
        if data != self._last:
            write_json_atomic(data, self.path)
            self._last = data


class SharedRuntimeStatus:
    """A worker's view of the runtime (the interface of ``supervisor.RuntimeStatus``), from ``runtime.json``, read
    again when the file changed (a stat at most every ``CHECK_S``)."""

    CHECK_S = 0.02

    def __init__(self, path: Path):
        self.path = path
        self._data: dict = {"state": "up", "restarts": 0}
        self._stat: tuple[int, int] | None = None
        self._checked = 0.0
        self._read()

    def _read(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.CHECK_S:
            return
        self._checked = now
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return
        if (st.st_ino, st.st_mtime_ns) != self._stat:
            try:
                self._data = json.loads(self.path.read_text())
                self._stat = (st.st_ino, st.st_mtime_ns)
            except (OSError, ValueError):
                return

    def _get(self, name: str) -> Any:
        self._read()
        return self._data.get(name)

    state = property(lambda self: self._get("state"))
    restarts = property(lambda self: self._get("restarts") or 0)
    last_failure = property(lambda self: self._get("last_failure"))

    @property
    def up(self) -> bool:
        return self.state == "up"

    def died(self) -> bool:
        """Up by the last write, but Triton's process has exited since."""
        pid = self._get("pid")
        if not pid:
            return False
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")

    def as_dict(self) -> dict:
        self._read()
        return {k: v for k, v in self._data.items() if k != "pid"}


class MetricsExchange:
    """Each worker's metrics snapshot to ``metrics-w<i>.json`` (``publish``, from the watcher and before each
    /metrics answer) and the others' (``others``, for /metrics)."""

    def __init__(self, directory: Path, index: int):
        self.directory, self.index = directory, index
        directory.mkdir(parents=True, exist_ok=True)
        self._published = 0.0

    def due(self) -> bool:
        return time.monotonic() - self._published >= METRICS_EVERY_S

    def publish(self, metrics: Any) -> None:
        self._published = time.monotonic()
        write_json_atomic(
            {"at": time.time(), "metrics": metrics.snapshot()}, self.directory / f"metrics-w{self.index}.json"
        )

    def others(self) -> dict[int, dict]:
        out = {}
        for path in self.directory.glob("metrics-w*.json"):
            index = path.stem.removeprefix("metrics-w")
            if not index.isdigit() or int(index) == self.index:
                continue
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if time.time() - data.get("at", 0) <= STALE_S:
                out[int(index)] = data["metrics"]
        return out
