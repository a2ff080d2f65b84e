# The model runtime image (the profile's `runtime_image`): `python -m gpu_runtime.serve` — Triton Inference Server
# (the tritonserver binary from nvidia-pytriton) with its Python backend in its own numpy<2 environment, and the
# inference gateway in the analytics environment, exactly as scripts/setup lays them out (.venv-runtime, .venv).
#
#   docker build -f docker/runtime.Dockerfile -t ghcr.io/keel-platform/keel-runtime:0.1.0 .
#
# GPU nodes: the NVIDIA container runtime injects the driver; the Triton build in nvidia-pytriton carries its CUDA
# libraries. On CPU nodes the same image serves with KIND_CPU instances (KEEL_RUNTIME_DEVICE=cpu).
FROM python:3.11.11-slim-bookworm

# The tritonserver build in nvidia-pytriton carries its own libraries (ldd finds nothing missing on Debian 12);
# LightGBM needs the OpenMP runtime.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/keel
# The model runtime's own environment (numpy<2: Triton's Python backend returns empty responses with numpy 2).
COPY gpu_runtime/requirements-runtime.txt gpu_runtime/constraints-runtime.txt ./gpu_runtime/
RUN python -m venv /opt/keel/.venv-runtime \
 && /opt/keel/.venv-runtime/bin/python -m pip install --no-cache-dir --disable-pip-version-check \
      -c gpu_runtime/constraints-runtime.txt -r gpu_runtime/requirements-runtime.txt

# The gateway and keel (numpy 2).
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
 && /opt/keel/.venv/bin/python -m pip install --no-cache-dir --disable-pip-version-check -c constraints.txt .

RUN useradd --create-home --uid 10001 keel
USER 10001
ENV PATH=/opt/keel/.venv/bin:$PATH KEEL_RUNTIME_PYTHON=/opt/keel/.venv-runtime/bin/python \
    KEEL_HOME=/var/lib/keel PYTHONUNBUFFERED=1
EXPOSE 8080 8001
# The StatefulSet sets KEEL_REPLICA (the pod's name) and KEEL_ADVERTISE_HOST (its IP); secrets give the rest.
CMD ["python", "-m", "gpu_runtime.serve", "--gateway-host", "0.0.0.0", "--gateway-port", "8080", "--triton-grpc-port", "8001"]
