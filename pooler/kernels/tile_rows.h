/* The register tiles' row dispatch, shared by pooler's C kernels (the GEMM tiles of
 * encoder_cpu.c and int8_gemm.c, the score tiles of attention.h, flash_attention.h,
 * attention_bf16.c and attention_bf16_flash.h). A tile takes its row count as a constant
 * (always_inline, so its loops unroll into registers):
 * ROWS_DISPATCH(mr, max_rows, tile, args...) runs tile(R, args...) with the literal R = mr, for
 * 1 <= mr <= max_rows <= 12; rows above max_rows (the AVX2 builds' 6-row tiles, int8_gemm.c's
 * 6-row tile_pair) compile to nothing. attention.h's PV_DISPATCH does the same for the P@V
 * tiles, which take a vector count too. */
#ifndef POOLER_TILE_ROWS_H
#define POOLER_TILE_ROWS_H

/* CASE(R, args...) for every row count R = 1 .. 12 (the largest tile's): the case lists of
 * ROWS_DISPATCH and of attention.h's PV_DISPATCH */
#define FOR_ROWS(CASE, ...) \
    CASE(1, __VA_ARGS__) CASE(2, __VA_ARGS__) CASE(3, __VA_ARGS__) CASE(4, __VA_ARGS__) \
    CASE(5, __VA_ARGS__) CASE(6, __VA_ARGS__) CASE(7, __VA_ARGS__) CASE(8, __VA_ARGS__) \
    CASE(9, __VA_ARGS__) CASE(10, __VA_ARGS__) CASE(11, __VA_ARGS__) CASE(12, __VA_ARGS__)

#define ROWS_CASE(R, max_rows, tile, ...) \
    case R: \
        if (R <= (max_rows)) tile(R, __VA_ARGS__); \
        break;
#define ROWS_DISPATCH(mr, max_rows, tile, ...) \
    switch (mr) { FOR_ROWS(ROWS_CASE, max_rows, tile, __VA_ARGS__) }

#endif
