/* gemv_quant.cu - cuk_gemv_fused's contract for GGUF's quantized formats,
 * read from the file's own blocks (Q8_0: as repacked at load): decode
 * steps of a Q4_K_M, Q5_K_M, Q6_K, Q8_0 ... model stream a quarter to a
 * half of a bf16 model's bytes. Two kernels over one launch shape:
 *   k_gemv_qdot (default): x rounded to 8 bits a 32-block as the CPU
 *     rounds it, the weights read as integer codes (quant_dot.cuh) and
 *     multiplied by dp4a, 32 values of each row a lane and step;
 *   k_gemv_quant (precise mode, no Q8_0): each weight widened to f32 with
 *     the host's bits (quant_dq.cuh, cuk_dq8) times the f32 x, 8 values a
 *     lane and step.
 * Blocks of 8 warps. A warp owns two rows (two of one matrix, or row r of
 * gate and of up where SwiGLU's output is paired), or a column slice of
 * them; a xor butterfly sums the lanes and the slices' sums are added in
 * order. x (n rows, as it is, or rmsnorm(x), or silu(x) * x2) is staged
 * in shared memory tile by tile with the plain kernels' input ops
 * (gemv_common.cuh), so the input ops have their bits, as in gemv.cu. No
 * atomics: the same bits run to run. */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/quant_dot.cuh"
#include "backend/cuda/quant_dq.cuh"
#ifdef CUK_GEMV_PROBE /* k_gemv_qstaged's records, apart from gemv_staged.cu's */
#define GP_NS gp_quant
#define GP_WHAT "quantized gemv probe"
#define GP_INIT cuk_gq_probe_init
#define GP_REPORT cuk_gq_probe_report
#include "backend/cuda/gemv_probe.cuh"
#endif

#include <string.h>

#define GQ_STEP 256 /* columns a warp covers per step: 32 lanes x 8 */
/* Warps a launch should have for its loads to cover the memory latency
 * (32 an SM on 132 SMs); fewer row pairs than that are split into
 * column slices. */
#define GQ_WARPS_WANT 4096

struct gqp {
    float *outp[3];
    const uint8_t *w[3];
    const uint16_t *sc[3]; /* Q8_0: the device's scale tables (cuk_weight.scales) */
    size_t row_bytes;
    int rows[3];
    int groups[3]; /* two rows a group; paired: one row of each of w[0], w[1] */
    int out;       /* CUK_OUT_* */
};

/* Matrix m's entry of one of gqp's per-matrix arrays, by selects rather
 * than an index (an indexed kernel parameter goes through local memory). */
template <typename T>
static __device__ __forceinline__ T gq_of(const T (&a)[3], int m)
{
    return m == 0 ? a[0] : m == 1 ? a[1] : a[2];
}

/* Steps of k_gemv_qdot's loop unrolled (their loads issued together):
 * 4 against 2, H100, 8B Q4_K decode 217.9 -> 230.1-232.0 tok/s with
 * 16-value units (session 50); with 32-value units 8B Q8_0 211.2 ->
 * 218.4, Q4_K flat (docs/benchmarks.md, session 51). */
#ifndef GD_UNROLL
#define GD_UNROLL 4
#endif
static constexpr int gd_unroll = GD_UNROLL;

/* A warp's share of a launch: row pair (group) g of matrix m, or column
 * slice `slice` of it (one of `slices` warps of a block taking steps
 * slice, slice + slices, ...). Warps past the last group (inactive)
 * still stage x and meet at the block's barriers, nothing else. */
struct gq_warp {
    int lane, warp, slice, m, rows;
    int rr[2];              /* the two output rows */
    const uint8_t *wr[2];   /* their weights */
    const uint16_t *sr[2];  /* Q8_0: their scales */
    bool active, pair;
};

static __device__ __forceinline__ gq_warp gq_warp_at(const gqp &p, int slices, int g)
{
    gq_warp w;
    w.lane = threadIdx.x & 31;
    w.warp = threadIdx.x >> 5;
    w.slice = w.warp % slices;
    w.pair = p.out == CUK_OUT_SWIGLU;
    w.active = g < p.groups[0] + p.groups[1] + p.groups[2];
    w.m = gemv_matrix_of(g, p.groups);
    if (!w.active)
        w.m = g = 0;
    w.rows = gq_of(p.rows, w.m);
    const int m0 = w.m;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        w.rr[r] = w.pair ? g : 2 * g + r;
        /* a row past the end (an odd last group) re-reads the last row; not written */
        const size_t row = (size_t)min(w.rr[r], w.rows - 1);
        const int mr = w.pair && r ? 1 : m0;
        w.wr[r] = gq_of(p.w, mr) + row * p.row_bytes;
        const uint16_t *sc = gq_of(p.sc, mr);
        w.sr[r] = sc ? sc + row * (p.row_bytes / 32) : nullptr;
    }
    return w;
}

/* The warp's share where each warp of the launch takes one. */
static __device__ __forceinline__ gq_warp gq_warp_of(const gqp &p, int slices)
{
    return gq_warp_at(p, slices, (int)((blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) / slices));
}

/* The warp's sums (acc: its lanes' partial sums of rows rr[0], rr[1] for
 * NT tokens) to the outputs: a xor butterfly over the lanes, the slices'
 * sums added in slice order through red, then STORE, ADD or SwiGLU's
 * pairing. Every thread of the block calls it. */
template <int NT>
static __device__ __forceinline__ void gq_finish(const gqp &p, const gq_warp &w,
                                                 float (&acc)[2][NT], float (*red)[2][NT],
                                                 int slices)
{
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const float a0 = cuk_warp_sum(acc[0][j]), a1 = cuk_warp_sum(acc[1][j]);
        if (w.lane == 0) {
            red[w.warp][0][j] = a0;
            red[w.warp][1][j] = a1;
        }
    }
    if (slices > 1)
        __syncthreads();
    else
        __syncwarp();
    if (!w.active || w.slice != 0 || w.lane >= NT)
        return;
    /* lane j: token j of the pair, its slices' sums in slice order */
    const int j = w.lane;
    float a[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        a[r] = red[w.warp][r][j];
        for (int k = 1; k < slices; k++)
            a[r] += red[w.warp + k][r][j];
    }
    float *out = gq_of(p.outp, w.m);
    if (w.pair) {
        if (w.rr[0] < w.rows)
            out[(size_t)j * w.rows + w.rr[0]] = cuk_silu_mul1(a[0], a[1]);
        return;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (w.rr[r] >= w.rows)
            continue;
        float *o = out + (size_t)j * w.rows + w.rr[r];
        *o = p.out == CUK_OUT_ADD ? *o + a[r] : a[r];
    }
}

