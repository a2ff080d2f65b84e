"""The gateway and Python's garbage collector: start-up objects frozen out of it, collections timed.

A full collection walks every tracked object with the event loop stopped meanwhile; in a gateway of ~250 MB that is
a pause of tens to hundreds of milliseconds, often enough under a flood's allocations to cost the top tier its
deadline (issue 45's overload drill). docs/serving.md, "Garbage collection".
"""

from __future__ import annotations

import time
from collections import deque

from gpu_runtime.gateway.metrics import Metrics


def freeze_startup_objects() -> None:
    """Freeze what start-up made (modules, the use cases, the models' state: hundreds of thousands of objects that
    live as long as the process) out of Python's garbage collector — for a serving process, once it is ready.

    A full collection walks every tracked object, the event loop stopped meanwhile: in a gateway of ~250 MB that is
    a pause of tens to hundreds of milliseconds, often enough under a flood's allocations to cost the top tier its
    deadline. ``gc.freeze()`` moves the objects alive now to a generation the collector never scans (what CPython
    documents for servers); collections then walk only what requests allocate."""
    import gc

    gc.collect()
    gc.freeze()


class CollectionTimer:
    """Times every garbage collection (each stops the event loop for its duration) for
    ``keel_gateway_gc_seconds{generation}``. The collector's callback only appends to a deque — it runs wherever a
    collection happens to start, a thread holding the metrics' lock included, so it must take no lock —; ``flush``
    moves what it saw into the metrics (Gateway.refresh_gauges, the watcher)."""

    def __init__(self, metrics: Metrics):
        import gc

        self.metrics = metrics
        self.seen: deque[tuple[int, float]] = deque(maxlen=10_000)
        self._started = 0.0
        gc.callbacks.append(self._timed)

    def _timed(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seen.append((info["generation"], time.perf_counter() - self._started))

    def flush(self) -> None:
        while self.seen:
            generation, seconds = self.seen.popleft()
            self.metrics.observe("keel_gateway_gc_seconds", {"generation": str(generation)}, seconds)

    def close(self) -> None:
        import gc

        if self._timed in gc.callbacks:
            gc.callbacks.remove(self._timed)
