/* gemv_mma.cuh - cuk_gemv_fused's contract for a batched decode step (up
 * to CUK_MMA_MAX_N tokens) on the tensor cores, with the input rows
 * rounded to the weights' half type as a cuBLAS GEMM reads them.
 *
 * Why: past 4 tokens the f32 GEMVs are bound by shared-memory reads of x
 * (32 bytes per 16-byte weight vector per token), so batched steps went
 * to cuBLAS, which reads the weights at ~90 % of the copy bandwidth but
 * launches without programmatic dependent launch and leaves the norms,
 * SwiGLU, the residual adds and its split-K reductions to launches of
 * their own (~1.2 ms of an 8B step at 8 streams). Here one launch does
 * what cuk_gemv_fused does: the input op (x, rmsnorm(x), silu(x) * x2)
 * while staging x, the product, and the output op (store, residual add,
 * SwiGLU of a gate/up pair), its first weight loads issued before it
 * waits for the previous kernel.
 *
 * Shape: blocks of 16 warps, one per SM, or where that does not fit 8
 * warps, at most two per SM (persistent: a block loops over work). Each
 * block stages all n rows of x, after the input op and rounded to half,
 * in shared memory once. The work is a list of units, a
 * tile of 16 weight rows (a gate/up pair: 8 rows of each) by one of ks
 * equal column slices; the ks slices of a tile go to neighbouring warps of
 * one block, which add their sums through shared memory in slice order.
 *
 * The product of a warp: mma.sync m16n8k16 with the tokens as M (16, so up
 * to 16 tokens cost what one does) and 8 weight rows as N, one mma per
 * 16 columns for each 8-row half of the unit's 16 rows. The weights never touch shared memory: lane (g, t)
 * (g = lane / 4, t = lane % 4) loads 16 bytes of row g at columns c0 + 8t
 * .. c0 + 8t + 7 straight from global memory, and x is read with the same
 * columns, because a k-step may take its 16 columns in any order as long
 * as A and B agree: of the 32 columns c0 .. c0 + 31, the first mma takes
 * c0 + 8t + {0, 1, 2, 3} as its logical columns {2t, 2t + 1, 2t + 8, 2t +
 * 9} and the second c0 + 8t + {4, 5, 6, 7}. A lane's 16 bytes are then
 * its b0/b1 registers for both, whole.
 *
 * GGUF's K-quants (Q4_K, Q5_K, Q6_K) have a kernel of their own on this
 * launch shape (gemv_mma_quant.cu), one block an SM, staging x itself.
 *
 * Every output is summed in an order fixed by the shapes and the device
 * (rows, cols, n, cfg): the same bits on every call. Not the bits of the f32 GEMVs (x is rounded)
 * nor of cuBLAS (another order), so the backend picks this kernel or
 * cuBLAS by shape, never both for one matrix. */
#ifndef CLLM_BACKEND_CUDA_GEMV_MMA_CUH
#define CLLM_BACKEND_CUDA_GEMV_MMA_CUH

#include <math.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/qmma_dq.cuh" /* qmma_fmt: the K-quant kernel's slot rows */

#define MMA_U 4 /* 32-column steps a warp loads together (a chunk) */
#define QMMA_U 8 /* the same for K-quant weights (gemv_mma_quant.cu): one block */
/* A warp's slot of that kernel's ring: one block of its unit's 16 rows,
 * bb bytes a row (qmma_block_bytes); slots a warp, and the ring's bytes
 * (w warps). After the ring, x's sums per token and 32 columns (Q6_K:
 * 16), for 8 or 16 tokens. */
#define QMMA_SLOT(bb) (16 * (bb))
#define QMMA_MIN_SLOTS 2
#define QMMA_MAX_SLOTS 4
#define QMMA_RING(w, slots, bb) ((size_t)(w) * (slots) * QMMA_SLOT(bb))
/* (and after them the runs' sums of squares of a norm, qmma_stage's:
 * fewer than 2 CUK_MMA_MAX_N) */
#define QMMA_SQ (2 * CUK_MMA_MAX_N * 4)
#define QMMA_SUMS(dt, n, cols) \
    ((size_t)(cols) / ((dt) == DT_Q6_K ? 16 : 32) * ((n) <= 8 ? 8 : 16) * 4 + QMMA_SQ)