/* The exact kernel (precise mode). NT: tokens (rows of x). Each row pair
 * is split over `slices` warps of one block (1, 2, 4 or 8: gq_shape's
 * choice), their partial sums added in slice order, so a launch shape
 * always gives the same bits. Slices put more warps, and so more bytes,
 * in flight where a matrix has few rows for its columns (a 0.6B model's o
 * and down projections: 512 row pairs, 8-12 steps each). */
template <int DT, int NT>
__global__ void __launch_bounds__(GEMV_THREADS)
    k_gemv_quant(const struct gqp p, const struct cuk_gemv_in in, int cols, int tile_cols,
                 int slices)
{
    extern __shared__ float4 gq_xs[];
    __shared__ float red[GEMV_WARPS][2][NT];
    cuk_pdl_start();
    const gq_warp w = gq_warp_of(p, slices);
    float acc[2][NT] = {};
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
        if (!w.active)
            continue;
        const int s1 = min(nsteps, (t + 1) * tile_steps);
        /* No branch in the body: a lane past the last column reads the
         * row's last 8 values and multiplies zeros, so the unrolled
         * steps' loads can all be issued before any product. */
#pragma unroll 4
        for (int s = t * tile_steps + w.slice; s < s1; s += slices) {
            const int c = s * GQ_STEP + 8 * w.lane;
            const bool ok = c < cols;
            const int cc = ok ? c : cols - 8;
            float v[2][8];
            cuk_dq8<DT>(w.wr[0], cc, v[0]);
            cuk_dq8<DT>(w.wr[1], cc, v[1]);
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
    gq_finish<NT>(p, w, acc, red, slices);
}

/* Stages columns [t*tile_cols, +tile_cols) of the NT input rows (x,
 * rmsnorm(x) or silu(x) * x2, with gemv_in_op4's bits) rounded to 8 bits
 * a 32-block, as the CPU rounds them (mm_codes_xq_quantize): word
 * gd_perm(c % GD_STEP) of step c / GD_STEP of row j's words, and the
 * block's scale (absmax / 127) in dx; zeros past the last column. A
 * thread takes one float4, eight lanes a block (their absmax by xor
 * shuffles; the loop's trip count is a multiple of 32 for every warp). */
template <int SHAPE, int NT, int IN>
static __device__ __forceinline__ void gd_stage(uint32_t *qx, float *dx,
                                                const struct cuk_gemv_in &in, const float *sinv,
                                                int cols, int t, int tile_cols)
{
    const int c0 = t * tile_cols, tw = min(cols - c0, tile_cols), nf = tile_cols / 4;
    __syncthreads(); /* every warp is done with the previous tile */
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const float4 *src = gemv_src(in, j, cols, c0), *src2 = gemv_src2<IN>(in, j, cols, c0);
        const float inv = IN == CUK_IN_RMSNORM ? sinv[j] : 0.0f;
        for (int f = threadIdx.x; f < nf; f += GEMV_THREADS) {
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (4 * f < tw) {
                v = __ldg(src + f);
                if (IN != CUK_IN_X)
                    v = gemv_in_op4<IN>(v, __ldg(src2 + f), inv);
            }
            float a = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
            a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 1));
            a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 2));
            a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 4));
            const float d = a / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            qx[j * nf + (4 * f / GD_STEP) * (GD_STEP / 4) + gd_perm<SHAPE>(4 * f % GD_STEP)] =
                gd_quant4(v.x, v.y, v.z, v.w, id);
            if ((f & 7) == 0)
                dx[j * (tile_cols / 32) + f / 8] = d;
        }
    }
    __syncthreads();
}

/* Most float4 of x a thread holds in gd_norm_stage: rows of up to
 * 4 * GEMV_THREADS * GQ_NORM_F4 = 4,096 columns (an 8B's, a 0.6B's; a
 * wider row takes the two passes). */
#define GQ_NORM_F4 4

/* Whether gd_norm_stage takes one row of cols columns. */
static __host__ __device__ constexpr bool gd_norm_one(int cols)
{
    return cols > 512 && cols <= 4 * GEMV_THREADS * GQ_NORM_F4;
}

/* gemv_rms_inv + gd_stage<CUK_IN_RMSNORM> for one row (gd_norm_one), the
 * same bits with one read of x and two barriers fewer, as gemv_staged.cu's
 * sg_norm_stage: thread t loads float4 t, t + GEMV_THREADS, ... of x and
 * of the norm's weights together, sums their squares in double in that
 * order (gemv_rms_inv's), each warp sums the warps' partials itself in
 * warp 0's order (cuk_block_sum_d's) after one barrier, and the thread
 * then rounds its own float4s as gd_stage does (the 8 lanes of a 32-block
 * are consecutive threads, their float4s consecutive). part: GEMV_WARPS
 * doubles outside qx and dx (a warp may write its codes while another
 * still reads the partials). Ends in a barrier, as gd_stage does. */
template <int SHAPE>
static __device__ __forceinline__ void gd_norm_stage(uint32_t *qx, float *dx,
                                                     const struct cuk_gemv_in &in, int cols,
                                                     int tile_cols, double *part)
{
    const int nx = cols / 4, nf = tile_cols / 4;
    float4 xv[GQ_NORM_F4], nwv[GQ_NORM_F4];
#pragma unroll
    for (int k = 0; k < GQ_NORM_F4; k++) {
        const int f = threadIdx.x + k * GEMV_THREADS;
        if (f < nx) {
            xv[k] = __ldg((const float4 *)in.x + f);
            nwv[k] = __ldg((const float4 *)in.nw + f);
        }
    }
    double ss = 0;
#pragma unroll
    for (int k = 0; k < GQ_NORM_F4; k++)
        if (threadIdx.x + k * GEMV_THREADS < nx)
            ss += cuk_rms_sq(xv[k]);
    cuk_warp_part_d(ss, part);
    __syncthreads();
    const float inv = cuk_rms_inv(cuk_parts_sum_d(part, GEMV_WARPS), cols, in.eps);
#pragma unroll
    for (int k = 0; k < GQ_NORM_F4; k++) {
        const int f = threadIdx.x + k * GEMV_THREADS;
        if (f >= nf) /* the same for the whole block: nf is a multiple of GEMV_THREADS */
            break;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (f < nx)
            v = gemv_in_op4<CUK_IN_RMSNORM>(xv[k], nwv[k], inv);
        float a = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
        a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 1));
        a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 2));
        a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 4));
        const float d = a / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        qx[(4 * f / GD_STEP) * (GD_STEP / 4) + gd_perm<SHAPE>(4 * f % GD_STEP)] =
            gd_quant4(v.x, v.y, v.z, v.w, id);
        if ((f & 7) == 0)
            dx[f / 8] = d;
    }
    __syncthreads();
}

