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

#define ROWS_CASE(R, max_rows, tile, ...) \
    case R: \
        if (R <= (max_rows)) tile(R, __VA_ARGS__); \
        break;
#define ROWS_DISPATCH(mr, max_rows, tile, ...) \
    switch (mr) { \
        ROWS_CASE(1, max_rows, tile, __VA_ARGS__) ROWS_CASE(2, max_rows, tile, __VA_ARGS__) \
        ROWS_CASE(3, max_rows, tile, __VA_ARGS__) ROWS_CASE(4, max_rows, tile, __VA_ARGS__) \
        ROWS_CASE(5, max_rows, tile, __VA_ARGS__) ROWS_CASE(6, max_rows, tile, __VA_ARGS__) \
        ROWS_CASE(7, max_rows, tile, __VA_ARGS__) ROWS_CASE(8, max_rows, tile, __VA_ARGS__) \
        ROWS_CASE(9, max_rows, tile, __VA_ARGS__) ROWS_CASE(10, max_rows, tile, __VA_ARGS__) \
        ROWS_CASE(11, max_rows, tile, __VA_ARGS__) ROWS_CASE(12, max_rows, tile, __VA_ARGS__) \
    }

#endif
