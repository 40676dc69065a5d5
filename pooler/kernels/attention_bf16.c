/* Bidirectional attention over packed (varlen) sequences with bf16 dot products (AVX512_BF16:
 * VDPBF16PS) and fp32 accumulation, softmax and output scaling. Built only for CPUs with
 * avx512_bf16 (pooler/kernels/attention_cpu.py loads it; build.py compiles it).
 *
 * Why: after the int8 or bf16 linears, fp32 attention (attention.h) was the largest part left
 * of an int8 or bf16 MiniLM job on the long mix (~23% of int8 time). VDPBF16PS does two
 * multiply-adds per fp32 lane where an FMA does one, so a product in it takes half the
 * instructions. Used where q/k/v are already bf16 (the bf16 engine's QKV projection) or where
 * the engine's precision is below bf16's anyway (int8): never for an fp32 engine.
 *
 * What is rounded to bf16: q, k and v (already bf16 on the bf16 engine), and with p_bf16 (int8
 * engines) the softmax numerators P before PV. Scores, max, exp, sums and outputs stay fp32, and
 * the 1/sqrt(d) scale is applied to the fp32 scores (not folded into bf16 q, which would round
 * twice). Without p_bf16 P@V runs in fp32 (attention.h's tile): rounding P moved a trained NER
 * model's probabilities further from fp32 than the bf16 engine's bar allows.
 *
 * Work unit: one (sequence, head), all its query blocks: its keys and values are re-laid out
 * once per unit into the thread's scratch:
 *   K:  kb[key][d] bf16 (read in place when the source is bf16);
 *   V:  with p_bf16, vp[key / 2][d][2] bf16, two keys' values interleaved, so one vector holds
 *       16 dims x 2 keys and a broadcast of two probabilities meets it in one VDPBF16PS;
 *       else vf32[key][d] fp32 (bf16 widens exactly);
 * and per block of QB = 32 queries:
 *   qt: [d / 2][QB][2] bf16 (a query's dims in pairs: a vector holds 16 queries x 2 dims);
 *   st: [key][QB] fp32 scores, transposed as in attention.h so the softmax is lane-wise (and,
 *       without p_bf16, P in place);
 *   pp: with p_bf16, [key / 2][QB][2] bf16 probabilities, two keys interleaved per query;
 *   otile: [QB][d] fp32, the fp32 P@V's block before it is rounded into a bf16 output.
 * An odd key count is padded with a zero key (zero probability, zero value), never read from
 * the source. Every output is computed by one thread in a fixed order: results do not depend on
 * the thread count.
 *
 * Long global sequences: a whole-sequence unit streams the head's K, V and a QB x L score row
 * through L2 for every query block (~210 GFLOP/s at 1-4k tokens, ~90 at 8k on Sapphire
 * Rapids); packed_tiled_attention_bf16 runs those of flash_min_len tokens or more in key blocks
 * with an online softmax instead (attention_bf16_flash.h), the same numerics. */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define VW 16