/* gd_stage for the input kind in.kind names. */
template <int SHAPE, int NT>
static __device__ __forceinline__ void gd_stage_any(uint32_t *qx, float *dx,
                                                    const struct cuk_gemv_in &in,
                                                    const float *sinv, int cols, int t,
                                                    int tile_cols)
{
    if (in.kind == CUK_IN_RMSNORM)
        gd_stage<SHAPE, NT, CUK_IN_RMSNORM>(qx, dx, in, sinv, cols, t, tile_cols);
    else if (in.kind == CUK_IN_SWIGLU)
        gd_stage<SHAPE, NT, CUK_IN_SWIGLU>(qx, dx, in, sinv, cols, t, tile_cols);
    else
        gd_stage<SHAPE, NT, CUK_IN_X>(qx, dx, in, sinv, cols, t, tile_cols);
}

/* A lane's two units wu (of its warp's two rows) times step sl of the
 * staged tile of tile_cols columns (8-bit codes gd_xs, block scales dx),
 * for each of the NT tokens, added into acc. */
template <int DT, int NT>
static __device__ __forceinline__ void gd_products(const gd_unit (&wu)[2], const uint4 *gd_xs,
                                                   const float *dx, int lane, int sl,
                                                   int tile_cols, float (&acc)[2][NT])
{
    using F = gd_fmt<DT>;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        /* the lane's two planes (gd_slot) */
        const uint4 *xs = gd_xs + j * (tile_cols / 16) + sl * (GD_STEP / 16) + lane;
        const uint4 xa = xs[0], xb = xs[32];
        const int x[8] = {(int)xa.x, (int)xa.y, (int)xa.z, (int)xa.w,
                          (int)xb.x, (int)xb.y, (int)xb.z, (int)xb.w};
        const float *db =
            dx + j * (tile_cols / 32) + sl * (GD_STEP / 32) + gd_block<F::SHAPE>(lane, 0);
        float d[4];
        if (F::G == 4) {
            const float4 d4 = *(const float4 *)db;
            d[0] = d4.x, d[1] = d4.y, d[2] = d4.z, d[3] = d4.w;
        } else if (F::G == 2 && F::GSTEP == 1) {
            const float2 d2 = *(const float2 *)db;
            d[0] = d2.x, d[1] = d2.y, d[2] = d[3] = 0.0f;
        } else if (F::G == 2) {
            d[0] = db[0], d[1] = db[F::GSTEP], d[2] = d[3] = 0.0f;
        } else {
            d[0] = *db, d[1] = d[2] = d[3] = 0.0f;
        }
        int sums[4] = {0, 0, 0, 0};
        if (F::MIN)
            gd_sums<DT>(x, sums);
#pragma unroll
        for (int r = 0; r < 2; r++)
            acc[r][j] += gd_dot<DT>(wu[r], x, d, sums);
    }
}

/* A warp's share of tile t of x (steps t * tile_steps + slice ... below
 * s1, every slices-th) for its two rows, added into acc: gd_load's
 * integer units (quant_dot.cuh) times the staged 8-bit activations by
 * dp4a, 32 values of each row a lane and step. */
template <int DT, int NT>
static __device__ __forceinline__ void gd_tile(const gq_warp &w, const uint4 *gd_xs,
                                               const float *dx, int cols, int tile_cols, int t,
                                               int s1, int slices, float (&acc)[2][NT])
{
    using F = gd_fmt<DT>;
    const int tile_steps = tile_cols / GD_STEP, last_unit = cols / 32 - 1;
    /* No branch in the body: a unit past the last column reads the row's
     * last unit against staged zeros. */
#pragma unroll gd_unroll
    for (int s = t * tile_steps + w.slice; s < s1; s += slices) {
        /* Q8_0's units clamp their halves in the row (gd_load) */
        const int u = F::SHAPE == GD_BYTES ? s * 32 + w.lane : min(s * 32 + w.lane, last_unit);
        gd_unit wu[2];
        gd_load<DT>(w.wr[0], w.sr[0], u, cols, wu[0]);
        gd_load<DT>(w.wr[1], w.sr[1], u, cols, wu[1]);
        gd_products<DT, NT>(wu, gd_xs, dx, w.lane, s - t * tile_steps, tile_cols, acc);
    }
}

/* The default kernel: gd_tile's products, the launch and the slices as
 * k_gemv_quant's, except that where x fits in one tile it is staged once
 * and each group of a block's warps then takes row pairs a launch's
 * width apart (gq_launch gives such launches no more blocks than the SMs
 * hold at once, cuk_gq_cfg); else one pass, x staged tile by tile. */
