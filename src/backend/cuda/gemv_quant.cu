/* gemv_quant.cu - cuk_gemv_fused's contract for GGUF's 2-6-bit block
 * formats (quant_dq.cuh), read from the file's own blocks: decode steps of
 * a Q4_K_M, Q5_K_M, Q6_K, Q4_0 ... model stream a quarter to a third of a
 * bf16 model's bytes.
 *
 * Blocks of 8 warps. A warp owns two rows (two of one matrix, or row r of
 * gate and of up where SwiGLU's output is paired), or a column slice of
 * them; a step covers 256 columns, each lane eight consecutive values of
 * each row, widened to f32 with the host's bits (cuk_dq8) and multiplied
 * into f32 accumulators with fmaf, then a xor butterfly sums the lanes
 * and the slices' sums are added in order. x (n rows, as it is, or
 * rmsnorm(x), or silu(x) * x2) is staged in shared memory tile by tile by
 * gemv_common.cuh's gemv_stage, in its layout for 8-element vectors, so the
 * input ops have the plain kernels' bits, as in gemv.cu. No atomics: the
 * same bits run to run. */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/quant_dq.cuh"

#define GQ_STEP 256 /* columns a warp covers per step: 32 lanes x 8 */
/* Warps a launch should have for its loads to cover the memory latency
 * (32 an SM on 132 SMs); fewer row pairs than that are split into
 * column slices. */
#define GQ_WARPS_WANT 4096

struct gqp {
    float *outp[3];
    const uint8_t *w[3];
    size_t row_bytes;
    int rows[3];
    int groups[3]; /* two rows a group; paired: one row of each of w[0], w[1] */
    int out;       /* CUK_OUT_* */
};

/* NT: tokens (rows of x). Each row pair is split over `slices` warps of
 * one block (1, 2, 4 or 8: gq_launch's choice), warp k of a pair taking
 * steps k, k + slices, ...; their partial sums meet in shared memory and
 * are added in slice order, so a launch shape always gives the same bits.
 * Slices put more warps, and so more bytes, in flight where a matrix has
 * few rows for its columns (a 0.6B model's o and down projections: 512
 * row pairs, 8-12 steps each). */
