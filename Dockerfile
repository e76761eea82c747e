# fedbroker's container image: the broker (`fedbroker serve`) as deploy/kustomize runs it.
#
#   docker build -t fedbroker .
#   docker run --read-only --tmpfs /tmp -p 8080:8080 \
#     -v "$PWD/my-config.yaml:/etc/fedbroker/config/config.yaml:ro" fedbroker
#
# Kept consistent with deploy/kustomize/base/deployment.yaml (tests/test_deploy.py checks):
#   * the user is uid/gid 10001, the Deployment's runAsUser/runAsGroup;
#   * ENTRYPOINT is the `fedbroker` console script and CMD is exactly the Deployment's
#     `args` (serve --config /etc/fedbroker/config/config.yaml): the Deployment sets `args`
#     only, which replaces CMD and keeps ENTRYPOINT;
#   * EXPOSE is the Deployment's containerPort (the shipped config's api.port).
# A read-only root filesystem works: nothing is written outside /tmp (an emptyDir there)
# and /var/lib/fedbroker (the SQLite directory, a volume); bytecode is compiled at build
# time and PYTHONDONTWRITEBYTECODE stops Python from trying to write more.

ARG PYTHON_IMAGE=python:3.11-slim

# --- build: the project and its runtime dependencies (no test or plot extras) in a venv --
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/fedbroker
WORKDIR /src
# Only what the wheel is built from (.dockerignore keeps the rest of the tree out).
COPY pyproject.toml README.md ./
COPY broker ./broker
COPY adapters ./adapters
COPY policies ./policies
RUN /opt/fedbroker/bin/pip install . \
 && /opt/fedbroker/bin/python -m compileall -q /opt/fedbroker/lib

# --- runtime -------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="fedbroker" \
      org.opencontainers.image.description="Multi-cluster GPU federation broker" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 fedbroker \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin fedbroker \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/fedbroker \
 && install -d -m 0755 /etc/fedbroker /etc/fedbroker/config /etc/fedbroker/kube
COPY --from=build /opt/fedbroker /opt/fedbroker
ENV PATH=/opt/fedbroker/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TMPDIR=/tmp \
    HOME=/tmp
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
WORKDIR /var/lib/fedbroker
EXPOSE 8080
# Docker only (Kubernetes uses the Deployment's probes): the liveness endpoint on the
# default port, with the image's own Python (the slim image has no curl).
HEALTHCHECK --interval=30s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status != 200)"]
ENTRYPOINT ["/opt/fedbroker/bin/fedbroker"]
CMD ["serve", "--config", "/etc/fedbroker/config/config.yaml"]