template <int DT, int NT>
__global__ void __launch_bounds__(GEMV_THREADS)
    k_gemv_qdot(const struct gqp p, const struct cuk_gemv_in in, int cols, int tile_cols,
                int slices)
{
    using F = gd_fmt<DT>;
    extern __shared__ uint4 gd_xs[];
    __shared__ float red[GEMV_WARPS][2][NT];
    cuk_pdl_start();
    const int tile_steps = tile_cols / GD_STEP, nsteps = (cols + GD_STEP - 1) / GD_STEP;
    uint32_t *qx = (uint32_t *)gd_xs;
    float *dx = (float *)(qx + NT * (tile_cols / 4)), *sinv = dx + NT * (tile_cols / 32);
    if (in.kind == CUK_IN_RMSNORM)
        gemv_rms_inv<NT>(sinv, in.x, cols, in.eps, (double *)gd_xs);
    const bool one_tile = tile_steps >= nsteps;
    const int per_block = GEMV_WARPS / slices; /* row pairs */
    const int total = p.groups[0] + p.groups[1] + p.groups[2];
    if (one_tile)
        gd_stage_any<F::SHAPE, NT>(qx, dx, in, sinv, cols, 0, tile_cols);
    /* the same trip count for every warp of a block: they meet at barriers */
    for (int g0 = blockIdx.x * per_block; g0 < total; g0 += gridDim.x * per_block) {
        const gq_warp w = gq_warp_at(p, slices, g0 + (int)(threadIdx.x >> 5) / slices);
        float acc[2][NT] = {};
        for (int t = 0; t * tile_steps < nsteps; t++) {
            if (!one_tile)
                gd_stage_any<F::SHAPE, NT>(qx, dx, in, sinv, cols, t, tile_cols);
            if (w.active)
                gd_tile<DT, NT>(w, gd_xs, dx, cols, tile_cols, t,
                                min(nsteps, (t + 1) * tile_steps), slices, acc);
        }
        gq_finish<NT>(p, w, acc, red, slices);
        if (!one_tile)
            break;
        /* red is written again for the next row pairs */
        if (slices > 1)
            __syncthreads();
        else
            __syncwarp();
    }
}

/* ---- The staged kernel (Hopper's default, CLLM_CUDA_GQ_STAGED): k_gemv_qdot's
 * products with the weights copied into a ring in shared memory by bulk
 * asynchronous copies, as gemv_staged.cu does for bf16, instead of loaded
 * into registers. Why: the integer kernel reads its units a step at a
 * time, each step's loads issued after the previous step's products
 * (~4 16-byte loads in flight a warp: 8B Q4_K decode at ~half its floor,
 * docs/benchmarks.md, session 52), where a ring keeps a warp's next
 * chunks in flight whatever its registers. Each warp owns `slots` slots;
 * a slot holds one chunk (whole steps: gd_chunk) of the warp's row pair,
 * lane 0 refilling it once the warp has read it. Row pairs are dealt
 * over all the grid's warps (pair u to warp u mod blocks x warps), x is
 * staged once per block (gd_stage, one tile: the launcher declines
 * wider x). One warp a row pair, steps in order, the same butterfly: the
 * bits of k_gemv_qdot where that runs one slice a pair. sm_90 only. */
