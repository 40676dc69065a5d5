/* int8 linear layers on x86-64: y = x W^T + b with W int8 per output channel (symmetric) and x
 * quantized per token to unsigned bytes with a zero point, in one call per layer
 * (pooler/kernels/int8_cpu.py is the Python side; pooler/kernels/build.py compiles this file
 * on first use, once per instruction set).
 *
 * Why it exists: torch._int_mm reaches oneDNN's VNNI kernel where the CPU has VNNI, and has no
 * fast kernel elsewhere (on an AVX2-only Zen 3 it ran 37x slower than the fp32 GEMM). Both
 * int8 dot-product instructions multiply UNSIGNED activation bytes by SIGNED weight bytes:
 * - AVX-512 VNNI: VPDPBUSD adds four u8 x s8 products into each int32 lane, exactly;
 * - AVX2: VPMADDUBSW adds two u8 x s8 products into an int16 lane (saturating), VPMADDWD by
 *   ones adds two int16 lanes into an int32.
 * So activations are quantized asymmetrically to [0, levels] with a per-token zero point zp:
 * x ~= scale * (q - zp). Then sum_k x[k] w[k] = scale * (sum_k q[k] w[k] - zp * colsum(w)),
 * where colsum is computed once at pack time: the zero point costs one multiply-add per output.
 * Asymmetric codes also spend all levels on the token's real range (a GELU output lies mostly
 * in [-0.17, max]), which symmetric codes waste half of.
 *
 * VPMADDUBSW saturation: a pair of products can reach 2 * 255 * 127 = 64770 > 32767, and
 * letting it saturate lost the answer (min cosine 0.896 to fp32 on the bench corpus). The AVX2
 * build uses activation codes [0, 128] and full int8 weights [-127, 127]: 2 * 128 * 127 = 32512
 * cannot saturate. With smoothing (below) the outlier channels' range moves into the weights,
 * so weight codes matter more than activation codes: this split measured better than codes
 * [0, 191] with weights [-85, 85] (benchmarks/int8_smoothing.py). VNNI sums into int32: codes
 * [0, 255] and weights [-127, 127].
 *
 * Per-input-channel smoothing (SmoothQuant): a few input channels of BERT's linears carry values
 * 5-20x the others (post-LayerNorm outlier channels), and a token's range, set by them, leaves
 * few codes for the rest; some down-projection weight columns do the same to their rows' scale.
 * The caller picks s[k] per input channel at load (pooler/layers/quantization.py), multiplies
 * weight column j by s[j] before quantizing it, and passes 1/s: x[j] / s[j] is what gets
 * quantized here, one multiply per element, and the product is unchanged in exact arithmetic.
 *
 * Outlier tokens: a row whose largest |x / s| exceeds 20x its root mean square (BERT's [CLS] and
 * [SEP], mostly at the FFN-down input) is quantized twice: its codes, then its rounding residual
 * (x / s minus the dequantized codes) on its own range; both products of those rows are redone
 * without bias or activation and combined as act(both + bias) (+ res) over the first pass's
 * rows (the register tile stays as it was: threading the addend through it halved its speed). ~2% of MiniLM's rows; it lifted the AVX2 build's min
 * cosine to fp32 on the 2,000-text bench corpus from 0.99651 to 0.99808 (VNNI 0.99818 ->
 * 0.99833): its worst texts were the shortest queries, where [CLS]/[SEP] weigh most.
 *
 * Layout: x fp32 row-major [m, k]; weights as nn.Linear keeps them, [n, k] int8, packed by
 * pack_int8_weight into [ceil(n/32)] panels of [k4/4][32 columns][4 consecutive k] bytes (k4 =
 * k rounded up to 4, zero-padded), so one 32-bit broadcast of 4 activation bytes meets 4 weight
 * bytes per column in each int32 lane. colsum/scales/bias are padded to whole panels.
 *
 * Threads: one OpenMP region per call on torch's runtime (see build.py); every output is
 * computed by one thread in a fixed order, so results do not depend on the thread count. */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NR 32 /* panel width in output columns */

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define LEVELS 255 /* activation codes [0, 255] */
/* rows per tile() register tile, 12 x 2 zmm accumulators: lone and partial panels (pairs of
 * whole panels take tile_pair's 6 x 4) */
#define MR 12
#define CW 32 /* columns per tile: the whole panel */
#else
#define LEVELS 128 /* activation codes [0, 128]: with |w| <= 127, 2 * 128 * 127 = 32512 */
#define AVX2_BUILD 1
/* 6 x 2 ymm accumulators, a broadcast, the ones and a product in 15 of the 16 ymm: the weights
 * are read as memory operands (MADD_U8S8), so they need no register */
#define MR 6
#define CW 16 /* columns per tile: half a panel */
#endif
#define MB 96 /* most rows per task (row_blocks) */

#ifdef AVX2_BUILD
/* acc += u8 x s8 products of 4 (a: 4 activation bytes in each lane; w: 32 weight bytes at
 * that address), as VPMADDUBSW (pairs -> int16), VPMADDWD by ones (-> int32), VPADDD. Inline
 * asm, as DPBUSD below: written with intrinsics, GCC 12 copied accumulators between registers
 * and spilled one to the stack on every step of the 4-row tile, and with the weights held in
 * registers no taller tile fit. This 6-row tile ran MiniLM's shapes 1.04-1.28x faster alone
 * (docs/dev/journal.md, "AVX2 int8 tile"). */
#define MADD_U8S8(acc, a, w, ones)                                                           \
    do {                                                                                      \
        __m256i t_;                                                                           \
        __asm__("vpmaddubsw %[W], %[A], %[T]\n\tvpmaddwd %[O], %[T], %[T]\n\t"                \
                "vpaddd %[T], %[C], %[C]"                                                     \
                : [C] "+x"(acc), [T] "=&x"(t_)                                                \
                : [A] "x"(a), [W] "m"(*(const __m256i *)(w)), [O] "x"(ones));                 \
    } while (0)
