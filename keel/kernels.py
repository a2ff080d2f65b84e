"""Array kernels behind one API: cupy on a GPU, numpy on the CPU.

``backend()`` picks cupy when it imports and sees a device (``KEEL_ARRAY_BACKEND=numpy`` forces the CPU), else
numpy. Every kernel takes and returns arrays of the chosen module (``xp``) and plain Python floats for scalars, so
callers never branch on the device. CI has no GPU: the numpy path is what its tests run; tests/test_kernels.py runs
the same checks on cupy where a device is visible.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ArrayBackend:
    name: str  # "numpy" | "cupy"
    xp: Any

    def asarray(self, values: Any) -> Any:
        return self.xp.asarray(values, dtype=self.xp.float64)

    def to_numpy(self, values: Any) -> np.ndarray:
        return values.get() if self.name == "cupy" else np.asarray(values)


@lru_cache(maxsize=1)
def backend() -> ArrayBackend:
    forced = os.environ.get("KEEL_ARRAY_BACKEND", "").lower()
    if forced != "numpy":
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() > 0:
                return ArrayBackend("cupy", cupy)
        except Exception:  # no cupy, no driver, no device: the CPU path
            if forced == "cupy":
                raise
    return ArrayBackend("numpy", np)


def numpy_backend() -> ArrayBackend:
    return ArrayBackend("numpy", np)


def finite_sorted(b: ArrayBackend, values: Any) -> Any:
    """The finite values, sorted: the reference sketch of a numeric feature."""
    xp = b.xp
    arr = b.asarray(values)
    arr = arr[xp.isfinite(arr)]
    return xp.sort(arr)


def wasserstein_ks(b: ArrayBackend, ref_sorted: Any, cur_sorted: Any) -> tuple[float, float]:
    """Exact W1 distance and KS statistic between two sorted samples, in one merge (O(n + m) after sorting).

    The two samples are merged by position (a searchsorted of the current values into the reference), the empirical
    CDFs are running counts over the merged order, W1 = Σ |F - G| Δx and KS = max |F - G| at the ends of tie groups.
    """
    xp = b.xp
    n, m = int(ref_sorted.size), int(cur_sorted.size)
    total = n + m
    pos = xp.searchsorted(ref_sorted, cur_sorted, side="right") + xp.arange(m)
    is_cur = xp.zeros(total, dtype=xp.bool_)
    is_cur[pos] = True
    merged = xp.empty(total, dtype=xp.float64)
    merged[pos] = cur_sorted
    merged[~is_cur] = ref_sorted
    g = xp.cumsum(is_cur, dtype=xp.int64)
    f = xp.arange(1, total + 1, dtype=xp.int64) - g
    d = xp.abs(f / n - g / m)
    gaps = xp.diff(merged)
    w = float(xp.sum(d[:-1] * gaps))
    group_end = xp.concatenate([gaps != 0, xp.ones(1, dtype=xp.bool_)])
    ks = float(xp.max(d[group_end]))
    return w, ks


def bin_counts(b: ArrayBackend, sorted_values: Any, inner_edges: Any) -> Any:
    """Counts of a sorted sample in the bins (-inf, e0], (e0, e1], ..., (e_last, inf)."""
    xp = b.xp
    cuts = xp.searchsorted(sorted_values, inner_edges, side="right")
    bounds = xp.concatenate([xp.zeros(1, dtype=cuts.dtype), cuts, xp.asarray([sorted_values.size], dtype=cuts.dtype)])
    return xp.diff(bounds)
