"""Whether the GPU paths can run here: the cupy array backend when cupy sees a CUDA device. A module of its own, with
no imports beyond keel.kernels (numpy), so that the GPU tests (tests/test_kernels.py, tests/serving/test_pools.py)
also run on a GPU machine that has only numpy, scipy, polars and cupy — with ``--noconftest``, as
``scripts/gpu-check`` runs them."""

from __future__ import annotations


def cupy_backend_or_none():
    """The cupy array backend when cupy sees a CUDA device, else None (GPU-marked tests skip then). Only a missing
    cupy or a machine with no CUDA device is None: any other start-up error (a broken driver, a cupy built for
    another CUDA) is raised, so that a broken GPU path fails on a GPU machine instead of reading as skipped."""
    from keel.kernels import ArrayBackend

    try:
        import cupy
    except ImportError:
        return None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        if no_cuda_device(exc):
            return None
        raise
    return ArrayBackend("cupy", cupy) if count > 0 else None


def no_cuda_device(exc: Exception) -> bool:
    """Whether a CUDA runtime error says there is no device (or no driver), as on every machine without a GPU."""
    text = str(exc)
    return any(code in text for code in ("cudaErrorNoDevice", "cudaErrorInsufficientDriver"))
