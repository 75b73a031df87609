/* gemm_tc.cu - out[n][ldc] (+)= x . W^T for a few tokens (2..64 rows of
 * x: a batched decode step) on the tensor cores, the weights streamed
 * through shared memory once.
 *
 * Why: a batched decode step reads every weight once whatever the batch,
 * and cuBLASLt costs the host ~6 us a call (a small model's batched step
 * is bound by issuing them) and adds split-K reduction launches. This
 * kernel costs the host ~2 us and reduces in-kernel, but on the H200 it is
 * 10-25 % slower on the GPU than cuBLAS's kernels (docs/benchmarks.md,
 * seventh pass), so the backend uses it only with CLLM_CUDA_GEMM_TC=1. It
 * is where fused batched epilogues (norm, SwiGLU) would go.
 *
 * Shape: one block per SM, 8 consumer warps and one producer warp. The
 * work is a list of stages, each 128 weight rows x 128 columns (32 KB of
 * bf16) plus the n x 128 slice of x, ordered row block by row block; every
 * block takes an equal run of that list (stream-K), so the bytes per SM
 * are even whatever the shape. The producer copies stages into a ring
 * with the Hopper tensor copy (TMA: one instruction per 64-column tile of
 * 128 rows or of the n tokens, completing on the stage's mbarrier, the
 * rows past the matrix's end filled with zeros); the first stages'
 * weights go out before the wait for the previous kernel. Each consumer
 * warp multiplies its 16 rows by all n tokens with mma.sync m16n8k16 (f32
 * accumulation) and frees the stage. The tiles are stored with the 128-byte
 * swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)), so ldmatrix
 * reads them without bank conflicts. (A copy per 256-byte row piece was
 * slower: as bulk copies, a third of cuBLAS's speed; as cp.async from a
 * producer warp, 71 % of the bandwidth where TMA reaches 82 %.)
 *
 * A row block whose stages fall to more than one block is summed
 * deterministically: each block writes its partial sums, and the last to
 * finish (a counter per row block) adds them in column order, so a call
 * gives the same bits every time. */
#include <cuda.h> /* CUtensorMap; the encoder is reached through the runtime */
#include <cudaTypedefs.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"

#define TC_ROWS 128 /* weight rows per stage: TC_CWARPS warps x 16 */
#define TC_KC 128   /* columns per stage: two 64-column (128-byte) tiles */
#define TC_TILE 64  /* columns per tensor copy: 128 bytes, the swizzle's span */
#define TC_CWARPS 8
#define TC_THREADS ((TC_CWARPS + 1) * 32)
#define TC_MAX_STAGES 8
#define TC_HDR 256  /* the full and empty barriers */
#define TC_SUM 8    /* partial sums a finishing thread loads together */
/* Shared memory per block: 120 KB (two to three stages) beat 226 KB (four
 * to six) at 2-16 tokens on the H200 (8B gate at 2 tokens: 82.6 % of the
 * bandwidth against 76.9 %) and matched it at 64. */
#define TC_SMEM_DEFAULT (120 * 1024)

struct tcp {
    CUtensorMap tw, tx; /* W (cols x rows) and x (cols x n), 64 x 128 / 64 x 8 NT8 tiles */
    float *out;
    float *part;    /* [blocks][2][CUK_TC_MAX_N][TC_ROWS] partial sums */
    unsigned *cnt;  /* [CUK_TC_MAX_RB] arrivals per row block, zero between calls */
    int rows, cols, n, ldc, acc;
    int kst;        /* stages per row block */
    int total;      /* stages in all */
    int stages;     /* ring depth */
};

/* (Only sm_90 code uses them: an older build would warn of them unused.) */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* First stage of block b's run (of gridDim.x). */
static __device__ __forceinline__ int tc_start(const struct tcp &p, int b)
{
    return (int)((long long)p.total * b / gridDim.x);
}

