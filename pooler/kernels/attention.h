/* Bidirectional attention over packed (varlen) sequences in fp32, shared by encoder_cpu.c's
 * short-step layer stack (bert_layers) and its stand-alone entry point (packed_attention_f32,
 * what pooler/kernels/attention_cpu.py calls for larger steps). The including file defines
 * VW, `vf`, `vi` and includes vector_math.h first.
 *
 * Work unit: one (sequence, head, block of QB queries). Its scores are kept transposed,
 * st[key][query], so that a vector holds one key's score for QB/2 queries: the softmax over
 * the keys is then lane-wise (max, exp, sum: no horizontal reductions, no padded keys), and
 * neither K nor V is ever copied or transposed: the score tile broadcasts K's elements straight
 * from the q/k/v rows, the P@V tile reads V's rows as vectors. Only the block's queries are
 * transposed (d x QB floats, pre-scaled). A block's scores take QB x keys floats (64 KB for 512
 * keys on AVX-512), so they stay in L2 while P@V reads them back.
 *
 * Local attention (half_window >= 0: query i sees keys j with |i - j| <= half_window, as
 * ModernBERT's local layers and pooler/layers/attention.py's _band_mask): a block's queries
 * q0 .. q0 + QB - 1 score only the keys q0 - w .. q0 + QB - 1 + w, the union of their bands,
 * and the lanes outside each query's band are masked before the softmax. Work per block is
 * QB x (QB + 2w) scores instead of QB x len, the scratch QB x (QB + 2w) floats whatever the
 * length: a local layer at 8k tokens does O(len w) work in O(block) memory.
 *
 * Decoder-style masks and grouped k/v heads (packed_masked_attention_f32): `causal` keeps the
 * keys j <= i (with half_window, Mistral's and Gemma3's causal sliding window i - w <= j <= i),
 * the band's right edge then 0, so a block scores keys q0 - w .. q0 + QB - 1; `kv_heads` < heads
 * (GQA: Gemma3, Qwen3, Llama) reads query head h's keys and values from head h / (heads /
 * kv_heads) of the k/v rows, never copying or repeating them.
 *
 * Every output element is computed by one thread in a fixed order: results do not depend on
 * the thread count or the schedule. */
#ifndef POOLER_ATTENTION_H
#define POOLER_ATTENTION_H

#include "tile_rows.h"

#define QB (2 * VW) /* queries per block: two vectors */
#ifdef __AVX512F__
#define KR 12 /* rows per tile (keys in the score tile, queries in P@V): 12 x 2 accumulators */
#else
#define KR 6 /* 6 x 2 accumulators + 2 operands + a broadcast in 16 ymm */
#endif

struct attention_args {
    const float *q, *k, *v; /* row t of sequence-major tokens at q + t * ldq, head hd at + hd*d */
    int ldq, ldk, ldv;
    float *out; /* [tokens][heads][d] */
    int heads, d, seqs;
    const int *starts;        /* seqs + 1 token offsets */
    const int *keys;          /* attended keys per sequence (a trailing unattended suffix), or
                                 NULL: all of them */
    const float *const *bias; /* NULL, or per sequence [heads][len][len] added to the scores */
    float scale;
    const int *task_starts;   /* seqs + 1: first work unit of each sequence (attention_tasks) */
    int half_window;          /* local attention: keys with |i - j| <= half_window; < 0: all */
    int kv_heads;             /* k/v heads (GQA: fewer than heads, dividing them); 0: heads */
    int causal;               /* nonzero: keys j <= i only */
};

#if VW == 16
/* 16 x 16 32-bit elements transposed in registers: r[i] lane j becomes r[j] lane i (unpacks
 * within 128-bit lanes, then a 4 x 4 transpose of the lanes) */