/* Runs each row of x is staged in (qmma_stage): the fewest that give
 * the fewest rounds of loads for the slowest warp, a round being up to
 * `loads` float4s a lane of one run, and a warp taking runs w, w + W,
 * .... A warp a row had put a whole row's loads behind one warp's few in
 * flight while W - n warps idled (an 8B's 4,096 columns at 2 tokens in 8
 * warps: 4 rounds of 8 loads; now 2 runs a row, 1 round of 16). Splitting
 * past one run a warp only adds rounds: at 3 tokens of 1,024 columns, 8
 * runs a row (two a warp) cost the 0.6B 7 % (H100, x401). */
static __host__ __device__ inline int qmma_parts(int n, int cols, int w, int loads)
{
    const int nf = cols / 4;
    int best = 1, cost = 1 << 30;
    for (int parts = 1; parts <= w && nf / parts >= 32; parts *= 2) {
        const int len = (nf + parts - 1) / parts;
        const int c = (n * parts + w - 1) / w * ((len + 32 * loads - 1) / (32 * loads));
        if (c < cost) {
            cost = c;
            best = parts;
        }
    }
    return best;
}

/* Most float4 loads a lane qmma_stage keeps in flight: 16 where 8-warp
 * blocks leave the registers for them (and as many of w or x2). */
static __host__ __device__ constexpr int qmma_stage_loads(int w)
{
    return w <= 8 ? 16 : 8;
}

/* A slot row's bytes for the dtypes that kernel takes (0: none): a block,
 * or Q6_K's 14 aligned 16-byte pieces over its 210. */
static inline int qmma_block_bytes(int dt)
{
    return dt == DT_Q4_K   ? qmma_fmt<DT_Q4_K>::BB
           : dt == DT_Q5_K ? qmma_fmt<DT_Q5_K>::BB
           : dt == DT_Q6_K ? qmma_fmt<DT_Q6_K>::BB
                           : 0;
}
/* A warp's sums (16 tokens x 16 rows, 8 floats a lane), per warp of a
 * block of W warps and for two rounds of units, so one barrier a round
 * suffices. */
#define MMA_SCRATCH(W) (2 * (W) * 8 * 32 * 4)
#define MMA_INV (CUK_MMA_MAX_N * 4)
/* Bytes of the staged half copy of x (n rows, stride halves apart), which
 * the rest of a block's shared memory follows. */
#define MMA_XBYTES(n, stride) (((size_t)(n) * (stride) * 2 + 15) / 16 * 16)
/* Shared memory x's f32 copy leaves unused on an SM: the rest of the
 * unified L1 holds the weights' loads in flight. Taking it (a block of
 * 209 KB, L1 down to 28 KB) slowed an 8B model's gate matrix at 8 tokens
 * from 34 to 46 us (docs/benchmarks.md, twentieth pass). */
#define MMA_L1_KEEP (32 * 1024)

struct mmap {
    float *outp[3];
    const uint8_t *w[3];      /* rows row_bytes apart */
    const uint16_t *sc[3];    /* Q8_0: the device's scale tables (an f16 a 32) */
    size_t row_bytes;
    int rows[3];
    int tiles[3]; /* 16-row tiles of each matrix (a pair: 8 rows of each) */
    int n, cols;
    int stride; /* halves per staged row of x */
    int ks;     /* column slices per tile (warps that share it) */
    int slice;  /* 32-column steps per slice */
    int cpu;    /* chunks per unit */
    int bunits; /* ceil(units / warps a block): a block's worth of units, in all */
    int out;    /* CUK_OUT_* */
    int ubytes; /* shared memory between x and 1/rms: the slices' sums, or x in f32 */
    int copy_x; /* stage x by mma_copy_x + mma_convert (else mma_stage) */
    int slots, ring_off; /* K-quants: a warp's ring slots, where the ring starts */
    int xld, xc0; /* K-quants: x's rows (floats; a norm's length) and the
                   * column of x the weights' first (w[], a window's) meets */
    int parts, loads; /* K-quants: runs each row of x is staged in, and
                       * float4 loads a lane in flight (qmma_parts and
                       * qmma_stage_loads, worked out once a launch; 1 and 8
                       * with cuk_mma_cfg's qmma_stage_rows) */
    int cl; /* K-quants: blocks a thread-block cluster, each cols (of the
             * cl * cols) of every tile, rank r from column xc0 + r * cols */
};

