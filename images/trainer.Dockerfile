# syntax=docker/dockerfile:1
# The kuberl trainer: every Ray pod of an RLJob runs this image (spec.cluster.image, default kuberl/trainer:0.1.0).
# KubeRay supplies the command (`ray start ...`); the RayJob's entrypoint runs `python -m kuberl.trainer.run`.
#
#   docker build -f images/trainer.Dockerfile -t kuberl/trainer:0.1.0 .
#
# CPython 3.12 on Ubuntu 24.04 (glibc 2.39) with torch 2.11.0+cu130, vLLM 0.26.0 and Ray 2.60 — the versions of
# pyproject's `gpu` extra and of the GPU test machine's bundle (../shared/gpu-bundle). The CUDA *devel* image
# because vLLM/FlashInfer JIT-compile some kernels with nvcc at first use. The cluster's driver must support
# CUDA 13.0 (R580+).

ARG CUDA_IMAGE=nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04

FROM ${CUDA_IMAGE}
ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu130
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/kuberl \
    PATH=/opt/kuberl/bin:$PATH
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 python3.12-venv python3.12-dev \
      ca-certificates curl git build-essential libnuma1 wget \
 && rm -rf /var/lib/apt/lists/* \
 && python3.12 -m venv /opt/kuberl
# torch first, from the CUDA 13.0 index, so that vLLM's pin resolves to this build and not PyPI's default CUDA
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api/ api/
COPY operator/ operator/
COPY sandbox/ sandbox/
COPY trainer/ trainer/
# kuberl[gpu] = kuberl[trainer] + vllm==0.26.0 + nvidia-ml-py; Ray 2.60 with [default] (dashboard, metrics agent);
# kuberl[wandb] for trainer.loggers wandb (mlflow needs no package: the trainer uses its REST API)
RUN pip install ".[gpu,wandb]" \
 && python -c "import torch, vllm, ray, wandb, kuberl.trainer; assert torch.version.cuda.startswith('13.'), torch.version.cuda; assert vllm.__version__ == '0.26.0', vllm.__version__; assert ray.__version__.startswith('2.60'), ray.__version__" \
 && rm -rf /src

# Ray's convention (KubeRay's images): uid 1000, writable home; Ray writes /tmp/ray and the session logs there.
RUN useradd --uid 1000 --create-home --shell /bin/bash ray \
 && mkdir -p /checkpoints /data && chown ray:ray /checkpoints /data
USER 1000
WORKDIR /home/ray
# Ray: gcs 6379, dashboard 8265, client 10001, metrics 8080; the trainer's Prometheus endpoint 9400
EXPOSE 6379 8265 10001 8080 9400
