# Operator image: `pdctl operator` (kopf) on a slim Python, non-root, no build tools at run time.
#
# Build: docker build -t ghcr.io/pd-serving/pd-operator:0.1.0 \
#          --build-arg REVISION="$(git rev-parse HEAD)" --build-arg CREATED="$(date -u +%FT%TZ)" .
# Refresh the base: docker buildx imagetools inspect python:3.11-slim-bookworm, then update the ARG.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b

FROM ${PYTHON_IMAGE} AS build
ENV PD_VENV=/opt/pd \
    PD_SRC=/tmp/pd-src
COPY pyproject.toml README.md setup.py /tmp/pd-src/
COPY build_backend /tmp/pd-src/build_backend
COPY operator /tmp/pd-src/operator
COPY runtime /tmp/pd-src/runtime
# The `operator` extra (the API and kopf) on top of the base install (`pdctl bench`); no ZMQ, no proxy.
# pd-install (tests/images runs this instruction as written, in a fresh virtual environment)
RUN python3 -m venv "$PD_VENV" \
    && "$PD_VENV/bin/pip" install --no-cache-dir "${PD_SRC}[operator]" \
    && rm -rf "$PD_SRC"

FROM ${PYTHON_IMAGE}
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="pd-operator" \
      org.opencontainers.image.description="kopf operator for PDDeployment (prefill/decode disaggregated vLLM)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/${PYTHON_IMAGE}"
COPY --from=build /opt/pd /opt/pd
ENV PATH=/opt/pd/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# A fixed non-root UID/GID that owns nothing in the image (the chart runs it with a read-only root).
USER 65532:65532
ENTRYPOINT ["pdctl"]
CMD ["operator", "--all-namespaces"]