/* Where unit uid's weights are, for the calling lane. */
struct mma_unit {
    const uint8_t *w0, *w1;    /* lane's rows of the two 8-row halves */
    const uint16_t *sc0, *sc1; /* Q8_0: their scales */
    int s0, s1;              /* its 32-column steps [s0, s1) */
    int m, row0, ks;
    bool valid;
};

template <bool PAIR>
static __device__ __forceinline__ struct mma_unit mma_unit_of(const struct mmap &p, int uid)
{
    struct mma_unit u;
    int tile = uid / p.ks;
    u.ks = uid - tile * p.ks;
    u.valid = tile < p.tiles[0] + p.tiles[1] + p.tiles[2];
    if (!u.valid)
        tile = 0;
    const int m = gemv_matrix_of(tile, p.tiles);
    u.m = m;
    const int rows = m == 0 ? p.rows[0] : m == 1 ? p.rows[1] : p.rows[2];
    const int g = (threadIdx.x & 31) >> 2;
    /* rows past the end (last tile) re-read the last row; not written */
    const size_t spr = (size_t)p.cols / 32; /* Q8_0 scales a row */
    if (PAIR) {
        u.row0 = tile * 8;
        const size_t r = (size_t)min(u.row0 + g, rows - 1);
        u.w0 = p.w[0] + r * p.row_bytes;
        u.w1 = p.w[1] + r * p.row_bytes;
        u.sc0 = p.sc[0] ? p.sc[0] + r * spr : nullptr;
        u.sc1 = p.sc[1] ? p.sc[1] + r * spr : nullptr;
    } else {
        u.row0 = tile * 16;
        const uint8_t *w = m == 0 ? p.w[0] : m == 1 ? p.w[1] : p.w[2];
        const uint16_t *sc = m == 0 ? p.sc[0] : m == 1 ? p.sc[1] : p.sc[2];
        const size_t r0 = (size_t)min(u.row0 + g, rows - 1), r1 = (size_t)min(u.row0 + 8 + g, rows - 1);
        u.w0 = w + r0 * p.row_bytes;
        u.w1 = w + r1 * p.row_bytes;
        u.sc0 = sc ? sc + r0 * spr : nullptr;
        u.sc1 = sc ? sc + r1 * spr : nullptr;
    }
    u.s0 = u.ks * p.slice;
    u.s1 = min(u.s0 + p.slice, p.cols / 32);
    return u;
}

/* Chunk j of unit u's weights: MMA_U steps of the lane's two rows. */
static __device__ __forceinline__ void mma_load(uint4 (&b)[2][MMA_U], const struct mma_unit &u,
                                                int j, int tig)
{
#pragma unroll
    for (int i = 0; i < MMA_U; i++) {
        int s = u.s0 + j * MMA_U + i;
        bool ok = u.valid && s < u.s1;
        const size_t c = (size_t)s * 32 + 8 * tig;
        b[0][i] = ok ? ld_stream((const uint4 *)(u.w0 + 2 * c)) : make_uint4(0, 0, 0, 0);
        b[1][i] = ok ? ld_stream((const uint4 *)(u.w1 + 2 * c)) : make_uint4(0, 0, 0, 0);
    }
}