typedef float vf __attribute__((vector_size(VW * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(VW * 4), aligned(4)));
#include "vector_math.h"
/* QB (32 queries per block), KR (12 rows per register tile), the fp32 P@V tile (pv_tile), the
 * P@V tiles' dispatch (PV_DISPATCH) of the fp32 kernel and the score tiles' (tile_rows.h's
 * ROWS_DISPATCH); its other functions go unused here */
#include "attention.h"

/* acc += pairwise bf16 products of a and b (fp32 lanes). Inline asm, as int8_gemm.c's
 * VPDPBUSD: GCC copies each accumulator through a spare register around the intrinsic. */
#define DPBF16(acc, a, b) __asm__("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b))

/* bf16 lane order [a0, b0, a1, b1, ...] from [a0..a15, b0..b15] (VPERMW indices) */
static const uint16_t INTERLEAVE[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30,
                                        15, 31};

struct bf16_args {
    const void *q, *k, *v; /* row t of sequence-major tokens at + t * ld, head hd at + hd * d */
    int ldq, ldk, ldv, in_bf16;
    void *out; /* [tokens][heads][d], bf16 when out_bf16 else fp32 */
    int out_bf16, p_bf16, heads, d, seqs;
    const int *starts; /* seqs + 1 token offsets */
    const int *keys;   /* attended keys per sequence (a trailing unattended suffix), or NULL */
    const float *const *bias; /* NULL, or per sequence [heads][len][len] added to the scores */
    float scale;
    int half_window; /* local attention: keys with |i - j| <= half_window; < 0: all */
};

static inline int pairs_of(int n) { return (n + 1) / 2; }

/* 2^t on every lane to ~3e-6 relative: 2^n * 2^f with n = round(t), |f| <= 1/2 and a degree-5
 * Taylor series, VSCALEFPS applying 2^n. Half the instructions of vector_math.h's vexp (the
 * softmax was the largest part of this kernel with it), accurate far beyond the bf16 rounding
 * its result gets. t is clamped at -127 so no result is a denormal. */
static inline vf exp2_fast(vf t) {
    __m512 x = _mm512_max_ps((__m512)t, _mm512_set1_ps(-127.f));
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.5403530e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    return (vf)_mm512_scalef_ps(p, n);
}

/* One thread's scratch for a unit of up to `len` tokens, head size d (see the header). */
struct unit_scratch {
    uint16_t *kb, *qt;
    uint32_t *vp, *pp;
    float *vf32, *st, *inv, *otile;
};

static inline size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

/* lays the scratch out from `work` (w may be NULL: sizing only); returns its bytes */
static size_t carve_into(char *work, int len, int d, struct unit_scratch *w) {
    char *base = work ? (char *)(((uintptr_t)work + 63) & ~(uintptr_t)63) : NULL;
    size_t at = 0;
#define TAKE(field, type, count) \
    if (w) w->field = (type *)(base + at); \
    at = up64(at + (size_t)(count) * sizeof(type));
    TAKE(kb, uint16_t, (size_t)len * d)
    TAKE(vp, uint32_t, (size_t)pairs_of(len) * d)
    TAKE(vf32, float, (size_t)len * d)
    TAKE(qt, uint16_t, (size_t)d * QB)
    TAKE(st, float, (size_t)QB * len)
    TAKE(pp, uint32_t, (size_t)pairs_of(len) * QB)
    TAKE(inv, float, QB)
    TAKE(otile, float, (size_t)QB * d)
#undef TAKE
    return at + 64; /* + the alignment of work */
}

static struct unit_scratch carve(char *work, int len, int d) {
    struct unit_scratch w;
    carve_into(work, len, d, &w);
    return w;
}

/* bytes of one thread's scratch for sequences of up to max_len tokens, head size d */
static size_t unit_bytes(int max_len, int d) { return carve_into(NULL, max_len, d, NULL); }

long attention_bf16_scratch_bytes(int max_len, int d, int threads) {
    return (long)threads * (long)unit_bytes(max_len, d);
}

/* Rows are a head's slice of a fused [tokens, 3 * hidden] projection, kilobytes apart: the
 * hardware prefetchers do not follow that stride, so the re-layout loops ask AHEAD rows early
 * (a prefetch past the tensor's end is harmless: it never faults). */
#define AHEAD 8
static inline void prefetch_row(const char *row, int bytes) {
    for (int b = 0; b < bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
}

/* n (a multiple of 16) fp32 values as bf16 at dst */
static inline void row_to_bf16(const float *f, int n, uint16_t *dst) {
    for (int c = 0; c < n; c += 16)
        _mm256_storeu_si256((__m256i *)(dst + c),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(f + c)));
}

/* 16 values of a source row (fp32 or bf16) from column c, as 16 bf16 in a ymm */
static inline __m256i load16_bf16(const void *row, int in_bf16, int c) {
    if (in_bf16) return _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + c));
    return (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps((const float *)row + c));
}

/* nk rows of V (fp32 or bf16, row stride ldv elements of `in` bytes) re-laid out for P@V:
 * with bf16 P, as key pairs interleaved, vp[j2][c] = (v[2 j2][c], v[2 j2 + 1][c]), an odd
 * count's last pair with a zero value; else as fp32 rows vf32[j][c] (bf16 widens exactly).
 * The whole-sequence units and the key-block units (attention_bf16_flash.h) share it. */
