/* A BERT-family encoder layer stack for a short step (one short query, or a few packed back
 * to back) on an x86-64 CPU with AVX-512 (or AVX2), in fp32, in one call
 * (pooler/kernels/bert_cpu.py is the Python side; pooler/kernels/build.py compiles this file
 * on first use for the best instruction set the CPU has).
 *
 * Why it exists: a short query (about 12 tokens) is bound by streaming the weights through a
 * small-M GEMM, 24 of them for MiniLM, plus ~60 small eager ops between them. oneDNN's GEMM at
 * M=12 runs well below what the core can do, and each eager op costs ~10-20 us of dispatch.
 * Here the GEMM is a 12x32 register tile (3x32 on AVX2) over weights packed into 32-column
 * panels (each weight read once per tile of rows, contiguous), and everything between the
 * GEMMs (attention, softmax, layer norm, GELU, residual adds) runs inside the same OpenMP
 * parallel region.
 *
 * Threads: the region runs on the OpenMP runtime torch already loaded (the .so asks for
 * libgomp.so.1, which the dynamic loader resolves to torch's copy), so torch's threads and
 * these are one pool. Every output element is computed by one thread in a fixed order, so
 * results do not depend on the thread count.
 *
 * Layout: activations row-major [tokens, features]; weights as nn.Linear keeps them, [out, in],
 * packed by pack_linear_weight into [ceil(out/32)][in][32] panels, zero-padded; biases padded to
 * a multiple of 32. */
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* One vector register: 16 floats (zmm) on AVX-512, 8 (ymm) in the AVX2 build. */
#ifdef __AVX512F__
#define VW 16
#define MR 12 /* rows per register tile: 12 x 2 accumulators + 2 weight vectors of 32 zmm */
#else
#define VW 8
#define MR 3 /* 3 x 4 accumulators + weights and a broadcast in 16 ymm */
#endif
typedef float vf __attribute__((vector_size(VW * 4), aligned(4)));  /* any alignment */
typedef int32_t vi __attribute__((vector_size(VW * 4), aligned(4)));

#define NR 32 /* panel width: 32 output columns, NV vectors */
#define NV (NR / VW)

#include "vector_math.h"

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

static inline float hsum(vf v) {  /* lanes added in a fixed order: results are reproducible */
    float s = 0.f;
    for (int i = 0; i < VW; i++) s += v[i];
    return s;
}

/* One register tile: rows [0, mr) of x (row stride k) times one weight panel, plus bias, into
 * y (row stride ldy), `cols` (<= 32) valid columns. mr is a constant at each call site, so the
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
        __builtin_prefetch(panel + (size_t)(kk + 32) * NR, 0, 1);
        __builtin_prefetch(panel + (size_t)(kk + 32) * NR + 16, 0, 1);
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

/* y[m, n] = epi(x[m, k] W^T + b) (EPI_RESIDUAL: + res[m, n]). Called inside a parallel region:
 * the panels are shared out among the threads, with the implicit barrier at the end. */
static void gemm(const float *x, const float *packed, const float *bias, const float *res,
                 float *y, int m, int n, int k, int epi) {
    int panels = (n + NR - 1) / NR;
#pragma omp for schedule(static)
    for (int p = 0; p < panels; p++) {
        const float *panel = packed + (size_t)p * k * NR;
        int cols = n - p * NR < NR ? n - p * NR : NR;
        for (int m0 = 0; m0 < m; m0 += MR) {
            int mr = m - m0 < MR ? m - m0 : MR;
            const float *xr = x + (size_t)m0 * k;
            float *yr = y + (size_t)m0 * n + p * NR;
            const float *rr = res ? res + (size_t)m0 * n + p * NR : NULL;
            switch (mr) {
#define TILE(R) \
    case R: if (R <= MR) tile(R, xr, k, panel, bias + p * NR, rr, yr, n, cols, epi); break;
                TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6)
                TILE(7) TILE(8) TILE(9) TILE(10) TILE(11) TILE(12)
#undef TILE
            }
        }
    }
}

/* out[r] = layer_norm(in[r]) * w + b, rows shared among the threads; h % 16 == 0. */
static void layer_norm(const float *in, float *out, int m, int h, const float *w,
                       const float *b, float eps) {
#pragma omp for schedule(static)
    for (int r = 0; r < m; r++) {
        const float *x = in + (size_t)r * h;
        float *y = out + (size_t)r * h;
        vf sum = vsplat(0.f), sq = vsplat(0.f);
        for (int i = 0; i < h; i += VW) sum += *(const vf *)(x + i);
        float mean = hsum(sum) / (float)h;
        for (int i = 0; i < h; i += VW) {
            vf c = *(const vf *)(x + i) - mean;
            sq += c * c;
        }
        float inv = 1.f / sqrtf(hsum(sq) / (float)h + eps);
        for (int i = 0; i < h; i++) y[i] = (x[i] - mean) * inv * w[i] + b[i];
    }
}

