/* qmma_rule.h - when a K-quant matmul of a batched decode step takes the
 * tensor-core GEMV (gemv_mma_quant.cu) by default, and when its blocks
 * run in clusters: plain C, so that the backend's host files, its
 * kernels and tests/test_cuda.c read one rule. The measurements behind
 * each number are docs/benchmarks.md's, sessions 61 and 62. */
#ifndef CLLM_QMMA_RULE_H
#define CLLM_QMMA_RULE_H

/* Fewest tokens that take the tensor-core GEMV (CLLM_CUDA_QMMA_FROM
 * overrides; CLLM_CUDA_QMMA=0 turns it off), up to CUK_MMA_MAX_N, rather
 * than the staged quantized GEMV (up to 8) or the widened GEMM, copies or
 * not. H100, 2 / 3 / 4 streams, from 5 against from 2 (x401, session
 * 61's kernel), without copies: an 8-layer 8B Q4_K_M 1,819 / 2,223 /
 * 2,373 against 1,665-1,684 / 2,403-2,437 / 3,204-3,223 tok/s,
 * Qwen3-0.6B Q4_K_M 1,542 / 1,785 / 1,956 against 1,679 / 2,311-2,330 /
 * 3,203-3,252; with the bf16 copies the 8B 1,815 / 2,231 / 2,493 against
 * 1,676 / 2,438 / 3,218, the 0.6B 1,542 / 1,782 / 2,903 against 1,675 /
 * 2,315 / 3,448. So 3 for both. */
#define QMMA_FROM_N 3
/* ... and from 2 tokens for matrices of at most this many columns: H100,
 * 2 streams, tensor-core GEMV against the staged one, Qwen3-0.6B Q4_K_M
 * (every matrix 1,024-3,072 columns) 1,516 -> 1,665 tok/s (+10 %; x405,
 * session 62, as in session 61's x401), the 8-layer 8B (4,096 columns
 * and more) 1,824 -> 1,657 (-9 %). */
#define QMMA_NARROW_COLS 3072
#define QMMA_NARROW_FROM_N 2

/* The default fewest tokens for a matrix of cols columns. */
static inline int qmma_from_n(int cols)
{
    return cols <= QMMA_NARROW_COLS ? QMMA_NARROW_FROM_N : QMMA_FROM_N;
}

/* Where clusters of 2 pay: an 8B's 4,096-column matrices from 5 tokens
 * (H200, 8-layer 8B Q4_K_M, against none: -0.4 / -0.3 % at 3 / 4
 * streams, +2.6 / +4.8 / +3.5 % at 5 / 8 / 16; q/k/v 25 -> 23 us a layer
 * at 16, o 14 -> 12.6); a 0.6B's 1,024-3,072 columns lost 4-12 % at 3-16
 * (x404). CLLM_CUDA_QMMA_CLUSTER overrides. */
#define QMMA_CLUSTER_COLS 4096
#define QMMA_CLUSTER_FROM_N 5

/* The default cluster size for n tokens of cols columns (before
 * cuk_qmma_cluster's check that the columns split evenly). */
static inline int qmma_cluster_default(int cols, int n)
{
    return cols >= QMMA_CLUSTER_COLS && n >= QMMA_CLUSTER_FROM_N ? 2 : 1;
}

#endif
