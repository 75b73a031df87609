/* gemv_common.cuh - what the two single-token GEMV kernels share (gemv.cu,
 * weights streamed through registers; gemv_staged.cu, weights staged in
 * shared memory): weight dtypes widened to f32, and the staging of x (or
 * rmsnorm(x), silu(x) * x2) into shared memory in the layout both kernels
 * read, with the plain kernels' arithmetic so every output is the same
 * bits whichever kernel computed it. The streaming weight load is also
 * the tensor-core GEMV's (gemv_mma.cu). */
#ifndef CLLM_GEMV_COMMON_CUH
#define CLLM_GEMV_COMMON_CUH

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"

#define GEMV_WARPS 8
#define GEMV_THREADS (GEMV_WARPS * 32)
/* Shared memory for one x tile (n rows) and the norm's 1/rms per row: at
 * most the default 48 KB. */
#define GEMV_SMEM_MAX (48 * 1024)
#define GEMV_INV_BYTES (CUK_GEMV_MAX * 4)

enum { WT_BF16, WT_F16, WT_Q8 };

/* Streaming 16-byte weight load: read-only, no L1 allocation, evicted
 * from L2 first (cuk_l2_evict_first), 256-byte L2 prefetch (the warp's 32
 * lanes read 512 contiguous bytes anyway). */
static __device__ __forceinline__ uint4 ld_stream(const uint4 *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "l"(cuk_l2_evict_first()));
    return v;
}

/* Which of three matrices work item i belongs to (0, 1, 2) when they take
 * n[0], n[1] and n[2] items in turn (row groups, rows, tiles), i made that
 * matrix's own index: how every GEMV kernel splits its launch between up to
 * three matrices. Past them all: matrix 2. */
static __device__ __forceinline__ int gemv_matrix_of(int &i, const int (&n)[3])
{
    int m = 0;
    if (i >= n[0]) {
        i -= n[0];
        m = 1;
        if (i >= n[1]) {
            i -= n[1];
            m = 2;
        }
    }
    return m;
}

/* The VE elements of a weight vector widened to f32 (exact). */
template <int WT>
static __device__ __forceinline__ void unpack(uint4 p, float *f)
{
    uint32_t u[4] = {p.x, p.y, p.z, p.w};
    if (WT == WT_BF16) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            f[2 * k] = __uint_as_float(u[k] << 16);
            f[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
        }
    } else if (WT == WT_F16) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            f[2 * k] = cuk_f16((uint16_t)(u[k] & 0xffffu));
            f[2 * k + 1] = cuk_f16((uint16_t)(u[k] >> 16));
        }
    } else {
        /* int8 q -> f32 exactly: the float 2^23 + (q + 128), minus 2^23 + 128. */
#pragma unroll
        for (int k = 0; k < 16; k++) {
            uint32_t b = __byte_perm(u[k / 4] ^ 0x80808080u, 0x4B00u, 0x5440u | (k % 4));
            f[k] = __uint_as_float(b) - 8388736.0f;
        }
    }
}

template <int WT> struct gemv_cfg;
template <> struct gemv_cfg<WT_BF16> { static constexpr int VE = 8, BYTES = 2; };
template <> struct gemv_cfg<WT_F16> { static constexpr int VE = 8, BYTES = 2; };
template <> struct gemv_cfg<WT_Q8> { static constexpr int VE = 16, BYTES = 1; };

/* sinv[j] = 1 / rms of row j of x (cols floats, 16-byte aligned rows), the
 * squares summed in the order launch_rmsnorm (kernels.cu) gives a row of
 * cols with aligned x, out and weights, so the staged rmsnorm(x) is
 * cuk_rmsnorm's output to the bit: one warp per row for cols <= 512
 * (k_rmsnorm_warp_vec for multiples of 128, else k_rmsnorm_warp; here each
 * warp sums for itself), else one block of 256 threads per row
 * (k_rmsnorm_vec up to 8192, else k_rmsnorm_block). part: NT * 32 doubles
 * of shared memory (the x tile's), sinv: NT floats of shared memory past
 * the tile (registers are what the GEMV is short of); staging begins with
 * a barrier, so both are safe to use until then. Every thread of the
 * block calls it. ALL (the staged GEMV's): NT > 1 rows of 512 < cols <=
 * 8192 summed together, the same bits with one trip to L2 and one
 * barrier for all rows; the register GEMV, which holds weights in
 * registers meanwhile, keeps the row-by-row form (ALL spills there). */
