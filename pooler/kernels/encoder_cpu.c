/* A BERT-family encoder layer stack for a short step (one short query, or a few packed back
 * to back) on an x86-64 CPU with AVX-512 (or AVX2), in fp32, in one call
 * (pooler/kernels/bert_cpu.py is the Python side; pooler/kernels/build.py compiles this file
 * on first use for the best instruction set the CPU has).
 *
 * Why it exists: a short query (about 12 tokens) is bound by streaming the weights through a
 * small-M GEMM, 24 of them for MiniLM, plus ~60 small eager ops between them. oneDNN's GEMM at
 * M=12 runs well below what the core can do, and each eager op costs ~10-20 us of dispatch.
 * Here the GEMM is a 12x32 register tile (6x16 on AVX2) over weights packed into panels of
 * that width (each weight read once per block of rows, contiguous), and everything between
 * the GEMMs (attention, softmax, layer norm, GELU, residual adds) runs inside the same OpenMP
 * parallel region.
 *
 * Threads: the region runs on the OpenMP runtime torch already loaded (the .so asks for
 * libgomp.so.1, which the dynamic loader resolves to torch's copy), so torch's threads and
 * these are one pool. Every output element is computed by one thread in a fixed order, so
 * results do not depend on the thread count.
 *
 * Layout: activations row-major [tokens, features]; weights as nn.Linear keeps them, [out, in],
 * packed by pack_linear_weight into [ceil(out/NR)][in][NR] panels (NR 32, or 16 on AVX2),
 * zero-padded, within the ceil(out/32) * 32 * in floats bert_cpu.py allocates; biases padded
 * to a multiple of 32. */
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One vector register: 16 floats (zmm) on AVX-512, 8 (ymm) in the AVX2 build. A register tile
 * is MR rows x one panel of NR columns, two vectors wide in both builds. */
#ifdef __AVX512F__
#define VW 16
#define MR 12 /* rows per register tile: 12 x 2 accumulators + 2 weight vectors of 32 zmm */
#define NR 32 /* panel width in output columns */
#else
#define VW 8
/* 6 x 2 accumulators + 2 weight vectors and a broadcast in 15 of 16 ymm. The panels are 16
 * columns wide: with 32-column panels (a 3 x 32 tile) a 12-token step streamed every panel 4
 * times, the first pass wanting 128 bytes of weights per 12 FMAs from memory, and a short query
 * ran 1.3-1.6x slower than on the AVX-512 build at the same FMA rate (docs/dev/journal.md,
 * "AVX2 short query"). */
#define MR 6
#define NR 16
#endif
typedef float vf __attribute__((vector_size(VW * 4), aligned(4)));  /* any alignment */
typedef int32_t vi __attribute__((vector_size(VW * 4), aligned(4)));

#define NV (NR / VW) /* vectors per tile row: 2 */

#include "vector_math.h"
#include "tile_rows.h"

/* What a GEMM does to its output: a residual add, or an activation (vector_math.h's codes). */
enum epilogue { EPI_NONE = ACT_NONE, EPI_RESIDUAL = 1, EPI_GELU_ERF = ACT_GELU_ERF,
                EPI_GELU_TANH = ACT_GELU_TANH, EPI_RELU = ACT_RELU };

/* The parameters of one layer, in this order (what bert_cpu.py passes per layer). */
enum { P_QKV_W, P_QKV_B, P_O_W, P_O_B, P_LN1_W, P_LN1_B, P_UP_W, P_UP_B, P_DOWN_W, P_DOWN_B,
       P_LN2_W, P_LN2_B, P_PER_LAYER };

void pack_linear_weight(const float *w, float *out, int n, int k) {
    int panels = (n + NR - 1) / NR;
    for (int p = 0; p < panels; p++)
        for (int kk = 0; kk < k; kk++)
            for (int j = 0; j < NR; j++) {
                int col = p * NR + j;
                out[((size_t)p * k + kk) * NR + j] = col < n ? w[(size_t)col * k + kk] : 0.f;
            }
}

/* One register tile: rows [0, mr) of x (row stride k) times one weight panel, plus bias, into
 * y (row stride ldy), `cols` (<= NR) valid columns. mr is a constant at each call site, so the
 * compiler keeps all accumulators in registers. */