static inline void relay_v(const char *v, int ldv, int in, int in_bf16, int p_bf16, int nk,
                           int d, uint32_t *vp, float *vf32) {
    if (p_bf16) {
        const __m512i weave = _mm512_loadu_si512(INTERLEAVE);
        for (int j2 = 0; j2 < (nk + 1) / 2; j2++) {
            const char *v0 = v + (size_t)(2 * j2) * ldv * in;
            const char *v1 = v0 + (size_t)ldv * in;
            int has1 = 2 * j2 + 1 < nk;
            prefetch_row(v0 + (size_t)AHEAD * ldv * in, d * in);
            prefetch_row(v1 + (size_t)AHEAD * ldv * in, d * in);
            for (int c = 0; c < d; c += 16) {
                __m256i lo = load16_bf16(v0, in_bf16, c);
                __m256i hi = has1 ? load16_bf16(v1, in_bf16, c) : _mm256_setzero_si256();
                __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                _mm512_storeu_si512(vp + (size_t)j2 * d + c,
                                    _mm512_permutexvar_epi16(weave, both));
            }
        }
        return;
    }
    for (int j = 0; j < nk; j++) {
        const char *vj = v + (size_t)j * ldv * in;
        prefetch_row(vj + (size_t)AHEAD * ldv * in, d * in);
        for (int c = 0; c < d; c += 16)
            _mm512_storeu_ps(vf32 + (size_t)j * d + c,
                             in_bf16 ? _mm512_cvtpbh_ps((__m256bh)load16_bf16(vj, 1, c))
                                     : _mm512_loadu_ps((const float *)vj + c));
    }
}

/* st[r][0..QB) = keys row r . queries, for mr key rows of kb (row stride ldk bf16). m0, m1: the
 * flash units' running maxima of the two query vectors (attention_bf16_flash.h), into which the
 * scores are also folded; NULL in the whole-sequence units, whose max comes after the band mask
 * (always_inline: the NULL check compiles away) */
static inline __attribute__((always_inline)) void bf16_score_tile(
        int mr, const uint16_t *kb, int ldk, const uint16_t *qt, int d, float *st, __m512 *m0,
        __m512 *m1) {
    __m512 acc[KR][2];
    _Pragma("GCC unroll 12") for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int c2 = 0; c2 < d / 2; c2++) {
        __m512 b0 = (__m512)_mm512_loadu_si512(qt + (size_t)c2 * QB * 2);
        __m512 b1 = (__m512)_mm512_loadu_si512(qt + (size_t)c2 * QB * 2 + 32);
        _Pragma("GCC unroll 12") for (int r = 0; r < mr; r++) {
            uint32_t pair;
            memcpy(&pair, kb + (size_t)r * ldk + 2 * c2, 4);
            __m512 a = (__m512)_mm512_set1_epi32((int)pair);
            DPBF16(acc[r][0], a, b0);
            DPBF16(acc[r][1], a, b1);
        }
    }
    __m512 x0 = m0 ? *m0 : _mm512_setzero_ps(), x1 = m1 ? *m1 : _mm512_setzero_ps();
    _Pragma("GCC unroll 12") for (int r = 0; r < mr; r++) {
        _mm512_storeu_ps(st + (size_t)r * QB, acc[r][0]);
        _mm512_storeu_ps(st + (size_t)r * QB + 16, acc[r][1]);
        if (m0) {
            x0 = _mm512_max_ps(acc[r][0], x0);
            x1 = _mm512_max_ps(acc[r][1], x1);
        }
    }
    if (m0) {
        *m0 = x0;
        *m1 = x1;
    }
}

/* o[r][0 .. nv*16) = inv[r] * sum_j p[r][j] v[j] for mr query rows; pp offset to the tile's
 * first query (row stride QB pairs), vp offset to the tile's first dim (row stride d pairs) */