/* acc += chunk j of unit u against the staged x (tokens g and g + 8). */
template <bool F16, int NT>
static __device__ __forceinline__ void mma_step(float (&acc)[2][4], const uint4 (&b)[2][MMA_U],
                                                const struct mma_unit &u, int j,
                                                const uint16_t *xs, int stride, int n, int g,
                                                int tig)
{
#pragma unroll
    for (int i = 0; i < MMA_U; i++) {
        int s = u.s0 + j * MMA_U + i;
        if (!u.valid || s >= u.s1) /* the same for the whole warp */
            break;
        const uint16_t *xp = xs + (size_t)g * stride + s * 32 + 8 * tig;
        /* tokens past n: zeros (their rows of the product are not stored) */
        uint4 xa = g < n ? *(const uint4 *)xp : make_uint4(0, 0, 0, 0);
        uint4 xb = NT > 8 && g + 8 < n ? *(const uint4 *)(xp + (size_t)8 * stride)
                                       : make_uint4(0, 0, 0, 0);
        const uint32_t a0[4] = {xa.x, xb.x, xa.y, xb.y}, a1[4] = {xa.z, xb.z, xa.w, xb.w};
#pragma unroll
        for (int h = 0; h < 2; h++) {
            cuk_mma16816<F16>(acc[h], a0, b[h][i].x, b[h][i].y);
            cuk_mma16816<F16>(acc[h], a1, b[h][i].z, b[h][i].w);
        }
    }
}

/* Element 4f.. of staged row j: v rounded to half. */
static __device__ __forceinline__ void mma_put4(uint16_t *xs, int stride, int j, int f, float4 v,
                                                int bf16)
{
    uint2 h;
    h.x = cuk_to_half(v.x, bf16) | (uint32_t)cuk_to_half(v.y, bf16) << 16;
    h.y = cuk_to_half(v.z, bf16) | (uint32_t)cuk_to_half(v.w, bf16) << 16;
    *(uint2 *)(xs + (size_t)j * stride + 4 * f) = h;
}

/* Stages rows [0, n) of x after the input op, rounded to half, into xs
 * (row j at j * stride). (Batching each thread's loads, four at a time,
 * was slower on the H200: docs/benchmarks.md, seventeenth pass.) */
template <int IN>
static __device__ __forceinline__ void mma_stage(uint16_t *xs, const struct cuk_gemv_in &in,
                                                 const float *sinv, int n, int cols, int stride,
                                                 int bf16)
{
    const int nf = cols / 4;
    for (int i = threadIdx.x; i < n * nf; i += blockDim.x) {
        const int j = i / nf, f = i - j * nf;
        float4 v = __ldg((const float4 *)(in.x + (size_t)j * cols) + f);
        if (IN != CUK_IN_X) /* the norm's weights, or SwiGLU's up row */
            v = gemv_in_op4<IN>(v,
                                __ldg((const float4 *)(IN == CUK_IN_RMSNORM
                                                           ? in.nw
                                                           : in.x2 + (size_t)j * cols) + f),
                                IN == CUK_IN_RMSNORM ? sinv[j] : 0.0f);
        mma_put4(xs, stride, j, f, v, bf16);
    }
}

/* Issues 16-byte asynchronous copies of x's n rows (and SwiGLU's n up
 * rows after them) as f32 into shared memory at xf, every thread its share
 * at once (mma_stage's loads go one after another per thread: an L2 round
 * trip per 2 KB of a block, ~0.5 us a token at 4,096 columns;
 * docs/benchmarks.md, twentieth pass). mma_convert waits for them. */
template <int IN>
static __device__ __forceinline__ void mma_copy_x(float *xf, const struct cuk_gemv_in &in, int n,
                                                  int cols)
{
    const int nx = n * cols / 4, n2 = IN == CUK_IN_SWIGLU ? nx : 0;
    const uint32_t dst = cuk_smem_addr(xf);
    for (int i = threadIdx.x; i < nx + n2; i += blockDim.x)
        cuk_cp_async16(dst + 16 * i, i < nx ? in.x + 4 * (size_t)i : in.x2 + 4 * (size_t)(i - nx),
                       true);
    cuk_cp_async_commit();
}

/* mma_stage's results from the rows mma_copy_x is bringing to xf: the same
 * operations on the same values, so the same bits. Thread t takes float4
 * columns t, t + blockDim, ... of every row, so it loads each of the
 * norm's weights once. */
