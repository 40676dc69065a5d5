/* Peak rates of the instructions pooler's kernels are built on, on one core of this CPU: what
 * "X% of peak" in docs/dev/journal.md divides by. Each loop runs 12-16 independent accumulators
 * (more than any latency x throughput product here), so it measures issue rate, not latency.
 *
 *   cc -O2 -mavx2 -mfma benchmarks/isa_peaks.c -o /tmp/isa_peaks && /tmp/isa_peaks
 *   cc -O2 -DAVX512 -mavx512f -mavx512bw -mavx512vnni -mavx512bf16 -mavx2 -mfma \
 *       benchmarks/isa_peaks.c -o /tmp/isa_peaks && /tmp/isa_peaks   # AVX-512 VNNI + BF16 CPUs
 *
 * The AVX2 int8 step is VPMADDUBSW (u8 x s8 pairs -> int16), VPMADDWD by ones (-> int32) and
 * VPADDD: two multiply instructions per 32 multiply-adds, timed as that chain. */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define R12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define N_ITER (100000000L / 12)

/* name, one accumulator's instruction(s) in asm, vector type, setup, ops per step */
#define RUN(NAME, VT, SET1, STEP, OPS)                                                         \
    {                                                                                          \
        R12(DECL_##VT) VT x = SET1(0x01010101), w = SET1(0x02020202);                          \
        __m256i ones = _mm256_set1_epi16(1);                                                   \
        (void)ones;                                                                            \
        double t = now();                                                                      \
        for (long n = 0; n < N_ITER; n++) { R12(STEP) }                                        \
        double dt = now() - t;                                                                 \
        int sink = 0;                                                                          \
        R12(SINK_##VT)                                                                         \
        printf("%-36s %7.1f G ops/s  (%.2f steps/ns)%s\n", NAME, N_ITER * 12.0 * OPS / dt / 1e9, \
               N_ITER * 12.0 / dt / 1e9, sink == 12345 ? " " : "");                            \
    }
/* fp32 runs start every accumulator at a normal float and add 1.0 * 1.0 per step (exact below
 * 2^24, never denormal): integer bit patterns as floats are denormals, whose FMAs take
 * microcode assists on Intel cores (0.4-0.7 G ops/s on the Sapphire Rapids VM, not the peak) */
#define SET1PS256(c) _mm256_set1_ps(1.0f)
#define DECL___m256(i) __m256 a##i = _mm256_set1_ps((float)(i + 1));
#define SINK___m256(i) sink += (int)_mm256_cvtss_f32(a##i);
#define DECL___m256i(i) __m256i a##i = _mm256_set1_epi32(i);
#define SINK___m256i(i) sink += _mm256_extract_epi32(a##i, 0);
#define FMA256(i) __asm__ volatile("vfmadd231ps %2, %1, %0" : "+v"(a##i) : "v"(x), "v"(w));
#define U8S8_256(i)                                                                            \
    __asm__ volatile("vpmaddubsw %2, %1, %%ymm15\n\tvpmaddwd %3, %%ymm15, %%ymm15\n\t"          \
                     "vpaddd %%ymm15, %0, %0"                                                  \
                     : "+v"(a##i) : "v"(x), "v"(w), "v"(ones) : "ymm15");
#ifdef AVX512
#define SET1PS512(c) _mm512_set1_ps(1.0f)
#define DECL___m512(i) __m512 a##i = _mm512_set1_ps((float)(i + 1));
#define SINK___m512(i) sink += (int)_mm512_reduce_add_ps(a##i);
#define DECL___m512i(i) __m512i a##i = _mm512_set1_epi32(i);
#define SINK___m512i(i) sink += _mm512_reduce_add_epi32(a##i);
#define FMA512(i) __asm__ volatile("vfmadd231ps %2, %1, %0" : "+v"(a##i) : "v"(x), "v"(w));
#define DPBUSD(i) __asm__ volatile("vpdpbusd %2, %1, %0" : "+v"(a##i) : "v"(x), "v"(w));
#define DPBF16(i) __asm__ volatile("vdpbf16ps %2, %1, %0" : "+v"(a##i) : "v"(x), "v"(w));
#endif

int main(void) {
    RUN("fp32 FMA, ymm (FLOP)", __m256, SET1PS256, FMA256, 16)
    RUN("int8 VPMADDUBSW+VPMADDWD+VPADDD, ymm", __m256i, _mm256_set1_epi32, U8S8_256, 64)
#ifdef AVX512
    RUN("fp32 FMA, zmm (FLOP)", __m512, SET1PS512, FMA512, 32)
    RUN("int8 VPDPBUSD, zmm", __m512i, _mm512_set1_epi32, DPBUSD, 128)
    RUN("bf16 VDPBF16PS, zmm (FLOP)", __m512i, _mm512_set1_epi32, DPBF16, 64)
#endif
    return 0;
}