static inline void transpose16_epi32(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int k = 0; k < 16; k += 2) {
        t[k] = _mm512_unpacklo_epi32(r[k], r[k + 1]);
        t[k + 1] = _mm512_unpackhi_epi32(r[k], r[k + 1]);
    }
    for (int k = 0; k < 16; k += 4) { /* u[k + j] lane L: column 4 L + j of rows k .. k + 3 */
        u[k] = _mm512_unpacklo_epi64(t[k], t[k + 2]);
        u[k + 1] = _mm512_unpackhi_epi64(t[k], t[k + 2]);
        u[k + 2] = _mm512_unpacklo_epi64(t[k + 1], t[k + 3]);
        u[k + 3] = _mm512_unpackhi_epi64(t[k + 1], t[k + 3]);
    }
    for (int j = 0; j < 4; j++) {
        __m512i ab_lo = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44);
        __m512i ab_hi = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xEE);
        __m512i cd_lo = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44);
        __m512i cd_hi = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xEE);
        r[j] = _mm512_shuffle_i32x4(ab_lo, cd_lo, 0x88);
        r[4 + j] = _mm512_shuffle_i32x4(ab_lo, cd_lo, 0xDD);
        r[8 + j] = _mm512_shuffle_i32x4(ab_hi, cd_hi, 0x88);
        r[12 + j] = _mm512_shuffle_i32x4(ab_hi, cd_hi, 0xDD);
    }
}
#endif

/* qt[c][i] = query i's element c times scale, for the nq queries of a block whose first row is
 * at q (row stride ldq); queries nq .. QB - 1 are zero (padding: computed, never stored).
 * Square tiles of queries x elements are loaded as vectors and transposed in registers: 16 x 16
 * on AVX-512 (as attention_bf16.c does for its bf16 pairs), 8 x 8 in the AVX2 build. */