#else
/* acc += u8 x s8 dot products of 4, in place. Inline asm because GCC 12 copies every
 * accumulator through a spare register around the intrinsic (2 moves per VPDPBUSD: the loop
 * ran at half speed). */
#define DPBUSD(acc, a, w) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(w))
#endif

int int8_levels(void) { return LEVELS; }

/* The epilogue's optional activation (vector_math.h, shared with encoder_cpu.c) on one vector
 * of CW/2 floats. */
#define VW (CW / 2)
typedef float vf __attribute__((vector_size(VW * 4), aligned(4)));  /* any alignment */
typedef int32_t vi __attribute__((vector_size(VW * 4), aligned(4)));

#include "vector_math.h"
#include "tile_rows.h"

static inline int round_up4(int k) { return (k + 3) & ~3; }

/* n floats of f as bf16 at dst (n <= CW / 2: one vector's worth), rounded to nearest even in
 * integer ops (this build may lack AVX512_BF16's VCVTNEPS2BF16, which rounds the same way for
 * every finite value) */
static inline void store_bf16(uint16_t *dst, vf f, int n) {
    vi b = (vi)f;
    b = (b + 0x7fff + ((b >> 16) & 1)) >> 16; /* arithmetic shift: the low 16 bits are right */
#ifndef AVX2_BUILD
    if (n == VW) {
        _mm256_storeu_si256((__m256i *)dst, _mm512_cvtepi32_epi16((__m512i)b));
        return;
    }
#endif
    for (int i = 0; i < n; i++) dst[i] = (uint16_t)b[i];
}

long int8_packed_bytes(int n, int k) {
    return (long)((n + NR - 1) / NR) * NR * round_up4(k);
}

/* out: int8_packed_bytes(n, k) bytes; colsum: ceil(n/32)*32 int32 (padding columns 0). */
void pack_int8_weight(const int8_t *w, int8_t *out, int32_t *colsum, int n, int k) {
    int panels = (n + NR - 1) / NR, k4 = round_up4(k);
    for (int p = 0; p < panels; p++)
        for (int j = 0; j < NR; j++) {
            int col = p * NR + j;
            int32_t sum = 0;
            for (int kk = 0; kk < k4; kk++) {
                int8_t v = (col < n && kk < k) ? w[(size_t)col * k + kk] : 0;
                out[(size_t)p * k4 * NR + (size_t)(kk / 4) * NR * 4 + j * 4 + kk % 4] = v;
                sum += v;
            }
            colsum[col] = sum;
        }
}

/* One token: q[k4] codes in [0, LEVELS], its scale and zero point. The range always holds 0,
 * so zero (padding, ReLU outputs) is exact. sumsq (may be NULL): the sum of (x / s)^2, from
 * the same pass as the range (the outlier test's input). */
static void quantize_row(const float *x, const float *inv_smooth, int k, int k4, uint8_t *q,
                         float *scale, int32_t *zp, float *sumsq) {
    float lo = 0.f, hi = 0.f, sq = 0.f;
    int i = 0;
#ifndef AVX2_BUILD
    __m512 vlo = _mm512_setzero_ps(), vhi = _mm512_setzero_ps(), vsq = _mm512_setzero_ps();
    for (; i + 16 <= k; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(inv_smooth + i));
        vlo = _mm512_min_ps(vlo, v);
        vhi = _mm512_max_ps(vhi, v);
        vsq = _mm512_fmadd_ps(v, v, vsq);
    }
    lo = _mm512_reduce_min_ps(vlo);
    hi = _mm512_reduce_max_ps(vhi);
    sq = _mm512_reduce_add_ps(vsq);
#else
    __m256 vlo = _mm256_setzero_ps(), vhi = _mm256_setzero_ps(), vsq = _mm256_setzero_ps();
    for (; i + 8 <= k; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(inv_smooth + i));
        vlo = _mm256_min_ps(vlo, v);
        vhi = _mm256_max_ps(vhi, v);
        vsq = _mm256_fmadd_ps(v, v, vsq);
    }
    float l8[8], h8[8], s8[8];
    _mm256_storeu_ps(l8, vlo);
    _mm256_storeu_ps(h8, vhi);
    _mm256_storeu_ps(s8, vsq);
    for (int j = 0; j < 8; j++) {
        lo = l8[j] < lo ? l8[j] : lo;
        hi = h8[j] > hi ? h8[j] : hi;
        sq += s8[j];
    }
#endif
    for (; i < k; i++) {
        float v = x[i] * inv_smooth[i];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        sq += v * v;
    }
    if (sumsq) *sumsq = sq;
    float s = (hi - lo) / (float)LEVELS;
    if (!(s > 1e-30f)) s = 1e-30f; /* an all-zero row; also catches NaN ranges */
    float inv = 1.f / s;
    int32_t z = (int32_t)lrintf(-lo * inv);
    z = z < 0 ? 0 : (z > LEVELS ? LEVELS : z);
    i = 0;
#ifndef AVX2_BUILD
    for (; i + 16 <= k; i += 16) {  /* round to nearest even, + zp, clamp to [0, 255] */
        __m512 f = _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(inv_smooth + i));
        __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(f, _mm512_set1_ps(inv)));
        v = _mm512_add_epi32(v, _mm512_set1_epi32(z));
        _mm_storeu_si128((__m128i *)(q + i), _mm512_cvtusepi32_epi8(_mm512_max_epi32(v, _mm512_setzero_si512())));
    }
#else
    for (; i + 8 <= k; i += 8) {  /* round to nearest even, + zp, clamp to [0, LEVELS] */
        __m256 f = _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(inv_smooth + i));
        __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(f, _mm256_set1_ps(inv)));
        v = _mm256_add_epi32(v, _mm256_set1_epi32(z));
        v = _mm256_min_epi32(_mm256_max_epi32(v, _mm256_setzero_si256()), _mm256_set1_epi32(LEVELS));
        __m256i w = _mm256_packs_epi32(v, v);            /* int16, per 128-bit lane */
        w = _mm256_packus_epi16(w, w);                   /* uint8, per 128-bit lane */
        uint32_t lo4 = (uint32_t)_mm256_extract_epi32(w, 0), hi4 = (uint32_t)_mm256_extract_epi32(w, 4);
        memcpy(q + i, &lo4, 4);
        memcpy(q + i + 4, &hi4, 4);
    }
