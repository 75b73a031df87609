/* gemv.cu - matrix-vector products for decode and short prefill chunks
 * (n <= CUK_GEMV_MAX tokens): out[n][rows] = x[n][cols] . W^T with f32
 * activations and f32 accumulation, reading each weight byte once.
 *
 * Vector path (bf16/f16 with cols % 8 == 0, Q8_0 with cols % 32 == 0):
 * blocks of 8 warps; each warp owns R consecutive rows of one matrix (a
 * "row group") and streams them in lock step, so every activation value it
 * fetches serves R rows. The block stages x (all n rows, f32, exact) in
 * shared memory one column tile at a time (tiles of whole steps, <= 48 KB,
 * so no opt-in attribute is needed and graph capture is unaffected); lanes
 * read it conflict-free through a swizzled layout. Weights come through
 * ld.global.nc.L1::no_allocate as 16-byte vectors (8 f16/bf16 or 16 int8
 * quants), U per row per lane per step, double-buffered so the next step's
 * loads (also across a tile barrier) are in flight while this step computes.
 *
 * Arithmetic of one output (r, j), the same for every grouping, tiling,
 * launch shape and for cuk_gemv / cuk_gemv_multi: lane l accumulates the
 * 16-byte vectors c = l, l+32, l+64, ... in increasing order into one f32
 * acc, element by element with fmaf (Q8_0: s = the vector's 16 products
 * chained with fmaf, then acc = fmaf(scale, s, acc)); then a fixed xor
 * butterfly sums the 32 lanes. No atomics: deterministic run to run.
 *
 * Fused neighbours (cuk_gemv_fused): the staged rows may be rmsnorm(x) or
 * silu(gate) * up instead of x, computed while staging with the plain
 * kernels' arithmetic (the norm's sum of squares in cuk_rmsnorm's order,
 * taken by every block before its first tile, while its first weight
 * loads are in flight), so the staged values, and with them the outputs,
 * are those of the plain kernels followed by cuk_gemv. The result may be
 * added to the output instead of stored (the residual add): out + v, as
 * cuk_add would. Or two matrices of equal rows (gate, up) are paired: a
 * warp's R rows are R/2 rows of each, and it stores silu(gate) * up
 * (cuk_silu_mul1, as cuk_silu_mul would) into the first output, so the
 * down projection reads SwiGLU's output without a launch of its own.
 *
 * A scalar fallback handles shapes the vector path cannot. */
#include <math.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemv_common.cuh"

/* Row count below which single-row GEMVs take one row per warp (measured
 * on the H200: 1,024-row o/down of a 0.6B model faster, 4,096-row q/k/v
 * slower). */
#define GEMV_R1_ROWS 2048

/* Up to 3 matrices of one dtype and one cols over the same x: warps take
 * row groups of matrix 0, then 1, then 2 (a group never straddles two). */
struct gemvp {
    float *outp[3];
    const void *w[3];
    const uint16_t *sc[3]; /* Q8_0 scales */
    int rows[3];
    int groups[3]; /* ceil(rows / R) */
    int out;       /* CUK_OUT_*: store, add into, or pair as SwiGLU */
};

/* Rows per warp and vectors per row per lane per step (tuned on an H200;
 * any choice gives the same arithmetic). */
template <int WT, int NT> struct gemv_shape {
    static constexpr int R = WT == WT_Q8 ? 2 : (NT <= 2 ? 2 : 4);
    static constexpr int U = NT <= 2 ? 4 : 2;
    /* n <= 2: <= 128 registers, 2 blocks (16 warps) per SM; more n needs the
     * registers (a cap spills), measured on the H200 */
    static constexpr int MIN_BLOCKS = NT == 1 || (NT == 2 && WT != WT_Q8) ? 2 : 1;
    static constexpr int STEP_COLS = 32 * U * gemv_cfg<WT>::VE;
};

/* Loads step s's weight vectors (and Q8_0 scales) of the warp's R rows. */
template <int WT, int R, int U>
static __device__ __forceinline__ void gemv_load(uint4 (&b)[R][U], uint32_t (&d)[R][U],
                                                 const uint4 *const (&wr)[R],
                                                 const uint16_t *const (&sr)[R], int s, int nv,
                                                 int lane)
{
#pragma unroll
    for (int u = 0; u < U; u++) {
        int c = s * 32 * U + 32 * u + lane;
        bool ok = c < nv;
#pragma unroll
        for (int r = 0; r < R; r++) {
            b[r][u] = ok ? ld_stream(wr[r] + c) : make_uint4(0, 0, 0, 0);
            if (WT == WT_Q8)
                d[r][u] = ok ? (uint32_t)__ldg(sr[r] + (c >> 1)) : 0u;
        }
    }
}

