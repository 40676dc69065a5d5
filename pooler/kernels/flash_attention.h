/* Global (every key attended) bidirectional fp32 attention for long sequences that never holds
 * a len x len score matrix: the flash-attention scheme (tiles of keys, an online softmax). Used
 * by encoder_cpu.c's packed_flash_attention_f32 (pooler/kernels/attention_cpu.py routes long
 * sequences to it). Needs attention.h first (its query transpose and score tile).
 *
 * A group of heads at a time (one head for long sequences): the threads first copy the group's
 * K and V rows of every sequence into contiguous [tokens][d] arrays per head (rows of a fused
 * projection are 3 x heads x d floats apart, 9 KB for 12 x 64, a stride that maps a block's
 * rows onto a quarter of L2's sets and a sixteenth of L1's), then share the group's work
 * units. Copying each key block once per unit instead read the head's K and V from L3 again for
 * every unit: 14% of the kernel's time at 4k tokens (docs/dev/journal.md, "The flash kernel at
 * 90% of the GEMM rate").
 *
 * Work unit: one (sequence, block of FQ = FSUB x QB queries) of the head. Its queries meet the
 * keys in blocks of FK: a block's K and V rows (FK x 256 bytes each at d = 64) serve all FSUB
 * sub-blocks of its queries from L1 and L2, and the scores are FK x QB per sub-block (30 KB).
 * Per sub-block and key block:
 *   st[j][i] = q_i . k_j (queries pre-scaled by scale * log2(e), attention.h's transposed tile:
 *              one vector holds one key's score for QB/2 queries, so the softmax is lane-wise);
 *   m_new = max(m, max_j st[j]), alpha = 2^(m - m_new), p = 2^(st - m_new) (in place),
 *   l = l alpha + sum_j p[j];  o[i] = o[i] alpha[i] + sum_j p[j][i] v_j  (o: QB x d, in L1/L2);
 * and at the end out[i] = o[i] / l[i]. The rescale of o is fused into the P@V tile's store
 * (QB x d multiplies per FK x QB x d FMAs).
 *
 * Every output element is computed by one thread in a fixed order: results do not depend on
 * the thread count or the schedule. */
#ifndef POOLER_FLASH_ATTENTION_H
#define POOLER_FLASH_ATTENTION_H

#ifndef FSUB
#define FSUB 8 /* query sub-blocks of QB per unit: 256 queries (AVX-512), 128 (AVX2) */
#endif
#ifndef FK
#define FK 240 /* keys per key block: whole score tiles (12 or 6 keys) */
#endif
#define FQ (FSUB * QB)

/* 2^x on every lane for x <= 0 (scores minus their running max), ~2 ulp: 2^n * 2^r with
 * n = round(x), |r| <= 1/2 and a degree-6 Taylor series of 2^r = e^(r ln 2). AVX-512 scales by
 * 2^n in one VSCALEFPS (0 below -149); the AVX2 build adds n to the exponent bits, clamping x at
 * -126 (2^-126 there, not 0: harmless next to the max's weight of 1). */
