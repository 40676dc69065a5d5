/* Vector math shared by pooler's C kernels (encoder_cpu.c, int8_gemm.c): exp, erf, the
 * epilogue activations on one GCC vector of floats, and a row's LayerNorm. The including file defines `vf` and `vi`
 * (float and int32 vectors of its width) before including this. build.py hashes this header
 * with each source, so editing it rebuilds both kernels. */
#ifndef POOLER_VECTOR_MATH_H
#define POOLER_VECTOR_MATH_H

/* Epilogue activation codes, as the Python side passes them (int8_cpu.EPILOGUE_ACTS). */
enum activation { ACT_NONE = 0, ACT_GELU_ERF = 2, ACT_GELU_TANH = 3, ACT_RELU = 4 };

#include <immintrin.h>
#include <math.h>
#include <string.h>

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

/* erf on every lane to ~4e-7 absolute: x P(x^2) / Q(x^2) on |x| <= 4 (erf(4) = 1 - 1.5e-8,
 * so clamping there costs nothing), P of degree 6 and Q of degree 4 fitted to erf in float64
 * (1.3e-7; float32 Horner rounding brings it to 4.4e-7). 18 vector operations where the
 * Abramowitz & Stegun form with exp took ~33: the int8 FFN-up layer with its GELU epilogue ran
 * ~10% faster on the VNNI build (Zen 4), level on the AVX2 build (docs/dev/journal.md). */
static inline vf verf(vf x) {
    x = vmin(vmax(x, vsplat(-4.f)), vsplat(4.f));
    vf z = x * x;
    vf p = 2.024146914e-01f + z * (5.088498071e-02f + z * (3.808320966e-03f +
            z * (1.444943482e-04f + z * (-1.964988314e-06f + z * 1.977801567e-08f))));
    p = 1.128378868f + z * p;
    vf q = 1.f + z * (5.127152801e-01f + z * (1.160142049e-01f + z * (1.456010714e-02f +
            z * 9.825493908e-04f)));
    return x * p * vrcp(q);
}

/* Lanes added in a fixed order: results are reproducible. */
static inline float hsum(vf v) {
    float s = 0.f;
    for (int i = 0; i < (int)(sizeof(vf) / sizeof(float)); i++) s += v[i];
    return s;
}

/* out[0, n) = (in - mean) / sqrt(var + eps) * w + b: LayerNorm over one row, in fp32. Two
 * passes: the mean, then the mean squared deviation (as torch's CPU kernel: no E[x^2] - E[x]^2
 * cancellation). in and out may be the same row; any n (a scalar tail past whole vectors). */
static inline void norm_row(const float *in, float *out, int n, const float *w, const float *b,
                            float eps) {
    const int lanes = (int)(sizeof(vf) / sizeof(float));
    vf vs = vsplat(0.f), vq = vsplat(0.f);
    int c = 0;
    for (; c + lanes <= n; c += lanes) {
        vf f;
        memcpy(&f, in + c, sizeof f);
        vs += f;
    }
    float sum = hsum(vs);
    for (int i = c; i < n; i++) sum += in[i];
    float mean = sum / (float)n;
    for (c = 0; c + lanes <= n; c += lanes) {
        vf f;
        memcpy(&f, in + c, sizeof f);
        f -= mean;
        vq += f * f;
    }
    float sq = hsum(vq);
    for (int i = c; i < n; i++) sq += (in[i] - mean) * (in[i] - mean);
    float inv = 1.f / sqrtf(sq / (float)n + eps);
    for (c = 0; c + lanes <= n; c += lanes) {
        vf f, g, h;
        memcpy(&f, in + c, sizeof f);
        memcpy(&g, w + c, sizeof g);
        memcpy(&h, b + c, sizeof h);
        f = (f - mean) * inv * g + h;
        memcpy(out + c, &f, sizeof f);
    }
    for (int i = c; i < n; i++) out[i] = (in[i] - mean) * inv * w[i] + b[i];
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