static inline __attribute__((always_inline)) void tile(
        int mr, const float *x, int k, const float *panel, const float *bias,
        const float *res, float *y, int ldy, int cols, int epi) {
    vf acc[12][NV];  /* rows < mr <= MR in use */
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = *(const vf *)(bias + v * VW);
    for (int kk = 0; kk < k; kk++) {
        /* the weights stream from memory: ask for them 4 KB ahead, into L2 (prefetcht2).
         * +17% on a memory-bound panel at one thread; 2 KB or 8 KB ahead, or into L1, lost. */
        __builtin_prefetch(panel + (size_t)kk * NR + 1024, 0, 1);
        if (NR > 16) __builtin_prefetch(panel + (size_t)kk * NR + 1024 + 16, 0, 1);
        vf w[NV];
        for (int v = 0; v < NV; v++) w[v] = *(const vf *)(panel + (size_t)kk * NR + v * VW);
        for (int r = 0; r < mr; r++) {
            float a = x[(size_t)r * k + kk];
            for (int v = 0; v < NV; v++) acc[r][v] += a * w[v];
        }
    }
    for (int r = 0; r < mr; r++) {
        float *row = y + (size_t)r * ldy;
        for (int v = 0; v < NV; v++) {
            if (res) {  /* EPI_RESIDUAL; a partial panel adds it below */
                if (cols == NR) acc[r][v] += *(const vf *)(res + (size_t)r * ldy + v * VW);
            } else
                acc[r][v] = activate(acc[r][v], epi);
        }
        if (cols == NR) {
            for (int v = 0; v < NV; v++) *(vf *)(row + v * VW) = acc[r][v];
        } else {  /* the last, partial panel */
            float out[NR];
            memcpy(out, acc[r], sizeof out);
            for (int j = 0; j < cols; j++)
                row[j] = out[j] + (res ? res[(size_t)r * ldy + j] : 0.f);
        }
    }
}

/* Most rows per task of a large step: a task's slice of x stays in L2 while every panel of the
 * weight streams past it (a whole large step of x, 3-12 MB, went out to L3 and back for each
 * panel). A step of at most GEMM_MB rows is one block, so a short step still shares the
 * panels out and reads each weight once. */
#ifndef GEMM_MB
#define GEMM_MB 48
#endif

/* How many row blocks a step of m rows splits into: one up to GEMM_MB rows (the panels are
 * shared out), else a multiple of the thread count, so each thread gets the same rows. Fixed
 * GEMM_MB-row blocks left a partial last block, and the static split of (block, panel) tasks
 * gave one thread far more work than the other (100 rows, 2 threads: 72% against 28%; a
 * 100-token step ran 1.28x faster balanced, 250 tokens 1.09-1.14x, Zen 4, 2 threads).
 * Block b is rows [b m / nb, (b + 1) m / nb), at most GEMM_MB. */
static int row_blocks(int m, int threads) {
    int nb = (m + GEMM_MB - 1) / GEMM_MB;
    return nb <= 1 ? 1 : (nb + threads - 1) / threads * threads;
}

/* y[m, n] = epi(x[m, k] W^T + b) (EPI_RESIDUAL: + res[m, n]). Called inside a parallel region:
 * (row block, panel) tasks are shared out among the threads, with the implicit barrier at the
 * end. */
static void gemm(const float *x, const float *packed, const float *bias, const float *res,
                 float *y, int m, int n, int k, int epi) {
    int panels = (n + NR - 1) / NR, blocks = row_blocks(m, omp_get_num_threads());
#pragma omp for schedule(static) collapse(2)
    for (int b = 0; b < blocks; b++)
        for (int p = 0; p < panels; p++) {
            const float *panel = packed + (size_t)p * k * NR;
            int cols = n - p * NR < NR ? n - p * NR : NR;
            int m_end = (int)((long)(b + 1) * m / blocks);
            for (int m0 = (int)((long)b * m / blocks); m0 < m_end; m0 += MR) {
                int mr = m_end - m0 < MR ? m_end - m0 : MR;
                const float *xr = x + (size_t)m0 * k;
                float *yr = y + (size_t)m0 * n + p * NR;
                const float *rr = res ? res + (size_t)m0 * n + p * NR : NULL;
                ROWS_DISPATCH(mr, MR, tile, xr, k, panel, bias + p * NR, rr, yr, n, cols, epi)
            }
        }
}