static inline __attribute__((always_inline)) void bf16_pv_tile(
        int mr, int nv, const uint32_t *pp, const uint32_t *vp, int d, int np, const float *inv,
        void *o, int ldo, int out_bf16) {
    __m512 acc[KR][2];
    _Pragma("GCC unroll 12") for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int j2 = 0; j2 < np; j2++) {
        const uint32_t *vj = vp + (size_t)j2 * d, *pj = pp + (size_t)j2 * QB;
        __m512 b0 = (__m512)_mm512_loadu_si512(vj);
        __m512 b1 = nv == 2 ? (__m512)_mm512_loadu_si512(vj + 16) : b0;
        _Pragma("GCC unroll 12") for (int r = 0; r < mr; r++) {
            __m512 a = (__m512)_mm512_set1_epi32((int)pj[r]);
            DPBF16(acc[r][0], a, b0);
            if (nv == 2) DPBF16(acc[r][1], a, b1);
        }
    }
    _Pragma("GCC unroll 12") for (int r = 0; r < mr; r++)
        for (int w = 0; w < nv; w++) {
            __m512 y = _mm512_mul_ps(acc[r][w], _mm512_set1_ps(inv[r]));
            if (out_bf16)
                _mm256_storeu_si256((__m256i *)((uint16_t *)o + (size_t)r * ldo + w * 16),
                                    (__m256i)_mm512_cvtneps_pbh(y));
            else
                _mm512_storeu_ps((float *)o + (size_t)r * ldo + w * 16, y);
        }
}

/* qt32[c2 * QB + i] = query i's dims (2 c2, 2 c2 + 1) as a bf16 pair, for the nq queries of a
 * block whose first row is at src (row stride ld values, fp32 or bf16); queries nq .. QB - 1 are
 * zero. Sixteen queries by sixteen pairs at a time, transposed in registers: one query row at a
 * time (a copy, then one 32-bit store per pair) was ~10% of this kernel. */
static void queries_to_qt(const char *src, int ld, int in_bf16, int nq, int d, uint32_t *qt32) {
    int d2 = d / 2, in = in_bf16 ? 2 : 4;
    for (int i0 = 0; i0 < QB; i0 += 16)
        for (int c0 = 0; c0 < d2; c0 += 16) {
            int nc = d2 - c0 < 16 ? d2 - c0 : 16; /* 16, or 8 (d % 16 == 0) */
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                const char *row = src + (size_t)(i0 + i) * ld * in;
                if (i0 + i >= nq) {
                    r[i] = _mm512_setzero_si512();
                    continue;
                }
                __m256i lo = load16_bf16(row, in_bf16, 2 * c0); /* pairs c0 .. c0 + 7 */
                __m256i hi = nc == 16 ? load16_bf16(row, in_bf16, 2 * c0 + 16)
                                      : _mm256_setzero_si256();
                r[i] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            }
            transpose16_epi32(r);
            for (int c = 0; c < nc; c++)
                _mm512_storeu_si512(qt32 + (size_t)(c0 + c) * QB + i0, r[c]);
        }
}