/* acc[r][j] += step s of the warp's rows against the staged x tile. */
template <int WT, int NT, int R, int U>
static __device__ __forceinline__ void gemv_step(float (&acc)[R][NT], const uint4 (&b)[R][U],
                                                 const uint32_t (&d)[R][U], const float4 *xs,
                                                 int s, int nv, int tile_vecs, int tile_f4,
                                                 int t_base, int lane)
{
    constexpr int VE = gemv_cfg<WT>::VE;
    (void)tile_vecs;
#pragma unroll
    for (int u = 0; u < U; u++) {
        int c = s * 32 * U + 32 * u + lane;
        if (c >= nv)
            continue;
        int cl = c - t_base; /* vector index in the tile; cl % 32 == lane */
        const float4 *xp = xs + (cl >> 5) * (8 * VE) + lane;
        float f[R][VE];
#pragma unroll
        for (int r = 0; r < R; r++)
            unpack<WT>(b[r][u], f[r]);
#pragma unroll
        for (int j = 0; j < NT; j++) {
            float xv[VE];
#pragma unroll
            for (int q = 0; q < VE / 4; q++) {
                float4 t = xp[j * tile_f4 + q * 32];
                xv[4 * q] = t.x;
                xv[4 * q + 1] = t.y;
                xv[4 * q + 2] = t.z;
                xv[4 * q + 3] = t.w;
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (WT == WT_Q8) {
                    float sum = f[r][0] * xv[0];
#pragma unroll
                    for (int e = 1; e < VE; e++)
                        sum = fmaf(f[r][e], xv[e], sum);
                    acc[r][j] = fmaf(cuk_f16((uint16_t)d[r][u]), sum, acc[r][j]);
                } else {
                    float a = acc[r][j];
#pragma unroll
                    for (int e = 0; e < VE; e++)
                        a = fmaf(f[r][e], xv[e], a);
                    acc[r][j] = a;
                }
            }
        }
    }
}

/* PAIR: the SwiGLU output (p.out == CUK_OUT_SWIGLU), a template argument
 * so the other kernels keep their registers (a run-time flag spilled). */