template <int IN>
static __device__ __forceinline__ void mma_convert(uint16_t *xs, const float *xf,
                                                   const struct cuk_gemv_in &in,
                                                   const float *sinv, int n, int cols, int stride,
                                                   int bf16)
{
    const int nf = cols / 4;
    const float4 *x4 = (const float4 *)xf, *y4 = x4 + (size_t)n * nf;
    cuk_cp_async_wait<0>();
    __syncthreads();
    for (int f = threadIdx.x; f < nf; f += blockDim.x) {
        const float4 w = IN == CUK_IN_RMSNORM ? __ldg((const float4 *)in.nw + f)
                                              : make_float4(0, 0, 0, 0);
        for (int j = 0; j < n; j++) {
            const size_t i = (size_t)j * nf + f;
            float4 v = x4[i];
            if (IN != CUK_IN_X)
                v = gemv_in_op4<IN>(v, IN == CUK_IN_RMSNORM ? w : y4[i],
                                    IN == CUK_IN_RMSNORM ? sinv[j] : 0.0f);
            mma_put4(xs, stride, j, f, v, bf16);
        }
    }
}

/* 1 / rms of one row of x (cols floats, 16-byte aligned) for the calling
 * warp, its squares summed in f32: four sums a lane (float4 lane, lane +
 * 32, ...), added, then the warp's. Not cuk_warp_rms_inv's f64 sums: the
 * conversions and multiply-adds of every element, in every block, run on
 * the SM's FP64 pipe, ~0.75 us of an 8B model's 8-token q/k/v launch
 * (docs/benchmarks.md, twenty-first pass). f32 is what HF sums in; the
 * rounding of x to half hides the difference from cuk_rmsnorm's f64 but
 * for a rare last bit. */
static __device__ __forceinline__ float mma_row_inv(const float *x, int cols, float eps,
                                                    int lane)
{
    const float4 *x4 = (const float4 *)x;
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int i = lane; i < cols / 4; i += 32) {
        const float4 v = __ldg(x4 + i);
        s.x = fmaf(v.x, v.x, s.x);
        s.y = fmaf(v.y, v.y, s.y);
        s.z = fmaf(v.z, v.z, s.z);
        s.w = fmaf(v.w, v.w, s.w);
    }
    const float ss = cuk_warp_sum((s.x + s.y) + (s.z + s.w)); /* every lane the same sum */
    return 1.0f / sqrtf(ss / (float)cols + eps);
}

/* sinv[j] = 1 / rms of row j of x, a warp per row. */
static __device__ __forceinline__ void mma_rms_inv(float *sinv, const float *x, int n, int cols,
                                                   float eps)
{
    const int lane = threadIdx.x & 31;
    for (int j = threadIdx.x >> 5; j < n; j += blockDim.x >> 5) {
        const float inv = mma_row_inv(x + (size_t)j * cols, cols, eps, lane);
        if (lane == 0)
            sinv[j] = inv;
    }
}

/* The end of a unit: the ks slices' sums added in slice order by the
 * tile's first warp, which applies the output op. Every warp of the block
 * calls it at the same chunks (ks > 1 meets at a barrier). */
