"""Per-model GPU memory pools as a Dagster resource: the budgets are configuration (shown in the UI), the pools are
made the first time a run asks for one — not when the code location loads — and live as long as the run's process.

On a machine with a GPU (cupy sees a device) each pool is a cupy memory pool capped at its budget × 1.2 headroom;
elsewhere the same API counts the bytes of the numpy arrays it hands out (gpu_runtime/pools.py).
"""

from __future__ import annotations

import dagster as dg
from pydantic import PrivateAttr

from gpu_runtime.pools import ModelMemoryPool, PoolRegistry


class MemoryPoolsResource(dg.ConfigurableResource):
    # model → bytes: a month of flight features is ~30k rows × 15 columns, a few MB; 64 MiB leaves room for a year
    budgets: dict[str, int] = {"flight-delay": 64 << 20}
    _registry: PoolRegistry | None = PrivateAttr(default=None)

    def registry(self) -> PoolRegistry:
        if self._registry is None:
            self._registry = PoolRegistry(self.budgets)
        return self._registry

    def pool(self, model: str) -> ModelMemoryPool:
        return self.registry()[model]
