"""Bidirectional attention over packed sequences in one C call: in fp32 (encoder_cpu.c's
packed_attention_f32, the attention of its short-step layer stack; attention.h explains the
kernel), or with bf16 dot products (attention_bf16.c) for the bf16 and int8 engines on CPUs
with AVX512_BF16.

Why: torch's CPU attention for an encoder step is a dozen ops per group of equal lengths
(matmul, scale, softmax, matmul, a strided copy into place) whose FLOPs are ~5% of the
linears' but which took ~26% of fp32 time on the long mix. The kernel reads q/k/v straight from
the fused projection's rows (no transposes or copies), keeps each block of 32 queries' scores in
L2, and writes [num_tokens, heads, head_dim] as o_proj reads it, all sequences in one OpenMP
region on torch's thread pool.

Taken by packed_attention when all of these hold, else its torch paths run:
- the kernels are built here (pooler/kernels/build.py: Linux x86-64 with AVX-512 or AVX2, a C
  compiler, `POOLER_CPU_KERNELS` not 0) and `ENABLED` is true;
- fp32 or bf16 q/k/v on the CPU, head size a multiple of the build's vector (16 floats on
  AVX-512, 8 on AVX2), each head's dims contiguous, no autograd;
- decoder-style attention (a causal mask, alone or with a sliding window: Qwen3, Mistral,
  Gemma3's causal layers; k/v with fewer heads than q, GQA: Gemma3/EmbeddingGemma, Qwen3, Llama,
  when causal or windowed) runs the fp32 kernel's masked entry point (attention.h; bf16 q/k/v
  widened, no score bias; long causal bf16 sequences on AMX: SDPA bf16, below; fp32 causal
  sequences of CAUSAL_SDPA_MIN_LEN tokens or more without a window: SDPA fp32); bidirectional
  global GQA keeps torch's SDPA (faster there);
- otherwise bidirectional: an unattended suffix (ColBERT), an additive fp32 score bias
  per length (MPNet) and local attention (`half_window`: ModernBERT's local layers, query i
  seeing keys |i - j| <= half_window) are handled. Local attention scores only each query
  block's band of keys (attention.h): O(L w) work and O(block (block + 2w)) scratch in the fp32
  kernel, where the torch path computed the full L x L product under a mask; the bf16 kernel
  scores the band alike (its scratch holds the sequence's K and V re-laid out, O(L d), as for
  global attention below BF16_FLASH_MIN_LEN tokens; from there, on BF16_FLASH_CPU_KINDS, its
  global sequences run in key blocks with an online softmax, one head's K and V of those
  sequences laid out once per call, O(L d) shared scratch and O(block) per thread).

Long global fp32 attention: on the AVX-512 build (FLASH_BUILDS) of a CPU kind it was measured
on (FLASH_CPU_KINDS: AMX, i.e. Sapphire Rapids, so far), with heads of at most
FLASH_MAX_HEAD_DIM = 64, a sequence of FLASH_MIN_LEN tokens or more (an unattended suffix
allowed, no score bias) takes the flash kernel (encoder_cpu.c's packed_flash_attention_f32,
flash_attention.h: K and V copied contiguous once per group of heads, 256-query units, 240-key
blocks, an online softmax, O(L d) scratch); on the AVX2 build a sequence of SDPA_MIN_LEN tokens
or more whose keys are all attended goes to torch's SDPA (its flash CPU kernel), as it does on
AVX-512 with wider heads. The other sequences of the step stay on attention.h's kernel.
Measured (one layer, 12 heads x 64, Sapphire Rapids VM shared with other sessions,
interleaved, fastest of N rounds, benchmarks/flash_attention_lengths.py; docs/dev/journal.md
"Flash attention for long fp32 sequences" and "The flash kernel at 90% of the GEMM rate"):
flash / SDPA time 0.91, 0.76, 0.76, 0.76 at 1,024, 2,048, 4,096, 8,192 tokens (2 threads,
wall, since K and V are copied once per head; 0.86-0.95 before), flash / attention.h's kernel
0.71 at 1,024 and 0.53 at 2,048 (1.02 at 512, 0.89 at 768); a 2-layer GTE-base forward 0.96x
the time at 4k, 0.94x at 8k (before). On the AVX2 build with torch held by
ATEN_CPU_CAPABILITY=avx2 (SDPA's GEMMs stay AVX-512 through MKL/oneDNN) the kernel took
1.40-1.57x SDPA's time, so that build keeps SDPA (0.93-1.08x with MKL and oneDNN held to AVX2
too, as on an AVX2-only CPU: not measured there). bf16 q/k/v and bf16 products keep their
kernels.

Long bf16 and int8 attention (_long_sequences_on_sdpa, which also takes long fp32 causal
sequences, above; separate from the fp32 global route): on a CPU with AMX-BF16 and torch on
its AVX-512 kernels (bf16_sdpa_is_fast), a sequence of BF16_SDPA_MIN_LEN (1,024) tokens or more
whose keys are all attended, global or causal (GQA included, no window, no score bias), with
bf16 q/k/v (the bf16 engine) or `bf16_products` (int8 engines; fp32 q/k/v
rounded to bf16), runs torch's SDPA in bf16 (oneDNN's AMX brgemm): 1.1-5x faster than the bf16
kernel from 1k tokens (2.3-5x at 2k-8k), and 1.0-3.4x faster than the fp32 masked kernel for
causal bf16 at 1k-8k (see BF16_SDPA_MIN_LEN). Shorter sequences, local attention and sliding
windows (the kernels score only the band), ColBERT's unattended suffixes and CPUs without AMX
keep the kernels.

Which kernel: bf16 q/k/v (the bf16 engine's QKV projection) take attention_bf16.c where it runs
(AVX512_BF16, head size a multiple of 16, `BF16_ENABLED`): QK^T in VDPBF16PS (exact products of
the bf16 values, fp32 sums), softmax and P@V in fp32, a bf16 result; elsewhere they are widened
to fp32 for the fp32 kernel and the result rounded back. With `bf16_products` (int8 engines)
fp32 or bf16 q/k/v take it too, P is rounded to bf16 for a VDPBF16PS P@V as well, and the
result is fp32. Measured on the long mix's shapes (16 sequences of 60-300 tokens, 12 heads x
32, 1 thread, Zen 4): the bf16 engine's attention 1.4-1.6x faster than widening for the fp32
kernel, an int8 engine's 1.5x faster than the fp32 kernel with bf16 q/k/v from the int8 QKV
layer (benchmarks/attention_bf16_ab.py has the whole-job A/B).
"""
from __future__ import annotations