/* Bidirectional attention within each packed sequence (head size % 16 == 0). qkv [m, 3h]
 * (q | k | v, each head's dims contiguous), ctx [m, h]. Sequence s holds tokens
 * [starts[s], starts[s + 1]); its queries see its first keys[s] tokens (a shorter keys[s]:
 * ColBERT's unattended query expansion). bias: NULL, or per sequence a [heads][len][len] score
 * bias added before the softmax (MPNet's relative positions). (sequence, head) pairs are
 * shared out; each thread
 * works in its own slice of `work` (attention_floats(m, d) floats): the head's keys transposed
 * to [d][keys rounded up to whole vectors], so that scores, softmax and exp run a vector of
 * keys per op. */
static long attention_floats(int m, int d) { return (long)(d + m) * (m + 16); }

static void attention(const float *qkv, float *ctx, float *work, int m, int h, int heads,
                      int seqs, const int *starts, const int *keys,
                      const float *const *bias) {
    int d = h / heads, ld = 3 * h;
    float scale = 1.f / sqrtf((float)d);
    float *kt = work + (size_t)omp_get_thread_num() * attention_floats(m, d);
    float *sc = kt + (size_t)d * (m + 16);
#pragma omp for schedule(static)
    for (int task = 0; task < seqs * heads; task++) {
        int sq = task / heads, hd = task % heads;
        int first = starts[sq], len = starts[sq + 1] - first, nk = keys[sq];
        int nkp = (nk + VW - 1) & ~(VW - 1);
        const float *q = qkv + (size_t)first * ld + hd * d;
        const float *k = q + h, *v = q + 2 * h;
        for (int c = 0; c < d; c++) {
            for (int j = 0; j < nk; j++) kt[(size_t)c * nkp + j] = k[(size_t)j * ld + c];
            for (int j = nk; j < nkp; j++) kt[(size_t)c * nkp + j] = 0.f;
        }
        for (int i = 0; i < len; i++) {
            const float *qi = q + (size_t)i * ld;
            float *si = sc + (size_t)i * nkp;
            for (int jb = 0; jb < nkp; jb += VW) {  /* scores of VW keys */
                vf acc = vsplat(0.f);
                for (int c = 0; c < d; c++) acc += qi[c] * *(const vf *)(kt + (size_t)c * nkp + jb);
                *(vf *)(si + jb) = acc * scale;
            }
            if (bias) {
                const float *bi = bias[sq] + ((size_t)hd * len + i) * len;
                for (int j = 0; j < nk; j++) si[j] += bi[j];
            }
            float mx = -INFINITY;
            for (int j = 0; j < nk; j++) mx = si[j] > mx ? si[j] : mx;
            vf total = vsplat(0.f);
            for (int jb = 0; jb < nkp; jb += VW) {
                vf e = vexp(*(const vf *)(si + jb) - mx);
                for (int j = nk - jb; j < VW; j++) e[j] = 0.f;  /* the padding keys */
                *(vf *)(si + jb) = e;
                total += e;
            }
            float inv = 1.f / hsum(total);
            float *o = ctx + (size_t)(first + i) * h + hd * d;
            for (int c = 0; c < d; c += VW) {
                vf acc = vsplat(0.f);
                for (int j = 0; j < nk; j++) acc += si[j] * *(const vf *)(v + (size_t)j * ld + c);
                *(vf *)(o + c) = acc * inv;
            }
        }
    }
}

/* Runs `layers` post-norm BERT layers over x [m, h] in place: `seqs` sequences packed back to
 * back (starts: seqs + 1 offsets; keys: attended keys per sequence; bias: NULL or a score
 * bias per sequence; see attention()).
 * params: P_PER_LAYER pointers per layer (packed weights, padded biases, norm weights).
 * scratch: at least bert_scratch_floats(m, h, inter, heads, threads) floats. act: EPI_GELU_ERF,
 * EPI_GELU_TANH or EPI_RELU. */
long bert_scratch_floats(int m, int h, int inter, int heads, int threads) {
    return (long)m * (3 * h + h + h + inter) + threads * attention_floats(m, h / heads);
}

void bert_layers(float *x, int m, int seqs, const int *starts, const int *keys,
                 const float *const *bias, int h, int heads, int inter, int layers,
                 const float *const *params, float eps, int act, float *scratch, int threads) {
    float *qkv = scratch, *ctx = qkv + (size_t)m * 3 * h, *t = ctx + (size_t)m * h;
    float *up = t + (size_t)m * h, *work = up + (size_t)m * inter;
#pragma omp parallel num_threads(threads)
    for (int l = 0; l < layers; l++) {
        const float *const *p = params + (size_t)l * P_PER_LAYER;
        gemm(x, p[P_QKV_W], p[P_QKV_B], NULL, qkv, m, 3 * h, h, EPI_NONE);
        attention(qkv, ctx, work, m, h, heads, seqs, starts, keys, bias);
        gemm(ctx, p[P_O_W], p[P_O_B], x, t, m, h, h, EPI_RESIDUAL);
        layer_norm(t, x, m, h, p[P_LN1_W], p[P_LN1_B], eps);
        gemm(x, p[P_UP_W], p[P_UP_B], NULL, up, m, inter, h, act);
        gemm(up, p[P_DOWN_W], p[P_DOWN_B], x, t, m, h, inter, EPI_RESIDUAL);
        layer_norm(t, x, m, h, p[P_LN2_W], p[P_LN2_B], eps);
    }
}