static void bf16_attention_unit(const struct bf16_args *a, int s, int hd, char *work) {
    int d = a->d, first = a->starts[s], len = a->starts[s + 1] - first;
    int nk = a->keys ? a->keys[s] : len, np = pairs_of(nk);
    int in = a->in_bf16 ? 2 : 4; /* source bytes per value */
    const char *q = (const char *)a->q + ((size_t)first * a->ldq + (size_t)hd * d) * in;
    const char *k = (const char *)a->k + ((size_t)first * a->ldk + (size_t)hd * d) * in;
    const char *v = (const char *)a->v + ((size_t)first * a->ldv + (size_t)hd * d) * in;
    struct unit_scratch w = carve(work, len, d);

    /* K as bf16 rows: in place when the source is bf16 */
    const uint16_t *kr = (const uint16_t *)k;
    int ldkb = a->ldk;
    if (!a->in_bf16) {
        for (int j = 0; j < nk; j++) {
            prefetch_row(k + (size_t)(j + AHEAD) * a->ldk * in, d * in);
            row_to_bf16((const float *)(k + (size_t)j * a->ldk * in), d, w.kb + (size_t)j * d);
        }
        kr = w.kb;
        ldkb = d;
    }
    relay_v(v, a->ldv, in, a->in_bf16, a->p_bf16, nk, d, w.vp, w.vf32);
    const __m512i weave = _mm512_loadu_si512(INTERLEAVE);
    float scale = a->scale;
    const float *bias = a->bias ? a->bias[s] + (size_t)hd * len * len : NULL;
    int ldo = a->heads * d;
    int hw = a->half_window;
    size_t out_size = a->out_bf16 ? 2 : 4;
    for (int q0 = 0; q0 < len; q0 += QB) {
        int nq = len - q0 < QB ? len - q0 : QB;
        /* the block's keys lo .. lo + nb - 1: all, or with a band the union of its queries'
         * bands, lo even so that key pairs (vp, pp) stay aligned (attention.h's scheme) */
        int lo = 0, nb = nk;
        if (hw >= 0) {
            lo = (q0 - hw > 0 ? q0 - hw : 0) & ~1;
            nb = (q0 + nq + hw < nk ? q0 + nq + hw : nk) - lo;
        }
        int npb = pairs_of(nb);
        char *o = (char *)a->out + ((size_t)(first + q0) * ldo + (size_t)hd * d) * out_size;
        if (nb <= 0) { /* every key of the band is unattended: zeros, as SDPA's masked rows */
            for (int i = 0; i < nq; i++) memset(o + (size_t)i * ldo * out_size, 0, d * out_size);
            continue;
        }
        queries_to_qt(q + (size_t)q0 * a->ldq * in, a->ldq, a->in_bf16, nq, d, (uint32_t *)w.qt);
        for (int j0 = 0; j0 < nb; j0 += KR) {
            int mr = nb - j0 < KR ? nb - j0 : KR;
            const uint16_t *kj = kr + (size_t)(lo + j0) * ldkb;
            float *sr = w.st + (size_t)j0 * QB;
            ROWS_DISPATCH(mr, KR, bf16_score_tile, kj, ldkb, w.qt, d, sr, NULL, NULL)
        }
        /* scores * scale (+ bias), then the softmax over the keys, lane-wise */
        float *st = w.st, exp_scale = scale;
        if (bias) {
            const float *b = bias + (size_t)q0 * len + lo;
            for (int j = 0; j < nb; j++)
                for (int i = 0; i < nq; i++)
                    st[(size_t)j * QB + i] = st[(size_t)j * QB + i] * scale + b[(size_t)i * len + j];
            exp_scale = 1.f;
        }
        /* keys outside some query's band (before q0 + QB - 1 - hw or after q0 + hw) are -inf
         * for those queries before the max, and their probabilities exactly 0 after it */
        int edge_lo = hw < 0 ? -1 : q0 + QB - 1 - hw - lo, edge_hi = hw < 0 ? nb : q0 + hw - lo;
#define EDGE(j) ((j) < edge_lo || (j) > edge_hi)
        const vf ninf = vsplat(-INFINITY), zero = vsplat(0.f);
        vf mx0 = ninf, mx1 = mx0, sum0 = zero, sum1 = sum0;
        for (int j = 0; j < nb; j++) {
            float *sj = st + (size_t)j * QB;
            if (EDGE(j)) {
                *(vf *)sj = vselect(band_lanes(q0, 0, lo + j, hw), *(const vf *)sj, ninf);
                *(vf *)(sj + 16) = vselect(band_lanes(q0, 16, lo + j, hw),
                                           *(const vf *)(sj + 16), ninf);
            }
            mx0 = vmax(*(const vf *)sj, mx0);
            mx1 = vmax(*(const vf *)(sj + 16), mx1);
        }
        /* e^(scale (s - max)) = 2^(c s - c max), c = scale / ln 2 */
        float c = exp_scale * 1.44269504f;
        vf cm0 = mx0 * c, cm1 = mx1 * c;
        if (a->p_bf16) {
            /* P for keys 2 j2 and 2 j2 + 1, rounded to bf16 and interleaved per query */
            for (int j2 = 0; j2 < npb; j2++) {
                const float *s0 = st + (size_t)(2 * j2) * QB, *s1 = s0 + QB;
                int has1 = 2 * j2 + 1 < nb;
                for (int h = 0; h < 2; h++) {
                    vf cm = h ? cm1 : cm0;
                    vf e0 = exp2_fast(*(const vf *)(s0 + 16 * h) * c - cm);
                    vf e1 = has1 ? exp2_fast(*(const vf *)(s1 + 16 * h) * c - cm) : vsplat(0.f);
                    if (EDGE(2 * j2))
                        e0 = vselect(band_lanes(q0, 16 * h, lo + 2 * j2, hw), e0, zero);
                    if (has1 && EDGE(2 * j2 + 1))
                        e1 = vselect(band_lanes(q0, 16 * h, lo + 2 * j2 + 1, hw), e1, zero);
                    if (h) sum1 += e0 + e1; else sum0 += e0 + e1;
                    __m512i both = (__m512i)_mm512_cvtne2ps_pbh((__m512)e1, (__m512)e0);
                    _mm512_storeu_si512(w.pp + (size_t)j2 * QB + 16 * h,
                                        _mm512_permutexvar_epi16(weave, both));
                }
            }
        } else {
            for (int j = 0; j < nb; j++) { /* P in place, fp32 */
                float *sj = st + (size_t)j * QB;
                vf e0 = exp2_fast(*(const vf *)sj * c - cm0);
                vf e1 = exp2_fast(*(const vf *)(sj + 16) * c - cm1);
                if (EDGE(j)) {
                    e0 = vselect(band_lanes(q0, 0, lo + j, hw), e0, zero);
                    e1 = vselect(band_lanes(q0, 16, lo + j, hw), e1, zero);
                }
                *(vf *)sj = e0;
                *(vf *)(sj + 16) = e1;
                sum0 += e0;
                sum1 += e1;
            }
        }
#undef EDGE
        /* a query whose band holds no attended key (sum 0) gets zeros, as SDPA's masked rows */
        *(vf *)w.inv = vselect(sum0 > 0.f, 1.f / sum0, zero);
        *(vf *)(w.inv + 16) = vselect(sum1 > 0.f, 1.f / sum1, zero);
        /* fp32 P@V into a bf16 output goes through the block's fp32 tile */
        float *of = a->out_bf16 ? w.otile : (float *)o;
        int ldf = a->out_bf16 ? d : ldo;
        for (int i0 = 0; i0 < nq; i0 += KR) {
            int mr = nq - i0 < KR ? nq - i0 : KR;
            for (int c0 = 0; c0 < d; c0 += 32) {
                int nv = d - c0 >= 32 ? 2 : 1;
                if (a->p_bf16) {
                    void *oc = o + ((size_t)i0 * ldo + c0) * out_size;
                    const uint32_t *pt = w.pp + i0, *vc = w.vp + (size_t)(lo / 2) * d + c0;
                    PV_DISPATCH(mr, nv, 2, bf16_pv_tile, pt, vc, d, npb, w.inv + i0, oc, ldo,
                                a->out_bf16)
                } else {
                    const float *pt = st + i0, *vc = w.vf32 + (size_t)lo * d + c0;
                    float *oc = of + (size_t)i0 * ldf + c0;
                    PV_DISPATCH(mr, nv, 2, pv_tile, pt, vc, d, nb, w.inv + i0, oc, ldf)
                }
            }
        }
        if (!a->p_bf16 && a->out_bf16)
            for (int i = 0; i < nq; i++)
                row_to_bf16(w.otile + (size_t)i * d, d, (uint16_t *)o + (size_t)i * ldo);
    }
}

