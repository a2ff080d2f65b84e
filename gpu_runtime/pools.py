"""Per-model memory pools: each model's array work draws from its own pool, capped at budget × headroom.

On a GPU (cupy sees a device) a pool is a ``cupy.cuda.MemoryPool`` with ``set_limit(budget × 1.2)``; inside
``pool.use()`` every cupy allocation goes to that pool (``cupy.cuda.using_allocator``), so one model's kernels
cannot take another's memory, and cupy's OutOfMemoryError becomes ``PoolBudgetExceeded`` naming the model.
On the CPU the same API does byte accounting: arrays made through the pool (``asarray``, ``empty``) count until
they are garbage-collected, and going over the limit raises the same error. Either way ``bytes_in_use`` and
``limit_bytes`` feed the metrics (``keel_gpu_pool_bytes_in_use{model=…}``).

    pools = PoolRegistry({"my-model": 256 << 20})
    with pools["my-model"].use() as pool:
        x = pool.asarray(features)   # on the device, or accounted on the CPU
        ...

A model without a configured budget has no pool: asking for one is a clear error, not a silent shared pool.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from keel.errors import KeelError
from keel.kernels import ArrayBackend, backend

HEADROOM = 1.2  # the design articles' rule: a model's pool may exceed its measured budget by 20 %


class PoolBudgetExceeded(KeelError):
    """A model's array work needed more memory than its pool allows; other models' pools are unaffected."""

    def __init__(self, model: str, requested: int, in_use: int, limit: int):
        super().__init__(
            f"model {model}: allocating {requested:,} bytes would exceed its memory pool "
            f"({in_use:,} of {limit:,} bytes in use; budget × {HEADROOM} headroom)"
        )
        self.model, self.requested, self.in_use, self.limit = model, requested, in_use, limit


class ModelMemoryPool:
    def __init__(
        self, model: str, budget_bytes: int, *, headroom: float = HEADROOM, array_backend: ArrayBackend | None = None
    ):
        if budget_bytes <= 0:
            raise ValueError(f"model {model}: memory budget must be positive, got {budget_bytes}")
        self.model = model
        self.budget_bytes = int(budget_bytes)
        self.limit_bytes = int(budget_bytes * headroom)
        self.backend = array_backend or backend()
        self._lock = threading.Lock()
        self._cpu_in_use = 0
        self._peak = 0
        self._cupy_pool = None
        if self.backend.name == "cupy":
            import cupy

            self._cupy_pool = cupy.cuda.MemoryPool()
            self._cupy_pool.set_limit(size=self.limit_bytes)

    @property
    def on_gpu(self) -> bool:
        return self._cupy_pool is not None

    def bytes_in_use(self) -> int:
        return int(self._cupy_pool.used_bytes()) if self.on_gpu else self._cpu_in_use

    def peak_bytes(self) -> int:
        """The most this pool has held at once (on a GPU: the pool's total reserved bytes, a close upper bound)."""
        return max(self._peak, int(self._cupy_pool.total_bytes())) if self.on_gpu else self._peak

    @contextmanager
    def use(self) -> Iterator[ModelMemoryPool]:
        """Route this thread's array allocations to the pool (cupy); translate out-of-memory to this model's error."""
        if not self.on_gpu:
            yield self
            return
        import cupy

        try:
            with cupy.cuda.using_allocator(self._cupy_pool.malloc):
                yield self
        except cupy.cuda.memory.OutOfMemoryError as exc:
            raise PoolBudgetExceeded(self.model, _requested(exc), self.bytes_in_use(), self.limit_bytes) from None

    def _account(self, nbytes: int) -> None:
        with self._lock:
            if self._cpu_in_use + nbytes > self.limit_bytes:
                raise PoolBudgetExceeded(self.model, nbytes, self._cpu_in_use, self.limit_bytes)
            self._cpu_in_use += nbytes
            self._peak = max(self._peak, self._cpu_in_use)

    def _release(self, nbytes: int) -> None:
        with self._lock:
            self._cpu_in_use -= nbytes

    def _track(self, arr: np.ndarray) -> np.ndarray:
        weakref.finalize(arr, self._release, arr.nbytes)
        return arr

    def empty(self, shape: tuple[int, ...], dtype: Any = np.float64) -> Any:
        if self.on_gpu:
            with self.use():
                return self.backend.xp.empty(shape, dtype=dtype)
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        self._account(nbytes)
        try:
            return self._track(np.empty(shape, dtype=dtype))
        except BaseException:
            self._release(nbytes)
            raise

    def asarray(self, values: Any, dtype: Any = np.float64) -> Any:
        """``values`` as an array of this pool: on the device (GPU), or a counted copy (CPU)."""
        if self.on_gpu:
            with self.use():
                return self.backend.xp.asarray(values, dtype=dtype)
        src = np.asarray(values, dtype=dtype)
        out = self.empty(src.shape, dtype)
        out[...] = src
        return out


def _requested(exc: Exception) -> int:
    import re

    m = re.search(r"allocating ([\d,]+) bytes", str(exc))
    return int(m.group(1).replace(",", "")) if m else 0


class PoolRegistry(Mapping[str, ModelMemoryPool]):
    """The pools of one process, by model name, from configured budgets (bytes)."""

    def __init__(
        self, budgets: Mapping[str, int], *, headroom: float = HEADROOM, array_backend: ArrayBackend | None = None
    ):
        self._made_with = {"headroom": headroom, "array_backend": array_backend}
        self._pools = {m: ModelMemoryPool(m, b, **self._made_with) for m, b in budgets.items()}

    def __getitem__(self, model: str) -> ModelMemoryPool:
        try:
            return self._pools[model]
        except KeyError:
            raise KeyError(
                f"model {model} has no memory budget configured (pools: {', '.join(self._pools)})"
            ) from None

    def ensure(self, model: str, budget_bytes: int) -> ModelMemoryPool:
        """``model``'s pool, made with ``budget_bytes`` if it has none yet."""
        if model not in self._pools:
            self._pools[model] = ModelMemoryPool(model, budget_bytes, **self._made_with)
        return self._pools[model]

    def __iter__(self):
        return iter(self._pools)

    def __len__(self) -> int:
        return len(self._pools)

    def usage(self) -> dict[str, tuple[int, int]]:
        """model → (bytes in use, limit)."""
        return {m: (p.bytes_in_use(), p.limit_bytes) for m, p in self._pools.items()}
