"""Fixtures shared by the unit tests of pooler's C kernels."""
from __future__ import annotations

import pytest


@pytest.fixture(params=["best", "avx2"])
def kernel_build(request, monkeypatch):
    """encoder_kernels() as the best build for this CPU, or as the AVX2 one (forced on an
    AVX-512 CPU); the usual build again afterwards."""
    from pooler.kernels import build

    if request.param == "avx2":
        if not build.cpu_features().avx2:
            pytest.skip("no AVX2 here")
        monkeypatch.setenv(build.DISABLE_ENV, "avx2")
    build.encoder_kernels.cache_clear()
    lib = build.encoder_kernels()
    assert lib is not None and (request.param != "avx2" or lib.variant == "avx2")
    yield lib
    monkeypatch.undo()
    build.encoder_kernels.cache_clear()
