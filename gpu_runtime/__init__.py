"""Serving-time code that runs outside Dagster: Triton process and model repository, per-model GPU memory pools,
array kernels (cupy on GPU, numpy on CPU behind one API), and the inference gateway. Filled in by the
model-runtime issue; the environment it runs in is created by scripts/setup (see README).
"""
