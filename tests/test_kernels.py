"""The array-kernel API: numpy here and in CI; the same checks on cupy where a GPU is visible."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from keel.kernels import backend, bin_counts, finite_sorted, numpy_backend, wasserstein_ks
from tests.gpu import cupy_backend_or_none

BACKENDS = [pytest.param(numpy_backend(), id="numpy")]
_gpu = cupy_backend_or_none()
BACKENDS.append(
    pytest.param(_gpu, id="cupy", marks=pytest.mark.gpu)
    if _gpu
    else pytest.param(
        None,
        id="cupy",
        marks=[pytest.mark.gpu, pytest.mark.skip(reason="no CUDA device visible to cupy on this machine")],
    )
)


@pytest.mark.parametrize("b", BACKENDS)
def test_kernels_match_scipy(b):
    rng = np.random.default_rng(0)
    ref, cur = rng.normal(0, 1, 100_000), np.concatenate([rng.normal(0.2, 1.3, 80_000), [np.nan, np.inf]])
    r, c = finite_sorted(b, ref), finite_sorted(b, cur)
    assert int(c.size) == 80_000
    w, ks = wasserstein_ks(b, r, c)
    finite_cur = cur[np.isfinite(cur)]
    assert w == pytest.approx(stats.wasserstein_distance(ref, finite_cur), rel=1e-9)
    assert ks == pytest.approx(stats.ks_2samp(ref, finite_cur).statistic, abs=1e-12)
    counts = b.to_numpy(bin_counts(b, r, b.asarray([-1.0, 0.0, 1.0])))
    assert counts.tolist() == np.histogram(ref, [-np.inf, -1.0, 0.0, 1.0, np.inf])[0].tolist()


def test_backend_can_be_forced_to_numpy(monkeypatch):
    backend.cache_clear()
    monkeypatch.setenv("KEEL_ARRAY_BACKEND", "numpy")
    try:
        assert backend().name == "numpy"
    finally:
        backend.cache_clear()


def test_only_a_missing_device_reads_as_no_gpu():
    """tests/conftest.py skips the GPU tests for a missing cupy or a machine without a CUDA device — and for nothing
    else: a broken driver or a mismatched cupy build must fail the GPU tests on a GPU machine."""
    from tests.gpu import no_cuda_device

    assert no_cuda_device(RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected"))
    assert no_cuda_device(RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient"))
    assert not no_cuda_device(RuntimeError("cudaErrorInitializationError: initialization error"))
    assert not no_cuda_device(RuntimeError("cudaErrorSystemDriverMismatch: system has unsupported display driver"))
