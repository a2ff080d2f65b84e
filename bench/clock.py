"""The cost of the shared clock on the gateway's request path: what stamping an exposure costs now that the
timestamp is the live year's simulated time.

Same process, same run, interleaved in rounds; nanoseconds per call, medians over rounds:

- ``time.time()``: what the gateway stamped before (and still does without a clock file);
- ``ServedModel.now()`` with no clock configured (the backfill and every test's gateway);
- ``ServedModel.now()`` following a live clock file (the live year: the state is re-read at most every 0.5 s);
- ``SimClock.now()``: reading and parsing the clock file on every call — what the gateway avoids by caching.

    .venv/bin/python bench/clock.py [--calls 200000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from keel.clock import SimClock  # noqa: E402


class _Stamp:
    """The gateway's ``now`` on its own (gpu_runtime.gateway.model.ServedModel.now), without building a whole gateway:
    the method is bound to an object with the attributes it reads."""

    def __init__(self, clock: SimClock | None):
        from gpu_runtime.gateway.metrics import Metrics
        from gpu_runtime.gateway.model import ServedModel

        self._clock, self._clock_state, self._clock_checked = clock, None, 0.0
        self.metrics = Metrics()
        self.now = ServedModel.now.__get__(self)


def per_call_ns(fn, calls: int) -> float:
    t = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t) / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        clock = SimClock(Path(tmp) / "clock.json")
        clock.start(datetime(2013, 4, 1, 12, tzinfo=UTC))
        ways = {
            "time.time()": time.time,
            "ServedModel.now(), no clock": _Stamp(None).now,
            "ServedModel.now(), live clock": _Stamp(clock).now,
            "SimClock.now() (file per call)": clock.now,
        }
        calls = {name: args.calls if "file" not in name else max(args.calls // 50, 1000) for name in ways}
        results: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, fn in ways.items():
                results[name].append(per_call_ns(fn, calls[name]))
    base = statistics.median(results["time.time()"])
    print(f"{'way':<32} {'ns/call (median)':>17} {'× time.time()':>14}")
    for name, values in results.items():
        m = statistics.median(values)
        print(f"{name:<32} {m:>17,.0f} {m / base:>14.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