/* The block whose run holds stage s. */
static __device__ __forceinline__ int tc_owner(const struct tcp &p, int s)
{
    int b = (int)((long long)s * gridDim.x / p.total);
    while (b + 1 < (int)gridDim.x && tc_start(p, b + 1) <= s)
        b++;
    while (b > 0 && tc_start(p, b) > s)
        b--;
    return b;
}

/* One tensor copy: the tile at column c0, row r0 of the tensor map m into
 * shared memory at dst, completing on bar. */
static __device__ __forceinline__ void tc_tma(void *dst, const CUtensorMap *m, int c0, int r0,
                                              uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];" ::"r"(cuk_smem_addr(dst)),
                 "l"((uint64_t)m), "r"(c0), "r"(r0), "r"(cuk_smem_addr(bar))
                 : "memory");
}

/* The producer (one lane): stage i's weight tiles and/or x tiles into ring
 * slot st; with the weights, the stage's bytes announced on full (a
 * tensor copy writes its whole box, zeros past the tensor's end). */
template <int NT8>
static __device__ __forceinline__ void tc_issue(const struct tcp &p, int i, unsigned char *st,
                                                uint64_t *full, bool wts, bool xs)
{
    constexpr int XT = NT8 * 8 * TC_TILE * 2; /* bytes of one x tile */
    const int rb = i / p.kst, k0 = (i - rb * p.kst) * TC_KC;
    if (wts) {
        cuk_mbar_expect(full, (TC_KC / TC_TILE) * (TC_ROWS * TC_TILE * 2 + XT));
        for (int t = 0; t < TC_KC / TC_TILE; t++)
            tc_tma(st + t * TC_ROWS * TC_TILE * 2, &p.tw, k0 + t * TC_TILE, rb * TC_ROWS, full);
    }
    if (xs)
        for (int t = 0; t < TC_KC / TC_TILE; t++)
            tc_tma(st + TC_KC * TC_ROWS * 2 + t * XT, &p.tx, k0 + t * TC_TILE, 0, full);
}

/* The consumers' output of row block rb from their accumulators: written
 * (or added) when this block ran all its stages, else through the partial
 * sums, the last block of the row block adding them in column order. */
template <int NT8>
static __device__ __forceinline__ void tc_emit(const struct tcp &p, float (*acc)[4], int rb,
                                               bool whole, bool first_run, int *s_last)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rw = warp * 16 + lane / 4; /* this thread's rows rw, rw + 8 of the block */
    if (whole) {
        const int r = rb * TC_ROWS + rw;
        if (r >= p.rows)
            return;
#pragma unroll
        for (int j = 0; j < NT8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int t = j * 8 + 2 * (lane & 3) + (e & 1), rr = r + (e >> 1) * 8;
                if (t < p.n) {
                    float *o = p.out + (size_t)t * p.ldc + rr;
                    *o = p.acc ? *o + acc[j][e] : acc[j][e];
                }
            }
        return;
    }
    float *mine = p.part + ((size_t)blockIdx.x * 2 + (first_run ? 0 : 1)) * CUK_TC_MAX_N * TC_ROWS;