#endif
    for (; i < k; i++) {
        int32_t v = (int32_t)lrintf(x[i] * inv_smooth[i] * inv) + z;
        q[i] = (uint8_t)(v < 0 ? 0 : (v > LEVELS ? LEVELS : v));
    }
    for (i = k; i < k4; i++) q[i] = 0; /* meets zero weights */
    *scale = s;
    *zp = z;
}

#ifndef AVX2_BUILD
typedef __m512i vacc;
#else
typedef __m256i vacc;
#endif

/* y rows [0, mr) (row stride ldy) = act(scale * wscale * (acc - zp * colsum) + bias) (+ res),
 * `cols` (<= CW) valid columns starting `c0` columns into the panel whose per-column vectors
 * colsum/wscale/bias point at (padded to whole panels, so full loads are safe). */
static inline __attribute__((always_inline)) void epilogue(
        int mr, vacc acc[][2], int c0, const float *scale, const int32_t *zp,
        const int32_t *colsum, const float *wscale, const float *bias, const float *res,
        void *y, int ldy, int cols, int act, int out_bf16) {
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++) {
        float *row = (float *)y + (size_t)r * ldy;
        float out[CW];
        if (out_bf16) row = out; /* rounded to bf16 after the loop */
        for (int v = 0; v < 2; v++) { /* a vector of CW / 2 columns at a time */
            int c = c0 + v * (CW / 2);
            vi t, cs;
            vf ws, bs, f;
            memcpy(&t, &acc[r][v], sizeof t);
            memcpy(&cs, colsum + c, sizeof cs);
            memcpy(&ws, wscale + c, sizeof ws);
            memcpy(&bs, bias + c, sizeof bs);
            f = __builtin_convertvector(t - cs * zp[r], vf) * scale[r];
            f = f * ws + bs; /* one FMA: GCC contracts it (its default -ffp-contract=fast) */
            if (act) f = activate(f, act);
            if (res && cols == CW) {
                vf rv;
                memcpy(&rv, res + (size_t)r * ldy + v * (CW / 2), sizeof rv);
                f += rv;
            }
            memcpy(cols == CW ? row + v * (CW / 2) : out + v * (CW / 2), &f, sizeof f);
        }
        if (cols < CW)
            for (int j = 0; j < cols; j++)
                out[j] += res ? res[(size_t)r * ldy + j] : 0.f;
        if (out_bf16) {
            uint16_t *dst = (uint16_t *)y + (size_t)r * ldy;
            for (int v = 0; v < 2; v++) {
                int n = cols - v * (CW / 2);
                n = n > CW / 2 ? CW / 2 : n;
                vf f;
                memcpy(&f, out + v * (CW / 2), sizeof f);
                if (n > 0) store_bf16(dst + v * (CW / 2), f, n);
            }
        } else if (cols < CW) {
            memcpy(row, out, (size_t)cols * sizeof(float));
        }
    }
}

#ifdef AVX2_BUILD
/* The AVX2 tile's epilogue, out of line. Inlined into tile(), its code shared the function's
 * 16 ymm registers with the product loop, and what the activation needed decided how well
 * that loop was allocated: a cheaper erf (vector_math.h) made every AVX2 shape 15-25% slower
 * until the two were split. The accumulators pass through memory once per tile. */
static __attribute__((noinline)) void epilogue_out_of_line(
        int mr, vacc acc[][2], int c0, const float *scale, const int32_t *zp,
        const int32_t *colsum, const float *wscale, const float *bias, const float *res,
        void *y, int ldy, int cols, int act, int out_bf16) {
    epilogue(mr, acc, c0, scale, zp, colsum, wscale, bias, res, y, ldy, cols, act, out_bf16);
}
#endif

/* Rows [0, mr) of q (row stride k4) times CW columns of a panel (starting `c0` columns in),
 * then the epilogue into y (row stride ldy), `cols` (<= CW) valid columns. */
static inline __attribute__((always_inline)) void tile(
        int mr, const uint8_t *q, int k4, const int8_t *panel, int c0, const float *scale,
        const int32_t *zp, const int32_t *colsum, const float *wscale, const float *bias,
        const float *res, void *y, int ldy, int cols, int act, int out_bf16) {
    vacc acc[MR][2];
#ifndef AVX2_BUILD
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    for (int g = 0; g < k4 / 4; g++) {
        const int8_t *wg = panel + (size_t)g * NR * 4;
        _mm_prefetch((const char *)(wg + 32 * NR * 4), _MM_HINT_T1);
        _mm_prefetch((const char *)(wg + 32 * NR * 4 + 64), _MM_HINT_T1);
        __m512i w0 = _mm512_loadu_si512(wg), w1 = _mm512_loadu_si512(wg + 64);
#pragma GCC unroll 12
        for (int r = 0; r < mr; r++) {
            int32_t a4;
            memcpy(&a4, q + (size_t)r * k4 + g * 4, 4);
            __m512i a = _mm512_set1_epi32(a4);
            DPBUSD(acc[r][0], a, w0);
            DPBUSD(acc[r][1], a, w1);
        }
    }
    epilogue(mr, acc, c0, scale, zp, colsum, wscale, bias, res, y, ldy, cols, act, out_bf16);
#else
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int g = 0; g < k4 / 4; g++) {
        const int8_t *wg = panel + (size_t)g * NR * 4 + c0 * 4;
        _mm_prefetch((const char *)(wg + 32 * NR * 4), _MM_HINT_T1);
#pragma GCC unroll 12
        for (int r = 0; r < mr; r++) {
            int32_t a4;
            memcpy(&a4, q + (size_t)r * k4 + g * 4, 4);
            __m256i a = _mm256_set1_epi32(a4);
            /* u8 x s8 pairs -> int16 (128 x 127 x 2 fits: no saturation), pairs -> int32 */
            MADD_U8S8(acc[r][0], a, wg, ones);
            MADD_U8S8(acc[r][1], a, wg + 32, ones);
        }
    }
    /* a copy for the call: were acc's own address passed, GCC would keep it in memory */
    vacc out[MR][2];
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++) out[r][0] = acc[r][0], out[r][1] = acc[r][1];
    epilogue_out_of_line(mr, out, c0, scale, zp, colsum, wscale, bias, res, y, ldy, cols, act,
                         out_bf16);