/* softmax(q k^T * scale + bias) v within each of `seqs` packed sequences, every head.
 * q/k/v: fp32 (in_bf16 0) or bf16 rows, head hd's d values at + hd * d; out: [tokens][heads][d]
 * fp32 or bf16 (out_bf16). half_window >= 0: local attention, query i sees keys
 * |i - j| <= half_window, only the band's keys scored per block (< 0: every key). d % 16 == 0.
 * work: attention_bf16_scratch_bytes(max_len, d, threads) bytes, max_len >= every sequence's
 * length. Runs its own region of `threads`. */
void packed_local_attention_bf16(const void *q, const void *k, const void *v, int ldq, int ldk,
                                 int ldv, int in_bf16, void *out, int out_bf16, int p_bf16,
                                 int heads, int d, int seqs, const int *starts, const int *keys,
                                 const float *const *bias, float scale, int half_window,
                                 int max_len, void *work, int threads) {
    struct bf16_args a = {q, k, v, ldq, ldk, ldv, in_bf16, out, out_bf16, p_bf16, heads, d,
                          seqs, starts, keys, bias, scale, half_window < 0 ? -1 : half_window};
    size_t bytes = unit_bytes(max_len, d);
    int units = seqs * heads;
#pragma omp parallel num_threads(threads)
    {
        char *mine = (char *)work + (size_t)omp_get_thread_num() * bytes;
        /* largest sequences first would balance better; units are whole (sequence, head)
         * pairs, and dynamic scheduling of single units keeps mixed lengths even enough */
#pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < units; t++) bf16_attention_unit(&a, t / heads, t % heads, mine);
    }
}