struct gqs {
    int chunk_steps, nch, slots, slot_bytes, tile_cols, bar_off, ring_off;
    int half; /* where a slot's second row starts: a chunk's bytes, 16-aligned */
    int res_late; /* cuk_gq_cfg's staged_res_late */
    int norm_one; /* one token's norm and staging in one pass (gd_norm_stage) */
    int pre;      /* slots a warp fills before the wait (the rest once x is staged) */
    int late;     /* the next kernel launches once x is staged, not at the wait */
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* Lane 0: the copies of chunk ch of row pair g into slot dst (rows at
 * dst and dst + q.half; Q8_0's scales after both, each q.half / 16
 * bytes), completing on bar. */
template <int DT>
static __device__ __forceinline__ void gqs_issue(const struct gqp &p, const struct gqs &q, int cols,
                                                 int g, int ch, unsigned char *dst, uint64_t *bar)
{
    const bool pair = p.out == CUK_OUT_SWIGLU;
    const int m = gemv_matrix_of(g, p.groups);
    const int rows = gq_of(p.rows, m);
    const int r0 = pair ? g : 2 * g, r1 = pair ? g : min(2 * g + 1, rows - 1);
    const uint8_t *w0 = gq_of(p.w, m), *w1 = pair ? p.w[1] : w0;
    const gd_chunk c = gd_chunk_of(DT, p.row_bytes, cols, q.chunk_steps, ch);
    const size_t half = q.half;
    const uint64_t pol = cuk_l2_evict_first();
    cuk_mbar_expect(bar, 2 * (c.bytes + c.sbytes));
    cuk_bulk_copy(dst, w0 + (size_t)r0 * p.row_bytes + c.off, c.bytes, bar, pol);
    cuk_bulk_copy(dst + half, w1 + (size_t)r1 * p.row_bytes + c.off, c.bytes, bar, pol);
    if (DT == DT_Q8_0) {
        const size_t srow = p.row_bytes / 16; /* bytes of a row's scales */
        const uint8_t *s0 = (const uint8_t *)gq_of(p.sc, m),
                      *s1 = pair ? (const uint8_t *)p.sc[1] : s0;
        cuk_bulk_copy(dst + 2 * half, s0 + r0 * srow + c.soff, c.sbytes, bar, pol);
        cuk_bulk_copy(dst + 2 * half + half / 16, s1 + r1 * srow + c.soff, c.sbytes, bar, pol);
    }
}

/* gd_tile over one staged chunk (steps st0 .. st0 + its steps) of the
 * warp's rows ra, rb (Q8_0: scales sa, sb), x staged in one tile. */
template <int DT, int NT>
static __device__ __forceinline__ void gqs_chunk(const uint8_t *ra, const uint8_t *rb,
                                                 const uint16_t *sa, const uint16_t *sb,
                                                 const uint4 *gd_xs, const float *dx, int lane,
                                                 int st0, int ccols, int tile_cols,
                                                 float (&acc)[2][NT])
{
    const int steps = (ccols + GD_STEP - 1) / GD_STEP;
#pragma unroll gd_unroll
    for (int k = 0; k < steps; k++) {
        const int u = gd_chunk_unit<DT>(k * 32 + lane, ccols), st = st0 + k;
        gd_unit wu[2];
        gd_load<DT, true>(ra, sa, u, ccols, wu[0]);
        gd_load<DT, true>(rb, sb, u, ccols, wu[1]);
        gd_products<DT, NT>(wu, gd_xs, dx, lane, st, tile_cols, acc);
    }
}
#endif

/* (The 2 caps registers at 128: two blocks an SM by default.) */
template <int DT, int NT>
__global__ void __launch_bounds__(GEMV_THREADS, 2)
    k_gemv_qstaged(const struct gqp p, const struct cuk_gemv_in in, int cols, const struct gqs q)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using F = gd_fmt<DT>;
    extern __shared__ __align__(128) unsigned char gqs_smem[];
    uint32_t *qx = (uint32_t *)gqs_smem;
    float *dx = (float *)(qx + NT * (q.tile_cols / 4)), *sinv = dx + NT * (q.tile_cols / 32);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#ifdef CUK_GEMV_PROBE
    gp_warp gpw;
    gpw.t0 = cuk_globaltimer();
#endif
    const int total = p.groups[0] + p.groups[1] + p.groups[2];
    /* the warp's row pairs: ubase, ubase + ustride, ... (nu of them) */
    const int ustride = (int)gridDim.x * GEMV_WARPS, ubase = (int)blockIdx.x * GEMV_WARPS + warp;
    const int nu = ubase < total ? (total - ubase + ustride - 1) / ustride : 0;
    const int items = nu * q.nch;
    uint64_t *bar = (uint64_t *)(gqs_smem + q.bar_off) + warp * q.slots;
    unsigned char *slot0 = gqs_smem + q.ring_off + (size_t)warp * q.slots * q.slot_bytes;
    const size_t half = q.half;
    const int first = min(items, q.slots), pre = min(first, q.pre);
    if (lane == 0) {
        for (int i = 0; i < q.slots; i++)
            cuk_mbar_init(bar + i, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        /* the weights never change: their first copies go before the wait */
        for (int i = 0; i < pre; i++)
            gqs_issue<DT>(p, q, cols, ubase + i / q.nch * ustride, i % q.nch,
                          slot0 + (size_t)i * q.slot_bytes, bar + i);
    }
    cuk_pdl_enter(q.late);
#ifdef CUK_GEMV_PROBE
    gp_released(gpw, cols, total, NT);
#endif
    /* Adding into out: lane k reads now the value output k of the warp's
     * units adds to (unit k / (2 NT), token row k / 2 % NT, row k % 2 of
     * the pair), so that its trip to L2 is not taken after the unit's
     * sums, as gemv_staged.cu's res does; outputs past 32 read it then. */
    float res = 0.0f;
    if (p.out == CUK_OUT_ADD && !q.res_late && lane < nu * 2 * NT) {
        int g = ubase + lane / (2 * NT) * ustride;
        const int m = gemv_matrix_of(g, p.groups), r = 2 * g + lane % 2;
        const int rows = gq_of(p.rows, m);
        const float *out = gq_of(p.outp, m);
        if (r < rows)
            res = __ldcg(out + (size_t)(lane / 2 % NT) * rows + r);
    }
    /* both end in a barrier, after which every lane sees the slots' barriers
     * (q.norm_one: one token, a norm; NT == 1 keeps gd_norm_stage out of the
     * wider instances) */
    if (NT == 1 && q.norm_one) {
        gd_norm_stage<F::SHAPE>(qx, dx, in, cols, q.tile_cols, (double *)(sinv + CUK_GEMV_MAX));
    } else {
        if (in.kind == CUK_IN_RMSNORM)
            gemv_rms_inv<NT>(sinv, in.x, cols, in.eps, (double *)gqs_smem);
        gd_stage_any<F::SHAPE, NT>(qx, dx, in, sinv, cols, 0, q.tile_cols);
    }
#ifdef CUK_GEMV_PROBE
    gp_stage(gpw, 2);
    bool gp_first = true;
#endif
    if (lane == 0)
        for (int i = pre; i < first; i++)
            gqs_issue<DT>(p, q, cols, ubase + i / q.nch * ustride, i % q.nch,
                          slot0 + (size_t)i * q.slot_bytes, bar + i);
    if (q.late)
        cuk_pdl_release();
    const bool pair = p.out == CUK_OUT_SWIGLU;
    int s = 0;
    unsigned parity = 0;
    for (int j = 0, i = 0; j < nu; j++) {
        float acc[2][NT] = {};
        for (int ch = 0; ch < q.nch; ch++, i++) {
            cuk_mbar_wait(bar + s, parity);
#ifdef CUK_GEMV_PROBE
            if (gp_first)
                gp_stage(gpw, 3);
            gp_first = false;
#endif
            const uint8_t *ra = slot0 + (size_t)s * q.slot_bytes;
            const uint16_t *sa = (const uint16_t *)(ra + 2 * half);
            const int st0 = ch * q.chunk_steps;
            gqs_chunk<DT, NT>(ra, ra + half, sa, sa + half / 32, (const uint4 *)qx, dx, lane, st0,
                              min(cols - st0 * GD_STEP, q.chunk_steps * GD_STEP), q.tile_cols,
                              acc);
            /* every lane has its units of the slot in registers */
            __syncwarp();
            if (lane == 0 && i + q.slots < items) {
                const int n = i + q.slots;
                gqs_issue<DT>(p, q, cols, ubase + n / q.nch * ustride, n % q.nch,
                              slot0 + (size_t)s * q.slot_bytes, bar + s);
            }
            if (++s == q.slots) {
                s = 0;
                parity ^= 1u;
            }
        }
        int g = ubase + j * ustride;
        const int m = gemv_matrix_of(g, p.groups);
        const int rows = gq_of(p.rows, m);
        float *out = gq_of(p.outp, m);
        /* (every lane has the sums, to the bit: a butterfly's pairs add
         * the same two values) */
        const bool early = p.out == CUK_OUT_ADD && !q.res_late && (j + 1) * 2 * NT <= 32;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float a0 = cuk_warp_sum(acc[0][t]), a1 = cuk_warp_sum(acc[1][t]);
            if (early) { /* lane 2 NT j + 2 t + r holds row 2 g + r's res */
                const int r = lane - 2 * NT * j - 2 * t;
                if (r >= 0 && r < 2 && 2 * g + r < rows)
                    out[(size_t)t * rows + 2 * g + r] = res + (r ? a1 : a0);
                continue;
            }
            if (lane != 0)
                continue;
            if (pair) {
                out[(size_t)t * rows + g] = cuk_silu_mul1(a0, a1);
                continue;
            }
            for (int r = 0; r < 2 && 2 * g + r < rows; r++) {
                float *o = out + (size_t)t * rows + 2 * g + r;
                const float a = r ? a1 : a0;
                *o = p.out == CUK_OUT_ADD ? *o + a : a;
            }
        }
    }
#ifdef CUK_GEMV_PROBE
    gp_end(gpw);
#endif
#else
    (void)p;
    (void)in;
    (void)cols;
    (void)q;
#endif
}