#endif
}

/* Asks for the lines the epilogue of an mr-row, 64-column tile will touch (its residual rows
 * and its output rows, written in place) while the products run. Measured on Zen 4, 1 thread:
 * +9% on a 2,000 x 384 x 1152 call with fp32 outputs, within noise on the other MiniLM shapes
 * (docs/dev/journal.md, "6 x 64 int8 tiles"). */
static inline __attribute__((always_inline)) void prefetch_out(
        int mr, const float *res, const void *y, int ldy, size_t out_bytes) {
    for (int r = 0; r < mr; r++) {
        const char *row = (const char *)y + (size_t)r * ldy * out_bytes;
        for (size_t b = 0; b < 64 * out_bytes; b += 64) __builtin_prefetch(row + b, 1, 3);
        if (res)
            for (int b = 0; b < 64 * 4; b += 64)
                __builtin_prefetch((const char *)(res + (size_t)r * ldy) + b, 0, 3);
    }
}

#ifndef AVX2_BUILD
/* Two adjacent whole panels at once (64 columns): rows [0, mr <= PR) of q, 4 zmm accumulators
 * per row. Per group of 4 k, 4 weight loads and PR broadcasts feed 4 PR VPDPBUSD, where
 * tile()'s 12 x 2 shape needs 12 broadcasts for 24: on Zen 4 the pair measured 5-12% faster on
 * MiniLM's shapes (2048 x {384, 1536} x {384, 1536}, one thread, the products alone). */
#define PR 6
static inline __attribute__((always_inline)) void tile_pair(
        int mr, const uint8_t *q, int k4, const int8_t *panel, const float *scale,
        const int32_t *zp, const int32_t *colsum, const float *wscale, const float *bias,
        const float *res, void *y, int ldy, int act, int out_bf16, size_t out_bytes) {
    const int8_t *panel2 = panel + (size_t)k4 * NR;
    vacc lo[PR][2], hi[PR][2]; /* columns 0-31 (panel), 32-63 (panel2) */
    prefetch_out(mr, res, y, ldy, out_bytes);
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++) lo[r][0] = lo[r][1] = hi[r][0] = hi[r][1] = _mm512_setzero_si512();
    for (int g = 0; g < k4 / 4; g++) {
        const int8_t *wg = panel + (size_t)g * NR * 4, *wg2 = panel2 + (size_t)g * NR * 4;
        __m512i w0 = _mm512_loadu_si512(wg), w1 = _mm512_loadu_si512(wg + 64);
        __m512i w2 = _mm512_loadu_si512(wg2), w3 = _mm512_loadu_si512(wg2 + 64);
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            int32_t a4;
            memcpy(&a4, q + (size_t)r * k4 + g * 4, 4);
            __m512i a = _mm512_set1_epi32(a4);
            DPBUSD(lo[r][0], a, w0);
            DPBUSD(lo[r][1], a, w1);
            DPBUSD(hi[r][0], a, w2);
            DPBUSD(hi[r][1], a, w3);
        }
    }
    epilogue(mr, lo, 0, scale, zp, colsum, wscale, bias, res, y, ldy, CW, act, out_bf16);
    epilogue(mr, hi, 0, scale, zp, colsum + NR, wscale + NR, bias + NR, res ? res + NR : NULL,
             (char *)y + NR * out_bytes, ldy, CW, act, out_bf16);
}
#endif

/* y[m, n] = act(x[m, k] W^T + bias) + res[m, n] (res may be NULL; act: enum act), fp32, or
 * bf16 when out_bf16 (the rounding is the output's last step).
 * ln_w / ln_b [n] (NULL: none): then y = LayerNorm(that) * ln_w + ln_b with ln_eps, fp32 only
 * (out_bf16 must be 0): BERT's add-and-norm after o_proj and down_proj, done on each row block
 * while it is in cache instead of as a pass of its own over [m, n].
 * inv_smooth[k]: 1 / the per-input-channel smoothing factor s the weights were multiplied by at
 * pack time (all ones for none): x * diag(1/s) is what gets quantized (SmoothQuant, see the
 * header).
 * wscale/bias/colsum padded to whole panels (bias may be all zeros). scratch: at least
 * int8_scratch_bytes(m, k) bytes. */
long int8_scratch_bytes(int m, int k) {
    return (long)m * round_up4(k) + (long)m * 8 + 64;
}

/* True when a token's largest |x / s| exceeds `ratio` times its root mean square: such a row
 * (BERT's [CLS] / [SEP], whose few huge channels set the whole range) gets a second, residual
 * pass. The caller picks the ratio per layer (pooler/layers/quantization.py: 20, or lower
 * where the codes are coarser). */
static int is_outlier_row(float sumsq, int k, float peak, float ratio) {
    return peak * peak > ratio * ratio * (sumsq / (float)k);
}

/* Rows [m0, m_end) times panel p's columns, in tile()'s MR-row tiles. */
static void panel_rows(const uint8_t *q, const float *scale, const int32_t *zp, int m0,
                       int m_end, int k4, const int8_t *packed, const int32_t *colsum,
                       const float *wscale, const float *bias, const float *res, void *y, int n,
                       int p, int act, int out_bf16) {
    size_t out_bytes = out_bf16 ? 2 : 4;
    const int8_t *panel = packed + (size_t)p * k4 * NR;
    for (int c0 = 0; c0 < NR; c0 += CW) {
        int cols = n - p * NR - c0;
        if (cols <= 0) break;
        cols = cols < CW ? cols : CW;
        int col = p * NR + c0;
        for (int r0 = m0; r0 < m_end; r0 += MR) {
            int mr = m_end - r0 < MR ? m_end - r0 : MR;
            const uint8_t *qr = q + (size_t)r0 * k4;
            char *yr = (char *)y + ((size_t)r0 * n + col) * out_bytes;
            const float *rr = res ? res + (size_t)r0 * n + col : NULL;
            const int32_t *cs = colsum + p * NR;
            const float *ws = wscale + p * NR, *bs = bias + p * NR;
            ROWS_DISPATCH(mr, MR, tile, qr, k4, panel, c0, scale + r0, zp + r0, cs, ws, bs, rr,
                          yr, n, cols, act, out_bf16)
        }
    }
}