static inline vf vexp2_nonpos(vf x) {
#if VW == 16
    x = vmax(x, vsplat(-150.f)); /* -inf (a first block's running max) to a finite n */
    vf n = (vf)_mm512_roundscale_ps((__m512)x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = x - n;
#else
    x = vmax(x, vsplat(-126.f));
    const float magic = 12582912.f; /* 1.5 * 2^23: rounds, leaving n in the low mantissa bits */
    vf t = x + magic;
    vf r = x - (t - magic);
#endif
    const float l1 = 0.693147181f, l2 = l1 * l1 / 2, l3 = l2 * l1 / 3, l4 = l3 * l1 / 4,
                l5 = l4 * l1 / 5, l6 = l5 * l1 / 6; /* (ln 2)^k / k! */
    vf p = 1.f + r * (l1 + r * (l2 + r * (l3 + r * (l4 + r * (l5 + r * l6)))));
#if VW == 16
    return (vf)_mm512_scalef_ps((__m512)p, (__m512)n);
#else
    vi bits = (((vi)t - 0x4B400000) + 127) << 23;
    return p * (vf)bits;
#endif
}

/* Vectors of d per P@V tile (FPV; attention.h's PV_ROWS gives the rows for nv vectors): 12
 * queries x 2 vectors on AVX-512 (6 x 2 on AVX2), each P broadcast once per column half. At
 * d = 64 the 6 x 4 tile left a 2-row tail in every 32 queries and measured 3-4% slower. */
#ifndef FPV
#define FPV 2
#endif

/* o[r][0 .. nv*VW) = alpha[r] o[r] + sum_j pt[j][r] v[j] for mr query rows; pt: the tile's
 * first query in a [keys][QB] score block */
static inline __attribute__((always_inline)) void flash_pv_tile(
        int mr, int nv, const float *pt, const float *v, int ldv, int nk, const float *alpha,
        float *o, int ldo) {
    vf acc[KR][4];
    for (int r = 0; r < mr; r++)
        for (int w = 0; w < nv; w++) acc[r][w] = vsplat(0.f);
    for (int j = 0; j < nk; j++) {
        const float *vj = v + (size_t)j * ldv, *pj = pt + (size_t)j * QB;
        vf b[4];
        for (int w = 0; w < nv; w++) b[w] = *(const vf *)(vj + w * VW);
        for (int r = 0; r < mr; r++)
            for (int w = 0; w < nv; w++) acc[r][w] += pj[r] * b[w];
    }
    for (int r = 0; r < mr; r++)
        for (int w = 0; w < nv; w++) {
            vf *or = (vf *)(o + (size_t)r * ldo + w * VW);
            *or = *or * alpha[r] + acc[r][w];
        }
}

/* floats of per-thread scratch: per sub-block its queries (d x QB), o (QB x d), scores
 * (FK x QB), running max, sum and rescale factor (3 x QB) */
static long flash_work_floats(int d) {
    return (long)FSUB * QB * (2L * d + FK + 3);
}

static int flash_blocks(int len) { return (len + FQ - 1) / FQ; }

/* One (sequence, head, block of FQ queries) unit with every one of the sequence's first nk
 * keys attended (a->keys: a trailing unattended suffix; no bias, no band). kh, vh: the head's
 * K and V rows of every sequence, contiguous ([tokens][d], flash_attention's copy). */
static void flash_unit(const struct attention_args *a, int s, int hd, int block,
                       const float *kh, const float *vh, float *work) {
    int d = a->d, first = a->starts[s], len = a->starts[s + 1] - first;
    int nk = a->keys ? a->keys[s] : len;
    int q0 = block * FQ, nq = len - q0 < FQ ? len - q0 : FQ;
    int subs = (nq + QB - 1) / QB;
    int ldo = a->heads * d;
    float *out = a->out + (size_t)(first + q0) * ldo + hd * d;
    if (nk <= 0) {
        for (int i = 0; i < nq; i++) memset(out + (size_t)i * ldo, 0, sizeof(float) * d);
        return;
    }
    const float *q = a->q + (size_t)(first + q0) * a->ldq + hd * d;
    /* per sub-block b: qt [d][QB], o [QB][d], st [FK][QB], mx / sum / alpha [QB] */
    long per_sub = (long)QB * (2L * d + FK + 3);
    const vf ninf = vsplat(-INFINITY), zero = vsplat(0.f);
    for (int b = 0; b < subs; b++) {
        float *qt = work + b * per_sub, *o = qt + (size_t)d * QB, *st = o + (size_t)QB * d;
        float *mx = st + (size_t)FK * QB;
        int n = nq - b * QB < QB ? nq - b * QB : QB;
        queries_to_qt_f32(q + (size_t)b * QB * a->ldq, a->ldq, n, d, a->scale * 1.44269504f,
                          qt);
        memset(o, 0, sizeof(float) * QB * d);
        *(vf *)mx = ninf;
        *(vf *)(mx + VW) = ninf;
        *(vf *)(mx + QB) = zero;
        *(vf *)(mx + QB + VW) = zero;
    }
    for (int j0 = 0; j0 < nk; j0 += FK) {
        int kb = nk - j0 < FK ? nk - j0 : FK;
        const float *kj = kh + (size_t)(first + j0) * d, *vj = vh + (size_t)(first + j0) * d;
        for (int b = 0; b < subs; b++) {
            float *qt = work + b * per_sub, *o = qt + (size_t)d * QB, *st = o + (size_t)QB * d;
            float *mx = st + (size_t)FK * QB, *sum = mx + QB, *alpha = sum + QB;
            int n = nq - b * QB < QB ? nq - b * QB : QB;
            vf m0 = *(const vf *)mx, m1 = *(const vf *)(mx + VW); /* the running maxima */
            vf n0 = m0, n1 = m1;                                   /* and the new ones */
            for (int j = 0; j < kb; j += KR) {
                int mr = kb - j < KR ? kb - j : KR;
                const float *kr = kj + (size_t)j * d;
                float *sr = st + (size_t)j * QB;
                ROWS_DISPATCH(mr, KR, score_tile, kr, d, qt, d, sr, &n0, &n1)
            }
            /* online softmax, lane-wise over the QB queries (two vectors) */
            /* the first key block: m = -inf, alpha = 0 (AVX2: 2^-126) multiplies o = 0, sum = 0 */
            vf a0 = vexp2_nonpos(m0 - n0), a1 = vexp2_nonpos(m1 - n1);
            vf s0 = zero, s1 = zero;
            for (int j = 0; j < kb; j++) {
                float *sj = st + (size_t)j * QB;
                vf e0 = vexp2_nonpos(*(const vf *)sj - n0);
                vf e1 = vexp2_nonpos(*(const vf *)(sj + VW) - n1);
                *(vf *)sj = e0;
                *(vf *)(sj + VW) = e1;
                s0 += e0;
                s1 += e1;
            }
            *(vf *)mx = n0;
            *(vf *)(mx + VW) = n1;
            *(vf *)sum = *(const vf *)sum * a0 + s0;
            *(vf *)(sum + VW) = *(const vf *)(sum + VW) * a1 + s1;
            *(vf *)alpha = a0;
            *(vf *)(alpha + VW) = a1;
            for (int c = 0; c < d; c += FPV * VW) {
                int nv = (d - c) / VW < FPV ? (d - c) / VW : FPV, rows = PV_ROWS(nv);
                for (int i0 = 0; i0 < n; i0 += rows) {
                    int mr = n - i0 < rows ? n - i0 : rows;
                    const float *pt = st + i0, *vc = vj + c;
                    float *oc = o + (size_t)i0 * d + c;
                    PV_DISPATCH(mr, nv, FPV, flash_pv_tile, pt, vc, d, kb, alpha + i0, oc, d)
                }
            }
        }
    }
    for (int b = 0; b < subs; b++) {
        float *o = work + b * per_sub + (size_t)d * QB, *sum = o + (size_t)QB * d + FK * QB + QB;
        int n = nq - b * QB < QB ? nq - b * QB : QB;
        for (int i = 0; i < n; i++) {
            float inv = 1.f / sum[i]; /* >= 1: the max's own weight */
            float *orow = out + (size_t)(b * QB + i) * ldo;
            for (int c = 0; c < d; c += VW)
                *(vf *)(orow + c) = *(const vf *)(o + (size_t)i * d + c) * inv;
        }
    }
}

/* Heads whose K and V are copied together (a group): enough that a group has FLASH_GROUP_UNITS
 * units per thread, so that the threads reach the barrier after each group together (with one
 * head of 5 units, one of 2 threads waited a unit per head); one head from 8 x 256 x
 * threads tokens on. tokens / FQ is one head's units when every sequence fills its blocks,
 * fewer otherwise, so the group is at most this large for these sequences (the scratch's). */
#define FLASH_GROUP_UNITS 8
static int flash_group_heads(int tokens, int heads, int threads) {
    int units = (tokens + FQ - 1) / FQ, want = FLASH_GROUP_UNITS * threads;
    int group = units > 0 ? (want + units - 1) / units : heads;
    return group < 1 ? 1 : group > heads ? heads : group;
}

/* Every unit of the sequences, `group` heads at a time (flash_group_heads), shared among the
 * threads of the enclosing parallel region; task_starts: flash_tasks's (one head's units per
 * sequence); heads_kv: the shared [2][group][tokens][d] floats that hold the group's K and V
 * rows. */
static void flash_attention(const struct attention_args *a, int group, float *heads_kv,
                            float *work, long work_floats) {
    float *mine = work + (size_t)omp_get_thread_num() * work_floats;
    int d = a->d, tokens = a->starts[a->seqs], per_head = a->task_starts[a->seqs];
    size_t head_rows = (size_t)tokens * d;
    float *kg = heads_kv, *vg = heads_kv + group * head_rows;
    for (int h0 = 0; h0 < a->heads; h0 += group) {
        int hn = a->heads - h0 < group ? a->heads - h0 : group;
#pragma omp for schedule(static)
        for (int t = 0; t < tokens; t++)
            for (int g = 0; g < hn; g++) {
                size_t row = g * head_rows + (size_t)t * d;
                memcpy(kg + row, a->k + (size_t)t * a->ldk + (h0 + g) * d, sizeof(float) * d);
                memcpy(vg + row, a->v + (size_t)t * a->ldv + (h0 + g) * d, sizeof(float) * d);
            }
        /* (the loops' barriers: every row copied before a unit reads it, every unit done
         * before the next group's rows overwrite them) */
#pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < hn * per_head; t++) {
            int g = t / per_head, rel = t % per_head;
            int lo = unit_sequence(a->task_starts, a->seqs, rel);
            flash_unit(a, lo, h0 + g, rel - a->task_starts[lo], kg + g * head_rows,
                       vg + g * head_rows, mine);
        }
    }
}

/* task_starts[s]: the first of one head's units of sequence s; returns one head's units */
static int flash_tasks(int seqs, const int *starts, int *task_starts) {
    task_starts[0] = 0;
    for (int s = 0; s < seqs; s++)
        task_starts[s + 1] = task_starts[s] + flash_blocks(starts[s + 1] - starts[s]);
    return task_starts[seqs];
}

#endif
