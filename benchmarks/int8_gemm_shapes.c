/* pooler's int8 GEMM (pooler/kernels/int8_gemm.c, int8_linear) alone on MiniLM's four linear
 * shapes, GOP/s (2 ops per multiply-add): the figures docs/dev/journal.md compares with the
 * instruction pair's peak (benchmarks/isa_peaks.c). Random codes, no outlier rows, no fused
 * LayerNorm; the best of `reps` timings of 4 calls each.
 *
 *   cc -O3 -fopenmp -fno-math-errno -mavx2 -mfma benchmarks/int8_gemm_shapes.c \
 *       -o /tmp/int8_avx2 -lm                                              # the AVX2 build
 *   cc -O3 -fopenmp -fno-math-errno -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma \
 *       benchmarks/int8_gemm_shapes.c -o /tmp/int8_vnni -lm                # the VNNI build
 *   /tmp/int8_avx2 [rows=2000] [threads=1] [reps=5]
 *
 * A shared machine's neighbours only ever slow a run: compare builds by the best of several
 * alternating invocations. */
#include "../pooler/kernels/int8_gemm.c"

#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *alloc(size_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64); }

int main(int argc, char **argv) {
    int m = argc > 1 ? atoi(argv[1]) : 2000, threads = argc > 2 ? atoi(argv[2]) : 1;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    /* out, in, activation (vector_math.h's codes), residual */
    const struct { const char *name; int n, k, act, res; } shapes[] = {
        {"qkv", 1152, 384, ACT_NONE, 0}, {"o", 384, 384, ACT_NONE, 1},
        {"up", 1536, 384, ACT_GELU_ERF, 0}, {"down", 384, 1536, ACT_NONE, 1}};
    for (int s = 0; s < 4; s++) {
        int n = shapes[s].n, k = shapes[s].k, npad = (n + NR - 1) / NR * NR;
        int8_t *w = alloc((size_t)n * k), *packed = alloc(int8_packed_bytes(n, k));
        int32_t *colsum = alloc(sizeof(int32_t) * npad);
        float *wscale = alloc(sizeof(float) * npad), *bias = alloc(sizeof(float) * npad);
        float *ones = alloc(sizeof(float) * k), *x = alloc(sizeof(float) * m * k);
        float *y = alloc(sizeof(float) * m * n);
        float *res = shapes[s].res ? alloc(sizeof(float) * m * n) : NULL;
        uint8_t *scratch = alloc(int8_scratch_bytes(m, k));
        for (size_t i = 0; i < (size_t)n * k; i++) w[i] = (int8_t)((i * 2654435761u >> 7) % 255 - 127);
        pack_int8_weight(w, packed, colsum, n, k);
        for (int i = 0; i < npad; i++) wscale[i] = 1e-3f, bias[i] = 0.01f;
        for (int i = 0; i < k; i++) ones[i] = 1.f;
        for (size_t i = 0; i < (size_t)m * k; i++) x[i] = (float)((i * 2654435761u) % 1000) / 1000.f - 0.5f;
        if (res)
            for (size_t i = 0; i < (size_t)m * n; i++) res[i] = 0.1f;
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            double t = now();
            for (int c = 0; c < 4; c++) /* an outlier ratio no row reaches: one pass */
                int8_linear(x, ones, m, k, packed, colsum, wscale, bias, res, y, n,
                            shapes[s].act, 0, 1e9f, NULL, NULL, 0.f, scratch, threads);
            t = (now() - t) / 4;
            best = t < best ? t : best;
        }
        printf("%s %.1f  ", shapes[s].name, 2.0 * m * n * k / best / 1e9);
        free(w), free(packed), free(colsum), free(wscale), free(bias), free(ones), free(x);
        free(y), free(res), free(scratch);
    }
    printf("\n");
    return 0;
}
