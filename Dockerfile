# syntax=docker/dockerfile:1
# pooler, CPU image. Started as TEI's image is: arguments and environment unchanged.
#
#   docker build -t pooler:cpu .
#   docker run -p 8080:80 -v $PWD/data:/data pooler:cpu --model-id BAAI/bge-small-en-v1.5
#   docker run -p 8080:80 -e MODEL_ID=BAAI/bge-small-en-v1.5 -e API_KEY=... pooler:cpu
#
# docs/operating/deploy.md: the flags and variables, what was tested and how.
FROM python:3.11-slim-bookworm

# pooler compiles its CPU kernels for the CPU it runs on, at first start (about a second):
# it needs a C compiler with OpenMP. Without one it runs, slower, on torch alone.
# APT_PACKAGES: more (KubeRay's probes call wget: deploy/kubernetes/rayservice.yaml).
ARG APT_PACKAGES=
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev $APT_PACKAGES \
    && rm -rf /var/lib/apt/lists/*

# torch==2.13.0 from PyTorch's CPU-only index (PyPI's x86_64 build carries CUDA: GBs).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# pooler's extras: ops (TEI's gRPC API, OTLP traces); ops,ray for KubeRay.
ARG POOLER_EXTRAS=ops
# The source is mounted for the install only, not copied into a layer.
RUN --mount=type=bind,source=.,target=/src,rw \
    PIP_NO_CACHE_DIR=1 TORCH_INDEX_URL="$TORCH_INDEX_URL" POOLER_EXTRAS="$POOLER_EXTRAS" \
    /src/deploy/install.sh /opt/pooler

RUN useradd --create-home --uid 1000 --user-group pooler \
    && mkdir /data && chown pooler:pooler /data

# As TEI's image: models cached on the /data volume (HF_HUB_CACHE=/data is the layout of TEI's
# HUGGINGFACE_HUB_CACHE=/data, so a volume TEI filled is reused; HF_HOME=/data keeps a token
# saved there), port 80. A non-root process may bind 80 where the runtime allows it (Docker
# >= 20.10 does by default; Kubernetes: docs/operating/deploy.md), else set PORT=8080.
ENV PATH=/opt/pooler/bin:$PATH \
    HF_HOME=/data \
    HF_HUB_CACHE=/data \
    PORT=80 \
    PYTHONUNBUFFERED=1
VOLUME /data
EXPOSE 80
USER 1000:1000
WORKDIR /home/pooler

# The first start downloads the model: give it time before failed checks count.
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('PORT', '80'), timeout=4)"

# --host 0.0.0.0: every interface of the container (a later --hostname/--host wins). The rest
# is TEI's command line or environment: --model-id / MODEL_ID, --port / PORT, ...
ENTRYPOINT ["pooler", "serve", "--host", "0.0.0.0"]
CMD ["--json-output"]