import ctypes
import functools
import itertools
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from pooler.cpu_features import cpu_features
from pooler.kernels.build import encoder_kernels, kernels_choice, load_library

log = logging.getLogger(__name__)

# Benchmarks and tests turn the kernel off here to time or check the torch paths.
ENABLED = True
# q/k/v dtypes taken; bf16 (the bf16 engine keeps its q/k/v projection in bf16) is widened to
# fp32 first (_widened: one pass over the fused projection), far cheaper than attention.
_DTYPES = (torch.float32, torch.bfloat16)

_BF16_SOURCE = Path(__file__).with_name("attention_bf16.c")
# what attention_bf16.c needs of the CPU, and the compiler flags for it
_BF16_NEEDS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16")
_BF16_CFLAGS = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mfma"]


# fp32 global attention over sequences of at least FLASH_MIN_LEN tokens (no score bias) runs the
# flash kernel (flash_attention.h: key blocks and an online softmax, O(L d) scratch) on the
# builds named in FLASH_BUILDS; the shorter sequences of the step stay on attention.h's kernel.
# From 1,024 tokens the flash kernel beat both SDPA and attention.h's kernel on AVX-512 (the
# module docstring has the ratios, benchmarks/flash_attention_lengths.py measures them); at
# 256-512 tokens attention.h's kernel (its scores still in L2) was 7-12% faster. The AVX2 build
# is not listed: there SDPA (MKL/oneDNN GEMMs) was 1.4-1.6x faster than the flash kernel.
# Heads wider than FLASH_MAX_HEAD_DIM keep the SDPA route: at 128 (6 heads) the flash kernel
# was level with SDPA (1.00-1.03x its time), at 32 and 64 faster (0.83-0.84x, 0.86-0.95x).
# FLASH_CPU_KINDS: the CPU kinds (cpu_features().kind()) the win was measured on. Only a
# Sapphire Rapids Xeon (AMX kind) so far; Zen 4 runs AVX-512 on 256-bit units, where SDPA's
# GEMMs and this kernel may rank otherwise, so other kinds keep SDPA until measured there
# (benchmarks/flash_attention_lengths.py).
FLASH_MIN_LEN = 1024
FLASH_BUILDS = ("avx512",)
FLASH_CPU_KINDS = ("AMX",)
FLASH_MAX_HEAD_DIM = 64


def flash_route_here(variant: str, head_dim: int) -> bool:
    """Whether long fp32 global sequences take the flash kernel with this build and head size
    on this CPU (else torch's SDPA from SDPA_MIN_LEN)."""
    return (variant in FLASH_BUILDS and head_dim <= FLASH_MAX_HEAD_DIM
            and cpu_features().kind() in FLASH_CPU_KINDS)

# On the other builds (AVX2), fp32 global attention over sequences of at least this many tokens
# (all keys attended) runs torch's SDPA, whose flash CPU kernel (q/k/v blocks through GEMMs,
# online softmax, O(block) scratch: 28 MB peak growth at 8k tokens x 12 heads, the output's
# 24 MB included) beat attention.h's kernel at d = 64: SDPA / kernel time 0.63 at 2,048 tokens,
# 0.66 at 4,096, 0.68 at 8,192, but 1.13 at 1,024 (one layer's 12 heads, 2 threads,
# interleaved, shared Sapphire Rapids Xeon, docs/dev/journal.md "GTE at 4k-8k"). That kernel
# reads every K and V row of the head from memory again for each block of 32 queries; SDPA
# tiles keys for the cache. Tests set both to route (or not) at other lengths.
SDPA_MIN_LEN = 1536