template <int NT, bool ALL = false>
static __device__ __forceinline__ void gemv_rms_inv(float *sinv, const float *x, int cols,
                                                    float eps, double *part)
{
    const int lane = threadIdx.x & 31;
    if (ALL && NT > 1 && cols > 512 && cols <= 8192) {
        /* All rows at once: each row's loads in flight beside the others'
         * (one trip to L2, not NT), then each row's block sum in the order
         * cuk_block_sum_d takes (every warp sums the warps' partials
         * itself, in warp 0's order), one barrier for all rows. */
        double ss[NT];
#pragma unroll
        for (int j = 0; j < NT; j++)
            ss[j] = 0;
#pragma unroll 2
        for (int i = threadIdx.x; i < cols / 4; i += GEMV_THREADS) {
            float4 v[NT];
#pragma unroll
            for (int j = 0; j < NT; j++)
                v[j] = __ldg((const float4 *)(x + (size_t)j * cols) + i);
#pragma unroll
            for (int j = 0; j < NT; j++)
                ss[j] += cuk_rms_sq(v[j]);
        }
#pragma unroll
        for (int j = 0; j < NT; j++)
            cuk_warp_part_d(ss[j], part + 32 * j);
        __syncthreads();
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const double t = cuk_parts_sum_d(part + 32 * j, GEMV_WARPS);
            if (threadIdx.x == 0)
                sinv[j] = cuk_rms_inv(t, cols, eps);
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const float *xr = x + (size_t)j * cols;
        const float4 *x4 = (const float4 *)xr;
        double ss = 0;
        /* unroll 4: loads in flight together, and no spills at the
         * 128-register cap of the n <= 2 kernels (the default unrolling
         * spills while the first weight loads are held) */
        if (cols <= 512) {
            if (cols % 128 == 0) {
#pragma unroll 4
                for (int i = lane; i < cols / 4; i += 32)
                    ss += cuk_rms_sq(__ldg(x4 + i));
            } else {
#pragma unroll 4
                for (int i = lane; i < cols; i += 32) {
                    float v = __ldg(xr + i);
                    ss += (double)v * v;
                }
            }
            ss = cuk_warp_sum_d(ss);
        } else {
            if (cols <= 8192) {
#pragma unroll 4
                for (int i = threadIdx.x; i < cols / 4; i += GEMV_THREADS)
                    ss += cuk_rms_sq(__ldg(x4 + i));
            } else {
#pragma unroll 4
                for (int i = threadIdx.x; i < cols; i += GEMV_THREADS) {
                    float v = __ldg(xr + i);
                    ss += (double)v * v;
                }
            }
            ss = cuk_block_sum_d(ss, part + 32 * j); /* a region per row: no reuse race */
        }
        if (threadIdx.x == 0) /* every thread has the same ss */
            sinv[j] = cuk_rms_inv(ss, cols, eps);
    }
}

/* Where float4 f of a staged row (its elements 4f..4f+3) goes in the x
 * tile: the layout gemv_stage documents, which the GEMV kernels read. */
template <int VE>
static __device__ __forceinline__ int gemv_xs_slot(int f)
{
    const int cl = (4 * f) / VE, q = ((4 * f) % VE) / 4;
    return (cl >> 5) * (8 * VE) + q * 32 + (cl & 31);
}

/* The input op on four elements of a row: rmsnorm (v2 the norm's
 * weights, inv the row's 1/rms) or silu(v) * v2 (v2 up), as the plain
 * kernels compute them; x as it is. */
template <int IN>
static __device__ __forceinline__ float4 gemv_in_op4(float4 v, float4 v2, float inv)
{
    if (IN == CUK_IN_RMSNORM) {
        v.x = cuk_rms_scale(v2.x, v.x, inv);
        v.y = cuk_rms_scale(v2.y, v.y, inv);
        v.z = cuk_rms_scale(v2.z, v.z, inv);
        v.w = cuk_rms_scale(v2.w, v.w, inv);
    } else if (IN == CUK_IN_SWIGLU) {
        v.x = cuk_silu_mul1(v.x, v2.x);
        v.y = cuk_silu_mul1(v.y, v2.y);
        v.z = cuk_silu_mul1(v.z, v2.z);
        v.w = cuk_silu_mul1(v.w, v2.w);
    }
    return v;
}

/* Stages columns [t*tile_cols, +tile_cols) of the n input rows into xs:
 * element lc of the tile (vector cl = lc / VE, quarter q = lc % VE / 4) at
 * float4 (cl / 32) * 8 * VE + q * 32 + cl % 32, so a warp's 32 lanes read
 * 32 consecutive float4 per quarter (no bank conflicts). The rows are x,
 * rmsnorm(x) (sinv from gemv_rms_inv) or silu(x) * x2, as IN says.
 * SB 0 (the register GEMV's, which holds weights in registers meanwhile)
 * stages row by row, each thread's float4s one after another; SB > 0 (the
 * staged GEMV's) takes the NT rows' float4s as one run of items (row j,
 * float4 f) with SB of a thread's loads in flight before any is used: x
 * was just written by the previous kernel, so each load is a trip to L2,
 * and one after another (4 a thread for a 4,096-column row, 8 for two
 * rows) they were the staging's time. */
