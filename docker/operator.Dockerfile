# syntax=docker/dockerfile:1
# The polyrl operator image: the `polyrl` package WITHOUT extras, so no torch, no
# transformers (the operator never needs them) and no nats-server (it never runs one). Build
# from the repository root:
#   docker build -f docker/operator.Dockerfile -t ghcr.io/polyrl/operator:0.1.0 .
# The chart (charts/polyrl) runs it as `polyrl operator --all-namespaces` with UID 65532 and a
# read-only root filesystem (it writes only to the /tmp emptyDir the chart mounts).

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY workers/ workers/
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
# The base package only: its dependencies are pydantic, kopf, kubernetes, nats-py, ...
RUN pip install /wheels/polyrl-*.whl && rm -rf /wheels
# Fail the build if anything pulled in a training dependency after all.
RUN python -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) for m in ('torch', 'transformers', 'datasets', 'math_verify')))"
RUN groupadd --gid 65532 polyrl \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin polyrl
# Numeric, so that the kubelet can verify runAsNonRoot without reading /etc/passwd.
USER 65532:65532
WORKDIR /tmp
EXPOSE 8080
ENTRYPOINT ["polyrl"]
CMD ["operator", "--all-namespaces"]
