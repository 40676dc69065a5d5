/* A BERT-family encoder layer stack for ONE short sequence on an x86-64 CPU with AVX-512, in
 * fp32, in one call (pooler/kernels/bert_cpu.py is the Python side; it compiles this file on
 * first use, see pooler/kernels/build.py).
 *
 * Why it exists: a short query (about 12 tokens) is bound by streaming the weights through a
 * small-M GEMM, 24 of them for MiniLM, plus ~60 small eager ops between them. oneDNN's GEMM at
 * M=12 runs well below what the core can do, and each eager op costs ~10-20 us of dispatch.
 * Here the GEMM is a 12x32 register tile over weights packed into 32-column panels (each weight
 * read once, contiguous), and everything between the GEMMs (attention, softmax, layer norm,
 * GELU, residual adds) runs inside the same OpenMP parallel region.
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
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64), aligned(4)));  /* one zmm, any alignment */

#define NR 32 /* panel width: two zmm of output columns */
#define MR 12 /* rows per register tile: 12 x 2 accumulators + 2 weight vectors of 32 zmm */

enum epilogue { EPI_NONE = 0, EPI_RESIDUAL = 1, EPI_GELU_ERF = 2, EPI_GELU_TANH = 3, EPI_RELU = 4 };

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

/* exp for x in float range, ~2 ulp: 2^n * e^r with |r| <= ln2/2 and a degree-6 Taylor series.
 * Branch-free, so loops over it vectorise. */
static inline float exp_approx(float x) {
    x = fminf(fmaxf(x, -87.3f), 88.3f);
    float n = __builtin_floorf(x * 1.44269504f + 0.5f);
    float r = x - n * 0.693145752f - n * 1.42860677e-6f; /* ln2 split in two for exactness */
    float p = 1.f + r * (1.f + r * (0.5f + r * (1.f / 6 + r * (1.f / 24 + r * (1.f / 120 +
              r * (1.f / 720))))));
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

/* erf to ~1.5e-7 absolute (Abramowitz & Stegun 7.1.26), odd-symmetric. */
static inline float erf_approx(float x) {
    float a = fabsf(x);
    float t = 1.f / (1.f + 0.3275911f * a);
    float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f +
                 t * (-1.453152027f + t * 1.061405429f))));
    float y = 1.f - poly * exp_approx(-a * a);
    return copysignf(y, x);
}

static inline void activate(float *y, int n, int epi) {
    if (epi == EPI_GELU_ERF) {
        for (int i = 0; i < n; i++) y[i] = 0.5f * y[i] * (1.f + erf_approx(y[i] * 0.70710678f));
    } else if (epi == EPI_GELU_TANH) {
        for (int i = 0; i < n; i++) {
            float u = 0.7978845608f * (y[i] + 0.044715f * y[i] * y[i] * y[i]);
            float th = 1.f - 2.f / (1.f + exp_approx(2.f * u));
            y[i] = 0.5f * y[i] * (1.f + th);
        }
    } else if (epi == EPI_RELU) {
        for (int i = 0; i < n; i++) y[i] = y[i] > 0.f ? y[i] : 0.f;
    }
}

/* One register tile: rows [0, mr) of x (row stride k) times one weight panel, plus bias, into
 * y (row stride ldy), `cols` (<= 32) valid columns. mr is a constant at each call site, so the
 * compiler keeps all accumulators in registers. */
static inline __attribute__((always_inline)) void tile(
        int mr, const float *x, int k, const float *panel, const float *bias,
        const float *res, float *y, int ldy, int cols, int epi) {
    v16 acc[MR][2];
    v16 b0 = *(const v16 *)bias, b1 = *(const v16 *)(bias + 16);
    for (int r = 0; r < mr; r++) { acc[r][0] = b0; acc[r][1] = b1; }
    for (int kk = 0; kk < k; kk++) {
        /* the weights stream from memory: ask for them 4 KB ahead, into L2 (prefetcht2).
         * +17% on a memory-bound panel at one thread; 2 KB or 8 KB ahead, or into L1, lost. */
        __builtin_prefetch(panel + (size_t)(kk + 32) * NR, 0, 1);
        __builtin_prefetch(panel + (size_t)(kk + 32) * NR + 16, 0, 1);
        v16 w0 = *(const v16 *)(panel + (size_t)kk * NR);
        v16 w1 = *(const v16 *)(panel + (size_t)kk * NR + 16);
        for (int r = 0; r < mr; r++) {
            float a = x[(size_t)r * k + kk];
            acc[r][0] += a * w0;
            acc[r][1] += a * w1;
        }
    }
    for (int r = 0; r < mr; r++) {
        float out[NR];
        memcpy(out, &acc[r][0], 64);
        memcpy(out + 16, &acc[r][1], 64);
        float *row = y + (size_t)r * ldy;
        if (epi == EPI_RESIDUAL) {
            const float *rrow = res + (size_t)r * ldy;
            for (int j = 0; j < NR; j++) out[j] += j < cols ? rrow[j] : 0.f;
        } else {
            activate(out, NR, epi);
        }
        memcpy(row, out, (size_t)cols * 4);
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
#define TILE(R) case R: tile(R, xr, k, panel, bias + p * NR, rr, yr, n, cols, epi); break;
                TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6)
                TILE(7) TILE(8) TILE(9) TILE(10) TILE(11) TILE(12)
#undef TILE
            }
        }
    }
}