# Benchmarks and tests turn the bf16 kernel alone off here (bf16 q/k/v then widen to fp32).
BF16_ENABLED = True
# bf16 kernel: global sequences (no score bias, an unattended suffix allowed) of at least this
# many tokens run in 240-key blocks with an online softmax (attention_bf16_flash.h: head by
# head, its K and V of those sequences laid out once per call into O(L d) shared scratch, then
# its 128-query units; level to 1.11x faster than laying each key block out per unit, journal
# "bf16 flash units: each head's K and V laid out once") instead of whole-sequence units (K
# and V of the head re-laid out per unit, every query block streaming all of them); 0 turns
# that off. Where bf16_sdpa_is_fast() (AMX) sequences from BF16_SDPA_MIN_LEN go to SDPA
# first: this matters on AVX512_BF16 CPUs without AMX (Zen 4, Cooper Lake), and for ColBERT's
# unattended suffixes. Measured on the Sapphire
# Rapids VM (12 heads x 64, 2 threads, interleaved, best of 5-7, shared machine; tiled / whole
# time over 2-7 runs; benchmarks/attention_bf16_tiled.py, docs/dev/journal.md): bf16 engine
# 1.00-1.17 at 1,024, 0.90-1.03 at 2,048 (4 of 6 runs 0.99-1.03), 0.86-0.96 at 2,560-3,072,
# 0.48-0.93 at 4,096, 0.55-0.83 at 8,192; bf16_products 1.00-1.17, 0.88-1.02, 0.94-0.98,
# 0.93-0.97, 0.91-0.98 (two early 8k runs at 1.34-1.48, not repeated in six since). Below
# 2,560 not clearly faster: the whole-sequence units stay. BF16_FLASH_CPU_KINDS: the CPU kinds
# (cpu_features().kind()) that was measured on; the CPUs it matters most for (Zen 4: AVX512_BF16
# on 256-bit units, 1 MB L2) keep the whole-sequence units until measured there with
# benchmarks/attention_bf16_tiled.py.
BF16_FLASH_MIN_LEN = 2560
BF16_FLASH_CPU_KINDS = ("AMX",)


def bf16_attention_kernels() -> ctypes.CDLL | None:
    """attention_bf16.c built for this CPU, or None where it cannot run: no AVX512_BF16, not
    Linux x86-64, no compiler, or POOLER_CPU_KERNELS set to 0 or avx2 (logged once)."""
    if not (BF16_ENABLED and ENABLED):
        return None
    # read on every call (a dict lookup): tests force the AVX2 build within one process
    if kernels_choice() != "":
        return None
    return _bf16_build()


def bf16_kernel_takes(head_dim: int) -> bool:
    """Whether bf16 q/k/v of this head size would run on the bf16 kernel here (else they would
    be widened, or take torch's attention: a producer should then keep them fp32)."""
    return _bf16_kernel_for(head_dim) is not None


def _bf16_kernel_for(head_dim: int) -> ctypes.CDLL | None:
    """The bf16 kernel when it runs here and takes this head size (a multiple of 16)."""
    return bf16_attention_kernels() if head_dim % 16 == 0 else None


@functools.lru_cache(maxsize=1)
def _bf16_build() -> ctypes.CDLL | None:
    if encoder_kernels() is None or not all(cpu_features().has(f) for f in _BF16_NEEDS):
        return None
    lib, why = load_library(_BF16_CFLAGS, _BF16_SOURCE)
    if lib is None:
        log.info("bf16 attention kernel off (%s); bf16 attention widens to fp32.", why)
        return None
    return _entry_points(lib, "bf16")


_P, _I, _F, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_long
# The C entry points by group: (function, argument types, return type) as the C files declare
# them. _entry_points sets a group's types on a library once; a group whose functions a build
# lacks (benchmarks load git revisions' builds) is None there.
_ENTRY_POINTS = {
    "bf16": (  # attention_bf16.c, whole-sequence units
        ("attention_bf16_scratch_bytes", [_I, _I, _I], _L),
        ("packed_attention_bf16", [_P, _P, _P, _I, _I, _I, _I, _P, _I, _I, _I, _I, _I, _P, _P,
                                   _P, _F, _I, _P, _I], None),
        ("packed_local_attention_bf16", [_P, _P, _P, _I, _I, _I, _I, _P, _I, _I, _I, _I, _I, _P,
                                         _P, _P, _F, _I, _I, _P, _I], None)),
    "bf16_tiled": (  # attention_bf16.c, long global sequences in key blocks
        ("attention_bf16_tiled_scratch_bytes", [_I, _I, _I, _I, _I, _I], _L),
        ("packed_tiled_attention_bf16", [_P, _P, _P, _I, _I, _I, _I, _P, _I, _I, _I, _I, _I, _P,
                                         _P, _P, _F, _I, _I, _I, _P, _I], None)),
    "bf16_flash_head": (  # attention_bf16.c, the shared scratch of its key-block units (builds
        # before it laid the key blocks out per unit and needed none)
        ("attention_bf16_flash_head_bytes", [_L, _I], _L),),
    "local": (  # encoder_cpu.c, local attention
        ("local_attention_scratch_floats", [_I, _I, _I, _I], _L),
        ("packed_local_attention_f32", [_P, _P, _P, _I, _I, _I, _P, _I, _I, _I, _P, _P, _P, _F,
                                        _I, _I, _P, _I], None)),
    "masked": (  # encoder_cpu.c, causal and GQA (its scratch is local attention's)
        ("local_attention_scratch_floats", [_I, _I, _I, _I], _L),
        ("packed_masked_attention_f32", [_P, _P, _P, _I, _I, _I, _P, _I, _I, _I, _I, _P, _P, _F,
                                         _I, _I, _I, _P, _I], None)),
    "flash": (  # encoder_cpu.c, long global fp32 sequences (flash_attention.h)
        ("flash_attention_scratch_floats", [_I, _I, _I, _I], _L),
        ("packed_flash_attention_f32", [_P, _P, _P, _I, _I, _I, _P, _I, _I, _I, _P, _P, _F, _P,
                                        _I], None)),
}