/* Most slots a warp keeps (more than a warp's chunks are never needed). */
#define GQS_MAX_SLOTS 16
/* Bytes of a row a chunk covers at most (its steps rounded down; at least
 * one step): 4 KB as gemv_staged.cu's bf16 chunks, whose slots below 4 KB
 * cost more in waits than their depth gained. */
#define GQS_CHUNK_BYTES 4096

/* k_gemv_qstaged's launch for x of NT rows: cudaErrorNotSupported, with
 * nothing launched, where x does not fit one tile beside two slots a warp
 * or a chunk's copies would not be 16-byte multiples (the caller then
 * runs k_gemv_qdot). */
template <int DT, int NT>
static cudaError_t gqs_launch(cudaStream_t s, const struct gqp &p, const struct cuk_gemv_in *in,
                              int cols, const struct cuk_gq_cfg *cfg)
{
    const long long total = (long long)p.groups[0] + p.groups[1] + p.groups[2];
    if (total == 0)
        return cudaSuccess;
    const int nsteps = (cols + GD_STEP - 1) / GD_STEP, sb = gd_step_bytes(DT);
    struct gqs q = {};
    q.tile_cols = nsteps * GD_STEP;
    q.res_late = cfg->staged_res_late;
    q.norm_one = NT == 1 && in->kind == CUK_IN_RMSNORM && !cfg->staged_norm_apart &&
                 gd_norm_one(cols);
    /* x's codes, scales and the norm's 1/rms (and gd_norm_stage's
     * partials); then the barriers, the ring */
    const size_t xbytes = (size_t)NT * q.tile_cols + (size_t)NT * (q.tile_cols / 32) * 4 +
                          GEMV_INV_BYTES + (q.norm_one ? GEMV_WARPS * sizeof(double) : 0);
    long long blocks =
        cfg->max_blocks > 0 ? cfg->max_blocks : (long long)cfg->n_sms * cfg->staged_bps;
    const long long need = (total + GEMV_WARPS - 1) / GEMV_WARPS;
    if (blocks > need)
        blocks = need;
    const long long per_warp = (total + blocks * GEMV_WARPS - 1) / (blocks * GEMV_WARPS);
    const int budget = cfg->staged_smem;
    int most = cfg->staged_steps > 0 ? cfg->staged_steps : GQS_CHUNK_BYTES / sb;
    if (most < 1)
        most = 1;
    /* (Q6_K's and Q3_K's steps, 840 and 440 bytes, take two a chunk,
     * unless one chunk is the whole row) */
    const int align = (sb & -sb) >= 16 ? 1 : 16 / (sb & -sb);
    if (most < align)
        most = align;
    if (most > nsteps)
        most = nsteps;
    for (int cs = most; cs >= 1; cs--) {
        if (cs % align && cs < nsteps)
            continue; /* the row's later chunks would not start 16-aligned */
        const int nch = (nsteps + cs - 1) / cs;
        const long long items = per_warp * nch;
        const int half = (cs * sb + 15) / 16 * 16;
        const int slot_bytes = 2 * half + (DT == DT_Q8_0 ? 2 * half / 16 : 0);
        for (int sl = (int)(items < GQS_MAX_SLOTS ? items : GQS_MAX_SLOTS); sl >= 1; sl--) {
            const int bar_off = (int)((xbytes + 7) / 8 * 8);
            const int ring_off = (bar_off + GEMV_WARPS * sl * 8 + 127) / 128 * 128;
            const size_t smem = (size_t)ring_off + (size_t)GEMV_WARPS * sl * slot_bytes;
            if (smem > (size_t)budget)
                continue;
            if (sl < 2 && items > 1)
                break; /* a narrower chunk, for two slots */
            q.chunk_steps = cs, q.nch = nch, q.slots = sl, q.slot_bytes = slot_bytes, q.half = half;
            q.pre = cfg->staged_prewait > 0 ? cfg->staged_prewait : sl;
            q.late = cfg->staged_late_launch;
            q.bar_off = bar_off, q.ring_off = ring_off;
            auto k = k_gemv_qstaged<DT, NT>;
            static struct cuk_opted opted;
            cudaError_t err = cuk_smem_opt_in(k, smem, &opted, true);
            if (err != cudaSuccess)
                return err;
            return cuk_launch(k, (unsigned)blocks, GEMV_THREADS, smem, s, p, *in, cols, q);
        }
    }
    return cudaErrorNotSupported;
}

template <int DT>
static cudaError_t gqs_launch_n(cudaStream_t s, const struct gqp &p, const struct cuk_gemv_in *in,
                                int n, int cols, const struct cuk_gq_cfg *cfg)
{
    switch (n) {
    case 1: return gqs_launch<DT, 1>(s, p, in, cols, cfg);
    case 2: return gqs_launch<DT, 2>(s, p, in, cols, cfg);
    case 3: return gqs_launch<DT, 3>(s, p, in, cols, cfg);
    case 4: return gqs_launch<DT, 4>(s, p, in, cols, cfg);
    case 5: return gqs_launch<DT, 5>(s, p, in, cols, cfg);
    case 6: return gqs_launch<DT, 6>(s, p, in, cols, cfg);
    case 7: return gqs_launch<DT, 7>(s, p, in, cols, cfg);
    case 8: return gqs_launch<DT, 8>(s, p, in, cols, cfg);
    default: return cudaErrorNotSupported;
    }
}

/* The staged kernel of dtype dt for n tokens. */
static cudaError_t gqs_launch_dt(cudaStream_t s, const struct gqp &p,
                                 const struct cuk_gemv_in *in, int n, int cols, int dt,
                                 const struct cuk_gq_cfg *cfg)
{
    return cuk_q_dispatch(dt, cudaErrorNotSupported, [&](auto d) {
        return gqs_launch_n<decltype(d)::value>(s, p, in, n, cols, cfg);
    });
}

/* The staged kernel for n tokens, or where their x is too wide for one
 * tile beside the ring, for its later and then its earlier half, each a
 * launch that reads the weights again (halved again as needed): H100,
 * an 8B's down projection (14,336 columns) at 8 tokens, which
 * k_gemv_qdot took at ~3x a 4-token staged launch's time. The later
 * half has as many tokens or one more, so where it fits the earlier one
 * does: a launch is never left half issued. cudaErrorNotSupported
 * (nothing launched) where one token does not fit either. */
