# syntax=docker/dockerfile:1
# The kuberl operator: kopf + kubernetes client + prometheus-client, no torch/ray/transformers
# (tests/chart/test_images.py resolves the `kuberl[operator]` closure and checks).
#
#   docker build -f images/operator.Dockerfile -t kuberl/operator:0.1.0 .
#
# Runs as uid 65532 with a read-only root filesystem (the chart mounts an emptyDir on /tmp).

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# only what setuptools needs to build the one `kuberl` distribution (the three package folders + metadata)
COPY pyproject.toml README.md ./
COPY api/ api/
COPY operator/ operator/
COPY sandbox/ sandbox/
COPY trainer/ trainer/
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/kuberl \
 && /opt/kuberl/bin/pip install "$(ls /wheels/kuberl-*.whl)[operator]" \
 && /opt/kuberl/bin/python -c "import kuberl.operator, kuberl.api" \
 && ! /opt/kuberl/bin/python -c "import torch" 2>/dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="kuberl-operator" \
      org.opencontainers.image.description="kopf operator for kuberl RLJobs (renders KubeRay RayJobs)" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 65532 kuberl \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin kuberl
COPY --from=build /opt/kuberl /opt/kuberl
ENV PATH=/opt/kuberl/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
# /metrics and /healthz (chart values operator.metricsPort / operator.healthPort)
EXPOSE 8080 8081
ENTRYPOINT ["python", "-m", "kuberl.operator"]