def _entry_points(lib: ctypes.CDLL, group: str) -> ctypes.CDLL | None:
    """lib with the argument and return types of `group`'s functions (_ENTRY_POINTS) set
    (once), or None for a build without them."""
    flag = f"{group}_typed"
    if getattr(lib, flag, False):
        return lib
    functions = _ENTRY_POINTS[group]
    if not all(hasattr(lib, name) for name, _, _ in functions):
        return None
    for name, argtypes, restype in functions:
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, restype
    setattr(lib, flag, True)
    return lib


def _row_stride(t: torch.Tensor, heads: int, head_dim: int) -> int | None:
    """Floats between consecutive tokens' rows of t [num_tokens, heads, head_dim], or None when
    the heads are not laid out back to back within a row."""
    if t.stride(2) != 1 or (heads > 1 and t.stride(1) != head_dim):
        return None
    return t.stride(0)


def _widened(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, strides: list[int]
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """q, k, v in fp32 and their row strides. Views of one fused projection [num_tokens,
    3 * heads * head_dim] (BertLayer's) widen in one contiguous pass over it: three strided
    copies cost ~1% more of a bf16 job on the long mix (profile: copies 4.6% -> 3.7%)."""
    num_tokens, heads, head_dim = q.shape
    width, step = heads * head_dim, heads * head_dim * q.element_size()
    if (strides == [3 * width] * 3 and k.data_ptr() == q.data_ptr() + step
            and v.data_ptr() == q.data_ptr() + 2 * step
            and k.untyped_storage().data_ptr() == q.untyped_storage().data_ptr()):
        fused = q.as_strided((num_tokens, 3 * width), (3 * width, 1)).float()  # [tokens, 3 w]
        parts = fused.view(num_tokens, 3, heads, head_dim).unbind(1)
        return (*parts, [3 * width] * 3)
    q, k, v = (t.float().contiguous() for t in (q, k, v))  # [num_tokens, heads, head_dim]
    return q, k, v, [width] * 3


def attention_on_cpu(q: torch.Tensor,  # [num_tokens, heads, head_dim]
                     k: torch.Tensor, v: torch.Tensor,  # [num_tokens, heads, head_dim]
                     seq_lens: list[int], cu_seqlens: torch.Tensor,  # [num_seqs + 1] int32
                     scale: float,
                     num_unattended: list[int] | None = None,
                     position_bias: dict[int, torch.Tensor] | None = None,  # L -> [heads, L, L]
                     bf16_products: bool = False,
                     half_window: int | None = None,
                     causal: bool = False,
                     long_on_sdpa: bool = True,
                     ) -> torch.Tensor | None:  # [num_tokens, heads, head_dim]
    """softmax(q k^T * scale + bias) v within each packed sequence, or None when this call
    does not qualify (see the module docstring). num_unattended must already be checked to
    leave each sequence at least one key. `bf16_products`: fp32 q/k/v may take the bf16
    kernel too (an int8 engine, whose error is far above bf16's; its q/k/v may also come in
    bf16 from the int8 QKV layer), and the result is fp32 (what int8 layers quantize from);
    without it bf16 q/k/v (the bf16 engine) give a bf16 result. `half_window`: local attention
    (keys |i - j| <= half_window), only the band scored. `causal` (keys j <= i; with
    half_window, i - half_window <= j <= i) and k/v with fewer heads than q (GQA, a divisor of
    them) take the fp32 kernel's decoder entry point (bf16 q/k/v widened, no score bias), but
    for long causal sequences without a window SDPA in bf16 where the route below applies
    (bf16 q/k/v, or fp32 ones with `bf16_products`: a decoder of an int8 or bf16 engine).
    `long_on_sdpa`: fp32 global attention sends long sequences apart (_long_apart): to the
    flash kernel from FLASH_MIN_LEN tokens where flash_route_here(), else to torch's SDPA from
    SDPA_MIN_LEN; bf16 / int8 global or causal attention sends those of BF16_SDPA_MIN_LEN or
    more to SDPA in bf16 where bf16_sdpa_is_fast() (False: all on the kernels; what the runs of
    other sequences take)."""
    if not (ENABLED and q.device.type == "cpu" and q.dtype in _DTYPES
            and k.dtype == v.dtype == q.dtype and q.dim() == 3 and k.dim() == 3
            and k.shape == v.shape and k.shape[0] == q.shape[0] and k.shape[2] == q.shape[2]
            and k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0):
        return None
    num_tokens, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    decoder = causal or kv_heads != heads  # the masked entry point (attention.h)
    if decoder and (position_bias is not None or not causal and half_window is None):
        # bidirectional global GQA (EmbeddingGemma's global layers, 3 q heads x 256 per k/v
        # head) stays on torch's SDPA: the kernel measured 0.66-0.77x its speed at 512-2,048
        # tokens and 1.04x at 8k, where causal GQA ran 1.19-1.86x and a 256-key window
        # 1.03-2.5x faster on the kernel (interleaved, shared Xeon, docs/dev/journal.md)
        return None
    lib = encoder_kernels()
    if lib is None or head_dim % lib.vector_floats or num_tokens == 0:
        return None
    masked = _entry_points(lib, "masked") if decoder else None
    if decoder and masked is None:
        return None  # an older build (benchmarks load git revisions' builds)
    strides = [_row_stride(t, n, head_dim) for t, n in ((q, heads), (k, kv_heads),
                                                         (v, kv_heads))]
    if None in strides:
        return None
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return None
    dtype = q.dtype
    if half_window is not None and half_window < 0:
        raise ValueError(f"half_window must be >= 0, got {half_window}.")
    if long_on_sdpa and _bf16_long_routes(dtype, bf16_products, seq_lens, half_window, causal,
                                          position_bias):
        return _long_sequences_on_sdpa(q, k, v, seq_lens, scale, num_unattended,
                                       bf16_products, causal)
    if long_on_sdpa and _long_causal_f32_routes(dtype, bf16_products, seq_lens, half_window,
                                                causal, position_bias):
        return _long_sequences_on_sdpa(q, k, v, seq_lens, scale, num_unattended, False, True,
                                       CAUSAL_SDPA_MIN_LEN, torch.float32)
    lib16 = _bf16_kernel_for(head_dim) if (dtype == torch.bfloat16 or bf16_products) \
        and not decoder else None
    if lib16 is None and dtype != torch.float32:  # bf16 without the bf16 kernel: fp32 inside
        if decoder:
            # needed: the masked kernel reads fp32 only (.float() is the one copy; contiguous)
            q, k, v = (t.float().contiguous() for t in (q, k, v))
            strides = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
        else:
            q, k, v, strides = _widened(q, k, v, strides)
    if (dtype == torch.float32 and not bf16_products and half_window is None and not decoder
            and position_bias is None and long_on_sdpa):
        flash = _entry_points(lib, "flash") if flash_route_here(lib.variant, head_dim) else None
        if max(seq_lens) >= (SDPA_MIN_LEN if flash is None else FLASH_MIN_LEN):
            return _long_apart(q, k, v, strides, seq_lens, scale, num_unattended, flash)
    count = len(seq_lens)
    if not (cu_seqlens.dtype == torch.int32 and cu_seqlens.is_cpu
            and cu_seqlens.is_contiguous() and cu_seqlens.numel() == count + 1):
        cu_seqlens = torch.tensor([0, *seq_lens]).cumsum(0).to(torch.int32)
    keys = None
    if num_unattended is not None:
        keys = (ctypes.c_int * count)(*(n - u for n, u in zip(seq_lens, num_unattended)))
    bias = None
    if position_bias is not None:
        tables = [position_bias[n] for n in seq_lens]  # [heads, n, n] each
        if any(t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu"
               or t.shape != (heads, n, n) for t, n in zip(tables, seq_lens)):
            return None
        bias = (ctypes.c_void_p * count)(*(t.data_ptr() for t in tables))
    max_len = max(seq_lens)
    threads = torch.get_num_threads()
    window = -1 if half_window is None else half_window
    if lib16 is not None:
        tiled = _entry_points(lib16, "bf16_tiled")
        if tiled is None:
            work = torch.empty(lib16.attention_bf16_scratch_bytes(max_len, head_dim, threads),
                               dtype=torch.uint8)
        else:
            flash_min = BF16_FLASH_MIN_LEN if cpu_features().kind() in BF16_FLASH_CPU_KINDS \
                else 0
            nbytes = tiled.attention_bf16_tiled_scratch_bytes(
                max_len, head_dim, window, int(bias is not None), flash_min, threads)
            shared = _entry_points(lib16, "bf16_flash_head")
            if shared is not None and flash_min and half_window is None and bias is None:
                # one head's K and V of the sequences that take the key-block units (the C
                # routes the same ones: global, no bias, flash_min tokens or more)
                nbytes += shared.attention_bf16_flash_head_bytes(
                    sum(n for n in seq_lens if n >= flash_min), head_dim)
            work = torch.empty(nbytes, dtype=torch.uint8)
        out_dtype = torch.float32 if bf16_products else dtype
        out = torch.empty(num_tokens, heads, head_dim, dtype=out_dtype)
        args = [q.data_ptr(), k.data_ptr(), v.data_ptr(), *strides,
                int(dtype == torch.bfloat16), out.data_ptr(), int(out_dtype == torch.bfloat16),
                int(bf16_products),  # P rounded to bf16 too
                heads, head_dim, count, cu_seqlens.data_ptr(), keys, bias, scale]
        # long global sequences in key blocks (BF16_FLASH_MIN_LEN); builds without that entry
        # point (benchmarks/interleaved.py calls git revisions' builds through this function)
        # take the ones they have
        if tiled is not None:
            tiled.packed_tiled_attention_bf16(*args, window, flash_min, max_len,
                                              work.data_ptr(), threads)
        elif half_window is None:
            lib16.packed_attention_bf16(*args, max_len, work.data_ptr(), threads)
        else:
            lib16.packed_local_attention_bf16(*args, window, max_len, work.data_ptr(), threads)
        return out
    out = torch.empty(num_tokens, heads, head_dim)
    if decoder:
        work = torch.empty(masked.local_attention_scratch_floats(max_len, head_dim, window,
                                                                 threads))
        masked.packed_masked_attention_f32(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), *strides, out.data_ptr(), heads,
            kv_heads, head_dim, count, cu_seqlens.data_ptr(), keys, scale, int(causal), window,
            max_len, work.data_ptr(), threads)
        return out if dtype == torch.float32 else out.to(dtype)
    args = [q.data_ptr(), k.data_ptr(), v.data_ptr(), *strides, out.data_ptr(), heads, head_dim,
            count, cu_seqlens.data_ptr(), keys, bias, scale]
    if half_window is None:  # the entry point older builds have too (as above)
        work = torch.empty(lib.attention_scratch_floats(max_len, head_dim, threads))
        lib.packed_attention_f32(*args, max_len, work.data_ptr(), threads)
    else:
        local = _entry_points(lib, "local")
        work = torch.empty(local.local_attention_scratch_floats(max_len, head_dim, window,
                                                                threads))
        local.packed_local_attention_f32(*args, window, max_len, work.data_ptr(), threads)
    return out if dtype == torch.float32 else out.to(dtype)