#ifndef AVX2_BUILD
/* Rows [m0, m_end) times whole panels p and p + 1, in tile_pair's PR-row tiles. */
static void pair_rows(const uint8_t *q, const float *scale, const int32_t *zp, int m0,
                      int m_end, int k4, const int8_t *packed, const int32_t *colsum,
                      const float *wscale, const float *bias, const float *res, void *y, int n,
                      int p, int act, int out_bf16) {
    size_t out_bytes = out_bf16 ? 2 : 4;
    const int8_t *panel = packed + (size_t)p * k4 * NR;
    const int32_t *cs = colsum + p * NR;
    const float *ws = wscale + p * NR, *bs = bias + p * NR;
    for (int r0 = m0; r0 < m_end; r0 += PR) {
        int mr = m_end - r0 < PR ? m_end - r0 : PR;
        const uint8_t *qr = q + (size_t)r0 * k4;
        char *yr = (char *)y + ((size_t)r0 * n + p * NR) * out_bytes;
        const float *rr = res ? res + (size_t)r0 * n + p * NR : NULL;
        ROWS_DISPATCH(mr, PR, tile_pair, qr, k4, panel, scale + r0, zp + r0, cs, ws, bs, rr, yr,
                      n, act, out_bf16, out_bytes)
    }
}
#endif

#ifndef AVX2_BUILD
#define UNIT 2 /* panels per task: tile_pair's 64 columns */
#else
#define UNIT 1
#endif

/* LayerNorm (vector_math.h's norm_row) over each of rows [m0, m_end) of y [*, n] in place,
 * times w plus b (the residual stream's norm after an add), except rows flagged in `skip`
 * (outlier rows: their output is only final after the residual pass, which normalizes them
 * then). The row is in cache: its task wrote it just before. */
static void norm_rows(float *y, int n, int m0, int m_end, const float *w, const float *b,
                      float eps, const char *skip) {
    for (int r = m0; r < m_end; r++)
        if (!(skip && skip[r])) norm_row(y + (size_t)r * n, y + (size_t)r * n, n, w, b, eps);
}

/* The LayerNorm fused after the GEMM (ln_w NULL: none), and the rows it skips. */
struct norm_args {
    const float *w, *b;
    float eps;
    const char *skip;
};

/* Rows [m0, m_end) times the units [u0, u1) of UNIT panels. */
static void rows_times_units(const uint8_t *q, const float *scale, const int32_t *zp, int m0,
                             int m_end, int k4, const int8_t *packed, const int32_t *colsum,
                             const float *wscale, const float *bias, const float *res, void *y,
                             int n, int act, int out_bf16, int u0, int u1) {
    int panels = (n + NR - 1) / NR;
    for (int u = u0; u < u1; u++) {
        int p = u * UNIT;
#ifndef AVX2_BUILD
        if ((p + 2) * NR <= n) {
            pair_rows(q, scale, zp, m0, m_end, k4, packed, colsum, wscale, bias, res, y, n, p,
                      act, out_bf16);
            continue;
        }
#endif
        for (int pp = p; pp < p + UNIT && pp < panels; pp++)
            panel_rows(q, scale, zp, m0, m_end, k4, packed, colsum, wscale, bias, res, y, n, pp,
                       act, out_bf16);
    }
}

#define MIN_BLOCK 12 /* fewest rows per block where the step has them: two 6-row pair tiles */

/* How many row blocks a call of m rows splits into: a multiple of the thread count where the
 * rows allow, each at most MB rows and at least MIN_BLOCK, so each thread gets the same rows.
 * Fixed MB-row blocks left a partial last block: on a 300-row step one thread had 192 rows and
 * the other 108 (the calls ran 1.23-1.25x faster balanced, Zen 4, 2 threads). Block b is rows
 * [b m / nb, (b + 1) m / nb). */
static int row_blocks(int m, int threads) {
    int nb = threads * ((m + threads * MB - 1) / (threads * MB));
    int most = m / MIN_BLOCK > 1 ? m / MIN_BLOCK : 1;
    return nb < most ? nb : most;
}

/* LayerNorm of rows [0, m) of y [*, n] in place, rows shared among the team (implicit barrier),
 * except the rows flagged in `skip` (see norm_rows). */
static void norm_rows_team(float *y, int m, int n, const struct norm_args *norm) {
#pragma omp for schedule(static)
    for (int r = 0; r < m; r++) norm_rows(y, n, r, r + 1, norm->w, norm->b, norm->eps, norm->skip);
}

/* y[rows, n] = act(codes W^T rescaled + bias) (+ res), every row and panel, then LayerNorm
 * when norm->w (fp32 output). Called by every thread of an enclosing parallel region, which
 * shares the tasks out (implicit barrier at the end; outside a region it runs on one thread).
 * A task is a block of rows (row_blocks) times UNIT panels; the VNNI build runs two whole
 * panels with tile_pair, a lone or partial last panel with tile(). With a norm and at least a
 * block per thread a task owns whole rows: every panel of its block, then the block's norm
 * while the block is still in cache. With fewer blocks than threads (a short step: one block
 * of up to 23 rows) whole-row tasks would leave all but one thread idle, so the panels are
 * shared out and the norm is a pass of its own. */
