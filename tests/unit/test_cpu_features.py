"""pooler/cpu_features.py: the one reader of the CPU's flags, and its test override."""
import pytest

from pooler import cpu_features as cf


@pytest.fixture
def fresh(monkeypatch):
    cf.cpu_features.cache_clear()
    yield monkeypatch
    cf.cpu_features.cache_clear()


@pytest.mark.parametrize("flags, kind, vnni, bf16", [
    ("sse4_2 avx2 fma", "AVX2", False, False),
    ("avx2 fma avx_vnni", "AVX2 + AVX-VNNI", True, False),
    ("avx2 fma avx512f avx512dq avx512vl", "AVX-512", False, False),
    ("avx2 fma avx512f avx512_vnni avx512_bf16", "AVX-512 VNNI", True, True),
    ("avx2 fma avx512f avx512_vnni amx_tile amx_bf16 amx_int8", "AMX", True, True),
    ("fp asimd", "NEON", False, False),
])
def test_kind_and_paths_follow_the_flags(fresh, flags, kind, vnni, bf16):
    fresh.setenv(cf.FLAGS_ENV, flags)
    cpu = cf.cpu_features()
    assert (cpu.kind(), cpu.vnni, cpu.bf16) == (kind, vnni, bf16)
    assert set(cpu.named()) <= set(flags.split())
    assert kind in cpu.summary()


def test_reads_this_machine_once(fresh):
    fresh.delenv(cf.FLAGS_ENV, raising=False)
    first = cf.cpu_features()
    assert first is cf.cpu_features()
    assert first.model and first.arch
