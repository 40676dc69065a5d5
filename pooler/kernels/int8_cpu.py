"""The int8 GEMM kernels (int8_gemm.c), one build per instruction set, chosen at start.

Paths, best first (`int8_path()` names the one this process takes; the bench and the load log
print it):
- "avx512-vnni": VPDPBUSD (CPUs with avx512_vnni + avx512bw/vl: Intel Cascade Lake and later,
  AMD Zen 4 and later);
- "avx2": VPMADDUBSW + VPMADDWD, activation codes 0..128 and weights +-127 so that no int16
  pair sum can saturate (every x86-64 CPU with AVX2 and FMA: Haswell, Zen 1-3);
- "torch": the portable path (torch._int_mm; aarch64, other hosts, kernels turned off). It is
  correct everywhere; whether it is faster than fp32 is the precision gate's question
  (pooler/precision_gate.py), asked at load.
AVX-VNNI (the VEX form on Alder Lake / Zen 5 client parts without AVX-512) takes the AVX2 build:
untested here, no such CPU was at hand. AMX: pooler has no AMX int8 kernel; on a CPU with
amx_int8 the VNNI build runs (AMX CPUs all have AVX-512 VNNI). oneDNN's AMX int8 GEMM (reached
through torch._int_mm) was not measured: no AMX machine was available for this work.

`POOLER_CPU_KERNELS=avx2` forces the AVX2 build on an AVX-512 CPU (as for encoder_cpu.c),
`POOLER_CPU_KERNELS=0` the torch path. Tests load a named build with `int8_kernels(path)`.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import platform
from pathlib import Path

from pooler.cpu_features import cpu_features
from pooler.kernels.build import kernels_choice, load_library

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("int8_gemm.c")
# (path name, CPU flags it needs, compiler flags), best first.
_VARIANTS = (("avx512-vnni", ("avx512f", "avx512bw", "avx512vl", "avx512_vnni"),
              ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mfma"]),
             ("avx2", ("avx2", "fma"), ["-mavx2", "-mfma"]))
PATHS = tuple(name for name, _, _ in _VARIANTS) + ("torch",)
# Largest |weight code| per path. The AVX2 build splits the bits VPMADDUBSW's int16 pair sums
# allow between activations (codes 0..128) and weights (+-127): 2 * 128 * 127 = 32512 <= 32767,
# so no sum can saturate (int8_gemm.c). Measured on the bench corpus (min cosine to fp32, QKV
# fp32), unsmoothed: 191/85 0.99639, 127/127 0.99639, 255/63 0.99453, 255/127 (saturating)
# 0.89588; with smoothing (pooler/layers/quantization.py) full weight codes win: see
# docs/dev/journal.md.
WEIGHT_LEVELS = {"avx512-vnni": 127, "avx2": 127, "torch": 127}
# int8_gemm.c's epilogue activations, by the (oneDNN post-op, algorithm) pooler/layers/linear.py
# names them with
ACT_NONE, ACT_GELU_ERF, ACT_GELU_TANH, ACT_RELU = 0, 2, 3, 4
EPILOGUE_ACTS = {("gelu", "none"): ACT_GELU_ERF, ("gelu", "tanh"): ACT_GELU_TANH,
                 ("relu", ""): ACT_RELU}


def runnable_paths() -> list[str]:
    """The C builds this CPU can execute, best first (what the parity tests run)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return []
    flags = cpu_features().flags
    return [name for name, needs, _ in _VARIANTS if all(f in flags for f in needs)]


def int8_path() -> str:
    """The path Int8Linear takes in this process: "avx512-vnni", "avx2" or "torch"."""
    lib = int8_kernels()
    return lib.variant if lib is not None else "torch"


def int8_kernels(path: str | None = None) -> ctypes.CDLL | None:
    """The compiled int8_gemm.c for `path` (None: the best this CPU runs, or what
    POOLER_CPU_KERNELS asks for), or None when no build can be used here (logged once)."""
    if path is None:
        choice = kernels_choice()
        if choice == "off":
            return None
        runnable = runnable_paths()
        if choice == "avx2":
            runnable = [p for p in runnable if p == "avx2"]
        if not runnable:
            _log_once(f"this CPU ({cpu_features().summary()}) runs neither the AVX-512 VNNI "
                      "nor the AVX2 build")
            return None
        path = runnable[0]
    elif path not in runnable_paths():
        raise ValueError(f"int8 path {path!r} cannot run on this CPU; runnable: "
                         f"{runnable_paths() or 'none'}.")
    return load_build(path)


@functools.lru_cache(maxsize=None)
def _log_once(why: str) -> None:
    log.info("int8 kernels off (%s); int8 layers take the portable torch path.", why)


@functools.lru_cache(maxsize=None)
def load_build(path: str) -> ctypes.CDLL | None:
    """The build for a path already checked by int8_kernels (cached: the per-call lookup)."""
    cflags = next(c for name, _, c in _VARIANTS if name == path)
    lib, why = load_library(cflags, _SOURCE)
    if lib is None:
        _log_once(why)
        return None
    P, I = ctypes.c_void_p, ctypes.c_int  # noqa: E741
    lib.int8_levels.argtypes = []
    lib.int8_levels.restype = I
    lib.int8_packed_bytes.argtypes = [I, I]
    lib.int8_packed_bytes.restype = ctypes.c_long
    lib.pack_int8_weight.argtypes = [P, P, P, I, I]
    lib.pack_int8_weight.restype = None
    lib.int8_scratch_bytes.argtypes = [I, I]
    lib.int8_scratch_bytes.restype = ctypes.c_long
    F = ctypes.c_float
    lib.int8_linear.argtypes = [P, P, I, I, P, P, P, P, P, P, I, I, I, F, P, P, F, P, I]
    lib.int8_linear.restype = None
    lib.int8_bert_params_per_layer.argtypes = []
    lib.int8_bert_params_per_layer.restype = I
    lib.int8_bert_scratch_bytes.argtypes = [I, I, I, I, I]
    lib.int8_bert_scratch_bytes.restype = ctypes.c_long
    lib.int8_bert_layers.argtypes = [P, I, I, P, P, P, I, I, I, I, P, P, F, I, P, I]
    lib.int8_bert_layers.restype = None
    lib.variant = path
    lib.levels = lib.int8_levels()
    log.debug("int8 kernels: the %s build", path)
    return lib