static void gemm_rows_team(const uint8_t *q, const float *scale, const int32_t *zp, int m,
                           int k4, const int8_t *packed, const int32_t *colsum,
                           const float *wscale, const float *bias, const float *res, void *y,
                           int n, int act, int out_bf16, const struct norm_args *norm) {
    int panels = (n + NR - 1) / NR, units = (panels + UNIT - 1) / UNIT;
    int threads = omp_get_num_threads(), blocks = row_blocks(m, threads);
    if (norm && norm->w && blocks >= threads) {
#pragma omp for schedule(static)
        for (int b = 0; b < blocks; b++) {
            int m0 = (int)((long)b * m / blocks), m_end = (int)((long)(b + 1) * m / blocks);
            rows_times_units(q, scale, zp, m0, m_end, k4, packed, colsum, wscale, bias, res, y,
                             n, act, 0, 0, units);
            norm_rows((float *)y, n, m0, m_end, norm->w, norm->b, norm->eps, norm->skip);
        }
        return;
    }
#pragma omp for schedule(static) collapse(2)
    for (int b = 0; b < blocks; b++)
        for (int u = 0; u < units; u++) {
            int m0 = (int)((long)b * m / blocks), m_end = (int)((long)(b + 1) * m / blocks);
            rows_times_units(q, scale, zp, m0, m_end, k4, packed, colsum, wscale, bias, res, y,
                             n, act, out_bf16, u, u + 1);
        }
    if (norm && norm->w) norm_rows_team((float *)y, m, n, norm);
}

/* d[0, k) = x / s minus the dequantized codes q: what the first pass's codes missed of a row */
static void residual_of(const float *x, const float *inv_smooth, const uint8_t *q, float scale,
                        int32_t zp, int k, float *d) {
    typedef uint8_t vu8 __attribute__((vector_size(VW)));
    int i = 0;
    for (; i + VW <= k; i += VW) {
        vf xv, sv;
        vu8 qv;
        memcpy(&xv, x + i, sizeof xv);
        memcpy(&sv, inv_smooth + i, sizeof sv);
        memcpy(&qv, q + i, sizeof qv);
        vf r = xv * sv - scale * (__builtin_convertvector(qv, vf) - (float)zp);
        memcpy(d + i, &r, sizeof r);
    }
    for (; i < k; i++) d[i] = x[i] * inv_smooth[i] - scale * (float)((int32_t)q[i] - zp);
}

/* The residual pass's buffers for up to `rows` outlier rows of a [*, k] x [n, k]^T call and
 * `threads` threads (residual_buffers_bytes; zeros and ones are filled by residual_buffers). */
struct residual_buffers {
    int *rows;       /* [rows] the outlier rows' indices */
    uint8_t *rq;     /* [2 rows][k4] codes */
    float *rscale;   /* [2 rows] */
    int32_t *rzp;    /* [2 rows] */
    float *t;        /* [2 rows][npad] products */
    float *zeros;    /* [npad] the second GEMM's bias */
    float *ones;     /* [k] no smoothing: the residual is already divided */
    float *d;        /* [threads][k] a residual row per thread */
};

static size_t residual_buffers_bytes(int rows, int k, int n, int threads) {
    size_t k4 = (size_t)round_up4(k), npad = (size_t)(n + NR - 1) / NR * NR;
    return 64 + sizeof(int) * rows + 2 * rows * (k4 + 8) + 64 +
           sizeof(float) * (2 * rows * npad + npad + k + (size_t)threads * k) + 64;
}

/* Carves `bytes` (residual_buffers_bytes) into the buffers, 64-byte aligned pieces. */
static struct residual_buffers residual_buffers(void *bytes, int rows, int k, int n,
                                                int threads) {
    size_t k4 = (size_t)round_up4(k), npad = (size_t)(n + NR - 1) / NR * NR;
    uintptr_t at = ((uintptr_t)bytes + 63) & ~(uintptr_t)63;
    struct residual_buffers b;
    b.rows = (int *)at;
    at += sizeof(int) * rows;
    b.rq = (uint8_t *)at;
    at += 2 * rows * k4;
    b.rscale = (float *)at;
    b.rzp = (int32_t *)(b.rscale + 2 * rows);
    at = ((uintptr_t)(b.rzp + 2 * rows) + 63) & ~(uintptr_t)63;
    b.t = (float *)at;
    b.zeros = b.t + 2 * rows * npad;
    b.ones = b.zeros + npad;
    b.d = b.ones + k;
    for (size_t i = 0; i < npad; i++) b.zeros[i] = 0.f;
    for (int i = 0; i < k; i++) b.ones[i] = 1.f;
    return b;
}

/* The second pass over the m_out rows flagged in `outlier` (see the header): each row's
 * residual (residual_of) is quantized on its own range, rows shared among the threads.
 * - No activation and an fp32 y (act 0, !out_bf16: QKV, o_proj, down_proj): the residual's
 *   product, without bias, is added onto y, which holds the first pass with bias and res:
 *   one GEMM row per outlier row.
 * - Else the first pass's codes are redone beside the residual's, both without bias, and
 *   y = act(both + bias) (+ res) over the first pass's row: the activation needs the whole
 *   sum, and a bf16 y has lost the bits to add to.
 * Then the norm, which the first pass left out for these rows. MiniLM's FFN-down input has
 * 6-8% outlier rows in its first four layers ([CLS], [SEP]); the serial, redone version of
 * this pass took 20-40% of those calls (Zen 4, 2 threads).
 * Called by every thread of an enclosing parallel region (implicit barrier at the end). */
