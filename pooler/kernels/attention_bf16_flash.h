/* Global bf16 attention for long sequences in key blocks with an online softmax (the scheme of
 * flash_attention.h, with attention_bf16.c's VDPBF16PS tiles and numerics). Included by
 * attention_bf16.c after its tiles; packed_tiled_attention_bf16 there routes sequences of
 * flash_min_len tokens or more (global, no score bias) here.
 *
 * Why: attention_bf16.c's unit is a whole (sequence, head): it re-lays the head's K and V out
 * (O(L d) scratch) and each block of QB = 32 queries scores every key, keeping QB x L scores,
 * so every query block streams all of K, V and a 1 MB score row (8k tokens) through L2: ~210
 * GFLOP/s at 1-4k tokens fell to ~90 at 8k (12 heads x 64, 2 threads, Sapphire Rapids).
 *
 * Heads one after another (flash_attention.h's order): the threads first lay out head h's K
 * and V of every flash sequence of the call once (bf16_flash_lay_out_head, into a shared
 * struct flash_head: kb [keys][d] bf16 rows; V as attention_bf16.c lays it out, with p_bf16
 * vp [keys / 2][d][2] bf16 key pairs, else vf32 [keys][d] fp32; each sequence's first key at
 * a row (pair) of its own, its attended keys only, an odd count's last pair with a zero key),
 * then share the head's units. Laying each key block out once per unit instead read the head's
 * K and V from the strided projection again for every unit: 0.99-1.11x this one's time at
 * 4k-8k tokens (docs/dev/journal.md, "bf16 flash units: each head's K and V laid out once").
 *
 * Work unit: one (sequence, block of FQ = FSUB x QB queries) of the head. Its queries meet the
 * keys in blocks of FK (240, even: a block's pairs are the sequence's pairs) that serve all its
 * FSUB query sub-blocks from L1/L2. Per sub-block and key block:
 *   st[j][i] = k_j . q_i (raw, VDPBF16PS, fp32 sums; transposed: lane-wise softmax), and the
 *              running max m of the raw scores (scale > 0 keeps its argmax);
 *   alpha = 2^(c (m_old - m_new)), p = 2^(c st - c m_new), c = scale log2(e) (the fp32 scores
 *   are scaled, never bf16 q: one rounding, as attention_bf16.c);
 *   l = l alpha + sum_j p (fp32 p, as attention_bf16.c sums them);
 *   o = o alpha + P@V: with p_bf16 P rounded to bf16 pairs (pp [FK / 2][QB][2]) for VDPBF16PS,
 *   else fp32 P in place and flash_attention.h's fp32 tile;
 * and at the end out = o / l (rounded to bf16 when out_bf16). Scratch: per thread O(FQ d + FK
 * QB) whatever the length, and one head's K and V (6 bytes x tokens x d, shared). Every output
 * is computed by one thread in a fixed order: results do not depend on the thread count. */
#ifndef POOLER_ATTENTION_BF16_FLASH_H
#define POOLER_ATTENTION_BF16_FLASH_H

/* one thread's scratch for a flash unit */
struct flash_scratch {
    uint16_t *qt;          /* FSUB x [d / 2][QB][2] */
    uint32_t *pp;          /* [FK / 2][QB] pairs */
    float *o, *state, *st; /* FSUB x [QB][d]; FSUB x (max, sum, alpha) x [QB]; [FK][QB] */
};

/* One head's K and V of the call's flash sequences, shared by the threads (laid out by
 * bf16_flash_lay_out_head). Flash sequence f's keys start at row koff[f] of kb and vf32 and at
 * pair poff[f] of vp (offsets over the flash sequences' lengths). */
struct flash_head {
    uint16_t *kb;  /* [rows][d] bf16 */
    uint32_t *vp;  /* p_bf16: [pairs][d] bf16 key pairs (relay_v's layout) */
    float *vf32;   /* else [rows][d] fp32 (the same bytes as vp) */
    int nflash;
    const int *seqs, *koff, *poff; /* per flash sequence: its index, first row, first pair */
};

/* bytes of struct flash_head's arrays for flash sequences of `tokens` tokens in all: K
 * 2 x tokens x d, V 4 x tokens x d (fp32 rows, or pairs_of(len) <= len pairs of 4 d bytes) */
static size_t flash_head_bytes(long tokens, int d) {
    return up64((size_t)tokens * d * 2) + up64((size_t)tokens * d * 4) + 64;
}

