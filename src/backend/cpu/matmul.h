/* matmul.h - CPU linear layers: out[n][rows] = x[n][cols] . W[rows][cols]^T
 * for every weight dtype, multi-threaded over output rows, SIMD chosen at
 * run time. Activations are f32; weights are read in their stored dtype. */
#ifndef CLLM_BACKEND_CPU_MATMUL_H
#define CLLM_BACKEND_CPU_MATMUL_H

#include <stddef.h>

#include "backend/cpu/cpu_features.h"
#include "base/err.h"
#include "base/threadpool.h"
#include "model/tensor.h"

/* Per-backend matmul state: the pool, the chosen ISA and scratch space (the
 * Q8_0 path quantizes activations to Q8_0 before the integer dot products).
 * Owned by the CPU backend; not shared between threads calling matmul. */
struct cpu_matmul {
    struct threadpool *tp;
    enum cpu_isa isa;
    void *scratch;
    size_t scratch_cap;
    int vnni; /* AVX-512 VNNI usable (decided once, in cpu_matmul_init) */
    /* Fewer tokens than the panels take (MM_PANEL_MIN_TOKENS) on a
     * low-bit format (a direct kernel for each on AVX2 and AVX-512 VNNI):
     * its blocks read as they are, up to 4 tokens with the bits of
     * unpacking them first, more in passes of 4 with each pass's bits
     * alone (1 from cpu_matmul_init; 0: always unpack, for the tiles past
     * 4 tokens, CLLM_CPU_QDIRECT=0, for measurement and tests) */
    int direct;
    /* 32 tokens or more (matmul.c's MM_PANEL_MIN_TOKENS) on a low-bit
     * format with AVX2 or AVX-512 VNNI: 16-row panels (1, the default)
     * or the tiles of the code layout (0, CLLM_CPU_QPANEL=0, for
     * measurement and tests) */
    int panel;
    /* CPU_MATMUL_BF16DOT_MIN_TOKENS tokens or more on bf16 weights, with
     * AVX512_BF16: the activations rounded to bf16 for bf16 dot products
     * (1 from cpu_matmul_init where the CPU has them; 0: f32 activations
     * and f32 FMAs always, CLLM_CPU_BF16DOT=0, for measurement and
     * tests) */
    int bf16dot;
};

/* Calls of this many tokens or more on bf16 weights round the activations
 * to bf16 (nearest even) where bf16dot is on: prompts' logits then differ
 * from decoding's by that rounding (a relative 2^-8 a value at most).
 * Fewer tokens (decoding, batched decode steps) keep f32 activations. */
#define CPU_MATMUL_BF16DOT_MIN_TOKENS 32

int cpu_matmul_init(struct cpu_matmul *mm, struct threadpool *tp, enum cpu_isa isa,
                    struct err *e);
void cpu_matmul_free(struct cpu_matmul *mm);

/* out and x must not alias. w->cols must equal the row length of x; Q8_0
 * requires cols % 32 == 0. Returns 0, or -1 with a message on bad shapes or
 * allocation failure. */
int cpu_matmul(struct cpu_matmul *mm, float *out, const float *x, int n,
               const struct tensor *w, struct err *e);

/* Scalar reference for tests: same contract, one thread, plain C loops,
 * double accumulation. */
void cpu_matmul_ref(float *out, const float *x, int n, const struct tensor *w);

/* Quantizes n floats (n % 32 == 0) into Q8_0 blocks the way ggml does
 * (scale = absmax/127, round to nearest). Used by the converter too. */
void quantize_row_q8_0(const float *x, struct block_q8_0 *y, int64_t n);
void dequantize_row_q8_0(const struct block_q8_0 *x, float *y, int64_t n);

#endif