def flash_attention(lib: ctypes.CDLL,
                    q: torch.Tensor,  # [num_tokens, heads, head_dim] fp32, rows strided
                    k: torch.Tensor, v: torch.Tensor,  # [num_tokens, heads, head_dim]
                    strides: list[int], seq_lens: list[int], scale: float,
                    num_unattended: list[int] | None = None) -> torch.Tensor:
    """Global attention of each packed sequence through the flash kernel (lib: a build that
    _entry_points(lib, "flash") accepted); strides: q/k/v row strides (_row_stride)."""
    num_tokens, heads, head_dim = q.shape
    count = len(seq_lens)
    cu = torch.tensor([0, *seq_lens]).cumsum(0).to(torch.int32)  # [count + 1]
    keys = None
    if num_unattended is not None:
        keys = (ctypes.c_int * count)(*(n - u for n, u in zip(seq_lens, num_unattended)))
    threads = torch.get_num_threads()
    work = torch.empty(lib.flash_attention_scratch_floats(num_tokens, heads, head_dim, threads))
    out = torch.empty(num_tokens, heads, head_dim)
    lib.packed_flash_attention_f32(q.data_ptr(), k.data_ptr(), v.data_ptr(), *strides,
                                   out.data_ptr(), heads, head_dim, count, cu.data_ptr(), keys,
                                   scale, work.data_ptr(), threads)
    return out