#pragma unroll
    for (int j = 0; j < NT8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int t = j * 8 + 2 * (lane & 3) + (e & 1);
            if (t < p.n)
                mine[(size_t)t * TC_ROWS + rw + (e >> 1) * 8] = acc[j][e];
        }
    const int sb = rb * p.kst, b0 = tc_owner(p, sb), b1 = tc_owner(p, sb + p.kst - 1);
    __threadfence();
    asm volatile("bar.sync 1, %0;" ::"n"(TC_CWARPS * 32) : "memory");
    if (threadIdx.x == 0) {
        const bool last = atomicAdd(p.cnt + rb, 1u) == (unsigned)(b1 - b0);
        if (last)
            p.cnt[rb] = 0; /* re-armed for the next call */
        *s_last = last;
    }
    asm volatile("bar.sync 1, %0;" ::"n"(TC_CWARPS * 32) : "memory");
    const bool last = *s_last;
    /* no consumer reads s_last again before the next row block's first
     * barrier, which every consumer passes only after this read */
    if (!last)
        return;
    __threadfence();
    const int nrows = min(TC_ROWS, p.rows - rb * TC_ROWS);
    /* Only the first contributor's run can be other than its first (it
     * may start before the row block): its sums are in slot 1. */
    const size_t plane = (size_t)CUK_TC_MAX_N * TC_ROWS;
    const float *__restrict__ first =
        p.part + ((size_t)b0 * 2 + (tc_start(p, b0) >= sb ? 0 : 1)) * plane;
    const float *__restrict__ rest = p.part + (size_t)(b0 + 1) * 2 * plane; /* slot 0 of b0 + 1 */
    const int nrest = b1 - b0;
    /* Each output's contributions loaded TC_SUM at a time (their L2
     * latencies overlap), then added in column order. */
    for (int q = threadIdx.x; q < p.n * TC_ROWS; q += TC_CWARPS * 32) {
        const int t = q / TC_ROWS, r = q - t * TC_ROWS;
        if (r >= nrows)
            continue;
        const size_t at = (size_t)t * TC_ROWS + r;
        float v = __ldcg(first + at);
        for (int b = 0; b < nrest; b += TC_SUM) {
            float c[TC_SUM];
#pragma unroll
            for (int u = 0; u < TC_SUM; u++)
                c[u] = b + u < nrest ? __ldcg(rest + (size_t)(b + u) * 2 * plane + at) : 0.0f;
#pragma unroll
            for (int u = 0; u < TC_SUM; u++)
                if (b + u < nrest)
                    v += c[u];
        }
        float *o = p.out + (size_t)t * p.ldc + rb * TC_ROWS + r;
        *o = p.acc ? *o + v : v;
    }
}
#endif

