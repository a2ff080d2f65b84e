# The keel platform image (the profile's `image`): Dagster code server, run workers (K8sRunLauncher Jobs), the
# webserver and daemon of the Helm chart, and the `keel` CLI — the analytics environment (numpy 2), as .venv.
#
#   docker build -f docker/platform.Dockerfile -t ghcr.io/keel-platform/keel:0.1.0 .
#
# Built from the repository root. Dependencies come from the same pins as scripts/setup (pyproject.toml +
# constraints.txt), so the image resolves exactly what CI tested. No state is baked in: KEEL_HOME is the shared
# volume, the control plane and online store are servers named by secrets (docs/kubernetes.md).
FROM python:3.11.11-slim-bookworm

# LightGBM needs the OpenMP runtime; nothing else from Debian.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
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
# keel and every installed use case's own data dependencies (usecases/<name>/requirements*.txt, as scripts/setup)
RUN python -m pip install --no-cache-dir --disable-pip-version-check "pip==25.3" \
 && python -m pip install --no-cache-dir --disable-pip-version-check -c constraints.txt ".[k8s]" \
 && python -m keel.usecase_deps --install

# Never root; the shared volume is mounted at KEEL_HOME with this uid's group write access.
RUN useradd --create-home --uid 10001 keel && mkdir -p /opt/dagster/dagster_home && chown keel /opt/dagster/dagster_home
USER 10001
ENV KEEL_HOME=/var/lib/keel DAGSTER_HOME=/opt/dagster/dagster_home PYTHONUNBUFFERED=1
EXPOSE 3030
# The chart's user-code deployment runs this (dagsterApiGrpcArgs); run workers override it with `dagster api …`.
CMD ["dagster", "api", "grpc", "--python-file", "definitions.py", "--host", "0.0.0.0", "--port", "3030"]