template <bool PAIR, int W>
static __device__ __forceinline__ void mma_finish(float (&acc)[2][4], const struct mmap &p,
                                                  const struct mma_unit &u, int round,
                                                  float *scratch, int g, int tig)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (p.ks > 1) {
        float *mine = scratch + ((round & 1) * W + warp) * 256;
#pragma unroll
        for (int e = 0; e < 8; e++)
            mine[e * 32 + lane] = acc[e / 4][e % 4];
        __syncthreads();
        if (u.ks == 0)
            for (int k = 1; k < p.ks; k++)
#pragma unroll
                for (int e = 0; e < 8; e++)
                    acc[e / 4][e % 4] += mine[k * 256 + e * 32 + lane];
    }
    if (u.valid && u.ks == 0) {
        const int rows = u.m == 0 ? p.rows[0] : u.m == 1 ? p.rows[1] : p.rows[2];
        float *out = u.m == 0 ? p.outp[0] : u.m == 1 ? p.outp[1] : p.outp[2];
        /* the lane's outputs: tokens g, g + 8 (hi), rows row0 + 8 h + 2 tig + e */
        auto ok = [&](int hi, int r) { return g + 8 * hi < p.n && r < rows; };
        auto at = [&](int hi, int r) { return out + (size_t)(g + 8 * hi) * rows + r; };
        if (PAIR) {
#pragma unroll
            for (int hi = 0; hi < 2; hi++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    if (ok(hi, u.row0 + 2 * tig + e))
                        *at(hi, u.row0 + 2 * tig + e) =
                            cuk_silu_mul1(acc[0][2 * hi + e], acc[1][2 * hi + e]);
        } else {
            /* every value added to is read before any output is written:
             * the L2 trips in flight together, not one after another */
            float old[2][2][2] = {};
            if (p.out == CUK_OUT_ADD)
#pragma unroll
                for (int hi = 0; hi < 2; hi++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
#pragma unroll
                        for (int h = 0; h < 2; h++)
                            if (ok(hi, u.row0 + 8 * h + 2 * tig + e))
                                old[hi][e][h] = __ldcg(at(hi, u.row0 + 8 * h + 2 * tig + e));
#pragma unroll
            for (int hi = 0; hi < 2; hi++)
#pragma unroll
                for (int e = 0; e < 2; e++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        if (ok(hi, u.row0 + 8 * h + 2 * tig + e))
                            *at(hi, u.row0 + 8 * h + 2 * tig + e) =
                                p.out == CUK_OUT_ADD ? old[hi][e][h] + acc[h][2 * hi + e]
                                                     : acc[h][2 * hi + e];
        }
    }
#pragma unroll
    for (int e = 0; e < 8; e++)
        acc[e / 4][e % 4] = 0.0f;
}

/* W warps a block: 8 (two blocks an SM) or 16 (one). */
template <bool F16, int NT, int IN, bool PAIR, int W>
__global__ void __launch_bounds__(W * 32, 16 / W)
    k_gemv_mma(const struct mmap p, const struct cuk_gemv_in in)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) unsigned char mm_smem[];
    uint16_t *xs = (uint16_t *)mm_smem;
    const size_t xbytes = MMA_XBYTES(p.n, p.stride);
    float *scratch = (float *)(mm_smem + xbytes); /* after staging: x's f32 rows before */
    float *sinv = (float *)(mm_smem + xbytes + p.ubytes);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
    const int grid = (int)gridDim.x, blk = (int)blockIdx.x;
    /* every warp of a block runs the same rounds (the barriers of ks > 1) */
    const int rounds = blk < p.bunits ? (p.bunits - blk + grid - 1) / grid : 0;
    const int nchunks = rounds * p.cpu;
    struct mma_unit lu = mma_unit_of<PAIR>(p, blk * W + warp), cu = lu;
    uint4 b0[2][MMA_U], b1[2][MMA_U];
    if (nchunks > 0)
        mma_load(b0, lu, 0, tig);
    /* Weights never change, so their first loads may overlap the previous
     * kernel (programmatic dependent launch); x and out are its. */
    cuk_pdl_start();
    if (p.copy_x) /* the norm's sums while the copies fly */
        mma_copy_x<IN>(scratch, in, p.n, p.cols);
    if (IN == CUK_IN_RMSNORM)
        mma_rms_inv(sinv, in.x, p.n, p.cols, in.eps);
    if (p.copy_x) {
        mma_convert<IN>(xs, scratch, in, sinv, p.n, p.cols, p.stride, !F16);
    } else {
        __syncthreads();
        mma_stage<IN>(xs, in, sinv, p.n, p.cols, p.stride, !F16);
    }
    __syncthreads();
    float acc[2][4] = {};
    /* Two chunks per trip so the buffers swap roles without copies; the
     * next chunk's loads (maybe the next unit's) go out before this one's
     * products. */
    for (int c = 0; c < nchunks; c += 2) {
        if (c + 1 < nchunks) {
            if ((c + 1) % p.cpu == 0)
                lu = mma_unit_of<PAIR>(p, (((c + 1) / p.cpu) * grid + blk) * W + warp);
            mma_load(b1, lu, (c + 1) % p.cpu, tig);
        }
        mma_step<F16, NT>(acc, b0, cu, c % p.cpu, xs, p.stride, p.n, g, tig);
        if ((c + 1) % p.cpu == 0) {
            mma_finish<PAIR, W>(acc, p, cu, c / p.cpu, scratch, g, tig);
            cu = lu;
        }
        if (c + 1 >= nchunks)
            break;
        if (c + 2 < nchunks) {
            if ((c + 2) % p.cpu == 0)
                lu = mma_unit_of<PAIR>(p, (((c + 2) / p.cpu) * grid + blk) * W + warp);
            mma_load(b0, lu, (c + 2) % p.cpu, tig);
        }
        mma_step<F16, NT>(acc, b1, cu, (c + 1) % p.cpu, xs, p.stride, p.n, g, tig);
        if ((c + 2) % p.cpu == 0) {
            mma_finish<PAIR, W>(acc, p, cu, (c + 1) / p.cpu, scratch, g, tig);
            cu = lu;
        }
    }
#else
    cuk_pdl_start();
#endif
}

