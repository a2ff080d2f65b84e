"""Serving-time code that runs outside Dagster: Triton process and model repository, per-model GPU memory pools,
array kernels (cupy on GPU, numpy on CPU behind one API), the inference gateway and the edge (Envoy) in front of it,
its worker processes, the replayed traffic and the overload drill. It runs in ``.venv``, created by scripts/setup
(see README).
"""
