"""Compile pooler's C kernels on first use and load them with ctypes.

The kernels are plain C (no torch headers), so a build takes about a second. The shared object
is cached under `$POOLER_KERNEL_CACHE` (default `~/.cache/pooler/kernels`) by a hash of the
source, the flags and the compiler, written to a temporary name and renamed so that concurrent
processes never load a half-written file. It is built for the best instruction set the CPU
has: AVX-512 (16-float vectors, a 12x32 register tile) or AVX2 with FMA (8-float vectors, 3x32).
Anything that fails (no compiler, neither instruction set, a non-Linux host,
`POOLER_CPU_KERNELS=0`) returns None once, with one log line saying why, and the caller keeps
its torch path.

torch is imported before the library is loaded: the library asks for libgomp.so.1 and the
dynamic loader then hands it torch's already-loaded OpenMP runtime, so both share one pool of
threads (two runtimes would spin against each other on the same cores).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch  # noqa: F401  (first: see the module docstring)

from pooler.cpu_features import cpu_features
from pooler.switch_words import is_off

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("encoder_cpu.c")
_COMMON_FLAGS = ["-O3", "-fopenmp", "-fPIC", "-shared", "-fno-math-errno"]
# Instruction sets, best first: (name, CPU flags it needs, compiler flags). The source picks its
# vector width and tile from __AVX512F__.
_VARIANTS = [("avx512", ("avx512f", "avx512dq", "avx512vl", "fma"),
              ["-mavx512f", "-mavx512dq", "-mavx512vl", "-mfma"]),
             ("avx2", ("avx2", "fma"), ["-mavx2", "-mfma"])]
# "0" (or off/false/no) turns the kernels off; "avx2" picks that build even on an AVX-512 CPU
# (how the tests check it); anything else picks the best the CPU has.
DISABLE_ENV = "POOLER_CPU_KERNELS"


def kernels_choice() -> str:
    """POOLER_CPU_KERNELS as every kernel loader reads it: "off", "avx2" or "" (the best)."""
    choice = os.environ.get(DISABLE_ENV, "").strip().lower()
    return "off" if is_off(choice) else choice if choice == "avx2" else ""


def load_library(cflags: list[str], source: Path) -> tuple[ctypes.CDLL | None, str | None]:
    """`source` compiled with `cflags` (cached, see _build) and loaded: (library, None), or
    (None, why not) when there is no compiler or the build fails."""
    cc = _compiler()
    if cc is None:
        return None, "no C compiler (set CC)"
    try:
        return ctypes.CDLL(str(_build(cc, cflags, source))), None
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", None) or str(e)
        return None, f"the build failed: {detail.strip()[:500]}"


def _variant(choice: str) -> tuple[str, list[str]] | None:
    flags = cpu_features().flags
    for name, needs, cflags in _VARIANTS:
        if choice in (name, "") and all(f in flags for f in needs):
            return name, cflags
    return None


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def _cache_dirs() -> list[Path]:
    root = os.environ.get("POOLER_KERNEL_CACHE")
    if root:
        return [Path(root)]
    # a read-only home (some containers) falls back to the temporary directory
    return [Path.home() / ".cache" / "pooler" / "kernels",
            Path(tempfile.gettempdir()) / f"pooler-kernels-{os.getuid()}"]


def _build(cc: str, cflags: list[str], source: Path = _SOURCE) -> Path:
    error: OSError | None = None
    for folder in _cache_dirs():
        try:
            return _build_in(cc, cflags, folder, source)
        except OSError as e:
            error = e
    raise error


def _build_in(cc: str, cflags: list[str], folder: Path, source_path: Path = _SOURCE) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                             check=True).stdout
    # The source and the headers beside it (vector_math.h): editing either rebuilds.
    source = source_path.read_bytes() + b"".join(
        h.read_bytes() for h in sorted(source_path.parent.glob("*.h")))
    flags = _COMMON_FLAGS + cflags
    digest = hashlib.sha256(source + " ".join(flags).encode() + version.encode())
    target = folder / f"{source_path.stem}-{digest.hexdigest()[:16]}.so"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    owner = folder.stat()
    if owner.st_uid != os.getuid() or owner.st_mode & 0o022:  # never load what others wrote
        raise PermissionError(f"{folder} is not ours alone")
    if target.exists():
        return target
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run([cc, *flags, str(source_path), "-o", tmp, "-lm"], capture_output=True,
                       text=True, check=True)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@functools.lru_cache(maxsize=1)
def encoder_kernels() -> ctypes.CDLL | None:
    """The compiled encoder_cpu.c, or None when it cannot be used here (logged once)."""
    choice = kernels_choice()
    if choice == "off":
        return None
    why = None
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        why = f"{platform.system()}/{platform.machine()} is not Linux x86-64"
    elif (variant := _variant(choice)) is None:
        why = "this CPU has neither AVX-512 nor AVX2 with FMA"
    else:
        lib, why = load_library(variant[1], _SOURCE)
    if why is not None:
        log.info("CPU encoder kernels off (%s); short sequences and attention take the torch "
                 "path.", why)
        return None
    P, I = ctypes.c_void_p, ctypes.c_int  # noqa: E741
    lib.pack_linear_weight.argtypes = [P, P, I, I]
    lib.pack_linear_weight.restype = None
    lib.bert_scratch_floats.argtypes = [I, I, I, I, I]
    lib.bert_scratch_floats.restype = ctypes.c_long
    lib.bert_layers.argtypes = [P, I, I, P, P, P, I, I, I, I, P, ctypes.c_float, I, P, I]
    lib.bert_layers.restype = None
    lib.attention_scratch_floats.argtypes = [I, I, I]
    lib.attention_scratch_floats.restype = ctypes.c_long
    lib.packed_attention_f32.argtypes = [P, P, P, I, I, I, P, I, I, I, P, P, P, ctypes.c_float,
                                         I, P, I]
    lib.packed_attention_f32.restype = None
    lib.variant = variant[0]
    lib.vector_floats = 16 if variant[0] == "avx512" else 8  # the build's VW
    log.debug("CPU encoder kernels: the %s build", variant[0])
    return lib