/* out[r] = layer_norm(in[r]) * w + b, rows shared among the threads. */
static void layer_norm(const float *in, float *out, int m, int h, const float *w,
                       const float *b, float eps) {
#pragma omp for schedule(static)
    for (int r = 0; r < m; r++) {
        const float *x = in + (size_t)r * h;
        float *y = out + (size_t)r * h;
        float mean = 0.f, var = 0.f;
        for (int i = 0; i < h; i++) mean += x[i];
        mean /= (float)h;
        for (int i = 0; i < h; i++) var += (x[i] - mean) * (x[i] - mean);
        float inv = 1.f / sqrtf(var / (float)h + eps);
        for (int i = 0; i < h; i++) y[i] = (x[i] - mean) * inv * w[i] + b[i];
    }
}

/* Full bidirectional attention over one sequence of m tokens: qkv [m, 3h] (q | k | v, each
 * head's dims contiguous), ctx [m, h]; scores [heads][m][m] scratch. Heads shared out. */
static void attention(const float *qkv, float *ctx, float *scores, int m, int h, int heads) {
    int d = h / heads, ld = 3 * h;
    float scale = 1.f / sqrtf((float)d);
#pragma omp for schedule(static)
    for (int hd = 0; hd < heads; hd++) {
        const float *q = qkv + hd * d, *kk = qkv + h + hd * d, *v = qkv + 2 * h + hd * d;
        float *s = scores + (size_t)hd * m * m;
        for (int i = 0; i < m; i++) {
            float *si = s + (size_t)i * m, mx = -INFINITY, sum = 0.f;
            for (int j = 0; j < m; j++) {
                float dot = 0.f;
                for (int c = 0; c < d; c++) dot += q[(size_t)i * ld + c] * kk[(size_t)j * ld + c];
                si[j] = dot * scale;
                mx = si[j] > mx ? si[j] : mx;
            }
            for (int j = 0; j < m; j++) { si[j] = exp_approx(si[j] - mx); sum += si[j]; }
            float inv = 1.f / sum;
            float *o = ctx + (size_t)i * h + hd * d;
            for (int c = 0; c < d; c++) o[c] = 0.f;
            for (int j = 0; j < m; j++) {
                float pj = si[j] * inv;
                for (int c = 0; c < d; c++) o[c] += pj * v[(size_t)j * ld + c];
            }
        }
    }
}

/* Runs `layers` post-norm BERT layers over x [m, h] in place. params: P_PER_LAYER pointers per
 * layer (packed weights, padded biases, norm weights). scratch: at least
 * bert_scratch_floats(m, h, inter, heads) floats. act: EPI_GELU_ERF, EPI_GELU_TANH or EPI_RELU. */
long bert_scratch_floats(int m, int h, int inter, int heads) {
    return (long)m * (3 * h + h + h + inter) + (long)heads * m * m;
}

void bert_layers(float *x, int m, int h, int heads, int inter, int layers,
                 const float *const *params, float eps, int act, float *scratch, int threads) {
    float *qkv = scratch, *ctx = qkv + (size_t)m * 3 * h, *t = ctx + (size_t)m * h;
    float *up = t + (size_t)m * h, *scores = up + (size_t)m * inter;
#pragma omp parallel num_threads(threads)
    for (int l = 0; l < layers; l++) {
        const float *const *p = params + (size_t)l * P_PER_LAYER;
        gemm(x, p[P_QKV_W], p[P_QKV_B], NULL, qkv, m, 3 * h, h, EPI_NONE);
        attention(qkv, ctx, scores, m, h, heads);
        gemm(ctx, p[P_O_W], p[P_O_B], x, t, m, h, h, EPI_RESIDUAL);
        layer_norm(t, x, m, h, p[P_LN1_W], p[P_LN1_B], eps);
        gemm(x, p[P_UP_W], p[P_UP_B], NULL, up, m, inter, h, act);
        gemm(up, p[P_DOWN_W], p[P_DOWN_B], x, t, m, h, inter, EPI_RESIDUAL);
        layer_norm(t, x, m, h, p[P_LN2_W], p[P_LN2_B], eps);
    }
}