/* Halves per staged row: cols rounded so that rows sit 64 bytes apart
 * modulo 128, which keeps a quarter-warp's 16-byte reads (two rows, 64
 * bytes each) off each other's banks. */
static inline int mma_stride(int cols)
{
    return cols % 64 == 0 ? cols + 32 : cols;
}

/* w: warps a block. */
static inline size_t mma_smem(int n, int cols, int ks, int w)
{
    return MMA_XBYTES(n, mma_stride(cols)) + (ks > 1 ? MMA_SCRATCH(w) : 0) + MMA_INV;
}

/* The most shared memory a block may take with per_sm (1 or 2) blocks on
 * an SM: two must fit beside each other with the 1 KB each reserves. */
static inline size_t mma_block_room(const struct cuk_mma_cfg *cfg, int per_sm, size_t smem_max)
{
    if (per_sm == 1)
        return smem_max;
    const size_t half = (size_t)cfg->smem_sm / 2;
    return half > 1024 ? half - 1024 : 0;
}

template <bool F16, int NT, int IN, bool PAIR, int W>
static cudaError_t mma_launch_w(cudaStream_t s, const struct mmap &p,
                                const struct cuk_gemv_in &in, int grid, size_t smem)
{
    static struct cuk_opted opted; /* per instantiation, see cuk_smem_opt_in */
    auto k = k_gemv_mma<F16, NT, IN, PAIR, W>;
    cudaError_t err = cuk_smem_opt_in(k, smem, &opted);
    if (err != cudaSuccess)
        return err;
    return cuk_launch(k, (unsigned)grid, W * 32, smem, s, p, in);
}

template <bool F16, int NT, int IN, bool PAIR>
static cudaError_t mma_launch(cudaStream_t s, const struct mmap &p,
                              const struct cuk_gemv_in &in, int grid, size_t smem, int w)
{
    return w == 16 ? mma_launch_w<F16, NT, IN, PAIR, 16>(s, p, in, grid, smem)
                   : mma_launch_w<F16, NT, IN, PAIR, 8>(s, p, in, grid, smem);
}

template <bool F16, int NT>
static cudaError_t mma_launch_in(cudaStream_t s, const struct mmap &p,
                                 const struct cuk_gemv_in &in, int grid, size_t smem, int w)
{
    if (p.out == CUK_OUT_SWIGLU)
        return mma_launch<F16, NT, CUK_IN_RMSNORM, true>(s, p, in, grid, smem, w);
    if (in.kind == CUK_IN_RMSNORM)
        return mma_launch<F16, NT, CUK_IN_RMSNORM, false>(s, p, in, grid, smem, w);
    if (in.kind == CUK_IN_SWIGLU)
        return mma_launch<F16, NT, CUK_IN_SWIGLU, false>(s, p, in, grid, smem, w);
    return mma_launch<F16, NT, CUK_IN_X, false>(s, p, in, grid, smem, w);
}


/* The quantized weights' launch (gemv_mma_quant.cu): dt Q4_K, Q5_K or Q6_K
 * (slices of whole blocks, QMMA_U steps a chunk), blocks of w warps (8
 * or 16); cudaErrorNotSupported for any other dtype. */
cudaError_t mma_launch_quant(cudaStream_t s, int dt, int n, const struct mmap &p,
                             const struct cuk_gemv_in &in, int grid, size_t smem, int w);

#endif