/* FK, FQ and the fp32 P@V tile with a rescale (flash_pv_tile) of the fp32 flash kernel; its
 * other functions go unused here. 128-query units and 6 x 4 P@V tiles, as measured for these
 * units (the fp32 kernel's 256 and 12 x 2 were measured for its own; with each head's K and V
 * laid out once, 256 queries and 12 x 2 measured level within noise, -1% to +5%: journal,
 * "bf16 flash units: each head's K and V laid out once"). -D overrides are for
 * benchmarks/attention_bf16_tiled.py --variants. */
#ifndef FSUB
#define FSUB 4
#endif
#ifndef FPV
#define FPV 4
#endif
#include "flash_attention.h"
_Static_assert(FK % 2 == 0, "key blocks must start on a key pair");
#include "attention_bf16_flash.h"

/* the sequences that take the flash units: flash_min_len tokens or more (0: none), global
 * attention without a score bias */
static int flash_min_len_for(int flash_min_len, int half_window, int biased) {
    return flash_min_len > 0 && half_window < 0 && !biased ? flash_min_len : 0;
}

static int takes_flash(int len, int flash_min) { return flash_min > 0 && len >= flash_min; }

/* bytes of one thread's scratch: the larger of a whole-sequence unit for the longest sequence
 * below flash_min (attention_bf16.c's) and a flash unit */
static size_t tiled_unit_bytes(int max_len, int d, int flash_min) {
    int whole = flash_min > 0 && max_len >= flash_min ? flash_min - 1 : max_len;
    size_t a = unit_bytes(whole > 0 ? whole : 1, d);
    size_t b = flash_min > 0 ? flash_unit_bytes(d) : 0;
    return a > b ? a : b;
}

/* the threads' part of packed_tiled_attention_bf16's work: biased nonzero when a score bias
 * will be passed */
long attention_bf16_tiled_scratch_bytes(int max_len, int d, int half_window, int biased,
                                        int flash_min_len, int threads) {
    int flash_min = flash_min_len_for(flash_min_len, half_window, biased);
    return (long)threads * (long)tiled_unit_bytes(max_len, d, flash_min);
}

/* the shared part after it: one head's K and V of the sequences that take the flash units,
 * flash_tokens tokens in all (0: none) */
long attention_bf16_flash_head_bytes(long flash_tokens, int d) {
    return flash_tokens > 0 ? (long)flash_head_bytes(flash_tokens, d) : 0;
}

/* packed_local_attention_bf16 with its long global sequences (flash_min_len tokens or more, no
 * score bias, half_window < 0; flash_min_len 0: none) in key blocks with an online softmax
 * (attention_bf16_flash.h: heads one after another, each head's K and V laid out once, then
 * its 128-query units), the others in whole-sequence units as there. work:
 * attention_bf16_tiled_scratch_bytes(max_len, d, half_window, bias != NULL, flash_min_len,
 * threads) + attention_bf16_flash_head_bytes(the flash sequences' tokens, d) bytes. */
