/* matmul_impl.h - the contract between the matmul driver (matmul.c:
 * validation, threading, cache blocking) and the per-ISA tile kernels
 * (matmul_avx2.c, matmul_avx512.c). Private to src/backend/cpu. */
#ifndef CLLM_BACKEND_CPU_MATMUL_IMPL_H
#define CLLM_BACKEND_CPU_MATMUL_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "model/tensor.h"

/* One matmul call as the kernels see it. For Q8_0 the activations were
 * quantized into xq first, in the layout the kernel family chose. */
struct mm_job {
    float *out;        /* n x rows */
    const float *x;    /* n x cols */
    const uint8_t *xq; /* n quantized rows, xq_stride bytes apart */
    size_t xq_stride;
    const uint8_t *w; /* rows x cols in the weight dtype, w_stride bytes apart */
    size_t w_stride;
    int64_t n, rows, cols;
    /* Panels only (mm_panel_run_*): per token (xu_stride floats apart),
     * per scale unit u of xq (panel_unit values: 16, or 32 where a
     * format's s and m hold for 32, on AVX-512 only), at 8 g + 2 u of group
     * g, its activation scale and its sum, its lanes' xs added pairwise
     * ((0 + 1) + (2 + 3), then the two halves of 8); made once a call
     * (mm_panel_unit_sums) instead of once a panel */
    const float *xu;
    size_t xu_stride;
    int panel_unit;
};

/* Computes out[t .. t+mr)[r .. r+nr) for the tile shape the function is
 * named for, over all cols. */
typedef void (*mm_tile_fn)(const struct mm_job *j, int64_t t, int64_t r);

/* Computes out[t .. t+nt)[r0 .. r1) one weight row after the other, nt <= 4:
 * each row is read once, in address order. */
typedef void (*mm_stream_fn)(const struct mm_job *j, int64_t t, int nt, int64_t r0, int64_t r1);

/* A kernel family for one dtype.
 *
 * Few tokens (decode) are memory-bound: `stream` reads the weights as one
 * sequential run, which the hardware prefetchers follow at full bandwidth
 * (tiles of several rows read as interleaved short runs, which they do not:
 * measured 2.5x slower from DRAM on Zen 4).
 *
 * Many tokens (prefill) are compute-bound: a main tile of mr tokens x nr
 * weight rows loads each weight vector once for mr tokens, plus narrow
 * tiles for the edges. */
struct mm_kernel {
    int mr, nr;
    int stream_max_n;    /* use `stream` when n <= this (and stream != NULL) */
    mm_stream_fn stream;
    mm_tile_fn tile;     /* mr x nr */
    mm_tile_fn tile_t1;  /* 1 x nr */
    mm_tile_fn tile_r1;  /* mr x 1 */
    mm_tile_fn tile_1x1; /* 1 x 1 */
    /* Q8_0 and the code formats: size of one quantized activation row and
     * the quantizer. */
    size_t (*xq_row_bytes)(int64_t cols);
    void (*xq_quantize)(const float *x, uint8_t *dst, int64_t cols);
};

/* NULL when the family has no kernel for dt. */
const struct mm_kernel *mm_kernel_avx2(enum dtype dt);
const struct mm_kernel *mm_kernel_avx512(enum dtype dt, int vnni);
/* bf16 weights by bf16 dot products, the activations rounded to bf16
 * (AVX512_BF16: call only where cpu_has_avx512_bf16()); tiles only, no
 * stream: the driver takes it for prompts (matmul.c). */
const struct mm_kernel *mm_bf16dot_kernel_avx512(void);