template <int WT, int NT, int IN, bool PAIR, int RW>
__global__ void __launch_bounds__(GEMV_THREADS, (gemv_shape<WT, NT>::MIN_BLOCKS))
    k_gemv_vec(const struct gemvp p, const struct cuk_gemv_in in, int cols, int tile_cols)
{
    /* the norm's reduction borrows the x tile: NT * 32 doubles */
    static_assert(gemv_shape<WT, NT>::STEP_COLS * 4 >= 32 * 8, "tile smaller than the norm's part");
    constexpr int VE = gemv_cfg<WT>::VE, BYTES = gemv_cfg<WT>::BYTES;
    constexpr int R = RW > 0 ? RW : gemv_shape<WT, NT>::R, U = gemv_shape<WT, NT>::U;
    extern __shared__ float4 gemv_xs[];
    const int lane = threadIdx.x & 31;
    int g = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    /* Warps past the last group still stage x (block barriers), nothing else. */
    const bool active = g < p.groups[0] + p.groups[1] + p.groups[2];
    int m = gemv_matrix_of(g, p.groups);
    if (!active) {
        m = 0;
        g = 0;
    }
    const int rows = m == 0 ? p.rows[0] : m == 1 ? p.rows[1] : p.rows[2];
    /* paired (SwiGLU out): rows g*R/2.. of matrix 0, then the same of 1 */
    constexpr int RH = R / 2 > 0 ? R / 2 : 1; /* PAIR: rows of each matrix */
    const int row0 = PAIR ? g * RH : g * R;
    const uint4 *wr[R];
    const uint16_t *sr[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int mr = PAIR ? (r < RH ? 0 : 1) : m, rr0 = PAIR ? row0 + r % RH : row0 + r;
        const char *wbase = (const char *)(mr == 0 ? p.w[0] : mr == 1 ? p.w[1] : p.w[2]);
        const uint16_t *sbase = mr == 0 ? p.sc[0] : mr == 1 ? p.sc[1] : p.sc[2];
        /* rows past the end (last group) re-read the last row; not written */
        int rr = min(rr0, rows - 1);
        wr[r] = (const uint4 *)(wbase + (size_t)rr * cols * BYTES);
        sr[r] = WT == WT_Q8 ? sbase + (size_t)rr * (cols / Q8_0_BLOCK) : nullptr;
    }
    const int nv = cols / VE, nsteps = (nv + 32 * U - 1) / (32 * U);
    const int tile_vecs = tile_cols / VE, spt = tile_vecs / (32 * U), tile_f4 = tile_cols / 4;

    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int j = 0; j < NT; j++)
            acc[r][j] = 0.0f;
    uint4 b0[R][U], b1[R][U];
    uint32_t d0[R][U], d1[R][U];
    if (active && nsteps > 0)
        gemv_load<WT, R, U>(b0, d0, wr, sr, 0, nv, lane);
    /* Weights never change, so their first loads may overlap the previous
     * kernel (programmatic dependent launch); x and out are its. */
    cuk_pdl_start();
    float *out = m == 0 ? p.outp[0] : m == 1 ? p.outp[1] : p.outp[2];
    /* Adding into out: lane r * NT + j reads the value output (row0 + r,
     * token j) adds to now, while the weights stream, instead of lane 0
     * reading them one after another once the sums are done. */
    static_assert(PAIR || R * NT <= 32, "a lane per output");
    float res = 0.0f;
    if (!PAIR && p.out == CUK_OUT_ADD && active && lane < R * NT && row0 + lane / NT < rows)
        res = __ldcg(out + (size_t)(lane % NT) * rows + row0 + lane / NT);
    float *sinv = (float *)(gemv_xs + NT * tile_f4); /* past the tile: GEMV_INV_BYTES (norm only) */
    if (IN == CUK_IN_RMSNORM) /* while the first weight loads are in flight */
        gemv_rms_inv<NT>(sinv, in.x, cols, in.eps, (double *)gemv_xs);
    /* Two steps per trip so the buffers swap roles without copies. */
    for (int s = 0; s < nsteps; s += 2) {
        int t = s / spt;
        if (s % spt == 0)
            gemv_stage<WT, NT, IN>(gemv_xs, in, sinv, cols, t, tile_cols);
        if (active) {
            if (s + 1 < nsteps)
                gemv_load<WT, R, U>(b1, d1, wr, sr, s + 1, nv, lane);
            gemv_step<WT, NT, R, U>(acc, b0, d0, gemv_xs, s, nv, tile_vecs, tile_f4,
                                    t * tile_vecs, lane);
        }
        if (s + 1 >= nsteps)
            break;
        t = (s + 1) / spt;
        if ((s + 1) % spt == 0)
            gemv_stage<WT, NT, IN>(gemv_xs, in, sinv, cols, t, tile_cols);
        if (active) {
            if (s + 2 < nsteps)
                gemv_load<WT, R, U>(b0, d0, wr, sr, s + 2, nv, lane);
            gemv_step<WT, NT, R, U>(acc, b1, d1, gemv_xs, s + 1, nv, tile_vecs, tile_f4,
                                    t * tile_vecs, lane);
        }
    }
    if (!active)
        return;
    if constexpr (PAIR) {
#pragma unroll
        for (int r = 0; r < RH; r++)
#pragma unroll
            for (int j = 0; j < NT; j++) {
                float gv = cuk_warp_sum(acc[r][j]), uv = cuk_warp_sum(acc[r + RH][j]);
                if (lane == 0 && row0 + r < rows)
                    out[(size_t)j * rows + row0 + r] = cuk_silu_mul1(gv, uv);
            }
    } else {
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int j = 0; j < NT; j++) {
                float v = cuk_warp_sum(acc[r][j]);
                const float old = __shfl_sync(0xffffffffu, res, r * NT + j);
                if (lane == 0 && row0 + r < rows)
                    out[(size_t)j * rows + row0 + r] = p.out == CUK_OUT_ADD ? old + v : v;
            }
    }
}

/* Any dtype, any shape: scalar loads. */
template <int NT>
__global__ void __launch_bounds__(GEMV_THREADS)
    k_gemv_any(float *out, const float *x, struct cuk_weight w)
{
    cuk_pdl_start();
    int row = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= w.rows)
        return;
    float acc[NT];
#pragma unroll
    for (int j = 0; j < NT; j++)
        acc[j] = 0.0f;
    for (int c = lane; c < w.cols; c += 32) {
        float wv = cuk_load_weight(&w, (size_t)row, c);
#pragma unroll
        for (int j = 0; j < NT; j++)
            acc[j] = fmaf(wv, x[(size_t)j * w.cols + c], acc[j]);
    }
