#!/bin/sh
# Install pooler into a new virtual environment: the install step of both images (Dockerfile,
# Dockerfile.cuda) and of CI's check of it (deploy/check-install.sh), so the two cannot drift.
#
#   deploy/install.sh PREFIX
#
# PREFIX: the virtual environment to create (the images: /opt/pooler). torch==2.13.0 comes
# from TORCH_INDEX_URL when it is set (the CPU image: PyTorch's CPU-only index), else from
# pip's configured sources (PyPI's default build, CUDA on x86_64 Linux; on a machine whose pip
# finds the wheel on local disk, that one). Then pooler with the extras in POOLER_EXTRAS
# (default: ops, TEI's gRPC API and OTLP traces; ops,ray for KubeRay), under constraints.txt.
# PYTHON picks the interpreter (default: python3). pip's cache is used unless PIP_NO_CACHE_DIR
# is set (the images set it: a cache in a layer is dead weight; CI reuses the wheels its own
# install fetched).
set -eu

if [ $# -ne 1 ]; then
    echo "usage: $0 PREFIX" >&2
    exit 2
fi
prefix=$1
src=$(cd "$(dirname "$0")/.." && pwd)

"${PYTHON:-python3}" -m venv "$prefix"
pip_install() {
    "$prefix/bin/python" -m pip install --disable-pip-version-check -q \
        -c "$src/constraints.txt" "$@"
}
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    pip_install --index-url "$TORCH_INDEX_URL" torch==2.13.0
else
    pip_install torch==2.13.0
fi
pip_install "$src[${POOLER_EXTRAS:-ops}]"
"$prefix/bin/pooler" --version