static cudaError_t gqs_split(cudaStream_t s, const struct gqp &p, const struct cuk_gemv_in *in,
                             int n, int cols, int dt, const struct cuk_gq_cfg *cfg)
{
    cudaError_t err = gqs_launch_dt(s, p, in, n, cols, dt, cfg);
    if (err != cudaErrorNotSupported || n == 1 || in->kind == CUK_IN_SPLITS)
        return err;
    const int h = n / 2;
    struct gqp p2 = p;
    const struct cuk_gemv_in in2 = cuk_gemv_in_from(in, h, cols);
    for (int i = 0; i < 3; i++)
        if (p2.outp[i])
            p2.outp[i] += (size_t)h * p.rows[i];
    err = gqs_split(s, p2, &in2, n - h, cols, dt, cfg);
    if (err != cudaSuccess)
        return err;
    return gqs_split(s, p, in, h, cols, dt, cfg);
}

/* Steps a slice keeps at least: 2 against 4 (1,024-column steps), H100,
 * 0.6B Q4_K decode 1,176 -> 1,220 tok/s, Q8_0 1,051 -> 1,099, the 8B flat
 * (docs/benchmarks.md, session 51). */
#ifndef GQ_SLICE_STEPS
#define GQ_SLICE_STEPS 2
#endif

/* The launch shape: slices (1, 2, 4 or 8 warps a row pair: enough warps
 * for GQ_WARPS_WANT, each left GQ_SLICE_STEPS steps or more) and blocks. */
static void gq_shape(long long total, int steps, int *slices, unsigned *grid)
{
    int sl = 1;
    while (sl < GEMV_WARPS && total * sl < GQ_WARPS_WANT && steps >= GQ_SLICE_STEPS * sl)
        sl *= 2;
    const long long per_block = GEMV_WARPS / sl;
    *slices = sl;
    *grid = (unsigned)((total + per_block - 1) / per_block);
}

/* x of NT tokens staged in tiles of whole steps (QDOT: the integer
 * kernel's, else the exact one's), as many as fit GEMV_SMEM_MAX beside
 * the norm's 1/rms and the static red[][][]: f32 (4 bytes a column) or
 * 8-bit codes and a scale a 32 (1 + 1/8). */
template <int NT, bool QDOT> struct gq_tiles {
    static constexpr int STEP = QDOT ? GD_STEP : GQ_STEP;
    static constexpr int STEP_BYTES = QDOT ? GD_STEP + GD_STEP / 8 : 4 * GQ_STEP;
    static constexpr int FIT = /* steps a tile holds */
        (GEMV_SMEM_MAX - GEMV_INV_BYTES - GEMV_WARPS * 2 * NT * 4) / (NT * STEP_BYTES);
    /* dynamic shared memory of a tile of tile_steps steps */
    static constexpr size_t smem(int tile_steps)
    {
        return (size_t)NT * tile_steps * STEP_BYTES + GEMV_INV_BYTES;
    }
};

/* QDOT: the integer kernel (k_gemv_qdot), else the exact one. */
template <int DT, int NT, bool QDOT>
static cudaError_t gq_launch(cudaStream_t s, const struct gqp &p, const struct cuk_gemv_in *in,
                             int cols, const struct cuk_gq_cfg *cfg)
{
    const long long total = (long long)p.groups[0] + p.groups[1] + p.groups[2];
    if (total == 0)
        return cudaSuccess;
    using T = gq_tiles<NT, QDOT>;
    const int steps = (cols + T::STEP - 1) / T::STEP;
    const int tile_steps = steps < T::FIT ? steps : T::FIT, tile_cols = tile_steps * T::STEP;
    const size_t smem = T::smem(tile_steps);
    int slices;
    unsigned grid;
    gq_shape(total, steps, &slices, &grid);
    if (QDOT) {
        /* x in one tile: no more blocks than the SMs hold at once, so
         * that a block's warps stage x once for several row pairs */
        const unsigned cap = cfg->max_blocks > 0 ? (unsigned)cfg->max_blocks
                                                  : (unsigned)(cfg->n_sms * cfg->bps[DT][NT - 1]);
        if (tile_cols >= cols && cap > 0 && grid > cap)
            grid = cap;
        return cuk_launch(k_gemv_qdot<DT, NT>, grid, GEMV_THREADS, smem, s, p, *in, cols,
                          tile_cols, slices);
    }
    return cuk_launch(k_gemv_quant<DT, NT>, grid, GEMV_THREADS, smem, s, p, *in, cols, tile_cols,
                      slices);
}

template <int DT, bool QDOT>
static cudaError_t gq_launch_n(cudaStream_t s, const struct gqp &p, const struct cuk_gemv_in *in,
                               int n, int cols, const struct cuk_gq_cfg *cfg)
{
    switch (n) {
    case 1: return gq_launch<DT, 1, QDOT>(s, p, in, cols, cfg);
    case 2: return gq_launch<DT, 2, QDOT>(s, p, in, cols, cfg);
    case 3: return gq_launch<DT, 3, QDOT>(s, p, in, cols, cfg);
    case 4: return gq_launch<DT, 4, QDOT>(s, p, in, cols, cfg);
    case 5: return gq_launch<DT, 5, QDOT>(s, p, in, cols, cfg);
    case 6: return gq_launch<DT, 6, QDOT>(s, p, in, cols, cfg);
    case 7: return gq_launch<DT, 7, QDOT>(s, p, in, cols, cfg);
    default: return gq_launch<DT, 8, QDOT>(s, p, in, cols, cfg);
    }
}

template <int DT>
static cudaError_t gq_launch_dt(cudaStream_t s, const struct gqp &p, const struct cuk_gemv_in *in,
                                int n, int cols, bool exact, const struct cuk_gq_cfg *cfg)
{
    return exact ? gq_launch_n<DT, false>(s, p, in, n, cols, cfg)
                 : gq_launch_n<DT, true>(s, p, in, n, cols, cfg);
}

static_assert(DT_COUNT <= CUK_GQ_DTS, "cuk_gq_cfg has a row per dtype");