template <int WT, int NT8>
__global__ void __launch_bounds__(TC_THREADS, 1) k_gemm_tc(const __grid_constant__ struct tcp p)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    /* a stage: the weights' two tiles, then x's two (128-byte rows) */
    constexpr int XT = NT8 * 8 * TC_TILE * 2, ST = TC_KC * TC_ROWS * 2 + 2 * XT;
    extern __shared__ __align__(128) unsigned char tc_smem[];
    __shared__ int s_last;
    uint64_t *full = (uint64_t *)tc_smem, *empty = full + TC_MAX_STAGES;
    /* the swizzle's pattern repeats every 1,024 bytes: tiles start on one */
    unsigned char *ring = tc_smem + ((cuk_smem_addr(tc_smem) + TC_HDR + 1023) / 1024 * 1024 -
                                     cuk_smem_addr(tc_smem));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int s0 = tc_start(p, blockIdx.x), s1 = tc_start(p, blockIdx.x + 1), ns = s1 - s0;
    if (threadIdx.x == 0) {
        for (int s = 0; s < p.stages; s++) {
            cuk_mbar_init(full + s, 1);
            cuk_mbar_init(empty + s, TC_CWARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == TC_CWARPS) {
        if (lane == 0) {
            /* the weights never change: the first stages' go out before
             * the wait; x is the previous kernel's */
            const int pre = min(ns, p.stages);
            for (int li = 0; li < pre; li++)
                tc_issue<NT8>(p, s0 + li, ring + (size_t)li * ST, full + li, true, false);
            cuk_pdl_start();
            for (int li = 0; li < pre; li++)
                tc_issue<NT8>(p, s0 + li, ring + (size_t)li * ST, full + li, false, true);
            for (int li = pre; li < ns; li++) {
                const int slot = li % p.stages;
                cuk_mbar_wait(empty + slot, ((li / p.stages) - 1) & 1);
                tc_issue<NT8>(p, s0 + li, ring + (size_t)slot * ST, full + slot, true, true);
            }
        }
        return;
    }
    cuk_pdl_start(); /* out, the partial sums and the counters may be the previous kernel's */
    float acc[NT8][4];
    int first_ks = 0;
    bool first_run = true;
    /* this lane's ldmatrix rows: A (weights) row warp * 16 + ar, B (x)
     * row br of each pair of 8-token tiles; both are = lane (mod 8), which
     * is the swizzle's key */
    const int ar = (lane & 7) + ((lane >> 3) & 1) * 8, br = (lane & 7) + (lane >> 4) * 8;
    const int ahalf = lane >> 4, bhalf = (lane >> 3) & 1, key = lane & 7;
    for (int li = 0; li < ns; li++) {
        const int i = s0 + li, rb = i / p.kst, ks = i - rb * p.kst, slot = li % p.stages;
        if (li == 0 || ks == 0) {
#pragma unroll
            for (int j = 0; j < NT8; j++)
                acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
            first_ks = ks;
        }
        cuk_mbar_wait(full + slot, (li / p.stages) & 1);
        if (rb * TC_ROWS + warp * 16 < p.rows) {
            const unsigned char *st = ring + (size_t)slot * ST;
            const unsigned char *arow = st + (size_t)(warp * 16 + ar) * (TC_TILE * 2);
            const unsigned char *brow = st + TC_KC * TC_ROWS * 2 + (size_t)br * (TC_TILE * 2);
            /* past the matrix's last column both tiles hold zeros */
#pragma unroll
            for (int kk = 0; kk < TC_KC / 16; kk++) {
                const int t = kk / 4, c = (kk % 4) * 2; /* tile, its first 16-byte chunk */
                uint32_t a[4];
                cuk_ldsm_x4(a, cuk_smem_addr(arow + t * (TC_ROWS * TC_TILE * 2) +
                                             (((c + ahalf) ^ key) << 4)));
                const unsigned char *bt = brow + t * XT + (((c + bhalf) ^ key) << 4);
                if (NT8 == 1) {
                    uint32_t b[2];
                    cuk_ldsm_x2(b, cuk_smem_addr(bt));
                    cuk_mma16816<WT == DT_F16>(acc[0], a, b[0], b[1]);
                } else {
#pragma unroll
                    for (int j = 0; j < NT8; j += 2) {
                        uint32_t b[4];
                        cuk_ldsm_x4(b, cuk_smem_addr(bt + (size_t)j * 8 * (TC_TILE * 2)));
                        cuk_mma16816<WT == DT_F16>(acc[j], a, b[0], b[1]);
                        cuk_mma16816<WT == DT_F16>(acc[j + 1], a, b[2], b[3]);
                    }
                }
            }
        }
        __syncwarp();
        if (lane == 0)
            cuk_mbar_arrive(empty + slot);
        if (li == ns - 1 || ks == p.kst - 1) {
            tc_emit<NT8>(p, acc, rb, first_ks == 0 && ks == p.kst - 1, first_run, &s_last);
            first_run = false;
        }
    }
#else
    (void)p;
#endif
}

/* cuTensorMapEncodeTiled, looked up once (NULL: no driver support). */
static PFN_cuTensorMapEncodeTiled_v12000 tc_encoder(void)
{
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                             cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            f = nullptr;
        return (PFN_cuTensorMapEncodeTiled_v12000)f;
    }();
    return fn;
}

/* The tensor map of a cols x rows 2-byte matrix read in 64 x box_rows
 * tiles with the 128-byte swizzle; false when the driver refuses it. */