/* out[r] = layer_norm(in[r]) * w + b (vector_math.h's norm_row), rows shared among the
 * threads. */
static void layer_norm(const float *in, float *out, int m, int h, const float *w,
                       const float *b, float eps) {
#pragma omp for schedule(static)
    for (int r = 0; r < m; r++) norm_row(in + (size_t)r * h, out + (size_t)r * h, h, w, b, eps);
}

#include "attention.h"

/* Bidirectional attention for callers outside the layer stack (pooler/kernels/attention_cpu.py):
 * q, k, v rows as in struct attention_args (any row strides: straight from a fused q/k/v
 * projection, or three tensors), out [tokens][heads][d]; keys and bias as there (NULL: none).
 * half_window >= 0: local attention, query i sees keys |i - j| <= half_window (< 0: all keys).
 * d % VW == 0. work: local_attention_scratch_floats(max_len, d, half_window, threads) floats,
 * max_len >= every sequence's length. Runs its own parallel region of `threads` threads. */
long local_attention_scratch_floats(int max_len, int d, int half_window, int threads) {
    return threads * attention_work_floats(attention_key_span(max_len, half_window), d);
}

/* attention() over every unit of a's sequences (a.task_starts set here) in a parallel region
 * of `threads`: what the two entry points below share */
static void attention_region(struct attention_args a, int max_len, float *work, int threads) {
    int *task_starts = malloc(sizeof(int) * (a.seqs + 1));
    if (!task_starts) return;
    attention_tasks(a.seqs, a.starts, a.heads, task_starts);
    a.task_starts = task_starts;
    long per_thread = attention_work_floats(attention_key_span(max_len, a.half_window), a.d);
#pragma omp parallel num_threads(threads)
    attention(&a, work, per_thread);
    free(task_starts);
}

void packed_local_attention_f32(const float *q, const float *k, const float *v, int ldq, int ldk,
                                int ldv, float *out, int heads, int d, int seqs,
                                const int *starts, const int *keys, const float *const *bias,
                                float scale, int half_window, int max_len, float *work,
                                int threads) {
    struct attention_args a = {q, k, v, ldq, ldk, ldv, out, heads, d, seqs, starts, keys, bias,
                               scale, NULL, half_window < 0 ? -1 : half_window};
    attention_region(a, max_len, work, threads);
}

/* Decoder-style attention (pooler/kernels/attention_cpu.py): as packed_local_attention_f32,
 * with k/v rows of kv_heads heads (GQA; kv_heads divides heads) and, when causal is nonzero,
 * only the keys j <= i (with half_window >= 0: i - half_window <= j <= i). work:
 * local_attention_scratch_floats(max_len, d, half_window, threads) floats (a causal block
 * scores at most as many keys as a symmetric band's). */
void packed_masked_attention_f32(const float *q, const float *k, const float *v, int ldq,
                                 int ldk, int ldv, float *out, int heads, int kv_heads, int d,
                                 int seqs, const int *starts, const int *keys, float scale,
                                 int causal, int half_window, int max_len, float *work,
                                 int threads) {
    struct attention_args a = {q, k, v, ldq, ldk, ldv, out, heads, d, seqs, starts, keys, NULL,
                               scale, NULL, half_window < 0 ? -1 : half_window, kv_heads,
                               causal};
    attention_region(a, max_len, work, threads);
}

/* The entry points before local attention (every key), kept for benchmarks that call older
 * builds alike (benchmarks/interleaved.py). */
long attention_scratch_floats(int max_len, int d, int threads) {
    return local_attention_scratch_floats(max_len, d, -1, threads);
}

void packed_attention_f32(const float *q, const float *k, const float *v, int ldq, int ldk,
                          int ldv, float *out, int heads, int d, int seqs, const int *starts,
                          const int *keys, const float *const *bias, float scale, int max_len,
                          float *work, int threads) {
    packed_local_attention_f32(q, k, v, ldq, ldk, ldv, out, heads, d, seqs, starts, keys, bias,
                               scale, -1, max_len, work, threads);
}

