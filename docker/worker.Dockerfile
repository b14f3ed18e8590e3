# syntax=docker/dockerfile:1
# The polyrl worker image: trainers (torchrun), rollout workers and workflow runners, i.e.
# the `polyrl` package WITH the train extra. Build from the repository root:
#   docker build -f docker/worker.Dockerfile -t ghcr.io/polyrl/worker:0.1.0 .
#
# This is the CPU image (torch from PyTorch's CPU wheel index; the `torch` rollout engine).
# For GPUs, base it on a CUDA runtime image instead, e.g.
#   docker build -f docker/worker.Dockerfile \
#     --build-arg BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#     --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 ...
# (that base needs python3.11 + pip installed first, or use a pytorch/pytorch image), and
# add the vllm extra (`.[train,vllm]`) for the vllm engine.

ARG BASE=python:3.11-slim
FROM ${BASE}
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/polyrl \
    HF_HOME=/home/polyrl/.cache/huggingface
WORKDIR /src
COPY pyproject.toml README.md ./
COPY .ci/constraints.txt .ci/constraints.txt
COPY operator/ operator/
COPY workers/ workers/
# The same pins as CI (.ci/constraints.txt), so the image runs what the tests ran.
RUN pip install --extra-index-url "${TORCH_INDEX}" -c .ci/constraints.txt ".[train]" \
    && rm -rf /src
RUN groupadd --gid 65532 polyrl \
    && useradd --uid 65532 --gid 65532 --create-home --home-dir /home/polyrl --shell /usr/sbin/nologin polyrl
# Numeric, so that the kubelet can verify runAsNonRoot without reading /etc/passwd.
USER 65532:65532
WORKDIR /home/polyrl
# The operator sets each pod's command (`polyrl worker <role>` or torchrun ...).
ENTRYPOINT ["polyrl"]
CMD ["--help"]