template <int DT, int NT>
__global__ void __launch_bounds__(GEMV_THREADS)
    k_gemv_quant(const struct gqp p, const struct cuk_gemv_in in, int cols, int tile_cols,
                 int slices)
{
    extern __shared__ float4 gq_xs[];
    __shared__ float red[GEMV_WARPS][2][NT];
    cuk_pdl_start();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, slice = warp % slices;
    const bool pair = p.out == CUK_OUT_SWIGLU;
    int g = (blockIdx.x * GEMV_WARPS + warp) / slices;
    /* warps past the last group still stage x and meet (block barriers), nothing else */
    const bool active = g < p.groups[0] + p.groups[1] + p.groups[2];
    int m = gemv_matrix_of(g, p.groups);
    if (!active)
        m = g = 0;
    const int rows = m == 0 ? p.rows[0] : m == 1 ? p.rows[1] : p.rows[2];
    const uint8_t *w0 = m == 0 ? p.w[0] : m == 1 ? p.w[1] : p.w[2];
    int rr[2];
    const uint8_t *wr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        rr[r] = pair ? g : 2 * g + r;
        /* a row past the end (an odd last group) re-reads the last row; not written */
        wr[r] = (pair && r ? p.w[1] : w0) + (size_t)min(rr[r], rows - 1) * p.row_bytes;
    }
    float acc[2][NT];
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int j = 0; j < NT; j++)
            acc[r][j] = 0.0f;
    const int tile_f4 = tile_cols / 4, tile_steps = tile_cols / GQ_STEP;
    const int nsteps = (cols + GQ_STEP - 1) / GQ_STEP;
    float *sinv = (float *)(gq_xs + NT * tile_f4);
    if (in.kind == CUK_IN_RMSNORM)
        gemv_rms_inv<NT>(sinv, in.x, cols, in.eps, (double *)gq_xs);
    for (int t = 0; t * tile_steps < nsteps; t++) {
        if (in.kind == CUK_IN_RMSNORM)
            gemv_stage<WT_BF16, NT, CUK_IN_RMSNORM>(gq_xs, in, sinv, cols, t, tile_cols);
        else if (in.kind == CUK_IN_SWIGLU)
            gemv_stage<WT_BF16, NT, CUK_IN_SWIGLU>(gq_xs, in, sinv, cols, t, tile_cols);
        else
            gemv_stage<WT_BF16, NT, CUK_IN_X>(gq_xs, in, sinv, cols, t, tile_cols);
        if (!active)
            continue;
        const int s1 = min(nsteps, (t + 1) * tile_steps);
        /* No branch in the body: a lane past the last column reads the
         * row's last 8 values and multiplies zeros, so the unrolled
         * steps' loads can all be issued before any product. */
#pragma unroll 4
        for (int s = t * tile_steps + slice; s < s1; s += slices) {
            const int c = s * GQ_STEP + 8 * lane;
            const bool ok = c < cols;
            const int cc = ok ? c : cols - 8;
            float v[2][8];
            cuk_dq8<DT>(wr[0], cc, v[0]);
            cuk_dq8<DT>(wr[1], cc, v[1]);
            /* this lane's vector in the tile: gemv_xs_slot's layout for 8 elements */
            const int cl = (cc - t * tile_cols) / 8, slot = (cl >> 5) * 64 + (cl & 31);
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const float4 a = gq_xs[j * tile_f4 + slot], b = gq_xs[j * tile_f4 + slot + 32];
                const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int r = 0; r < 2; r++)
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        acc[r][j] = fmaf(ok ? v[r][i] : 0.0f, x[i], acc[r][j]);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const float a0 = cuk_warp_sum(acc[0][j]), a1 = cuk_warp_sum(acc[1][j]);
        if (lane == 0) {
            red[warp][0][j] = a0;
            red[warp][1][j] = a1;
        }
    }
    if (slices > 1)
        __syncthreads();
    else
        __syncwarp();
    if (!active || slice != 0 || lane >= NT)
        return;
    /* lane j: token j of the pair, its slices' sums in slice order */
    const int j = lane;
    float a[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        a[r] = red[warp][r][j];
        for (int k = 1; k < slices; k++)
            a[r] += red[warp + k][r][j];
    }
    float *out = m == 0 ? p.outp[0] : m == 1 ? p.outp[1] : p.outp[2];
    if (pair) {
        if (rr[0] < rows)
            out[(size_t)j * rows + rr[0]] = cuk_silu_mul1(a[0], a[1]);
        return;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (rr[r] >= rows)
            continue;
        float *o = out + (size_t)j * rows + rr[r];
        *o = p.out == CUK_OUT_ADD ? *o + a[r] : a[r];
    }
}

template <int DT, int NT>
static cudaError_t gq_launch(cudaStream_t s, const struct gqp &p, const struct cuk_gemv_in *in,
                             int cols)
{
    const long long total = (long long)p.groups[0] + p.groups[1] + p.groups[2];
    if (total == 0)
        return cudaSuccess;
    /* whole steps, as many as fit GEMV_SMEM_MAX beside the norm's 1/rms */
    const int steps = (cols + GQ_STEP - 1) / GQ_STEP;
    const int fit = (GEMV_SMEM_MAX - GEMV_INV_BYTES) / (NT * 4 * GQ_STEP);
    const int tile_cols = (steps < fit ? steps : fit) * GQ_STEP;
    const size_t smem = (size_t)NT * tile_cols * 4 + GEMV_INV_BYTES;
    /* slices: enough warps for GQ_WARPS_WANT, each left two steps or more */
    int slices = 1;
    while (slices < GEMV_WARPS && total * slices < GQ_WARPS_WANT && steps >= 4 * slices)
        slices *= 2;
    const long long per_block = GEMV_WARPS / slices;
    const unsigned grid = (unsigned)((total + per_block - 1) / per_block);
    return cuk_launch(k_gemv_quant<DT, NT>, grid, GEMV_THREADS, smem, s, p, *in, cols, tile_cols,
                      slices);
}