def _long_apart(q: torch.Tensor,  # [num_tokens, heads, head_dim] fp32, rows strided
                k: torch.Tensor, v: torch.Tensor,  # [num_tokens, heads, head_dim]
                strides: list[int], seq_lens: list[int], scale: float,
                num_unattended: list[int] | None, flash: ctypes.CDLL | None) -> torch.Tensor:
    """Global fp32 attention with the long sequences apart from the others: with `flash` each
    run of sequences of FLASH_MIN_LEN tokens or more in one flash kernel call (an unattended
    suffix included), else each sequence of SDPA_MIN_LEN tokens or more with no unattended
    suffix on torch's SDPA; each run of the others on attention.h's kernel (a call on their
    rows, so a step with one long document and short texts keeps the kernel for those). SDPA
    reads the strided [1, heads, L, head_dim] views of the projection's rows (no copies in) and
    takes its flash CPU kernel (no mask, fp32): never an L x L buffer."""
    out = torch.empty(q.shape, dtype=torch.float32)  # [num_tokens, heads, head_dim]
    unattended = num_unattended or [0] * len(seq_lens)
    if flash is not None:
        long = [n >= FLASH_MIN_LEN for n in seq_lens]
    else:
        long = [n >= SDPA_MIN_LEN and not u for n, u in zip(seq_lens, unattended)]
    for i, j, a, b in _runs(seq_lens, long):
        lens = seq_lens[i:j]
        part_unattended = None if num_unattended is None else num_unattended[i:j]
        if not long[i]:
            out[a:b] = _on_kernels(q[a:b], k[a:b], v[a:b], lens, scale, part_unattended)
        elif flash is not None:
            out[a:b] = flash_attention(flash, q[a:b], k[a:b], v[a:b], strides, lens, scale,
                                       part_unattended)
        else:
            _each_on_sdpa(out, q, k, v, lens, a, scale, q.dtype)
    return out


