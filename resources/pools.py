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
    # model → bytes, over the budgets the use cases declare (``Serving.pool_budget_bytes``, keel/usecase.py)
    budgets: dict[str, int] = {}
    _registry: PoolRegistry | None = PrivateAttr(default=None)

    def registry(self) -> PoolRegistry:
        if self._registry is None:
            self._registry = PoolRegistry(self.budgets)
        return self._registry

    def pool(self, model: str, declared_bytes: int | None = None) -> ModelMemoryPool:
        """``model``'s pool: its configured budget, else ``declared_bytes`` (its use case's declaration)."""
        if declared_bytes is not None:
            return self.registry().ensure(model, declared_bytes)
        return self.registry()[model]
