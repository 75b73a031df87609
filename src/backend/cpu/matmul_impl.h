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
    /* Q8_0 only: size of one quantized activation row and the quantizer. */
    size_t (*xq_row_bytes)(int64_t cols);
    void (*xq_quantize)(const float *x, uint8_t *dst, int64_t cols);
};

/* NULL when the family has no kernel for dt. */
const struct mm_kernel *mm_kernel_avx2(enum dtype dt);
const struct mm_kernel *mm_kernel_avx512(enum dtype dt, int vnni);

static inline size_t mm_round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

#endif