static void residual_pass_team(const float *x, const float *inv_smooth, int m, int k,
                               const uint8_t *q, const float *scale, const int32_t *zp,
                               const char *outlier, int m_out, const int8_t *packed,
                               const int32_t *colsum, const float *wscale, const float *bias,
                               const float *res, void *y, int n, int act, int out_bf16,
                               const struct norm_args *norm, const struct residual_buffers *buf) {
    int k4 = round_up4(k), npad = (n + NR - 1) / NR * NR;
    int direct = act == 0 && !out_bf16, nrows = direct ? m_out : 2 * m_out;
    int *rows = buf->rows;
    uint8_t *rq = buf->rq;
    float *rscale = buf->rscale, *t = buf->t;
    int32_t *rzp = buf->rzp;
#pragma omp single
    for (int r = 0, j = 0; r < m; r++)
        if (outlier[r]) rows[j++] = r;
#pragma omp for schedule(static)
    for (int j = 0; j < m_out; j++) {
        int r = rows[j], at = direct ? j : m_out + j;
        float *dr = buf->d + (size_t)omp_get_thread_num() * k;
        residual_of(x + (size_t)r * k, inv_smooth, q + (size_t)r * k4, scale[r], zp[r], k, dr);
        quantize_row(dr, buf->ones, k, k4, rq + (size_t)at * k4, rscale + at, rzp + at, NULL);
        if (!direct) {
            memcpy(rq + (size_t)j * k4, q + (size_t)r * k4, k4);
            rscale[j] = scale[r];
            rzp[j] = zp[r];
        }
    }
    gemm_rows_team(rq, rscale, rzp, nrows, k4, packed, colsum, wscale, buf->zeros, NULL, t,
                   npad, 0, 0, NULL);
#pragma omp for schedule(static)
    for (int j = 0; j < m_out; j++) {
        size_t at = (size_t)rows[j] * n;
        const float *a = t + (size_t)j * npad, *b = direct ? NULL : a + (size_t)m_out * npad;
        const float *rr = res ? res + at : NULL;
        for (int c = 0; c < n; c += VW) { /* t and bias are padded to whole panels */
            int cols = n - c < VW ? n - c : VW;
            vf f, g, h;
            memcpy(&f, a + c, sizeof f);
            if (direct) {
                memcpy(&g, (float *)y + at + c, (size_t)cols * sizeof(float));
                f += g;
                memcpy((float *)y + at + c, &f, (size_t)cols * sizeof(float));
                continue;
            }
            memcpy(&g, b + c, sizeof g);
            memcpy(&h, bias + c, sizeof h);
            f = f + g + h;
            if (act) f = activate(f, act);
            for (int i = 0; i < cols; i++) f[i] += rr ? rr[c + i] : 0.f;
            if (out_bf16) store_bf16((uint16_t *)y + at + c, f, cols);
            else memcpy((float *)y + at + c, &f, (size_t)cols * sizeof(float));
        }
        if (norm->w) norm_rows((float *)y, n, rows[j], rows[j] + 1, norm->w, norm->b, norm->eps,
                               NULL);
    }
}

/* Quantizes rows [0, m) of x (quantize_row) and flags the outlier rows, rows shared among the
 * team; returns the number of outlier rows (every thread gets it: after the loop's barrier
 * each counts the shared flags itself). */
static int quantize_rows_team(const float *x, const float *inv_smooth, int m, int k,
                              uint8_t *q, float *scale, int32_t *zp, char *outlier,
                              float outlier_ratio) {
    int k4 = round_up4(k);
#pragma omp for schedule(static)
    for (int r = 0; r < m; r++) {
        float sumsq;
        quantize_row(x + (size_t)r * k, inv_smooth, k, k4, q + (size_t)r * k4, scale + r, zp + r,
                     &sumsq);
        /* the range [lo, hi] is scale * [-zp, LEVELS - zp]: its larger end is the peak */
        float peak = scale[r] * (float)(zp[r] > LEVELS - zp[r] ? zp[r] : LEVELS - zp[r]);
        outlier[r] = (char)is_outlier_row(sumsq, k, peak, outlier_ratio);
    }
    int m_out = 0;
    for (int r = 0; r < m; r++) m_out += outlier[r];
    return m_out;
}

/* One int8 linear layer (int8_linear's contract) by every thread of an enclosing region:
 * q/scale/zp/outlier hold m rows' codes, buf has room for m outlier rows. */
static void linear_team(const float *x, const float *inv_smooth, int m, int k,
                        const int8_t *packed, const int32_t *colsum, const float *wscale,
                        const float *bias, const float *res, void *y, int n, int act,
                        int out_bf16, float outlier_ratio, const struct norm_args *norm_in,
                        uint8_t *q, float *scale, int32_t *zp, char *outlier,
                        const struct residual_buffers *buf) {
    int m_out = quantize_rows_team(x, inv_smooth, m, k, q, scale, zp, outlier, outlier_ratio);
    struct norm_args norm = {norm_in->w, norm_in->b, norm_in->eps, outlier};
    gemm_rows_team(q, scale, zp, m, round_up4(k), packed, colsum, wscale, bias, res, y, n, act,
                   out_bf16, &norm);
    if (m_out > 0)
        residual_pass_team(x, inv_smooth, m, k, q, scale, zp, outlier, m_out, packed, colsum,
                           wscale, bias, res, y, n, act, out_bf16, &norm, buf);
}

void int8_linear(const float *x, const float *inv_smooth, int m, int k, const int8_t *packed,
                 const int32_t *colsum,
                 const float *wscale, const float *bias, const float *res, void *y, int n,
                 int act, int out_bf16, float outlier_ratio, const float *ln_w,
                 const float *ln_b, float ln_eps, uint8_t *scratch, int threads) {
    int k4 = round_up4(k);
    float *scale = (float *)scratch;
    int32_t *zp = (int32_t *)(scale + m);
    uint8_t *q = (uint8_t *)(zp + m);
    char *outlier = malloc((size_t)m);
    if (!outlier) return;
    int m_out = 0;
#pragma omp parallel num_threads(threads)
    {
        int count = quantize_rows_team(x, inv_smooth, m, k, q, scale, zp, outlier,
                                       outlier_ratio);
#pragma omp single
        m_out = count;
    }
    struct norm_args norm = {ln_w, ln_b, ln_eps, outlier};
#pragma omp parallel num_threads(threads)
    gemm_rows_team(q, scale, zp, m, k4, packed, colsum, wscale, bias, res, y, n, act, out_bf16,
                   &norm);
    if (m_out > 0) { /* the buffers for m_out rows only: a large step has few */
        void *bytes = malloc(residual_buffers_bytes(m_out, k, n, threads));
        if (bytes) {
            struct residual_buffers buf = residual_buffers(bytes, m_out, k, n, threads);
#pragma omp parallel num_threads(threads)
            residual_pass_team(x, inv_smooth, m, k, q, scale, zp, outlier, m_out, packed,
                               colsum, wscale, bias, res, y, n, act, out_bf16, &norm, &buf);
            free(bytes);
        }
    }
    free(outlier);
}

