/* Vector math shared by pooler's C kernels (encoder_cpu.c, int8_gemm.c): exp, erf and the
 * epilogue activations on one GCC vector of floats. The including file defines `vf` and `vi`
 * (float and int32 vectors of its width) before including this. build.py hashes this header
 * with each source, so editing it rebuilds both kernels. */
#ifndef POOLER_VECTOR_MATH_H
#define POOLER_VECTOR_MATH_H

/* Epilogue activation codes, as pooler/kernels/*.py pass them (EPILOGUE_ACTS). */
enum activation { ACT_NONE = 0, ACT_GELU_ERF = 2, ACT_GELU_TANH = 3, ACT_RELU = 4 };

#include <immintrin.h>

static inline vf vsplat(float v) { return (vf){} + v; }
static inline vf vselect(vi mask, vf a, vf b) { return (vf)((mask & (vi)a) | (~mask & (vi)b)); }
/* lane-wise max / min in one instruction (a compare and a select are three or four) */
#if defined(__AVX512F__) && VW == 16
static inline vf vmax(vf a, vf b) { return (vf)_mm512_max_ps((__m512)a, (__m512)b); }
static inline vf vmin(vf a, vf b) { return (vf)_mm512_min_ps((__m512)a, (__m512)b); }
#else
static inline vf vmax(vf a, vf b) { return (vf)_mm256_max_ps((__m256)a, (__m256)b); }
static inline vf vmin(vf a, vf b) { return (vf)_mm256_min_ps((__m256)a, (__m256)b); }
#endif

/* exp on every lane, ~2 ulp: 2^n * e^r with n = round(x / ln2), |r| <= ln2/2 and a degree-6
 * Taylor series. Rounding by the 1.5 * 2^23 trick leaves n in the low mantissa bits. */
static inline vf vexp(vf x) {
    x = vmin(vmax(x, vsplat(-87.3f)), vsplat(88.3f));
    const float magic = 12582912.f; /* 1.5 * 2^23, bits 0x4B400000 */
    vf t = x * 1.44269504f + magic;
    vf n = t - magic;
    vf r = x - n * 0.693145752f - n * 1.42860677e-6f; /* ln2 split in two for exactness */
    vf p = 1.f + r * (1.f + r * (0.5f + r * (1.f / 6 + r * (1.f / 24 + r * (1.f / 120 +
            r * (1.f / 720))))));
    vi bits = (((vi)t - 0x4B400000) + 127) << 23;
    return p * (vf)bits;
}

/* 1 / d on every lane (d > 0, finite) to ~1 ulp: the hardware estimate (14 bits on AVX-512,
 * 12 on AVX2) and one Newton step. A VDIVPS issues once every several cycles; in the GELU
 * epilogue of an int8 GEMM tile it was a fifth of the FFN-up layer's time. */
static inline vf vrcp(vf d) {
#if defined(__AVX512F__) && VW == 16
    vf r = (vf)_mm512_rcp14_ps((__m512)d);
#else
    vf r = (vf)_mm256_rcp_ps((__m256)d);
#endif
    return r * (2.f - d * r);
}

/* erf on every lane to ~1.5e-7 absolute (Abramowitz & Stegun 7.1.26), odd-symmetric. */
static inline vf verf(vf x) {
    vi sign = (vi)x & (int32_t)0x80000000;
    vf a = (vf)((vi)x & 0x7fffffff);
    vf t = vrcp(1.f + 0.3275911f * a);
    vf poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f +
               t * (-1.453152027f + t * 1.061405429f))));
    vf y = 1.f - poly * vexp(-a * a);
    return (vf)((vi)y | sign);
}

static inline vf activate(vf y, int act) {
    if (act == ACT_GELU_ERF)
        return 0.5f * y * (1.f + verf(y * 0.70710678f));
    if (act == ACT_GELU_TANH) {
        vf u = 0.7978845608f * (y + 0.044715f * y * y * y);
        return 0.5f * y * (2.f - 2.f * vrcp(1.f + vexp(2.f * u))); /* 1 + tanh(u) */
    }
    if (act == ACT_RELU)
        return vselect(y > 0.f, y, vsplat(0.f));
    return y;
}

#endif