/* The integer-code formats (GGUF's 2-6-bit ones, unpack.h): the driver
 * unpacks a slab of weight rows at a time into unpack.h's layout and runs
 * one of these over it (NULL: none in the family). Their activation rows
 * are groups of UNPACK_GROUP_BYTES matching the weights' groups, written
 * by mm_codes_xq_quantize (or its AVX2 twin, the same bytes):
 *   qs [64] int8   values 64g .. rounded to 8 bits a 32-block, at
 *                  scale absmax / 127 (a missing half: zeros)
 *   d  [16] f32    lane l's block scale
 *   xs [16] f32    d * (the sum of lane l's four qs)
 * so that value by value sum (s u - m) x = sum over lanes of
 * (s d) dot(u, qs) - m xs, the dot products exact in int32. */
const struct mm_kernel *mm_codes_kernel_avx2(void);
const struct mm_kernel *mm_codes_kernel_avx512(int vnni);
/* A kernel family reading an integer-code format's own blocks for up to
 * its stream_max_n tokens (stream only; the same activation rows), with
 * the bits of the slab path on the same ISA (the codes kernel above):
 * no unpacking. NULL where none (every 2-6-bit format has one in both). */
const struct mm_kernel *mm_direct_kernel_avx512(enum dtype dt, int vnni);
const struct mm_kernel *mm_direct_kernel_avx2(enum dtype dt);
/* Prompts of the code formats (matmul.c's MM_PANEL_MIN_TOKENS or more): the
 * unpacked rows of a slab (stride bytes apart, ns <= MM_PANEL_ROWS)
 * rebuilt as one panel of mm_panel_bytes(cols) (matmul.c), and a panel
 * kernel of the codes kernel's family (AVX-512 with VNNI, else AVX2):
 * out[t][0 .. ns) for all of j's n tokens (j->xq quantized by
 * mm_codes_xq_quantize*, j->out at the panel's first row, j->rows its
 * stride). */
#define MM_PANEL_ROWS 16
/* Fewer tokens than this take the direct kernels (4 a pass) or, without
 * them, the tiles: building a panel (a pass over its 16 unpacked rows)
 * costs more than its kernel saves below it (0.6B Q4_K, 2 threads:
 * p16 129 tok/s on panels against 178 in direct passes, 8 streams'
 * batched step 17.5-18 on panels against 25-26 on tiles); prompts break
 * even at ~32 tokens on the development VM. */
#define MM_PANEL_MIN_TOKENS 32
/* A panel's 64-value group: at 0, [16 lanes k][16 rows] 4 bytes, codes
 * 4k .. 4k + 3 of each row; at MM_PANEL_S, s of [4 units][16 rows] f32;
 * at MM_PANEL_M, m likewise (rows past ns: zeros). */
#define MM_PANEL_S 1024
#define MM_PANEL_M 1280
#define MM_PANEL_GROUP_BYTES 1536
size_t mm_panel_bytes(int64_t cols);
/* xu's floats a token for cols values, and one token's from its row of xq */
size_t mm_panel_xu_floats(int64_t cols);
void mm_panel_unit_sums(const uint8_t *xq, int64_t cols, int unit, float *xu);
typedef void (*mm_panel_build_fn)(const uint8_t *src, size_t stride, int64_t ns, int64_t cols,
                                  uint8_t *panel);
void mm_panel_build(const uint8_t *slab, size_t stride, int64_t ns, int64_t cols, uint8_t *panel);
void mm_panel_build_avx512(const uint8_t *slab, size_t stride, int64_t ns, int64_t cols,
                           uint8_t *panel); /* the same bytes */
/* The same from ns rows of Q8_0 blocks: codes q + 128 (up to 255), s = d,
 * m = 128 d; for mm_panel_run_avx512 only (int32 unit sums) */
void mm_panel_build_q8_0(const uint8_t *rows, size_t stride, int64_t ns, int64_t cols,
                         uint8_t *panel);
void mm_panel_build_q8_0_avx512(const uint8_t *rows, size_t stride, int64_t ns,
                                int64_t cols, uint8_t *panel); /* the same bytes */
