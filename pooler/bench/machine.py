"""Facts about the machine and the model that bound what any engine can reach."""
from __future__ import annotations

import os
import platform
import resource
import time
from importlib import metadata

from pooler.cpu_features import cpu_features


def measure_gemm_gflops(threads: int, size: int = 2048, repeats: int = 5) -> float:
    """fp32 GFLOP/s of a square GEMM at `threads` threads, the practical FMA peak: the faster
    of torch's matmul (MKL, or OpenBLAS) and oneDNN's GEMM, each the best of `repeats` calls,
    the two alternating. Why both: on AMD CPUs MKL runs its AVX2 kernels even where AVX-512
    exists, and on Zen 4 that ceiling alone (136-168 GFLOP/s at 2 threads) sat below what
    pooler's fp32 ran on the long mix (184 GFLOP/s: "109% of the ceiling")."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        gemms = [lambda: a @ b]
        if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn,
                                                             "_linear_pointwise"):
            packed = torch.ops.mkldnn._reorder_linear_weight(b)
            gemms.append(lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none",
                                                                    [], ""))
        best = [float("inf")] * len(gemms)
        for _ in range(2):
            for gemm in gemms:
                gemm()
        for _ in range(repeats):  # best of N: the machine is shared, take the least disturbed
            for i, gemm in enumerate(gemms):
                start = time.perf_counter()
                gemm()
                best[i] = min(best[i], time.perf_counter() - start)
        return 2 * size ** 3 / min(best) / 1e9
    finally:
        torch.set_num_threads(previous)


def encoder_flops_per_token(hf_config: dict, seq_lens: list[int]) -> float:
    """Forward FLOPs per real token of a BERT-style encoder on these sequence lengths:
    the four GEMMs of each layer (QKV, output, FFN up and down) plus attention scores and
    weighted sum, whose cost per token grows with the length of its own sequence."""
    h = int(hf_config["hidden_size"])
    inter = int(hf_config["intermediate_size"])
    layers = int(hf_config["num_hidden_layers"])
    gemm = 2 * (h * 3 * h + h * h + 2 * h * inter)
    # Token-weighted mean length: attention costs 4*h*L per token of a length-L sequence.
    total = sum(seq_lens)
    mean_len = sum(n * n for n in seq_lens) / total if total else 0.0
    return layers * (gemm + 4 * h * mean_len)


def rss_mb() -> float:
    """Current resident set size of this process in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def precision_paths() -> dict[str, str]:
    """What each precision runs on this CPU (before any load-time timing): fp32's C kernel
    build for short steps, bf16's oneDNN path or its fallback, int8's kernel, and each one's
    attention kernel (fp32, or bf16 products where the CPU has AVX512_BF16)."""
    from pooler.kernels.attention_cpu import bf16_attention_kernels
    from pooler.kernels.build import encoder_kernels
    from pooler.worker.cpu_bf16 import bf16_path_name

    cpu = cpu_features()
    lib = encoder_kernels()
    fp32 = f"C kernel {lib.variant} (steps <= 48 tokens; larger ones too where it beats " \
        "oneDNN at load)" if lib is not None else \
        "torch/oneDNN (no C kernel here)"
    low = ", attention in bf16 products" if bf16_attention_kernels() is not None else \
        (", attention fp32" if lib is not None else "")
    bf16 = bf16_path_name(cpu) + low + ", timed against fp32 at load" if cpu.bf16 else \
        "float32 fallback (no AVX512_BF16 / AMX-BF16)"
    return {"float32": fp32, "bfloat16": bf16, "int8": _int8_path(cpu, low)}


def _int8_path(cpu, attention: str = "") -> str:
    """The int8 product's kernel in this process, which layers keep fp32 with smoothing, and
    `attention` (what precision_paths says of the attention kernel)."""
    from pooler.kernels.int8_cpu import int8_path
    from pooler.layers.quantization import keep_fp32_for

    path = int8_path()
    kernel = "torch._int_mm" if path == "torch" else f"C kernel {path}"
    kept = keep_fp32_for(path, smoothed=True)
    return (f"{kernel} ({', '.join(kept) or 'no linear'} kept fp32){attention}, timed against "
            "fp32 at load")


def machine_info() -> dict:
    cpu = cpu_features()
    return {
        "cpu": cpu.model, "cpu_kind": cpu.kind(), "cpu_flags": " ".join(cpu.named()),
        "precision_paths": precision_paths(), "cores": os.cpu_count(),
        "python": platform.python_version(), "torch": _version("torch"),
        "transformers": _version("transformers"),
        "sentence-transformers": _version("sentence-transformers"),
        "tokenizers": _version("tokenizers"),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
