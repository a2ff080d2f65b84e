"""Per-model memory pools: the CPU path (byte accounting, what CI runs) and, where cupy sees a device, the GPU path
with real cupy MemoryPools."""

from __future__ import annotations

import gc

import numpy as np
import polars as pl
import pytest

from gpu_runtime.pools import HEADROOM, ModelMemoryPool, PoolBudgetExceeded, PoolRegistry
from keel.drift import build_reference, compare
from keel.kernels import numpy_backend
from tests.gpu import cupy_backend_or_none

GPU = cupy_backend_or_none()
BACKENDS = [pytest.param(numpy_backend(), id="cpu")] + [
    pytest.param(GPU, id="gpu", marks=pytest.mark.gpu)
    if GPU
    else pytest.param(
        None, id="gpu", marks=[pytest.mark.gpu, pytest.mark.skip(reason="no CUDA device visible to cupy here")]
    )
]
MB = 1 << 20


@pytest.mark.parametrize("b", BACKENDS)
def test_limit_is_budget_times_headroom_and_over_budget_names_the_model(b):
    pools = PoolRegistry({"model-a": 10 * MB, "model-b": 10 * MB}, array_backend=b)
    a, other = pools["model-a"], pools["model-b"]
    assert a.limit_bytes == int(10 * MB * HEADROOM)
    with a.use():
        held = a.empty((11 * MB // 8,))  # 11 MB: over the budget, within the 12 MB limit
        assert a.bytes_in_use() >= 11 * MB
        with pytest.raises(PoolBudgetExceeded, match="model model-a") as err:
            a.empty((2 * MB // 8,))  # 13 MB in all: over the limit
    assert err.value.model == "model-a" and err.value.limit == a.limit_bytes
    with other.use():
        fine = other.empty((11 * MB // 8,))  # the other model's pool is untouched by a's trouble
    assert other.bytes_in_use() >= 11 * MB
    del held, fine
    gc.collect()
    if b.name == "numpy":
        assert a.bytes_in_use() == 0 and a.peak_bytes() >= 11 * MB  # freed arrays give their bytes back


def test_unknown_model_has_no_pool():
    with pytest.raises(KeyError, match="no memory budget configured"):
        PoolRegistry({"model-a": MB}, array_backend=numpy_backend())["model-z"]
    with pytest.raises(ValueError, match="must be positive"):
        ModelMemoryPool("m", 0, array_backend=numpy_backend())


@pytest.mark.parametrize("b", BACKENDS)
def test_drift_kernels_run_in_the_models_pool_and_fail_only_over_budget(b):
    rng = np.random.default_rng(0)
    ref = pl.DataFrame({"x": rng.normal(0, 1, 50_000), "y": rng.normal(5, 2, 50_000)})
    cur = pl.DataFrame({"x": rng.normal(0.5, 1, 200_000), "y": rng.normal(5, 2, 200_000)})
    profile = build_reference(ref, window="ref", numeric=["x", "y"], categorical=[])
    roomy = ModelMemoryPool("flight-delay", 64 * MB, array_backend=b)
    pooled = compare(profile, cur, window="cur", pool=roomy)
    plain = compare(profile, cur, window="cur", b=numpy_backend())
    assert [f.value for f in pooled.features] == pytest.approx([f.value for f in plain.features], rel=1e-9)
    assert roomy.peak_bytes() >= 200_000 * 8  # the current sample was held in the pool
    tight = ModelMemoryPool("flight-delay", 1 * MB, array_backend=b)  # 1.2 MB cannot hold 1.6 MB of samples
    with pytest.raises(PoolBudgetExceeded, match="flight-delay"):
        compare(profile, cur, window="cur", pool=tight)


def test_the_pools_resource_makes_its_pools_when_a_run_asks_not_when_the_code_loads():
    """The drift assets' pools come from the ``memory_pools`` resource: its budgets are configuration, and no pool
    (on a GPU machine: no cupy memory pool) exists until an asset asks for one; then the same one each time."""
    from resources import MemoryPoolsResource

    resource = MemoryPoolsResource(budgets={"flight-delay": 8 * MB})
    assert resource._registry is None
    pool = resource.pool("flight-delay")
    assert pool is resource.pool("flight-delay") and pool.limit_bytes == int(8 * MB * HEADROOM)
    with pytest.raises(KeyError, match="no memory budget configured"):
        resource.pool("another-model")
