# syntax=docker/dockerfile:1
# One image with every entry point: `mqbalance operator`, `mqbalance sidecar` and `mqbalance injector`.
# Build:  docker build -t mqbalance/mqbalance:0.2.0 .
# The dependencies of the operator, the sidecar and the injector (mqbalance[operator,sidecar,injector]); the replay
# (mqbalance[replay]) is not included: it runs where Spark runs.

# Pinned to an exact Python release on an exact Debian release: rebuilds are repeatable.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# --- build stage: wheels for mqbalance and its dependencies --------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY mqbalance/ mqbalance/
RUN python3 -m venv /opt/mqbalance \
 && /opt/mqbalance/bin/pip install --no-compile '.[operator,sidecar,injector]' \
 && /opt/mqbalance/bin/python -m compileall -q /opt/mqbalance/lib

# --- runtime stage: the virtual environment only, no compilers, no sources -----------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="mqbalance" \
      org.opencontainers.image.description="RocketMQ-style consumer group load balancing under Kubernetes control" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.2.0"
ENV PATH=/opt/mqbalance/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/mqbalance /opt/mqbalance
# A fixed numeric user, so Kubernetes can check runAsNonRoot without resolving names.
RUN groupadd --system --gid 10001 mqbalance \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin mqbalance
USER 10001:10001
WORKDIR /tmp
# Operator metrics and health (8080); sidecar metrics (9091). The sidecar API listens on loopback only.
EXPOSE 8080 9091
# No HEALTHCHECK: Kubernetes ignores it; the chart's probes call the operator's /healthz.
ENTRYPOINT ["mqbalance"]
CMD ["--help"]