def _runs(seq_lens: list[int], apart: list[bool]) -> Iterator[tuple[int, int, int, int]]:
    """The packed sequences in maximal runs that are all apart or all not (apart[i]): (i, j, a,
    b) for the run of sequences i .. j - 1, tokens a .. b - 1."""
    starts = [0, *itertools.accumulate(seq_lens)]
    i = 0
    while i < len(seq_lens):
        j = i + 1
        while j < len(seq_lens) and apart[j] == apart[i]:
            j += 1
        yield i, j, starts[i], starts[j]
        i = j


def _on_kernels(q: torch.Tensor,  # [run_tokens, heads, head_dim]: one run's rows
                k: torch.Tensor, v: torch.Tensor,  # [run_tokens, kv_heads, head_dim]
                lens: list[int], scale: float, num_unattended: list[int] | None,
                **options) -> torch.Tensor:  # [run_tokens, heads, head_dim]
    """A run of sequences that stays on the kernels (attention_on_cpu's `options`, none of its
    sequences sent apart again: long_on_sdpa=False)."""
    cu = torch.tensor([0, *lens]).cumsum(0).to(torch.int32)  # [len(lens) + 1]
    part = attention_on_cpu(q, k, v, lens, cu, scale, num_unattended, long_on_sdpa=False,
                            **options)
    if part is None:
        raise RuntimeError("the attention kernel declined a run it was chosen for")
    return part


def _each_on_sdpa(out: torch.Tensor,  # [num_tokens, heads, head_dim], written in place
                  q: torch.Tensor,  # [num_tokens, heads, head_dim]
                  k: torch.Tensor, v: torch.Tensor,  # [num_tokens, kv_heads, head_dim]
                  lens: list[int], first: int, scale: float, dtype: torch.dtype,
                  causal: bool = False) -> None:
    """Each of the packed sequences `lens` from token `first` on torch's SDPA in `dtype` (q/k/v
    of another dtype copied to it; is_causal, enable_gqa for fewer k/v heads), one call per
    sequence on the strided [1, heads, L, head_dim] views of its rows."""
    gqa = k.shape[1] != q.shape[1]
    for a, b in itertools.pairwise(itertools.accumulate(lens, initial=first)):
        qs, ks, vs = (t[a:b].transpose(0, 1).unsqueeze(0).to(dtype) for t in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, scale=scale, is_causal=causal,
                                           enable_gqa=gqa)  # [1, heads, L, head_dim]
        out[a:b] = o[0].transpose(0, 1)


# bf16 and int8 (`bf16_products`) attention over sequences of at least this many tokens, global
# or causal, all keys attended, runs torch's SDPA on bf16 q/k/v where bf16_sdpa_is_fast() holds.
# Its flash CPU kernel feeds q/k/v blocks and the rounded probabilities to oneDNN's bf16 brgemm
# (AMX tiles on this Xeon); the bf16 kernel here scores with VDPBF16PS, one query block at a
# time over the whole sequence's K and V, and slows past ~2k tokens (90 GFLOP/s at 8k against
# ~210 at 1-4k). One sequence, 12 heads x 64, 2 threads, interleaved, best of 4-9 rounds on the
# shared Sapphire Rapids Xeon (load 0.2-5; benchmarks/attention_bf16_sdpa.py), kernel / SDPA
# time: bf16 engine 0.4-1.9 at 512 tokens, 1.4-2.2 at 768, 1.1-3.8 at 1k, 2.3-2.9 at 2k,
# 3.2-3.3 at 4k, 4.2-4.5 at 8k; int8 (P rounded) 0.5-6.9 at 512, 1.6-3.8 at 768, 1.7-4.0 at 1k,
# 2.5-3.4 at 2k, 3.9-4.5 at 4k, 4.3-5.1 at 8k; causal and causal GQA (today the fp32 masked
# kernel on widened q/k/v) 0.96-3.4 at 1k, 2.6-3.3 at 2k-8k. 1,024: from there SDPA won every
# run but one causal 1k one (0.96); at 512 the load swung it both ways. Shorter sequences keep the
# kernel, which runs a step's short
# texts in one C call (the short-text ratios stay as they were). Local attention (ModernBERT's
# half_window, a decoder's sliding window) stays on the kernels too: they score only the band,
# SDPA the whole L x L under a mask (kernel / SDPA 0.55 at 1k-2k, 0.11-0.17 at 8k). Tests set
# it to route (or not) at other lengths.
BF16_SDPA_MIN_LEN = 1024
# Benchmarks and tests turn the bf16 SDPA route off here (or on, with bf16_sdpa_is_fast patched).
BF16_SDPA_ENABLED = True