#pragma unroll
    for (int j = 0; j < NT; j++) {
        float v = cuk_warp_sum(acc[j]);
        if (lane == 0)
            out[(size_t)j * w.rows + row] = v;
    }
}


/* Fills the groups of p (k matrices) and launches the vector kernel. */
template <int WT, int NT, int IN, bool PAIR, int RW>
static cudaError_t launch_vec(cudaStream_t s, struct gemvp *p, int k,
                              const struct cuk_gemv_in *in, int cols)
{
    constexpr int R = RW > 0 ? RW : gemv_shape<WT, NT>::R, STEP = gemv_shape<WT, NT>::STEP_COLS;
    static_assert(!PAIR || R % 2 == 0, "paired rows need an even R");
    long long total = 0;
    for (int i = 0; i < 3; i++) {
        p->groups[i] = i < k ? (p->rows[i] + R - 1) / R : 0;
        total += p->groups[i];
    }
    if (PAIR) { /* R/2 rows of each matrix per warp */
        constexpr int RH = R / 2 > 0 ? R / 2 : 1;
        p->groups[0] = (p->rows[0] + RH - 1) / RH;
        p->groups[1] = p->groups[2] = 0;
        total = p->groups[0];
    }
    if (total == 0)
        return cudaSuccess;
    /* Tile: whole steps, as many as fit GEMV_SMEM_MAX (>= 1: NT * STEP * 4 <= 32 KB). */
    int steps = (cols + STEP - 1) / STEP;
    constexpr int INV = IN == CUK_IN_RMSNORM ? GEMV_INV_BYTES : 0;
    int fit = (GEMV_SMEM_MAX - INV) / (NT * 4 * STEP);
    int tile_cols = (steps < fit ? (steps > 0 ? steps : 1) : fit) * STEP;
    size_t smem = (size_t)NT * tile_cols * 4 + INV;
    unsigned grid = (unsigned)((total + GEMV_WARPS - 1) / GEMV_WARPS);
    return cuk_launch(k_gemv_vec<WT, NT, IN, PAIR, RW>, grid, GEMV_THREADS, smem, s, *p, *in, cols,
                      tile_cols);
}

/* launch_vec for the run-time input kind, dtype and row count. */
template <int WT, int NT>
static cudaError_t launch_in(cudaStream_t s, struct gemvp *p, int k,
                             const struct cuk_gemv_in *in, int cols)
{
    /* SwiGLU's output only after a norm, as a layer has it (gate/up) */
    if (p->out == CUK_OUT_SWIGLU)
        return in->kind == CUK_IN_RMSNORM
                   ? launch_vec<WT, NT, CUK_IN_RMSNORM, true, 0>(s, p, k, in, cols)
                   : cudaErrorNotSupported;
    /* One row per warp where two would leave SMs idle (fewer than
     * GEMV_R1_ROWS rows in all: a 0.6B model's o and down projections),
     * single-row steps only. The same arithmetic per row either way. */
    int all = p->rows[0] + (k > 1 ? p->rows[1] : 0) + (k > 2 ? p->rows[2] : 0);
    if (NT == 1 && all < GEMV_R1_ROWS) {
        if (in->kind == CUK_IN_RMSNORM)
            return launch_vec<WT, NT, CUK_IN_RMSNORM, false, 1>(s, p, k, in, cols);
        if (in->kind == CUK_IN_SWIGLU)
            return launch_vec<WT, NT, CUK_IN_SWIGLU, false, 1>(s, p, k, in, cols);
        return launch_vec<WT, NT, CUK_IN_X, false, 1>(s, p, k, in, cols);
    }
    if (in->kind == CUK_IN_RMSNORM)
        return launch_vec<WT, NT, CUK_IN_RMSNORM, false, 0>(s, p, k, in, cols);
    if (in->kind == CUK_IN_SWIGLU)
        return launch_vec<WT, NT, CUK_IN_SWIGLU, false, 0>(s, p, k, in, cols);
    return launch_vec<WT, NT, CUK_IN_X, false, 0>(s, p, k, in, cols);
}

