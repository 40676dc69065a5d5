"""Keep the process's resident memory from creeping up across steps (glibc only).

Each step allocates activation tensors of a different size (the packed token count varies), and
glibc's heap keeps the freed pieces instead of returning them: measured here, RSS grew by ~6 MB
per step, to ~1 GB over the 2,000-text benchmark corpus. `malloc_trim` hands free heap pages
back; calling it only when RSS has grown by `threshold_mb` since the last trim bounds the growth.
Measured on that corpus (1 thread): no trim 990 MB peak; threshold 256 MB: 892 MB, ~1% slower;
128 MB: 787 MB, ~2% slower; 64 MB: 740 MB, ~4% slower; a trim every step: 753 MB, 7% slower.
RSS is read at most once per `check_every_tokens` tokens run (default 4096): the read costs
~85 us right after a forward pass, 2% of a one-query call, while small steps barely grow the heap.
A no-op where glibc is absent.

Kernel caches (`bound_kernel_caches`): oneDNN and ideep (torch's oneDNN wrapper) each keep the
kernels they built for every distinct shape, 1,024 of each by default, and a step's shapes
change with its packed token count. Measured on all-MiniLM-L6-v2 with requests of 1-32 varied
texts: ~2 MB of live heap per new token count, +~500 MB over the first few hundred requests
before they level off. Bounded to `KERNEL_CACHE_CAPACITY` entries each.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import threading

_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20 if hasattr(os, "sysconf") else 0.0


@functools.lru_cache(maxsize=1)
def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _load_trim():
    return getattr(_libc(), "malloc_trim", None)


def trim_heap() -> bool:
    """Hand free heap pages back to the system now (glibc's malloc_trim; False without it). For
    one-off moments that free a lot, e.g. weight copies dropped at load: freed blocks under the
    mmap threshold stay in the heap, and count in RSS, until a trim."""
    trim = _load_trim()
    if trim is None:
        return False
    trim(0)
    return True


# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# Activations up to 32 MB (glibc's largest mmap threshold) come from the heap and freed heap
# stays mapped up to 256 MB, so each step reuses the last step's pages. glibc's defaults mmap
# such blocks fresh or trim them on free, and every step page-faults them in again: measured
# on the 2,000-text embed job, int8 ~100 -> ~120 texts/s (its int32 GEMM outputs and casts are
# all fresh [tokens, 1536] buffers), fp32 unchanged within noise (docs/dev/journal.md).
# RSS stays bounded by HeapTrimmer's malloc_trim. Setting either threshold alone is worse
# than the defaults (trim alone halved int8 speed: it pins the mmap threshold at 128 KB).
MMAP_THRESHOLD_BYTES = 32 * 2**20
TRIM_THRESHOLD_BYTES = 256 * 2**20
_malloc_tuned = False


def tune_malloc_for_steps() -> bool:
    """Set both glibc thresholds once per process (no-op without glibc, when already done, or
    when POOLER_MALLOC_TUNING=0 or the user set MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_).
    Returns whether the thresholds are now set by pooler."""
    global _malloc_tuned
    if _malloc_tuned:
        return True
    if os.environ.get("POOLER_MALLOC_TUNING", "1") == "0" or any(
            v in os.environ for v in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    _malloc_tuned = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    return _malloc_tuned


# glibc's M_MMAP_MAX (malloc.h) and its default: how many blocks malloc may mmap at once.
_M_MMAP_MAX, _DEFAULT_MMAP_MAX = -4, 65536
# A step of this many tokens or more makes blocks of 32 MB and over (the mmap threshold's
# ceiling): a hidden-1024 model's [8192, 1024] fp32 activations are exactly 32 MB, a 4,096-wide
# MLP's [2048, 4096] too. Below it no block reaches 32 MB at these widths.
LARGE_BLOCK_STEP_TOKENS = 2048
_heap_only_depth = 0
_heap_only_lock = threading.Lock()


@contextlib.contextmanager
def large_blocks_from_heap(active: bool = True):
    """While a long step's forward runs, serve blocks of 32 MB and over from the heap (glibc's
    M_MMAP_MAX = 0) instead of a fresh mmap each, so that each layer reuses the blocks the
    layer before it freed. glibc mmaps every block of at least the mmap threshold (32 MB at
    most) and unmaps it on free, so each one is page-faulted and zeroed by the kernel again:
    a Jina-v3-sized model (hidden 1,024) made ~100k faults per layer at 8,192 tokens, 2.4M per
    document, and a fresh 128 MB product took 58 ms where a reused one took 18 (docs/dev/
    journal.md, "Long documents: 32 MB blocks from the heap"). After the step the heap keeps
    them, bounded by HeapTrimmer as any other free heap. A no-op when `active` is false,
    without glibc, or where pooler does not tune malloc (tune_malloc_for_steps: the user's own
    MALLOC_* variables or POOLER_MALLOC_TUNING=0). Process-wide while any such step runs
    (mallopt has no per-thread form): other threads' large blocks come from the heap too,
    which is harmless. A thread other than the main one (the server's engine loop) has its
    own arena of 64 MB heaps: there a block over ~64 MB is still mmapped."""
    global _heap_only_depth
    mallopt = getattr(_libc(), "mallopt", None) if active and _malloc_tuned else None
    if mallopt is None or "MALLOC_MMAP_MAX_" in os.environ:
        yield
        return
    with _heap_only_lock:
        _heap_only_depth += 1
        if _heap_only_depth == 1:
            mallopt(_M_MMAP_MAX, 0)
    try:
        yield
    finally:
        with _heap_only_lock:
            _heap_only_depth -= 1
            if _heap_only_depth == 0:
                mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)


# Entries per cache. A MiniLM step builds 4 GEMM kernels per token count, so 128 keeps the
# 32 most recent token counts hot (a stream of short queries of similar lengths never rebuilds)
# and caps the caches at ~+55 MB of heap instead of ~+500 MB. With no cache at all every step
# rebuilds its kernels: one short query went from 5 to 14 ms. Measured in docs/dev/journal.md
# ("Soak").
KERNEL_CACHE_CAPACITY = 128
# oneDNN's primitive cache, ideep's computation cache.
_KERNEL_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_kernel_caches(capacity: int = KERNEL_CACHE_CAPACITY) -> dict[str, str]:
    """Bound oneDNN's and ideep's per-shape kernel caches, unless the user set their own
    capacity (or POOLER_KERNEL_CACHE_CAPACITY, which sets both). Both libraries read the
    variable when they build their first kernel, so this must run before the process's first
    oneDNN call (ModelRunner calls it before loading the model); later it changes nothing.
    Returns the capacities in effect as far as the environment says."""
    value = os.environ.get("POOLER_KERNEL_CACHE_CAPACITY", str(capacity))
    for name in _KERNEL_CACHE_VARIABLES:
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in _KERNEL_CACHE_VARIABLES}


class _MallInfo2(ctypes.Structure):  # glibc >= 2.33, malloc.h
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def heap_in_use_mb() -> float | None:
    """Bytes malloc has handed out and not had back (all arenas, mmapped blocks included), in
    MB; None without glibc >= 2.33. Unlike RSS it ignores free heap the trimmer has not
    returned yet, so it shows what the process really holds (a leak or a growing cache)."""
    mallinfo2 = getattr(_libc(), "mallinfo2", None)
    if mallinfo2 is None:
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return (info.uordblks + info.hblkhd) / 2**20


class HeapTrimmer:
    def __init__(self, threshold_mb: float = 128.0, check_every_tokens: int = 4096):
        self.threshold_mb = threshold_mb
        self.check_every_tokens = check_every_tokens
        self._trim = _load_trim() if os.path.exists("/proc/self/statm") else None
        self._baseline_mb: float | None = None
        self._tokens_since_check = check_every_tokens  # the first step reads the baseline

    @staticmethod
    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE_MB

    def trim_if_grown(self, min_growth_mb: float = 32.0) -> bool:
        """At an idle moment: hand every free heap page back (all arenas, the HTTP worker
        threads' too) if RSS grew by min_growth_mb since the last trim, e.g. after a burst.
        Not on every idle moment: a trim costs a walk of the heap and the next step's page
        faults, which a server answering one query at a time would pay per query."""
        if self._trim is None:
            return False
        rss = self.rss_mb()
        if self._baseline_mb is not None and rss - self._baseline_mb < min_growth_mb:
            return False
        self._trim(0)
        self._baseline_mb = self.rss_mb()
        return True

    def maybe_trim(self, num_tokens: int) -> None:
        """Call after a step of num_tokens tokens: trims when RSS grew past the threshold
        since the last trim."""
        if self._trim is None:
            return
        self._tokens_since_check += num_tokens
        if self._tokens_since_check < self.check_every_tokens:
            return
        self._tokens_since_check = 0
        rss = self.rss_mb()
        if self._baseline_mb is None:
            self._baseline_mb = rss
        elif rss - self._baseline_mb > self.threshold_mb:
            self._trim(0)
            self._baseline_mb = self.rss_mb()