static void queries_to_qt_f32(const float *q, int ldq, int nq, int d, float scale, float *qt) {
#if VW == 16
    for (int i0 = 0; i0 < QB; i0 += 16)
        for (int c0 = 0; c0 < d; c0 += 16) { /* d % VW == 0 */
            __m512i r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i0 + i < nq ? _mm512_castps_si512(_mm512_mul_ps(
                                         _mm512_loadu_ps(q + (size_t)(i0 + i) * ldq + c0),
                                         _mm512_set1_ps(scale)))
                                   : _mm512_setzero_si512();
            transpose16_epi32(r);
            for (int c = 0; c < 16; c++)
                _mm512_storeu_si512(qt + (size_t)(c0 + c) * QB + i0, r[c]);
        }
#else
    for (int i0 = 0; i0 < QB; i0 += 8)
        for (int c0 = 0; c0 < d; c0 += 8) { /* d % VW == 0 */
            __m256 r[8], t[8], u[8];
            for (int i = 0; i < 8; i++)
                r[i] = i0 + i < nq ? _mm256_mul_ps(_mm256_loadu_ps(q + (size_t)(i0 + i) * ldq + c0),
                                                   _mm256_set1_ps(scale))
                                   : _mm256_setzero_ps();
            for (int k = 0; k < 8; k += 2) { /* pairs of rows interleaved, per 128-bit lane */
                t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
                t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
            }
            for (int k = 0; k < 8; k += 4) { /* u[k + j]: columns j and 4 + j of rows k .. k + 3 */
                u[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);
                u[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xEE);
                u[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
                u[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
            }
            for (int j = 0; j < 4; j++) {
                _mm256_storeu_ps(qt + (size_t)(c0 + j) * QB + i0,
                                 _mm256_permute2f128_ps(u[j], u[4 + j], 0x20));
                _mm256_storeu_ps(qt + (size_t)(c0 + 4 + j) * QB + i0,
                                 _mm256_permute2f128_ps(u[j], u[4 + j], 0x31));
            }
        }
#endif
}

/* floats of per-thread scratch for sequences of up to max_len tokens, head size d */
static long attention_work_floats(int max_len, int d) {
    return (long)QB * (d + max_len + 1);
}

/* the most keys one block of queries scores: every key, or with a band the union of the
 * block's bands (QB queries, half_window keys on each side) */
static int attention_key_span(int max_len, int half_window) {
    if (half_window < 0 || (long)QB + 2L * half_window >= max_len) return max_len;
    return QB + 2 * half_window;
}

/* lanes (queries q0 + lane, lane from `first`) whose band -right <= i - key <= left holds
 * `key`: -1 */
static inline vi band_lanes_lr(int q0, int first, int key, int left, int right) {
    vi lane;
    for (int l = 0; l < VW; l++) lane[l] = l;
    vi off = lane + (q0 + first - key); /* query - key */
    return (off <= left) & (off >= -right);
}

/* the symmetric band |i - key| <= w (attention_bf16.c's local attention) */
static inline vi band_lanes(int q0, int first, int key, int w) {
    return band_lanes_lr(q0, first, key, w, w);
}

/* a band edge that no sequence reaches (no window on that side) */
#define NO_EDGE (1 << 29)

static int attention_blocks(int len) { return (len + QB - 1) / QB; }

/* The sequence work unit t belongs to: the last s with task_starts[s] <= t. */
static inline int unit_sequence(const int *task_starts, int seqs, int t) {
    int lo = 0, hi = seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (task_starts[mid] <= t) lo = mid; else hi = mid - 1;
    }
    return lo;
}

/* task_starts[s]: the first work unit of sequence s; returns the number of units. */
static int attention_tasks(int seqs, const int *starts, int heads, int *task_starts) {
    task_starts[0] = 0;
    for (int s = 0; s < seqs; s++)
        task_starts[s + 1] = task_starts[s] + heads * attention_blocks(starts[s + 1] - starts[s]);
    return task_starts[seqs];
}

/* st[r][0..QB) = keys row r . qt (qt: [d][QB] queries, pre-scaled), for mr key rows of k (row
 * stride ldk). m0, m1: flash_attention.h's running maxima of the two query vectors, into which
 * the scores are also folded; NULL here, where the max comes after the bias and the band mask
 * (always_inline: the NULL check compiles away) */
static inline __attribute__((always_inline)) void score_tile(
        int mr, const float *k, int ldk, const float *qt, int d, float *st, vf *m0, vf *m1) {
    vf acc[KR][2];
    for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = vsplat(0.f);
    for (int c = 0; c < d; c++) {
        vf b0 = *(const vf *)(qt + c * QB), b1 = *(const vf *)(qt + c * QB + VW);
        for (int r = 0; r < mr; r++) {
            float a = k[(size_t)r * ldk + c];
            acc[r][0] += a * b0;
            acc[r][1] += a * b1;
        }
    }
    vf x0 = m0 ? *m0 : vsplat(0.f), x1 = m1 ? *m1 : vsplat(0.f);
    for (int r = 0; r < mr; r++) {
        *(vf *)(st + r * QB) = acc[r][0];
        *(vf *)(st + r * QB + VW) = acc[r][1];
        if (m0) {
            x0 = vmax(acc[r][0], x0);
            x1 = vmax(acc[r][1], x1);
        }
    }
    if (m0) {
        *m0 = x0;
        *m1 = x1;
    }
}

/* o[r][0 .. nv*VW) = inv[r] * sum_j pt[j][r] v[j], for mr query rows; pt is st offset to the
 * tile's first query (row stride QB) */
static inline __attribute__((always_inline)) void pv_tile(
        int mr, int nv, const float *pt, const float *v, int ldv, int nk, const float *inv,
        float *o, int ldo) {
    vf acc[KR][2];
    for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = vsplat(0.f);
    for (int j = 0; j < nk; j++) {
        const float *vj = v + (size_t)j * ldv, *pj = pt + (size_t)j * QB;
        vf b0 = *(const vf *)vj, b1 = nv == 2 ? *(const vf *)(vj + VW) : b0;
        for (int r = 0; r < mr; r++) {
            acc[r][0] += pj[r] * b0;
            if (nv == 2) acc[r][1] += pj[r] * b1;
        }
    }
    for (int r = 0; r < mr; r++)
        for (int w = 0; w < nv; w++) *(vf *)(o + (size_t)r * ldo + w * VW) = acc[r][w] * inv[r];
}

/* Query rows per P@V tile of nv vectors: 2 KR accumulators, KR rows of one or two vectors,
 * fewer rows of more (flash_attention.h's tiles of up to FPV vectors). */
#define PV_ROWS(nv) ((nv) <= 2 ? KR : 2 * KR / (nv))

/* The P@V loops' one dispatch (tile_rows.h's ROWS_DISPATCH with a vector count): the tiles take
 * their rows and vectors as constants (always_inline, so their loops unroll into registers), and
 * PV_DISPATCH(mr, nv, max_nv, tile, args...) runs tile(R, NV, args...) with the literals R = mr
 * and NV = nv, for nv <= max_nv (at most 4) and mr <= PV_ROWS(nv). Used by every P@V loop:
 * here, flash_attention.h, attention_bf16.c and attention_bf16_flash.h. */
#define PV_CASE(R, NV, max_nv, tile, ...) \
    case 4 * R + NV - 1: \
        if (NV <= (max_nv) && R <= PV_ROWS(NV)) tile(R, NV, __VA_ARGS__); \
        break;
#define PV_CASES(R, max_nv, tile, ...) \
    PV_CASE(R, 1, max_nv, tile, __VA_ARGS__) PV_CASE(R, 2, max_nv, tile, __VA_ARGS__) \
    PV_CASE(R, 3, max_nv, tile, __VA_ARGS__) PV_CASE(R, 4, max_nv, tile, __VA_ARGS__)
#define PV_DISPATCH(mr, nv, max_nv, tile, ...) \
    switch ((mr) * 4 + (nv) - 1) { FOR_ROWS(PV_CASES, max_nv, tile, __VA_ARGS__) }

/* One (sequence, head, query block) unit; work: attention_work_floats floats. */
static void attention_unit(const struct attention_args *a, int s, int hd, int block,
                           float *work) {
    int d = a->d, first = a->starts[s], len = a->starts[s + 1] - first;
    int nk = a->keys ? a->keys[s] : len;
    int q0 = block * QB, nq = len - q0 < QB ? len - q0 : QB;
    float *qt = work, *inv = qt + (size_t)d * QB, *st = inv + QB;
    const float *q = a->q + (size_t)(first + q0) * a->ldq + hd * d;
    int kvh = a->kv_heads > 0 ? hd / (a->heads / a->kv_heads) : hd; /* GQA: the shared head */
    const float *k = a->k + (size_t)first * a->ldk + kvh * d;
    const float *v = a->v + (size_t)first * a->ldv + kvh * d;
    /* query i sees keys i - left .. i + right (NO_EDGE: that side unbounded) */
    int w = a->half_window, lo = 0; /* keys lo .. lo + nk - 1 are scored */
    int left = w >= 0 ? w : NO_EDGE, right = a->causal ? 0 : left;
    int banded = w >= 0 || a->causal;
    if (banded) {
        lo = q0 - left > 0 ? q0 - left : 0;
        /* one past the last query's last key */
        int hi = (long)q0 + nq + right < nk ? q0 + nq + right : nk;
        nk = hi - lo;
        k += (size_t)lo * a->ldk;
        v += (size_t)lo * a->ldv;
    }
    int ldo = a->heads * d;
    float *o = a->out + (size_t)(first + q0) * ldo + hd * d;
    if (nk <= 0) { /* every key of the band is unattended: zeros, as SDPA gives a masked row */
        for (int i = 0; i < nq; i++) memset(o + (size_t)i * ldo, 0, sizeof(float) * d);
        return;
    }
    queries_to_qt_f32(q, a->ldq, nq, d, a->scale, qt);
    for (int j0 = 0; j0 < nk; j0 += KR) {
        int mr = nk - j0 < KR ? nk - j0 : KR;
        const float *kr = k + (size_t)j0 * a->ldk;
        float *sr = st + (size_t)j0 * QB;
        ROWS_DISPATCH(mr, KR, score_tile, kr, a->ldk, qt, d, sr, NULL, NULL)
    }
    if (a->bias) {
        const float *b = a->bias[s] + ((size_t)hd * len + q0) * len + lo;
        for (int i = 0; i < nq; i++)
            for (int j = 0; j < nk; j++) st[(size_t)j * QB + i] += b[(size_t)i * len + j];
    }
    /* With a band, keys lo + j outside some query's band (those before q0 + QB - 1 - left or
     * after q0 + right) are -inf for those queries, and their exponentials exactly 0. */
    int edge_lo = !banded || left == NO_EDGE ? -1 : q0 + QB - 1 - left - lo;
    int edge_hi = !banded || right == NO_EDGE ? nk : q0 + right - lo;
    const vf ninf = vsplat(-INFINITY), zero = vsplat(0.f);
    /* softmax over the keys, QB queries at a time; the 1/sum is applied after P@V */
    vf mx0 = ninf, mx1 = mx0, sum0 = zero, sum1 = sum0;
    for (int j = 0; j < nk; j++) {
        float *sj = st + (size_t)j * QB;
        if (j < edge_lo || j > edge_hi) {
            *(vf *)sj = vselect(band_lanes_lr(q0, 0, lo + j, left, right), *(const vf *)sj, ninf);
            *(vf *)(sj + VW) = vselect(band_lanes_lr(q0, VW, lo + j, left, right),
                                       *(const vf *)(sj + VW), ninf);
        }
        mx0 = vmax(*(const vf *)sj, mx0);
        mx1 = vmax(*(const vf *)(sj + VW), mx1);
    }
    for (int j = 0; j < nk; j++) {
        float *sj = st + (size_t)j * QB;
        vf e0 = vexp(*(const vf *)sj - mx0), e1 = vexp(*(const vf *)(sj + VW) - mx1);
        if (j < edge_lo || j > edge_hi) {
            e0 = vselect(band_lanes_lr(q0, 0, lo + j, left, right), e0, zero);
            e1 = vselect(band_lanes_lr(q0, VW, lo + j, left, right), e1, zero);
        }
        *(vf *)sj = e0;
        *(vf *)(sj + VW) = e1;
        sum0 += e0;
        sum1 += e1;
    }
    /* a query whose band holds no attended key (sum 0) gets zeros, as SDPA's masked rows */
    *(vf *)inv = vselect(sum0 > 0.f, 1.f / sum0, zero);
    *(vf *)(inv + VW) = vselect(sum1 > 0.f, 1.f / sum1, zero);
    for (int i0 = 0; i0 < nq; i0 += KR) {
        int mr = nq - i0 < KR ? nq - i0 : KR;
        for (int c = 0; c < d; c += 2 * VW) {
            int nv = d - c >= 2 * VW ? 2 : 1;
            const float *pt = st + i0, *vc = v + c;
            float *oc = o + (size_t)i0 * ldo + c;
            PV_DISPATCH(mr, nv, 2, pv_tile, pt, vc, a->ldv, nk, inv + i0, oc, ldo)
        }
    }
}

/* Every unit of a->task_starts, shared among the threads of the enclosing parallel region
 * (implicit barrier at the end); each thread uses its slice of `work` (work_floats each). */
static void attention(const struct attention_args *a, float *work, long work_floats) {
    float *mine = work + (size_t)omp_get_thread_num() * work_floats;
    int units = a->task_starts[a->seqs];
    /* chunks of about 1/16 of a thread's share: balances mixed lengths at little cost */
    int chunk = units / (16 * omp_get_num_threads());
    chunk = chunk < 1 ? 1 : chunk;
#pragma omp for schedule(dynamic, chunk)
    for (int t = 0; t < units; t++) {
        int lo = unit_sequence(a->task_starts, a->seqs, t);
        int rel = t - a->task_starts[lo];
        int blocks = attention_blocks(a->starts[lo + 1] - a->starts[lo]);
        attention_unit(a, lo, rel / blocks, rel % blocks, mine);
    }
}

#endif