static bool tc_map(CUtensorMap *m, const void *base, int dtype, int cols, int rows, int box_rows)
{
    PFN_cuTensorMapEncodeTiled_v12000 enc = tc_encoder();
    if (!enc)
        return false;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)cols * 2};
    const cuuint32_t box[2] = {TC_TILE, (cuuint32_t)box_rows}, estr[2] = {1, 1};
    return enc(m, dtype == DT_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
               2, (void *)base, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* w and x reach the kernel only through p's tensor maps, made here. */
template <int WT, int NT8>
static cudaError_t tc_launch(cudaStream_t st, struct tcp *p, const void *w, const uint16_t *x,
                             int blocks, int budget)
{
    constexpr int ST = TC_KC * TC_ROWS * 2 + 2 * NT8 * 8 * TC_TILE * 2;
    int stages = (budget - TC_HDR - 1024) / ST; /* 1,024: the ring's alignment */
    if (stages > TC_MAX_STAGES)
        stages = TC_MAX_STAGES;
    if (stages < 2)
        return cudaErrorNotSupported;
    if (!tc_map(&p->tw, w, WT, p->cols, p->rows, TC_ROWS) ||
        !tc_map(&p->tx, x, WT, p->cols, p->n, NT8 * 8))
        return cudaErrorNotSupported;
    p->stages = stages;
    size_t smem = TC_HDR + 1024 + (size_t)stages * ST;
    auto k = k_gemm_tc<WT, NT8>;
    static struct cuk_opted opted;
    cudaError_t err = cuk_smem_opt_in(k, smem, &opted);
    if (err != cudaSuccess)
        return err;
    return cuk_launch(k, (unsigned)blocks, TC_THREADS, smem, st, *p);
}

template <int WT>
static cudaError_t tc_launch_n(cudaStream_t st, struct tcp *p, const void *w, const uint16_t *x,
                               int blocks, int budget)
{
    if (p->n <= 8)
        return tc_launch<WT, 1>(st, p, w, x, blocks, budget);
    if (p->n <= 16)
        return tc_launch<WT, 2>(st, p, w, x, blocks, budget);
    if (p->n <= 32)
        return tc_launch<WT, 4>(st, p, w, x, blocks, budget);
    return tc_launch<WT, 8>(st, p, w, x, blocks, budget);
}

extern "C" size_t cuk_gemm_tc_ws_bytes(int blocks)
{
    return (size_t)CUK_TC_MAX_RB * 4 + (size_t)blocks * 2 * CUK_TC_MAX_N * TC_ROWS * 4;
}

extern "C" cudaError_t cuk_gemm_tc(cudaStream_t s, float *out, int ldc, const void *w, int dtype,
                                   const uint16_t *x, int rows, int n, int cols, int acc,
                                   void *ws, int blocks, const struct cuk_tc_cfg *cfg)
{
    if (!out || !w || !x || !ws || rows <= 0 || n <= 0 || cols <= 0 || ldc < rows || blocks <= 0)
        return cudaErrorInvalidValue;
    if ((dtype != DT_BF16 && dtype != DT_F16) || n > CUK_TC_MAX_N || rows % 16 || cols % 16 ||
        ((uintptr_t)w & 15) || ((uintptr_t)x & 15))
        return cudaErrorNotSupported;
    struct tcp p = {};
    p.out = out;
    /* the counters first: where they are must not depend on `blocks`,
     * or a call with fewer blocks would find another's partial sums there */
    p.cnt = (unsigned *)ws;
    p.part = (float *)((char *)ws + (size_t)CUK_TC_MAX_RB * 4);
    p.rows = rows;
    p.cols = cols;
    p.n = n;
    p.ldc = ldc;
    p.acc = acc;
    p.kst = (cols + TC_KC - 1) / TC_KC;
    const int nrb = (rows + TC_ROWS - 1) / TC_ROWS;
    if (nrb > CUK_TC_MAX_RB || (long long)nrb * p.kst > (1 << 30))
        return cudaErrorNotSupported;
    p.total = nrb * p.kst;
    /* Each partial run costs n x 128 partial sums written and read again:
     * at least n / 8 stages a block keeps that under a quarter of the
     * weights it reads (a small matrix then runs on fewer SMs). */
    const int min_run = n > 8 ? n / 8 : 1;
    if (blocks > p.total / min_run)
        blocks = p.total / min_run > 0 ? p.total / min_run : 1;
    const int budget = cfg && cfg->smem_bytes > 0 ? cfg->smem_bytes : TC_SMEM_DEFAULT;
    cudaError_t err = dtype == DT_BF16 ? tc_launch_n<DT_BF16>(s, &p, w, x, blocks, budget)
                                       : tc_launch_n<DT_F16>(s, &p, w, x, blocks, budget);
    cudaError_t last = cudaGetLastError();
    return err != cudaSuccess ? err : last;
}