def bf16_sdpa_is_fast() -> bool:
    """Whether torch's SDPA on bf16 q/k/v is the fast path here: the CPU has AMX-BF16 (what the
    figures above were measured on) and torch dispatches its AVX-512 kernels. Without AMX the
    margin goes: with oneDNN and MKL held off AMX on the same Xeon (ONEDNN_MAX_CPU_ISA=
    AVX512_CORE_BF16, MKL_ENABLE_INSTRUCTIONS=AVX512; an emulation of an AVX512_BF16-only CPU,
    not one), SDPA bf16 ran no faster than SDPA fp32 and 1.0-1.4x the kernel at 2k-8k (one
    loaded run), against 1.9-3.5x with AMX; on AVX2, oneDNN emulates bf16. Nothing there
    clearly beat the kernel, so bf16 keeps its kernel (or widens to fp32) without AMX. Torch held to
    AVX2 (ATEN_CPU_CAPABILITY=avx2)
    on an AMX CPU raises in SDPA bf16 ("pack_vnni2 is only supported when avx512 is
    supported", torch 2.13): it must not be routed there either."""
    if not BF16_SDPA_ENABLED:
        return False
    return (cpu_features().has("amx_bf16", "amx_tile")
            and torch.backends.cpu.get_cpu_capability() in ("AVX512", "AMX"))


# fp32 causal attention without a window (Qwen3, Llama and Mistral-style embedders without
# sliding layers) over sequences of at least this many tokens runs torch's SDPA (is_causal,
# enable_gqa) instead of the masked kernel. Measured (one layer, 2 threads, interleaved, best of
# 5, Sapphire Rapids VM with one other session busy): masked kernel / SDPA time at 1k, 1.5k, 2k,
# 4k tokens: 0.94, 1.16, 1.26, 1.53 at 16 heads x 128 with 8 k/v heads (Qwen3-0.6B), 0.83,
# 0.71, 0.98, 1.42 at 12 x 64; on the AVX2 build 1.78-3.00 and 1.33-2.53 from 1k. From 2k
# SDPA is level or ahead on every shape and build seen.
CAUSAL_SDPA_MIN_LEN = 2048


def _long_causal_f32_routes(dtype: torch.dtype, bf16_products: bool, seq_lens: list[int],
                            half_window: int | None, causal: bool,
                            position_bias: dict[int, torch.Tensor] | None) -> bool:
    """Whether an fp32 causal call without a window or score bias sends its sequences of
    CAUSAL_SDPA_MIN_LEN tokens or more to SDPA in fp32."""
    return (dtype == torch.float32 and not bf16_products and causal and half_window is None
            and position_bias is None and max(seq_lens) >= CAUSAL_SDPA_MIN_LEN)


def _bf16_long_routes(dtype: torch.dtype, bf16_products: bool, seq_lens: list[int],
                      half_window: int | None, causal: bool,
                      position_bias: dict[int, torch.Tensor] | None) -> bool:
    """Whether a bf16 (bf16 q/k/v) or int8 (`bf16_products`) call sends its long sequences to
    SDPA in bf16 (_long_sequences_on_sdpa): global or causal attention without a score bias, a
    sequence of BF16_SDPA_MIN_LEN tokens or more, and bf16_sdpa_is_fast()."""
    return ((dtype == torch.bfloat16 or bf16_products) and half_window is None
            and position_bias is None and max(seq_lens) >= BF16_SDPA_MIN_LEN
            and bf16_sdpa_is_fast())


def _long_sequences_on_sdpa(q: torch.Tensor,  # [num_tokens, heads, head_dim] bf16 or fp32
                            k: torch.Tensor, v: torch.Tensor,  # [num_tokens, kv_heads, head_dim]
                            seq_lens: list[int], scale: float,
                            num_unattended: list[int] | None, bf16_products: bool,
                            causal: bool, min_len: int = 0,
                            sdpa_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Attention with each long sequence (min_len tokens or more, no unattended suffix) on
    torch's SDPA in `sdpa_dtype` (is_causal, enable_gqa for fewer k/v heads) and each run of the
    others on the kernels (long_on_sdpa=False), in one output. Two routes take it: bf16 / int8
    attention, global or causal (_bf16_long_routes: SDPA in bf16 from BF16_SDPA_MIN_LEN, the
    defaults), and fp32 causal attention (_long_causal_f32_routes: SDPA in fp32 from
    CAUSAL_SDPA_MIN_LEN). The output is fp32 for `bf16_products` where the bf16 kernel takes
    the head size (what an int8 engine's output projection quantizes from), else q's dtype, as
    the kernel paths return. SDPA reads strided [1, heads, L, head_dim] views of the
    projection's rows when they are in `sdpa_dtype` already (fp32 q/k/v of an int8 engine are
    rounded to bf16 first: its precision is below bf16's)."""
    min_len = min_len or BF16_SDPA_MIN_LEN
    heads, head_dim = q.shape[1], q.shape[2]
    gqa = k.shape[1] != heads
    wide = bf16_products and not (causal or gqa) and _bf16_kernel_for(head_dim) is not None
    out = torch.empty(q.shape, dtype=torch.float32 if wide else q.dtype)
    unattended = num_unattended or [0] * len(seq_lens)
    routed = [n >= min_len and not u for n, u in zip(seq_lens, unattended)]
    for i, j, a, b in _runs(seq_lens, routed):
        lens = seq_lens[i:j]
        if routed[i]:
            _each_on_sdpa(out, q, k, v, lens, a, scale, sdpa_dtype, causal)
        else:
            out[a:b] = _on_kernels(q[a:b], k[a:b], v[a:b], lens, scale,
                                   None if num_unattended is None else num_unattended[i:j],
                                   bf16_products=bf16_products, causal=causal)
    return out