/* kb, vp and vf32 carved from `work` (flash_head_bytes of it) */
static void flash_head_carve(char *work, long tokens, int d, struct flash_head *h) {
    char *base = (char *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
    h->kb = (uint16_t *)base;
    h->vp = (uint32_t *)(base + up64((size_t)tokens * d * 2));
    h->vf32 = (float *)h->vp;
}

/* Keys j0 .. j0 + n - 1 (j0 even) of flash sequence f's head hd into h: K rows as bf16, V as
 * key pairs (an odd n's last pair with a zero key) or fp32 rows (relay_v) */
static void bf16_flash_lay_out_keys(const struct bf16_args *a, int hd, const struct flash_head *h,
                                    int f, int j0, int n) {
    int d = a->d, in = a->in_bf16 ? 2 : 4, first = a->starts[h->seqs[f]];
    const char *k = (const char *)a->k + ((size_t)(first + j0) * a->ldk + (size_t)hd * d) * in;
    const char *v = (const char *)a->v + ((size_t)(first + j0) * a->ldv + (size_t)hd * d) * in;
    uint16_t *kb = h->kb + (size_t)(h->koff[f] + j0) * d;
    for (int j = 0; j < n; j++) {
        const char *row = k + (size_t)j * a->ldk * in;
        prefetch_row(row + (size_t)AHEAD * a->ldk * in, d * in);
        if (a->in_bf16)
            memcpy(kb + (size_t)j * d, row, sizeof(uint16_t) * d);
        else
            row_to_bf16((const float *)row, d, kb + (size_t)j * d);
    }
    relay_v(v, a->ldv, in, a->in_bf16, a->p_bf16, n, d,
            h->vp + (size_t)(h->poff[f] + j0 / 2) * d, h->vf32 + (size_t)(h->koff[f] + j0) * d);
}

/* Head hd's K and V of every flash sequence into h (attended keys only), shared among the
 * threads of the enclosing parallel region (all of them call it) in chunks of 16 keys (even:
 * a chunk's pairs are the sequence's); returns after a barrier, every row laid out. */
static void bf16_flash_lay_out_head(const struct bf16_args *a, int hd,
                                    const struct flash_head *h) {
    for (int f = 0; f < h->nflash; f++) {
        int s = h->seqs[f];
        int nk = a->keys ? a->keys[s] : a->starts[s + 1] - a->starts[s];
        int chunks = nk > 0 ? (nk + 15) / 16 : 0;
#pragma omp for schedule(static) nowait
        for (int c = 0; c < chunks; c++)
            bf16_flash_lay_out_keys(a, hd, h, f, 16 * c, nk - 16 * c < 16 ? nk - 16 * c : 16);
    }
#pragma omp barrier
}

static size_t flash_carve_into(char *work, int d, struct flash_scratch *w) {
    char *base = work ? (char *)(((uintptr_t)work + 63) & ~(uintptr_t)63) : NULL;
    size_t at = 0;
#define TAKE(field, type, count) \
    if (w) w->field = (type *)(base + at); \
    at = up64(at + (size_t)(count) * sizeof(type));
    TAKE(qt, uint16_t, (size_t)FSUB * d * QB)
    TAKE(pp, uint32_t, (size_t)pairs_of(FK) * QB)
    TAKE(o, float, (size_t)FSUB * QB * d)
    TAKE(state, float, (size_t)FSUB * 3 * QB)
    TAKE(st, float, (size_t)FK * QB)
#undef TAKE
    return at + 64; /* + the alignment of work */
}

static size_t flash_unit_bytes(int d) { return flash_carve_into(NULL, d, NULL); }

/* o[r][0 .. nv*16) = alpha[r] o[r] + sum_j p[r][j] v[j] for mr query rows, P and V as bf16
 * key pairs (pp offset to the tile's first query, row stride QB pairs; vp offset to the tile's
 * first dim, row stride d pairs); o: fp32 rows of ldo */
static inline __attribute__((always_inline)) void bf16_flash_pv_tile(
        int mr, int nv, const uint32_t *pp, const uint32_t *vp, int d, int np,
        const float *alpha, float *o, int ldo) {
    __m512 acc[KR][4];
    _Pragma("GCC unroll 12") for (int r = 0; r < mr; r++)
        _Pragma("GCC unroll 4") for (int w = 0; w < nv; w++) acc[r][w] = _mm512_setzero_ps();
    for (int j2 = 0; j2 < np; j2++) {
        const uint32_t *vj = vp + (size_t)j2 * d, *pj = pp + (size_t)j2 * QB;
        __m512 b[4];
        _Pragma("GCC unroll 4") for (int w = 0; w < nv; w++)
            b[w] = (__m512)_mm512_loadu_si512(vj + 16 * w);
        _Pragma("GCC unroll 12") for (int r = 0; r < mr; r++) {
            __m512 a = (__m512)_mm512_set1_epi32((int)pj[r]);
            _Pragma("GCC unroll 4") for (int w = 0; w < nv; w++) DPBF16(acc[r][w], a, b[w]);
        }
    }
    _Pragma("GCC unroll 12") for (int r = 0; r < mr; r++)
        _Pragma("GCC unroll 4") for (int w = 0; w < nv; w++) {
            float *orow = o + (size_t)r * ldo + 16 * w;
            _mm512_storeu_ps(orow, _mm512_fmadd_ps(_mm512_loadu_ps(orow),
                                                   _mm512_set1_ps(alpha[r]), acc[r][w]));
        }
}

/* One (sequence, head, block of FQ queries) unit: every one of the sequence's first nk keys
 * attended (a->keys: a trailing unattended suffix), no bias, no band. h: the head's K and V
 * laid out (bf16_flash_lay_out_head), f: the sequence's place among h's. */
static void bf16_flash_unit(const struct bf16_args *a, const struct flash_head *h, int f,
                            int hd, int block, char *work) {
    int s = h->seqs[f];
    int d = a->d, first = a->starts[s], len = a->starts[s + 1] - first;
    int nk = a->keys ? a->keys[s] : len;
    int q0 = block * FQ, nq = len - q0 < FQ ? len - q0 : FQ;
    int subs = (nq + QB - 1) / QB;
    int in = a->in_bf16 ? 2 : 4; /* source bytes per value */
    int ldo = a->heads * d;
    size_t out_size = a->out_bf16 ? 2 : 4;
    char *out = (char *)a->out + ((size_t)(first + q0) * ldo + (size_t)hd * d) * out_size;
    if (nk <= 0) { /* no attended key: zeros, as SDPA's masked rows */
        for (int i = 0; i < nq; i++) memset(out + (size_t)i * ldo * out_size, 0, d * out_size);
        return;
    }
    const char *q = (const char *)a->q + ((size_t)(first + q0) * a->ldq + (size_t)hd * d) * in;
    const uint16_t *kseq = h->kb + (size_t)h->koff[f] * d;
    const uint32_t *vpseq = h->vp + (size_t)h->poff[f] * d;
    const float *vfseq = h->vf32 + (size_t)h->koff[f] * d;
    struct flash_scratch w;
    flash_carve_into(work, d, &w);
    const __m512 ninf = _mm512_set1_ps(-INFINITY), zero = _mm512_setzero_ps();
    for (int b = 0; b < subs; b++) {
        int n = nq - b * QB < QB ? nq - b * QB : QB;
        queries_to_qt(q + (size_t)b * QB * a->ldq * in, a->ldq, a->in_bf16, n, d,
                      (uint32_t *)(w.qt + (size_t)b * d * QB));
        memset(w.o + (size_t)b * QB * d, 0, sizeof(float) * QB * d);
        float *mx = w.state + (size_t)b * 3 * QB, *sum = mx + QB;
        _mm512_storeu_ps(mx, ninf);
        _mm512_storeu_ps(mx + 16, ninf);
        _mm512_storeu_ps(sum, zero);
        _mm512_storeu_ps(sum + 16, zero);
    }
    const __m512i weave = _mm512_loadu_si512(INTERLEAVE);
    float c = a->scale * 1.44269504f; /* e^(scale x) = 2^(c x) */
    for (int j0 = 0; j0 < nk; j0 += FK) {
        int kb = nk - j0 < FK ? nk - j0 : FK, npb = pairs_of(kb);
        /* the key block's rows and pairs in the head's layout (j0 even: pair j0 / 2 on) */
        const uint16_t *kj = kseq + (size_t)j0 * d;
        const uint32_t *vpj = vpseq + (size_t)(j0 / 2) * d;
        const float *vfj = vfseq + (size_t)j0 * d;
        for (int b = 0; b < subs; b++) {
            int n = nq - b * QB < QB ? nq - b * QB : QB;
            const uint16_t *qt = w.qt + (size_t)b * d * QB;
            float *o = w.o + (size_t)b * QB * d, *st = w.st;
            float *mx = w.state + (size_t)b * 3 * QB, *sum = mx + QB, *alpha = sum + QB;
            __m512 m0 = _mm512_loadu_ps(mx), m1 = _mm512_loadu_ps(mx + 16); /* running maxima */
            __m512 n0 = m0, n1 = m1;                                          /* new ones */
            for (int j = 0; j < kb; j += KR) {
                int mr = kb - j < KR ? kb - j : KR;
                const uint16_t *kr = kj + (size_t)j * d;
                float *sr = st + (size_t)j * QB;
                ROWS_DISPATCH(mr, KR, bf16_score_tile, kr, d, qt, d, sr, &n0, &n1)
            }
            /* the first block: m_old = -inf, alpha ~ 0 (exp2_fast clamps) times o = 0, l = 0 */
            __m512 cm0 = _mm512_mul_ps(n0, _mm512_set1_ps(c));
            __m512 cm1 = _mm512_mul_ps(n1, _mm512_set1_ps(c));
            __m512 a0 = (__m512)exp2_fast((vf)_mm512_fmsub_ps(m0, _mm512_set1_ps(c), cm0));
            __m512 a1 = (__m512)exp2_fast((vf)_mm512_fmsub_ps(m1, _mm512_set1_ps(c), cm1));
            vf s0 = vsplat(0.f), s1 = s0, vc = vsplat(c);
            if (a->p_bf16) {
                /* P for keys 2 j2 and 2 j2 + 1, rounded to bf16 and interleaved per query */
                for (int j2 = 0; j2 < npb; j2++) {
                    const float *r0 = st + (size_t)(2 * j2) * QB, *r1 = r0 + QB;
                    int has1 = 2 * j2 + 1 < kb;
                    for (int h = 0; h < 2; h++) {
                        vf cm = (vf)(h ? cm1 : cm0);
                        vf e0 = exp2_fast(*(const vf *)(r0 + 16 * h) * vc - cm);
                        vf e1 = has1 ? exp2_fast(*(const vf *)(r1 + 16 * h) * vc - cm)
                                     : vsplat(0.f);
                        if (h) s1 += e0 + e1; else s0 += e0 + e1;
                        __m512i both = (__m512i)_mm512_cvtne2ps_pbh((__m512)e1, (__m512)e0);
                        _mm512_storeu_si512(w.pp + (size_t)j2 * QB + 16 * h,
                                            _mm512_permutexvar_epi16(weave, both));
                    }
                }
            } else {
                for (int j = 0; j < kb; j++) { /* P in place, fp32 */
                    float *sj = st + (size_t)j * QB;
                    vf e0 = exp2_fast(*(const vf *)sj * vc - (vf)cm0);
                    vf e1 = exp2_fast(*(const vf *)(sj + 16) * vc - (vf)cm1);
                    *(vf *)sj = e0;
                    *(vf *)(sj + 16) = e1;
                    s0 += e0;
                    s1 += e1;
                }
            }
            _mm512_storeu_ps(mx, n0);
            _mm512_storeu_ps(mx + 16, n1);
            _mm512_storeu_ps(sum, _mm512_fmadd_ps(_mm512_loadu_ps(sum), a0, (__m512)s0));
            _mm512_storeu_ps(sum + 16, _mm512_fmadd_ps(_mm512_loadu_ps(sum + 16), a1,
                                                       (__m512)s1));
            _mm512_storeu_ps(alpha, a0);
            _mm512_storeu_ps(alpha + 16, a1);
            for (int c0 = 0; c0 < d; c0 += FPV * 16) {
                int nv = (d - c0) / 16 < FPV ? (d - c0) / 16 : FPV, rows = PV_ROWS(nv);
                for (int i0 = 0; i0 < n; i0 += rows) {
                    int mr = n - i0 < rows ? n - i0 : rows;
                    float *oc = o + (size_t)i0 * d + c0;
                    if (a->p_bf16) {
                        const uint32_t *pt = w.pp + i0, *vc2 = vpj + c0;
                        PV_DISPATCH(mr, nv, FPV, bf16_flash_pv_tile, pt, vc2, d, npb,
                                    alpha + i0, oc, d)
                    } else {
                        const float *pt = st + i0, *vc2 = vfj + c0;
                        PV_DISPATCH(mr, nv, FPV, flash_pv_tile, pt, vc2, d, kb, alpha + i0,
                                    oc, d)
                    }
                }
            }
        }
    }
    for (int b = 0; b < subs; b++) {
        int n = nq - b * QB < QB ? nq - b * QB : QB;
        const float *o = w.o + (size_t)b * QB * d, *sum = w.state + (size_t)b * 3 * QB + QB;
        for (int i = 0; i < n; i++) {
            __m512 inv = _mm512_set1_ps(1.f / sum[i]); /* >= 1: the max's own weight */
            char *orow = out + (size_t)(b * QB + i) * ldo * out_size;
            for (int cc = 0; cc < d; cc += 16) {
                __m512 y = _mm512_mul_ps(_mm512_loadu_ps(o + (size_t)i * d + cc), inv);
                if (a->out_bf16)
                    _mm256_storeu_si256((__m256i *)((uint16_t *)orow + cc),
                                        (__m256i)_mm512_cvtneps_pbh(y));
                else
                    _mm512_storeu_ps((float *)orow + cc, y);
            }
        }
    }
}

#endif