#include "flash_attention.h"

/* Global attention for long sequences (flash_attention.h; pooler/kernels/attention_cpu.py):
 * arguments as packed_attention_f32's, without a score bias (keys: NULL, or a trailing
 * unattended suffix per sequence). work: flash_attention_scratch_floats(tokens, heads, d,
 * threads) floats for `tokens` packed tokens in all: a group of heads' K and V rows (2 x group
 * x tokens x d; one head from 8 x 256 x threads tokens on) and a fixed block per thread. */
long flash_attention_scratch_floats(int tokens, int heads, int d, int threads) {
    return 2L * flash_group_heads(tokens, heads, threads) * tokens * d +
           threads * flash_work_floats(d);
}

void packed_flash_attention_f32(const float *q, const float *k, const float *v, int ldq,
                                int ldk, int ldv, float *out, int heads, int d, int seqs,
                                const int *starts, const int *keys, float scale, float *work,
                                int threads) {
    int *task_starts = malloc(sizeof(int) * (seqs + 1));
    if (!task_starts) return;
    flash_tasks(seqs, starts, task_starts);
    struct attention_args a = {q, k, v, ldq, ldk, ldv, out, heads, d, seqs, starts, keys, NULL,
                               scale, task_starts, -1};
    /* work: the group's K and V (flash_attention_scratch_floats's first term), then the units' */
    int group = flash_group_heads(starts[seqs], heads, threads);
    float *units = work + 2L * group * starts[seqs] * d;
#pragma omp parallel num_threads(threads)
    flash_attention(&a, group, work, units, flash_work_floats(d));
    free(task_starts);
}

/* Runs `layers` post-norm BERT layers over x [m, h] in place: `seqs` sequences packed back to
 * back (starts: seqs + 1 offsets; keys: attended keys per sequence; bias: NULL or a score
 * bias per sequence; see attention()).
 * params: P_PER_LAYER pointers per layer (packed weights, padded biases, norm weights).
 * scratch: at least bert_scratch_floats(m, h, inter, heads, threads) floats. act: EPI_GELU_ERF,
 * EPI_GELU_TANH or EPI_RELU. */
long bert_scratch_floats(int m, int h, int inter, int heads, int threads) {
    return (long)m * (3 * h + h + h + inter) + threads * attention_work_floats(m, h / heads);
}

void bert_layers(float *x, int m, int seqs, const int *starts, const int *keys,
                 const float *const *bias, int h, int heads, int inter, int layers,
                 const float *const *params, float eps, int act, float *scratch, int threads) {
    float *qkv = scratch, *ctx = qkv + (size_t)m * 3 * h, *t = ctx + (size_t)m * h;
    float *up = t + (size_t)m * h, *work = up + (size_t)m * inter;
    int *task_starts = malloc(sizeof(int) * (seqs + 1)); /* a large step: many sequences */
    if (!task_starts) return;
    attention_tasks(seqs, starts, heads, task_starts);
    int d = h / heads;
    struct attention_args a = {qkv, qkv + h, qkv + 2 * h, 3 * h, 3 * h, 3 * h, ctx, heads, d,
                               seqs, starts, keys, bias, 1.f / sqrtf((float)d), task_starts,
                               -1};
    long per_thread = attention_work_floats(m, d);
#pragma omp parallel num_threads(threads)
    for (int l = 0; l < layers; l++) {
        const float *const *p = params + (size_t)l * P_PER_LAYER;
        gemm(x, p[P_QKV_W], p[P_QKV_B], NULL, qkv, m, 3 * h, h, EPI_NONE);
        attention(&a, work, per_thread);
        gemm(ctx, p[P_O_W], p[P_O_B], x, t, m, h, h, EPI_RESIDUAL);
        layer_norm(t, x, m, h, p[P_LN1_W], p[P_LN1_B], eps);
        gemm(x, p[P_UP_W], p[P_UP_B], NULL, up, m, inter, h, act);
        gemm(up, p[P_DOWN_W], p[P_DOWN_B], x, t, m, h, inter, EPI_RESIDUAL);
        layer_norm(t, x, m, h, p[P_LN2_W], p[P_LN2_B], eps);
    }
    free(task_starts);
}
