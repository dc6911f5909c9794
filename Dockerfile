# The gpuledger exporter image: one image for the node agent (DaemonSet) and the cluster
# view (Deployment). Build from the repository root:
#
#   docker build -t gpuledger:0.1.0 .
#
# Every install step lives in scripts/install-runtime, which tests run into a fresh venv
# (tests/helm/test_packaging.py): change the steps there, never here.
ARG PYTHON_IMAGE=python:3.12-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter/ exporter/
COPY scripts/install-runtime scripts/install-runtime
RUN scripts/install-runtime /opt/gpuledger /src

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="gpuledger" \
      org.opencontainers.image.description="Prometheus exporter joining Kubernetes, Ray, vLLM and NVML GPU data" \
      org.opencontainers.image.licenses="Apache-2.0"
# The venv's interpreter links to the base image's python, identical in both stages.
COPY --from=build /opt/gpuledger /opt/gpuledger
ENV PATH=/opt/gpuledger/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Non-root by default (the cluster view needs nothing more). The node agent's chart runs
# it as uid 0 with all capabilities dropped but SYS_PTRACE and DAC_READ_SEARCH, which
# reading other processes' /proc/<pid>/environ needs (docs/operations.md, "Security").
USER 65532:65532
EXPOSE 9402
ENTRYPOINT ["gpuledger"]
CMD ["serve"]