void packed_tiled_attention_bf16(const void *q, const void *k, const void *v, int ldq, int ldk,
                                 int ldv, int in_bf16, void *out, int out_bf16, int p_bf16,
                                 int heads, int d, int seqs, const int *starts, const int *keys,
                                 const float *const *bias, float scale, int half_window,
                                 int flash_min_len, int max_len, void *work, int threads) {
    struct bf16_args a = {q, k, v, ldq, ldk, ldv, in_bf16, out, out_bf16, p_bf16, heads, d,
                          seqs, starts, keys, bias, scale, half_window < 0 ? -1 : half_window};
    int flash_min = flash_min_len_for(flash_min_len, a.half_window, bias != NULL);
    size_t bytes = tiled_unit_bytes(max_len, d, flash_min);
    /* per sequence: a whole-sequence unit per head, or (flash) a unit per head and FQ queries;
     * ints: the whole-sequence ones, the flash ones, and per flash sequence its first row, first
     * pair and first unit (+ the ends) */
    int *ints = malloc(sizeof(int) * (5 * (size_t)seqs + 3));
    if (!ints) return;
    int *whole = ints, *flash = whole + seqs, *koff = flash + seqs, *poff = koff + seqs + 1;
    int *unit_starts = poff + seqs + 1;
    int nwhole = 0, nflash = 0;
    koff[0] = poff[0] = unit_starts[0] = 0;
    for (int s = 0; s < seqs; s++) {
        int len = starts[s + 1] - starts[s];
        if (!takes_flash(len, flash_min)) {
            whole[nwhole++] = s;
            continue;
        }
        koff[nflash + 1] = koff[nflash] + len;
        poff[nflash + 1] = poff[nflash] + pairs_of(len);
        unit_starts[nflash + 1] = unit_starts[nflash] + (len + FQ - 1) / FQ;
        flash[nflash++] = s;
    }
    struct flash_head h = {NULL, NULL, NULL, nflash, flash, koff, poff};
    if (nflash) flash_head_carve((char *)work + (size_t)threads * bytes, koff[nflash], d, &h);
    int head_units = nwhole + unit_starts[nflash]; /* with flash sequences: per head */
#pragma omp parallel num_threads(threads)
    {
        char *mine = (char *)work + (size_t)omp_get_thread_num() * bytes;
        if (!nflash) {
#pragma omp for schedule(dynamic, 1)
            for (int t = 0; t < seqs * heads; t++)
                bf16_attention_unit(&a, t / heads, t % heads, mine);
        } else {
            /* head by head: its K and V laid out, then its units, the whole-sequence ones first
             * (the larger, so the flash units even the threads out at the end); the loop's
             * barrier keeps the next head's layout from overwriting rows still read */
            for (int hd = 0; hd < heads; hd++) {
                bf16_flash_lay_out_head(&a, hd, &h);
#pragma omp for schedule(dynamic, 1)
                for (int t = 0; t < head_units; t++) {
                    if (t < nwhole) {
                        bf16_attention_unit(&a, whole[t], hd, mine);
                    } else {
                        int f = unit_sequence(unit_starts, nflash, t - nwhole);
                        bf16_flash_unit(&a, &h, f, hd, t - nwhole - unit_starts[f], mine);
                    }
                }
            }
        }
    }
    free(ints);
}

/* The entry point before local attention (every key), kept for benchmarks that call older
 * builds alike (benchmarks/interleaved.py). */
void packed_attention_bf16(const void *q, const void *k, const void *v, int ldq, int ldk,
                           int ldv, int in_bf16, void *out, int out_bf16, int p_bf16,
                           int heads, int d, int seqs, const int *starts, const int *keys,
                           const float *const *bias, float scale, int max_len, void *work,
                           int threads) {
    packed_local_attention_bf16(q, k, v, ldq, ldk, ldv, in_bf16, out, out_bf16, p_bf16, heads,
                                d, seqs, starts, keys, bias, scale, -1, max_len, work, threads);
}