/* ---- The BERT-family layer stack for a short step, every linear in int8 ------------------
 * The same post-norm layer loop as encoder_cpu.c's bert_layers (fp32; its header says why a
 * short step wants one C call), with each linear the int8 layer above: per-token codes, the
 * fused bias / GELU / residual / LayerNorm epilogue, the outlier rows' residual pass. One
 * OpenMP region for the whole stack: the team versions of the GEMM steps share their rows and
 * panels out inside it, so a 12-token step pays one fork instead of ~4 per linear. The
 * attention is fp32 (attention.h, as bert_layers), over q/k/v kept in fp32.
 * pooler/kernels/bert_int8_cpu.py is the Python side: it passes the tensors the Int8Linear
 * layers already hold (packed weights, column sums, scales, padded bias, 1 / smoothing). */
#include "attention.h"

/* The pointers per linear, and the linears and norms per layer, in params' order. */
enum { L_PACKED, L_COLSUM, L_WSCALE, L_BIAS, L_INV_SMOOTH, L_PER_LINEAR };
enum { Q_QKV, Q_O, Q_UP, Q_DOWN, Q_LINEARS };
enum { N_LN1_W = Q_LINEARS * L_PER_LINEAR, N_LN1_B, N_LN2_W, N_LN2_B, I_PER_LAYER };

int int8_bert_params_per_layer(void) { return I_PER_LAYER; }

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Bytes of int8_bert_layers' scratch for a step of m tokens. */
long int8_bert_scratch_bytes(int m, int h, int inter, int heads, int threads) {
    int kmax = h > inter ? h : inter, nmax = 3 * h > inter ? 3 * h : inter;
    size_t floats = (size_t)m * (3 * h + h + h + inter) +
                    (size_t)threads * attention_work_floats(m, h / heads);
    return (long)(64 + align64(sizeof(float) * floats) + align64((size_t)m * round_up4(kmax)) +
                  align64((size_t)m * 9) + residual_buffers_bytes(m, kmax, nmax, threads));
}

/* Runs `layers` post-norm BERT layers over x [m, h] in place: `seqs` sequences packed back to
 * back (starts: seqs + 1 offsets; keys: attended keys per sequence; bias: NULL or a score
 * bias per sequence; see attention.h). params: I_PER_LAYER pointers per layer (per linear:
 * packed weight, column sums, weight scales and bias padded to whole panels, 1 / smoothing
 * [in]; then the two norms' weight and bias); ratios: the outlier ratio of each linear
 * (Q_LINEARS per layer). act: the FFN activation (ACT_*). scratch: int8_bert_scratch_bytes. */
void int8_bert_layers(float *x, int m, int seqs, const int *starts, const int *keys,
                      const float *const *bias, int h, int heads, int inter, int layers,
                      const void *const *params, const float *ratios, float eps, int act,
                      void *scratch, int threads) {
    int kmax = h > inter ? h : inter, nmax = 3 * h > inter ? 3 * h : inter, d = h / heads;
    char *at = (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *qkv = (float *)at, *ctx = qkv + (size_t)m * 3 * h, *t = ctx + (size_t)m * h;
    float *up = t + (size_t)m * h, *work = up + (size_t)m * inter;
    long per_thread = attention_work_floats(m, d);
    at += align64(sizeof(float) * ((size_t)m * (5 * h + inter) + (size_t)threads * per_thread));
    uint8_t *q = (uint8_t *)at;
    at += align64((size_t)m * round_up4(kmax));
    float *scale = (float *)at;
    int32_t *zp = (int32_t *)(scale + m);
    char *outlier = (char *)(zp + m);
    at += align64((size_t)m * 9);
    struct residual_buffers buf = residual_buffers(at, m, kmax, nmax, threads);
    int *task_starts = malloc(sizeof(int) * (seqs + 1));
    if (!task_starts) return;
    attention_tasks(seqs, starts, heads, task_starts);
    struct attention_args a = {qkv, qkv + h, qkv + 2 * h, 3 * h, 3 * h, 3 * h, ctx, heads, d,
                               seqs, starts, keys, bias, 1.f / sqrtf((float)d), task_starts,
                               -1};
#pragma omp parallel num_threads(threads)
    for (int l = 0; l < layers; l++) {
        const void *const *p = params + (size_t)l * I_PER_LAYER;
        const float *r = ratios + (size_t)l * Q_LINEARS;
        struct norm_args none = {NULL, NULL, 0.f, NULL};
        struct norm_args ln1 = {p[N_LN1_W], p[N_LN1_B], eps, NULL};
        struct norm_args ln2 = {p[N_LN2_W], p[N_LN2_B], eps, NULL};
#define LINEAR(which, in, k, res, out, n, act_, norm)                                           \
    linear_team(in, p[which * L_PER_LINEAR + L_INV_SMOOTH], m, k,                              \
                p[which * L_PER_LINEAR + L_PACKED], p[which * L_PER_LINEAR + L_COLSUM],        \
                p[which * L_PER_LINEAR + L_WSCALE], p[which * L_PER_LINEAR + L_BIAS], res,     \
                out, n, act_, 0, r[which], norm, q, scale, zp, outlier, &buf)
        LINEAR(Q_QKV, x, h, NULL, qkv, 3 * h, ACT_NONE, &none);
        attention(&a, work, per_thread);
        LINEAR(Q_O, ctx, h, x, t, h, ACT_NONE, &ln1);      /* t = LN(ctx Wo + b + x) */
        LINEAR(Q_UP, t, h, NULL, up, inter, act, &none);
        LINEAR(Q_DOWN, up, inter, t, x, h, ACT_NONE, &ln2); /* x = LN(up Wd + b + t) */
#undef LINEAR
    }
    free(task_starts);
}
