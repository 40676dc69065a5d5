"""What this CPU can do, read once: the one place the kernels, the precision paths, the bench
and the logs ask, so they agree.

Linux reads `/proc/cpuinfo` (x86 `flags`, aarch64 `Features`); elsewhere the flags are empty
and every ISA-specific path stays off (the portable torch path runs). `POOLER_CPU_FLAGS`
(space-separated) replaces the flags read from the machine: tests use it to show a CPU without
a feature, e.g. an AVX2-only machine on an AVX-512 one. It is read here and nowhere else.
"""
from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path

FLAGS_ENV = "POOLER_CPU_FLAGS"

# The flags that decide a path, in the order the bench prints them. /proc/cpuinfo names:
# avx512_vnni (AVX-512 VNNI), avx_vnni (the VEX-encoded one on Alder Lake / Zen 5),
# avx512_bf16, amx_bf16/amx_int8 (with amx_tile), asimd (NEON on aarch64), sve.
NAMED_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
               "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve")


@dataclass(frozen=True)
class CpuFeatures:
    model: str               # "AMD EPYC 9R14 96-Core Processor"
    arch: str                # platform.machine(): "x86_64", "aarch64"
    flags: frozenset[str]    # every flag the kernel reported (or POOLER_CPU_FLAGS)

    def has(self, *names: str) -> bool:
        return all(n in self.flags for n in names)

    @property
    def avx2(self) -> bool:
        return self.has("avx2", "fma")

    @property
    def avx512(self) -> bool:
        return self.has("avx512f", "avx512dq", "avx512vl", "fma")

    @property
    def vnni(self) -> bool:
        """int8 dot products in one instruction (AVX-512 VNNI or AVX-VNNI)."""
        return self.has("avx512_vnni") or self.has("avx_vnni")

    @property
    def bf16(self) -> bool:
        """bf16 dot products in silicon (AVX512_BF16 or AMX-BF16)."""
        return self.has("avx512_bf16") or self.has("amx_bf16")

    @property
    def amx(self) -> bool:
        return self.has("amx_tile")

    def named(self) -> list[str]:
        """The deciding flags this CPU has, in NAMED_FLAGS order (for logs and the bench)."""
        return [f for f in NAMED_FLAGS if f in self.flags]

    def kind(self) -> str:
        """A short name for the CPU kind: 'AMX', 'AVX-512 VNNI', 'AVX-512', 'AVX2', ..."""
        if self.amx:
            return "AMX"
        if self.has("avx512f"):
            return "AVX-512 VNNI" if self.has("avx512_vnni") else "AVX-512"
        if self.avx2:
            return "AVX2 + AVX-VNNI" if self.has("avx_vnni") else "AVX2"
        if self.has("asimd"):
            return "NEON"
        return self.arch or "unknown"

    def summary(self) -> str:
        return f"{self.model} ({self.kind()}: {' '.join(self.named()) or 'no vector flags'})"


def _read_cpuinfo() -> tuple[str, set[str]]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown", set()
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if not model and key in ("model name", "Model", "Hardware"):
            model = value.strip()
        elif not flags and key in ("flags", "Features"):
            flags = set(value.split())
        if model and flags:
            break
    return model or platform.processor() or "unknown", flags


@functools.lru_cache(maxsize=1)
def cpu_features() -> CpuFeatures:
    model, flags = _read_cpuinfo()
    override = os.environ.get(FLAGS_ENV)
    if override is not None:
        flags = set(override.split())
    return CpuFeatures(model=model, arch=platform.machine(), flags=frozenset(flags))