/* Row j of x from column c0 on, and beside it the second operand of the
 * input op IN (the norm's weights, SwiGLU's up; nullptr for plain x). */
static __device__ __forceinline__ const float4 *gemv_src(const struct cuk_gemv_in &in, int j,
                                                         int cols, int c0)
{
    return (const float4 *)(in.x + (size_t)j * cols + c0);
}
template <int IN>
static __device__ __forceinline__ const float4 *gemv_src2(const struct cuk_gemv_in &in, int j,
                                                          int cols, int c0)
{
    return IN == CUK_IN_RMSNORM  ? (const float4 *)(in.nw + c0)
           : IN == CUK_IN_SWIGLU ? (const float4 *)(in.x2 + (size_t)j * cols + c0)
                                 : nullptr;
}

template <int WT, int NT, int IN, int SB = 0>
static __device__ __forceinline__ void gemv_stage(float4 *xs, const struct cuk_gemv_in &in,
                                                  const float *sinv, int cols, int t,
                                                  int tile_cols)
{
    constexpr int VE = gemv_cfg<WT>::VE;
    int c0 = t * tile_cols, tw = min(cols - c0, tile_cols), nf = tw / 4, tile_f4 = tile_cols / 4;
    __syncthreads(); /* every warp is done with the previous tile */
    if constexpr (SB == 0) {
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const float4 *src = gemv_src(in, j, cols, c0), *src2 = gemv_src2<IN>(in, j, cols, c0);
            const float inv = IN == CUK_IN_RMSNORM ? sinv[j] : 0.0f;
            for (int f = threadIdx.x; f < nf; f += GEMV_THREADS) {
                float4 v = __ldg(src + f);
                if (IN != CUK_IN_X)
                    v = gemv_in_op4<IN>(v, __ldg(src2 + f), inv);
                xs[j * tile_f4 + gemv_xs_slot<VE>(f)] = v;
            }
        }
    } else {
        const int items = NT * nf;
        for (int i0 = threadIdx.x; i0 < items; i0 += SB * GEMV_THREADS) {
            float4 v[SB], v2[SB];
            int jb[SB], fb[SB]; /* item i0 + b * GEMV_THREADS: row jb, float4 fb */
#pragma unroll
            for (int b = 0; b < SB; b++) {
                int j = 0, f = i0 + b * GEMV_THREADS;
#pragma unroll
                for (int r = 1; r < NT; r++)
                    if (f >= nf) {
                        f -= nf;
                        j++;
                    }
                jb[b] = j;
                fb[b] = f;
                if (i0 + b * GEMV_THREADS < items) {
                    v[b] = __ldg(gemv_src(in, j, cols, c0) + f);
                    if (IN != CUK_IN_X)
                        v2[b] = __ldg(gemv_src2<IN>(in, j, cols, c0) + f);
                }
            }
#pragma unroll
            for (int b = 0; b < SB; b++) {
                if (i0 + b * GEMV_THREADS >= items)
                    break;
                float4 w = v[b];
                if (IN != CUK_IN_X)
                    w = gemv_in_op4<IN>(w, v2[b], IN == CUK_IN_RMSNORM ? sinv[jb[b]] : 0.0f);
                xs[jb[b] * tile_f4 + gemv_xs_slot<VE>(fb[b])] = w;
            }
        }
    }
    __syncthreads();
}

/* cuk_gemv_fused's arguments (and cuk_gemv_quant's, the same contract)
 * as the contract allows them: n rows of x, k matrices, an input kind up
 * to CUK_IN_SWIGLU, an output kind, SwiGLU's output only for two
 * matrices of equal rows. */
static inline bool gemv_fused_args(const struct cuk_gemv_in *in, int n,
                                   const struct cuk_weight *const *ws, int k, int out)
{
    return n >= 1 && n <= CUK_GEMV_MAX && k >= 1 && k <= 3 && in && in->kind >= CUK_IN_X &&
           in->kind <= CUK_IN_SWIGLU && out >= CUK_OUT_STORE && out <= CUK_OUT_SWIGLU &&
           (out != CUK_OUT_SWIGLU || (k == 2 && ws[0]->rows == ws[1]->rows));
}

/* Whether the staging can read the rows `in` describes as float4: x and
 * the input op's second operand (the norm's weights, SwiGLU's up) 16-byte
 * aligned. */
static inline bool gemv_in_aligned(const struct cuk_gemv_in *in)
{
    const float *x2 = in->kind == CUK_IN_RMSNORM ? in->nw
                      : in->kind == CUK_IN_SWIGLU ? in->x2
                                                  : NULL;
    return ((uintptr_t)in->x & 15) == 0 && (in->kind == CUK_IN_X || (x2 && ((uintptr_t)x2 & 15) == 0));
}

#endif