/* Blocks of k_gemv_qdot<DT, NT> an SM holds at once with x in the
 * largest one tile (its shared memory is then the most a one-tile launch
 * takes; registers are the limit here anyway). Fewer blocks than that
 * leave latency uncovered: H100, 8B Q4_K decode at 1, 2, 3 and 4 blocks
 * an SM 201, 266, 297, 329 tok/s (docs/benchmarks.md, session 52). */
template <int DT, int NT>
static unsigned char gq_blocks_per_sm(void)
{
    using T = gq_tiles<NT, true>;
    const size_t smem = T::smem(T::FIT);
    int bps = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, k_gemv_qdot<DT, NT>, GEMV_THREADS,
                                                      smem) != cudaSuccess) {
        cudaGetLastError();
        bps = 0; /* no limit */
    }
    return (unsigned char)(bps > 255 ? 255 : bps);
}

template <int DT>
static void gq_fill(struct cuk_gq_cfg *cfg)
{
    unsigned char *b = cfg->bps[DT];
    b[0] = gq_blocks_per_sm<DT, 1>(), b[1] = gq_blocks_per_sm<DT, 2>();
    b[2] = gq_blocks_per_sm<DT, 3>(), b[3] = gq_blocks_per_sm<DT, 4>();
    b[4] = gq_blocks_per_sm<DT, 5>(), b[5] = gq_blocks_per_sm<DT, 6>();
    b[6] = gq_blocks_per_sm<DT, 7>(), b[7] = gq_blocks_per_sm<DT, 8>();
}

extern "C" void cuk_gemv_quant_init(struct cuk_gq_cfg *cfg, int n_sms, int persist,
                                    int max_blocks)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->n_sms = n_sms;
    cfg->max_blocks = max_blocks;
    if (!persist)
        return;
    gq_fill<DT_Q8_0>(cfg);
    gq_fill<DT_Q4_0>(cfg);
    gq_fill<DT_Q4_1>(cfg);
    gq_fill<DT_Q5_0>(cfg);
    gq_fill<DT_Q5_1>(cfg);
    gq_fill<DT_Q4_K>(cfg);
    gq_fill<DT_Q5_K>(cfg);
    gq_fill<DT_Q6_K>(cfg);
    gq_fill<DT_Q2_K>(cfg);
    gq_fill<DT_Q3_K>(cfg);
}

/* Whether k_gemv_qstaged's bulk copies can read the matrices' rows (and
 * Q8_0's scale rows): 16-aligned starts and 16-byte multiples. */
static bool gqs_takes(const struct gqp *p, const struct cuk_weight *const *ws, int k, int dt,
                      int cols)
{
    if (p->row_bytes % 16 || (dt == DT_Q8_0 && cols % 256))
        return false;
    for (int i = 0; i < k; i++)
        if (((uintptr_t)ws[i]->data & 15) || (dt == DT_Q8_0 && ((uintptr_t)ws[i]->scales & 15)))
            return false;
    return true;
}

extern "C" cudaError_t cuk_gemv_quant(cudaStream_t s, float *const *outs,
                                      const struct cuk_gemv_in *in, int n,
                                      const struct cuk_weight *const *ws, int k, int out,
                                      int exact, const struct cuk_gq_cfg *cfg)
{
    if (!gemv_fused_args(in, n, ws, k, out))
        return cudaErrorInvalidValue;
    const int dt = ws[0]->dtype, cols = ws[0]->cols;
    const bool q8 = dt == DT_Q8_0 && !exact; /* Q8_0 has no exact kernel here (gemv.cu's) */
    /* SwiGLU's output only after a norm, as a layer has it (gate/up) and
     * as cuk_gemv_fused takes it */
    if (!(cuk_q_low_bit(dt) || q8) || cols <= 0 || cols % (q8 ? 32 : cuk_q_block_elems(dt)) ||
        (out == CUK_OUT_SWIGLU && in->kind != CUK_IN_RMSNORM))
        return cudaErrorNotSupported;
    if (!gemv_in_aligned(in))
        return cudaErrorNotSupported;
    /* the integer kernel's 16-byte loads (gd_bytes16) */
    const bool load16 = !exact && (dt == DT_Q8_0 || dt == DT_Q4_K || dt == DT_Q5_K);
    struct gqp p = {};
    p.out = out;
    p.row_bytes = q8 ? (size_t)cols : cuk_q_row_bytes(dt, cols); /* Q8_0: the repacked int8 */
    for (int i = 0; i < k; i++) {
        if (ws[i]->dtype != dt || ws[i]->cols != cols || ws[i]->rows < 1 ||
            ((uintptr_t)ws[i]->data & (load16 ? 15 : 7)) || (q8 && !ws[i]->scales))
            return cudaErrorNotSupported;
        p.outp[i] = outs[i];
        p.w[i] = (const uint8_t *)ws[i]->data;
        p.sc[i] = q8 ? ws[i]->scales : nullptr;
        p.rows[i] = ws[i]->rows;
        p.groups[i] = out == CUK_OUT_SWIGLU ? (i == 0 ? ws[0]->rows : 0) : (ws[i]->rows + 1) / 2;
    }
    const bool ex = exact != 0;
    cudaError_t err;
    if (!exact && cfg->staged_bps > 0 && n <= cfg->staged_max_n) {
        err = gqs_takes(&p, ws, k, dt, cols) ? gqs_split(s, p, in, n, cols, dt, cfg)
                                              : cudaErrorNotSupported;
        if (err == cudaErrorNotSupported && cfg->staged_strict)
            return cudaErrorNotPermitted;
        if (err != cudaErrorNotSupported) {
            cudaError_t last = cudaGetLastError();
            return err != cudaSuccess ? err : last;
        }
    }
    /* (Q8_0 has no exact kernel here: gemv.cu's) */
    err = cuk_q_dispatch(dt, cudaErrorNotSupported, [&](auto d) {
        constexpr int DT = decltype(d)::value;
        if constexpr (DT == DT_Q8_0)
            return gq_launch_n<DT, true>(s, p, in, n, cols, cfg);
        else
            return gq_launch_dt<DT>(s, p, in, n, cols, ex, cfg);
    });
    cudaError_t last = cudaGetLastError();
    return err != cudaSuccess ? err : last;
}