typedef void (*mm_panel_fn)(const struct mm_job *j, const uint8_t *panel, int64_t ns);
void mm_panel_run_avx512(const struct mm_job *j, const uint8_t *panel, int64_t ns); /* VNNI */
void mm_panel_run_avx2(const struct mm_job *j, const uint8_t *panel, int64_t ns);
size_t mm_codes_xq_row_bytes(int64_t cols);
void mm_codes_xq_quantize(const float *x, uint8_t *dst, int64_t cols);
/* The same bytes by AVX2 (the AVX2 and AVX-512 families' quantizer; call
 * only where cpu_isa_hw() has AVX2). */
void mm_codes_xq_quantize_avx2(const float *x, uint8_t *dst, int64_t cols);

static inline size_t mm_round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* An integer kernel family (Q8_0, or the unpacked codes of GGUF's
 * low-bit formats) from its tile template tile(mr, nr, j, t, r), built
 * with the target attribute ATTR: the streaming kernel (nt tokens against
 * one row at a time), the main tile and its three edges, with the
 * activations' row size and quantizer. The including file defines MR, NR
 * and STREAM_MAX_N. */
#define MM_INT_KERNEL(ATTR, name, tile, xq_bytes, xq_quant)                    \
    static ATTR void name##_stream(const struct mm_job *j, int64_t t, int nt, int64_t r0, \
                                   int64_t r1)                                 \
    {                                                                          \
        switch (nt) {                                                          \
        case 1: for (int64_t r = r0; r < r1; r++) tile(1, 1, j, t, r); break;  \
        case 2: for (int64_t r = r0; r < r1; r++) tile(2, 1, j, t, r); break;  \
        case 3: for (int64_t r = r0; r < r1; r++) tile(3, 1, j, t, r); break;  \
        default: for (int64_t r = r0; r < r1; r++) tile(4, 1, j, t, r); break; \
        }                                                                      \
    }                                                                          \
    static ATTR void name##_main(const struct mm_job *j, int64_t t, int64_t r) \
    { tile(MR, NR, j, t, r); }                                                 \
    static ATTR void name##_t1(const struct mm_job *j, int64_t t, int64_t r)   \
    { tile(1, NR, j, t, r); }                                                  \
    static ATTR void name##_r1(const struct mm_job *j, int64_t t, int64_t r)   \
    { tile(MR, 1, j, t, r); }                                                  \
    static ATTR void name##_1x1(const struct mm_job *j, int64_t t, int64_t r)  \
    { tile(1, 1, j, t, r); }                                                   \
    static const struct mm_kernel name = {MR, NR, STREAM_MAX_N, name##_stream, name##_main, \
                                          name##_t1, name##_r1, name##_1x1, xq_bytes, xq_quant};

/* A direct kernel family (mm_direct_kernel_*) of dtype DT from the
 * row template row(DT, nt, j, t, r): out[t .. t + nt)[r] for nt <=
 * STREAM_MAX_N tokens, streamed row after row; no tiles (the driver
 * passes more tokens than that STREAM_MAX_N at a time over blocks of
 * rows, mm_run_chunk). */
#define MM_DIRECT_KERNEL(ATTR, name, row, DT)                                  \
    static ATTR void name##_stream(const struct mm_job *j, int64_t t, int nt, int64_t r0, \
                                   int64_t r1)                                 \
    {                                                                          \
        switch (nt) {                                                          \
        case 1: for (int64_t r = r0; r < r1; r++) row(DT, 1, j, t, r); break;  \
        case 2: for (int64_t r = r0; r < r1; r++) row(DT, 2, j, t, r); break;  \
        case 3: for (int64_t r = r0; r < r1; r++) row(DT, 3, j, t, r); break;  \
        default: for (int64_t r = r0; r < r1; r++) row(DT, 4, j, t, r); break; \
        }                                                                      \
    }                                                                          \
    static const struct mm_kernel name = {MR, NR, STREAM_MAX_N, name##_stream, NULL, NULL, \
                                          NULL, NULL, mm_codes_xq_row_bytes,   \
                                          mm_codes_xq_quantize_avx2};

#endif