template <int DT>
static cudaError_t gq_launch_n(cudaStream_t s, const struct gqp &p, const struct cuk_gemv_in *in,
                               int n, int cols)
{
    switch (n) {
    case 1: return gq_launch<DT, 1>(s, p, in, cols);
    case 2: return gq_launch<DT, 2>(s, p, in, cols);
    case 3: return gq_launch<DT, 3>(s, p, in, cols);
    case 4: return gq_launch<DT, 4>(s, p, in, cols);
    case 5: return gq_launch<DT, 5>(s, p, in, cols);
    case 6: return gq_launch<DT, 6>(s, p, in, cols);
    case 7: return gq_launch<DT, 7>(s, p, in, cols);
    default: return gq_launch<DT, 8>(s, p, in, cols);
    }
}

extern "C" cudaError_t cuk_gemv_quant(cudaStream_t s, float *const *outs,
                                      const struct cuk_gemv_in *in, int n,
                                      const struct cuk_weight *const *ws, int k, int out)
{
    if (!gemv_fused_args(in, n, ws, k, out))
        return cudaErrorInvalidValue;
    const int dt = ws[0]->dtype, cols = ws[0]->cols;
    /* SwiGLU's output only after a norm, as a layer has it (gate/up) and
     * as cuk_gemv_fused takes it */
    if (!cuk_q_low_bit(dt) || cols <= 0 || cols % cuk_q_block_elems(dt) ||
        (out == CUK_OUT_SWIGLU && in->kind != CUK_IN_RMSNORM))
        return cudaErrorNotSupported;
    if (!gemv_in_aligned(in))
        return cudaErrorNotSupported;
    struct gqp p = {};
    p.out = out;
    p.row_bytes = cuk_q_row_bytes(dt, cols);
    for (int i = 0; i < k; i++) {
        if (ws[i]->dtype != dt || ws[i]->cols != cols || ws[i]->rows < 1 ||
            ((uintptr_t)ws[i]->data & 7))
            return cudaErrorNotSupported;
        p.outp[i] = outs[i];
        p.w[i] = (const uint8_t *)ws[i]->data;
        p.rows[i] = ws[i]->rows;
        p.groups[i] = out == CUK_OUT_SWIGLU ? (i == 0 ? ws[0]->rows : 0) : (ws[i]->rows + 1) / 2;
    }
    cudaError_t err;
    switch (dt) {
    case DT_Q4_0: err = gq_launch_n<DT_Q4_0>(s, p, in, n, cols); break;
    case DT_Q4_1: err = gq_launch_n<DT_Q4_1>(s, p, in, n, cols); break;
    case DT_Q5_0: err = gq_launch_n<DT_Q5_0>(s, p, in, n, cols); break;
    case DT_Q5_1: err = gq_launch_n<DT_Q5_1>(s, p, in, n, cols); break;
    case DT_Q4_K: err = gq_launch_n<DT_Q4_K>(s, p, in, n, cols); break;
    case DT_Q5_K: err = gq_launch_n<DT_Q5_K>(s, p, in, n, cols); break;
    case DT_Q6_K: err = gq_launch_n<DT_Q6_K>(s, p, in, n, cols); break;
    case DT_Q2_K: err = gq_launch_n<DT_Q2_K>(s, p, in, n, cols); break;
    default: err = gq_launch_n<DT_Q3_K>(s, p, in, n, cols); break;
    }
    cudaError_t last = cudaGetLastError();
    return err != cudaSuccess ? err : last;
}
