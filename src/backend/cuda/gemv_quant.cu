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
    w.rows = w.m == 0 ? p.rows[0] : w.m == 1 ? p.rows[1] : p.rows[2];
    const int m0 = w.m;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        w.rr[r] = w.pair ? g : 2 * g + r;
        /* a row past the end (an odd last group) re-reads the last row; not written */
        const size_t row = (size_t)min(w.rr[r], w.rows - 1);
        const int mr = w.pair && r ? 1 : m0;
        w.wr[r] = (mr == 0 ? p.w[0] : mr == 1 ? p.w[1] : p.w[2]) + row * p.row_bytes;
        const uint16_t *sc = mr == 0 ? p.sc[0] : mr == 1 ? p.sc[1] : p.sc[2];
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
    float *out = w.m == 0 ? p.outp[0] : w.m == 1 ? p.outp[1] : p.outp[2];
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
        const int sl = s - t * tile_steps;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            /* the lane's two planes (gd_slot) */
            const uint4 *xs = gd_xs + j * (tile_cols / 16) + sl * (GD_STEP / 16) + w.lane;
            const uint4 xa = xs[0], xb = xs[32];
            const int x[8] = {(int)xa.x, (int)xa.y, (int)xa.z, (int)xa.w,
                              (int)xb.x, (int)xb.y, (int)xb.z, (int)xb.w};
            const float *db = dx + j * (tile_cols / 32) + sl * (GD_STEP / 32) +
                              gd_block<F::SHAPE>(w.lane, 0);
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
    switch (dt) {
    case DT_Q8_0: err = gq_launch_n<DT_Q8_0, true>(s, p, in, n, cols, cfg); break;
    case DT_Q4_0: err = gq_launch_dt<DT_Q4_0>(s, p, in, n, cols, ex, cfg); break;
    case DT_Q4_1: err = gq_launch_dt<DT_Q4_1>(s, p, in, n, cols, ex, cfg); break;
    case DT_Q5_0: err = gq_launch_dt<DT_Q5_0>(s, p, in, n, cols, ex, cfg); break;
    case DT_Q5_1: err = gq_launch_dt<DT_Q5_1>(s, p, in, n, cols, ex, cfg); break;
    case DT_Q4_K: err = gq_launch_dt<DT_Q4_K>(s, p, in, n, cols, ex, cfg); break;
    case DT_Q5_K: err = gq_launch_dt<DT_Q5_K>(s, p, in, n, cols, ex, cfg); break;
    case DT_Q6_K: err = gq_launch_dt<DT_Q6_K>(s, p, in, n, cols, ex, cfg); break;
    case DT_Q2_K: err = gq_launch_dt<DT_Q2_K>(s, p, in, n, cols, ex, cfg); break;
    default: err = gq_launch_dt<DT_Q3_K>(s, p, in, n, cols, ex, cfg); break;
    }
    cudaError_t last = cudaGetLastError();
    return err != cudaSuccess ? err : last;
}