template <int NT>
static cudaError_t launch_dt(cudaStream_t s, struct gemvp *p, int k,
                             const struct cuk_gemv_in *in, int cols, int dt)
{
    if (dt == DT_BF16)
        return launch_in<WT_BF16, NT>(s, p, k, in, cols);
    if (dt == DT_F16)
        return launch_in<WT_F16, NT>(s, p, k, in, cols);
    return launch_in<WT_Q8, NT>(s, p, k, in, cols);
}

/* Whether the vector path takes w over activation rows at x: 16-byte
 * aligned weight and activation rows; Q8_0 also whole 32-element scale
 * blocks per row. */
static bool vec_ok(const struct cuk_weight *w, const float *x)
{
    bool ok = ((w->dtype == DT_BF16 || w->dtype == DT_F16) && w->cols % 8 == 0) ||
              (w->dtype == DT_Q8_0 && w->cols % Q8_0_BLOCK == 0 && w->scales);
    return ok && w->cols > 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)w->data & 15) == 0;
}

extern "C" cudaError_t cuk_gemv_fused(cudaStream_t s, float *const *outs,
                                      const struct cuk_gemv_in *in, int n,
                                      const struct cuk_weight *const *ws, int k, int out)
{
    if (!gemv_fused_args(in, n, ws, k, out))
        return cudaErrorInvalidValue;
    /* x (vec_ok) and the prologue's second operand (norm weights, up) are read as float4 */
    if (!gemv_in_aligned(in))
        return cudaErrorNotSupported;
    int dt = ws[0]->dtype, cols = ws[0]->cols;
    struct gemvp p = {};
    p.out = out;
    for (int i = 0; i < k; i++) {
        if (!vec_ok(ws[i], in->x) || ws[i]->dtype != dt || ws[i]->cols != cols)
            return cudaErrorNotSupported;
        p.outp[i] = outs[i];
        p.w[i] = ws[i]->data;
        p.sc[i] = ws[i]->scales;
        p.rows[i] = ws[i]->rows;
    }
    cudaError_t err;
    switch (n) {
    case 1: err = launch_dt<1>(s, &p, k, in, cols, dt); break;
    case 2: err = launch_dt<2>(s, &p, k, in, cols, dt); break;
    case 3: err = launch_dt<3>(s, &p, k, in, cols, dt); break;
    case 4: err = launch_dt<4>(s, &p, k, in, cols, dt); break;
    case 5: err = launch_dt<5>(s, &p, k, in, cols, dt); break;
    case 6: err = launch_dt<6>(s, &p, k, in, cols, dt); break;
    case 7: err = launch_dt<7>(s, &p, k, in, cols, dt); break;
    default: err = launch_dt<8>(s, &p, k, in, cols, dt); break;
    }
    cudaError_t last = cudaGetLastError();
    return err != cudaSuccess ? err : last;
}

extern "C" cudaError_t cuk_gemv_multi(cudaStream_t s, float *const *outs, const float *x, int n,
                                      const struct cuk_weight *const *ws, int k)
{
    struct cuk_gemv_in in = {};
    in.kind = CUK_IN_X;
    in.x = x;
    return cuk_gemv_fused(s, outs, &in, n, ws, k, CUK_OUT_STORE);
}

template <int NT>
static void launch_any(cudaStream_t s, float *out, const float *x, const struct cuk_weight *w)
{
    cuk_launch(k_gemv_any<NT>, (unsigned)((w->rows + GEMV_WARPS - 1) / GEMV_WARPS),
               GEMV_THREADS, 0, s, out, x, *w);
}

extern "C" cudaError_t cuk_gemv(cudaStream_t s, float *out, const float *x, int n,
                                const struct cuk_weight *w)
{
    if (n < 1 || n > CUK_GEMV_MAX)
        return cudaErrorInvalidValue;
    if (vec_ok(w, x)) {
        struct cuk_gemv_in in = {};
        in.kind = CUK_IN_X;
        in.x = x;
        return cuk_gemv_fused(s, &out, &in, n, &w, 1, CUK_OUT_STORE);
    }
    if (w->rows <= 0)
        return cudaGetLastError();
    switch (n) {
    case 1: launch_any<1>(s, out, x, w); break;
    case 2: launch_any<2>(s, out, x, w); break;
    case 3: launch_any<3>(s, out, x, w); break;
    case 4: launch_any<4>(s, out, x, w); break;
    case 5: launch_any<5>(s, out, x, w); break;
    case 6: launch_any<6>(s, out, x, w); break;
    case 7: launch_any<7>(s, out, x, w); break;
    default: launch_any<8>(s, out, x, w); break;
    }
    return cudaGetLastError();
}
