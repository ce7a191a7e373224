# The specfleet gateway: aiohttp + the routing code; no torch, no numpy. Build from the repository root
# (`make images` builds all three with pyproject.toml's version as the tag; this line declares the image's
# name, and tests/packaging/test_images.py holds it to that version):
#   docker build -f images/gateway.Dockerfile -t ghcr.io/specfleet/gateway:0.1.0 .
FROM python:3.11.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
RUN python -m venv /opt/specfleet
COPY pyproject.toml setup.py README.md ./
COPY crds/ crds/
COPY manifests/ manifests/
COPY operator/ operator/
COPY cluster/ cluster/
COPY cli/ cli/
COPY engine/ engine/
RUN /opt/specfleet/bin/pip install --no-cache-dir ".[gateway]"

FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="specfleet-gateway" \
      org.opencontainers.image.source="https://github.com/specfleet/specfleet"
RUN groupadd --system --gid 10001 specfleet \
 && useradd --system --uid 10001 --gid specfleet --home-dir /tmp --shell /usr/sbin/nologin specfleet
COPY --from=build /opt/specfleet /opt/specfleet
ENV PATH=/opt/specfleet/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["specfleet"]
CMD ["gateway", "run", "--port", "8000"]
