/* gemv_mma_quant.cu - the tensor-core GEMV of batched decode steps
 * (gemv_mma.cuh's contract and launch shape) for GGUF's
 * K-quants (Q4_K, Q5_K, Q6_K: all of a Q4_K_M or Q5_K_M file's
 * matrices), read from their blocks: a quarter to two fifths of the
 * bytes of a bf16 copy of them, and no widening pass.
 *
 * Why: past a token or two the integer GEMV (gemv_quant.cu) is bound by
 * its dot products, and past 8 tokens a model without bf16 copies (a KV
 * pool that took the GPU) widened every matrix at every step for a GEMM.
 * The backend sends this kernel steps of 3-16 tokens (cuda_matmul.c,
 * qmma_takes), even where bf16 copies exist (mm_weights: faster than
 * the copies since session 60, docs/benchmarks.md).
 *
 * The product: mma.sync m16n8k16 with the weights as A (16 rows: the
 * lane's rows g and g + 8, as cuk_gemv_mma loads them) and x as B (8
 * tokens an n-tile), so a lane's accumulators are its own rows' and no
 * scale crosses lanes. A 32-column step lies in one 32-value group of a
 * block, of scale d1 = d * sc and min m1 = dmin * m (the host's
 * products): its value is d1 q - m1 (Q5_K: q < 32). A takes 128 + q,
 * exact in bf16 as the bits 0x4300 | q, and the step's sums are
 *     sum x (d1 q - m1) = d1 C - (128 d1 + m1) S,
 * C = sum x (128 + q) from the mma and S = sum x. Q6_K's scales cover 16
 * values (value d sc (q - 32), q < 64), so each of its k-steps takes one
 * scale's 16 columns and adds d sc (C - 160 S). The weights enter exactly
 * (the bf16 copies round them); x is rounded to bf16 as for a bf16 model.
 * How a warp reads a block is qmma_dq.cuh's.
 *
 * Work a group: S is made once a launch for every group and token (by
 * an mma with A all ones, kept after the ring), a chunk's coefficients
 * once (four a lane, written over its slot), and a word of codes is
 * masked once and widened two values a byte permute (docs/benchmarks.md,
 * session 59: +3-16 % over making them per group).
 *
 * Loads: each warp a ring of 2-4 slots in shared memory, a slot one block
 * (256 columns) of its unit's 16 rows, filled by 16-byte asynchronous
 * copies of all its lanes, the first slots before the wait for the
 * previous kernel; one block an SM, of 8 warps (16 with
 * cfg->qmma_warps). Q6_K's 210-byte blocks are 2-aligned: a slot row is
 * the 14 aligned pieces over the block, none read past it. Every output
 * is summed in an order fixed by the shapes and the device: the same
 * bits on every call. */
#include "backend/cuda/gemv_mma.cuh"
#include "backend/cuda/qmma_dq.cuh"

/* A 16-byte asynchronous copy to shared memory of the first `bytes` (0
 * to 16) of src, zeros after them, the source evicted first from L2:
 * weights stream. */
static __device__ __forceinline__ void qmma_cp16(uint32_t dst, const void *src, int bytes)
{
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(dst),
                 "l"(src), "r"(bytes), "l"(cuk_l2_evict_first()));
}

/* Tile row r's (0..15) weights of unit u: row row0 + r (a pair: gate's
 * rows row0 .. row0 + 7, then up's), the last row again past the end. */
template <bool PAIR>
static __device__ __forceinline__ const uint8_t *qmma_row(const struct mmap &p,
                                                          const struct mma_unit &u, int r)
{
    if (PAIR) {
        const int rr = min(u.row0 + (r & 7), p.rows[0] - 1);
        return (r < 8 ? p.w[0] : p.w[1]) + (size_t)rr * p.row_bytes;
    }
    const int rows = u.m == 0 ? p.rows[0] : u.m == 1 ? p.rows[1] : p.rows[2];
    const uint8_t *w = u.m == 0 ? p.w[0] : u.m == 1 ? p.w[1] : p.w[2];
    return w + (size_t)min(u.row0 + r, rows - 1) * p.row_bytes;
}

/* Block blk of a unit's 16 rows into the slot at dst (row r at r * BB),
 * or zeros where !ok (past the unit's steps, or an invalid unit). Lane L
 * copies row L / 2's 16-byte pieces L % 2, L % 2 + 2, ... from row, the
 * unit's row L / 2 (qmma_row, found once a unit: working out each piece's
 * row at every chunk was a sixth of the kernel's instructions, ncu x395). */
template <int DT>
static __device__ __forceinline__ void qmma_issue(uint32_t dst, const uint8_t *row,
                                                  const uint8_t *any, int blk, bool ok, int lane)
{
    using F = qmma_fmt<DT>;
    constexpr int PC = F::BB / 16; /* pieces a row */
    const uint8_t *b = row + (size_t)blk * F::BYTES;
    /* Q6_K: the aligned pieces over the block, none read past it */
    const uint8_t *a0 = F::K6 ? (const uint8_t *)((uintptr_t)b & ~(uintptr_t)15) : b;
    dst += (lane >> 1) * F::BB;
#pragma unroll
    for (int m = 0; m < (PC + 1) / 2; m++) {
        const int k = 2 * m + (lane & 1);
        if (k >= PC)
            break;
        const uint8_t *a = a0 + 16 * k;
        const long left = F::K6 ? (long)(b + F::BYTES - a) : 16;
        const int bytes = !ok || left <= 0 ? 0 : left >= 16 ? 16 : (int)left;
        qmma_cp16(dst + 16 * k, bytes ? a : any, bytes);
    }
}

/* Until the chunk issued slots - 1 commits ago has landed (this
 * thread's copies of it). */
static __device__ __forceinline__ void qmma_wait(int slots)
{
    if (slots >= 4)
        cuk_cp_async_wait<3>();
    else if (slots == 3)
        cuk_cp_async_wait<2>();
    else
        cuk_cp_async_wait<1>();
}

/* Stages columns [c0, c0 + cols) of x's n rows (ld floats apart) after
 * the input op, rounded to bf16, into xs (row j at j * stride): each row
 * in `parts` runs of its float4s (qmma_parts), item i = row i / parts,
 * run i % parts, to warps i = w, w + W, ..., a lane's float4s lane, lane +
 * 32, ... of its run, `loads` (at most qmma_stage_loads) at a time. For a norm over whole rows
 * (defer) the staged row is x * w: its 1 / rms, a factor of every product
 * of the token, comes from the same loads and qmma_finish applies it.
 * With one part a row it goes to sinv[j] (mma_row_inv's sums in
 * mma_row_inv's order, so the same bits); with more, each run's sum goes
 * to sq[j * parts + run] and qmma_rms_parts adds them in run order. So a
 * block reads x once, where the norm's pass and the staging had read it
 * twice, one load in flight a thread (ncu x395: ~45 % of a q/k/v
 * launch's stall samples). Not deferred, sinv holds 1 / rms already (a
 * window's norm: mma_rms_inv). */
template <int IN, int W>
static __device__ __forceinline__ void qmma_stage(uint16_t *xs, float *sinv, float *sq,
                                                  const struct cuk_gemv_in &in, int n, int cols,
                                                  int ld, int c0, int stride, bool defer,
                                                  int parts, int loads, bool whole)
{
    constexpr int B = qmma_stage_loads(W);
    const int lane = threadIdx.x & 31, nf = cols / 4, nb = min(loads, B);
    for (int i = threadIdx.x >> 5; i < n * parts; i += W) {
        const int j = i / parts, h = i - j * parts;
        const int lo = h * nf / parts, hi = (h + 1) * nf / parts;
        const float4 *x = (const float4 *)(in.x + (size_t)j * ld + c0);
        const float4 *y = (const float4 *)(IN == CUK_IN_RMSNORM ? in.nw + c0
                                           : IN == CUK_IN_SWIGLU ? in.x2 + (size_t)j * ld + c0
                                                                 : in.x);
        const float inv = IN == CUK_IN_RMSNORM && !defer ? sinv[j] : 1.0f;
        float4 sqs = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int f0 = lo + lane; f0 < hi; f0 += nb * 32) {
            float4 v[B], w[B];
#pragma unroll
            for (int b = 0; b < B; b++)
                if (b < nb && f0 + 32 * b < hi) {
                    v[b] = __ldg(x + f0 + 32 * b);
                    if (IN != CUK_IN_X)
                        w[b] = __ldg(y + f0 + 32 * b);
                }
#pragma unroll
            for (int b = 0; b < B; b++)
                if (b < nb && f0 + 32 * b < hi) {
                    float4 o = v[b];
                    if (IN == CUK_IN_RMSNORM && defer) {
                        sqs.x = fmaf(o.x, o.x, sqs.x);
                        sqs.y = fmaf(o.y, o.y, sqs.y);
                        sqs.z = fmaf(o.z, o.z, sqs.z);
                        sqs.w = fmaf(o.w, o.w, sqs.w);
                        o = make_float4(w[b].x * o.x, w[b].y * o.y, w[b].z * o.z, w[b].w * o.w);
                    } else if (IN != CUK_IN_X) {
                        o = gemv_in_op4<IN>(o, w[b], inv);
                    }
                    mma_put4(xs, stride, j, f0 + 32 * b, o, 1);
                }
        }
        if (IN == CUK_IN_RMSNORM && defer) {
            const float ss = cuk_warp_sum((sqs.x + sqs.y) + (sqs.z + sqs.w));
            if (lane == 0 && parts == 1 && whole)
                sinv[j] = 1.0f / sqrtf(ss / (float)cols + in.eps);
            else if (lane == 0)
                sq[i] = ss;
        }
    }
}

/* sinv[j] from the runs' sums of squares qmma_stage left in sq, added
 * in run order, and in a cluster of cl blocks (each its share of the
 * row's len columns) in rank order, read from each rank's sq (after a
 * barrier of the cluster; thread j). */
static __device__ __forceinline__ void qmma_rms_parts(float *sinv, const float *sq, int n,
                                                      int len, int parts, int cl, float eps)
{
    const int j = threadIdx.x;
    if (j < n) {
        float ss = 0.0f;
        const uint32_t a = cuk_smem_addr(sq + j * parts);
        for (int r = 0; r < cl; r++)
            for (int h = 0; h < parts; h++)
                ss += cl == 1 ? sq[j * parts + h] : cuk_dsmem_ld(cuk_dsmem_addr(a + 4 * h, r));
        sinv[j] = 1.0f / sqrtf(ss / (float)len + eps);
    }
}

/* S: each 32-column group's sum of the staged x per token (Q6_K: of each
 * 16-column half), the mma's sum with A all ones, as the products' mma
 * sees x, made once a launch, warp w taking groups w, w + W, ...:
 * sg[part * 8 NTL + token], part the group (Q6_K: 2 group + half). */
template <int DT, int NTL, int W>
static __device__ __forceinline__ void qmma_sums(float *sg, const uint16_t *xs, int stride, int n,
                                                 int cols, int g, int tig)
{
    const uint32_t ones[4] = {0x3F803F80u, 0x3F803F80u, 0x3F803F80u, 0x3F803F80u};
    for (int s = threadIdx.x >> 5; s < cols / 32; s += W)
#pragma unroll
        for (int nt = 0; nt < NTL; nt++) {
            const uint4 xv = qmma_x<DT>(xs, stride, 8 * nt + g, n, s * 32, tig);
            float sx[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sy[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            cuk_mma16816<false>(sx, ones, xv.x, xv.y);
            cuk_mma16816<false>(DT == DT_Q6_K ? sy : sx, ones, xv.z, xv.w);
            /* sx[0..1]: tokens 8 nt + 2t, + 1 (every row the same) */
            if (g == 0 && DT == DT_Q6_K) {
                *(float2 *)(sg + 2 * s * 8 * NTL + 8 * nt + 2 * tig) = make_float2(sx[0], sx[1]);
                *(float2 *)(sg + (2 * s + 1) * 8 * NTL + 8 * nt + 2 * tig) =
                    make_float2(sy[0], sy[1]);
            } else if (g == 0) {
                *(float2 *)(sg + s * 8 * NTL + 8 * nt + 2 * tig) = make_float2(sx[0], sx[1]);
            }
        }
}

/* acc += chunk j of unit u (codes r, coefficients cf) against the
 * staged x and its sums sg: NTL n-tiles of 8 tokens; acc[nt][0..1] row
 * g, tokens 8 nt + 2t, +1; [2..3] row g + 8 (a pair: up's row g). */
template <int DT, int NTL>
static __device__ __forceinline__ void qmma_step(float (&acc)[NTL][4], const qmma_raw &r,
                                                 const float4 *cf, const struct mma_unit &u,
                                                 int j, const uint16_t *xs, const float *sg,
                                                 int stride, int n, int g, int tig)
{
    const int s0 = u.s0 + j * QMMA_U;
    if (!u.valid || s0 >= u.s1) /* the same for the whole warp */
        return;
#pragma unroll
    for (int i = 0; i < QMMA_U; i++) {
        uint32_t a0[4], a1[4];
        qmma_a<DT>(r, i, a0, a1);
        const float4 c4 = cf[8 * i + g];
        const float ca[2] = {c4.x, c4.z}, cb[2] = {c4.y, c4.w};
#pragma unroll
        for (int nt = 0; nt < NTL; nt++) {
            const uint4 xv = qmma_x<DT>(xs, stride, 8 * nt + g, n, (s0 + i) * 32, tig);
            float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            cuk_mma16816<false>(c, a0, xv.x, xv.y);
            if constexpr (DT == DT_Q6_K) {
                /* the halves apart: d sc (c - 160 S) each, q + 128 - 160 = q - 32 */
                float c2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                cuk_mma16816<false>(c2, a1, xv.z, xv.w);
                const float *sp = sg + 2 * (s0 + i) * 8 * NTL + 8 * nt + 2 * tig;
                const float2 s1 = *(const float2 *)sp, s2 = *(const float2 *)(sp + 8 * NTL);
                const float sa[2] = {s1.x, s1.y}, sb[2] = {s2.x, s2.y};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int h = e / 2;
                    acc[nt][e] = fmaf(ca[h], fmaf(-160.0f, sa[e & 1], c[e]),
                                      fmaf(cb[h], fmaf(-160.0f, sb[e & 1], c2[e]), acc[nt][e]));
                }
            } else {
                cuk_mma16816<false>(c, a1, xv.z, xv.w);
                const float2 sv = *(const float2 *)(sg + (s0 + i) * 8 * NTL + 8 * nt + 2 * tig);
                const float sx[2] = {sv.x, sv.y};
                /* c[0..1]: row g, tokens 2t, 2t + 1; c[2..3]: row g + 8 */
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int h = e / 2;
                    acc[nt][e] = fmaf(ca[h], c[e], fmaf(-cb[h], sx[e & 1], acc[nt][e]));
                }
            }
        }
    }
}

/* The end of a unit: the ks slices' sums added in slice order (through
 * shared memory) by the tile's first warp, which applies the output op
 * (mma_finish's, for this kernel's layout). */
template <bool PAIR, int NTL, int W>
static __device__ __forceinline__ void qmma_finish(float (&acc)[NTL][4], const struct mmap &p,
                                                   const struct mma_unit &u, int round,
                                                   float *scratch, const float *sinv, int g,
                                                   int tig, int rank)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *mine = scratch + ((round & 1) * W + warp) * 256;
    if (p.ks > 1) {
#pragma unroll
        for (int e = 0; e < 4 * NTL; e++)
            mine[e * 32 + lane] = acc[e / 4][e % 4];
        __syncthreads();
        if (u.ks == 0)
            for (int k = 1; k < p.ks; k++)
#pragma unroll
                for (int e = 0; e < 4 * NTL; e++)
                    acc[e / 4][e % 4] += mine[k * 256 + e * 32 + lane];
    }
    if (p.cl > 1) {
        /* the cluster's ranks' sums of the tile (each over its columns),
         * added by rank 0 in rank order from each rank's slot of this
         * round (the other round's slots are being written meanwhile: a
         * rank writes this one again two rounds on, after the next
         * meeting, which rank 0 reaches once it has read) */
        if (u.ks == 0)
#pragma unroll
            for (int e = 0; e < 4 * NTL; e++)
                mine[e * 32 + lane] = acc[e / 4][e % 4];
        cuk_cluster_sync();
        if (rank == 0 && u.ks == 0) {
            const uint32_t a = cuk_smem_addr(mine + lane);
            for (int r = 1; r < p.cl; r++)
#pragma unroll
                for (int e = 0; e < 4 * NTL; e++)
                    acc[e / 4][e % 4] += cuk_dsmem_ld(cuk_dsmem_addr(a + 4 * 32 * e, r));
        }
    }
    if (u.valid && u.ks == 0 && rank == 0) {
        if (sinv) /* the norm's 1 / rms, deferred (qmma_stage): the token's factor */
#pragma unroll
            for (int nt = 0; nt < NTL; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float s = sinv[min(8 * nt + 2 * tig + e, p.n - 1)];
                    acc[nt][e] *= s;
                    acc[nt][2 + e] *= s;
                }
        const int rows = u.m == 0 ? p.rows[0] : u.m == 1 ? p.rows[1] : p.rows[2];
        float *out = u.m == 0 ? p.outp[0] : u.m == 1 ? p.outp[1] : p.outp[2];
        /* the lane's outputs: tokens 8 nt + 2t + e, rows row0 + 8 h + g */
        auto ok = [&](int nt, int e, int h) {
            return 8 * nt + 2 * tig + e < p.n && u.row0 + 8 * h + g < rows;
        };
        auto at = [&](int nt, int e, int h) {
            return out + (size_t)(8 * nt + 2 * tig + e) * rows + u.row0 + 8 * h + g;
        };
        if constexpr (PAIR) {
#pragma unroll
            for (int nt = 0; nt < NTL; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    if (ok(nt, e, 0))
                        *at(nt, e, 0) = cuk_silu_mul1(acc[nt][e], acc[nt][2 + e]);
        } else {
            auto each = [&](auto &&f) { /* f(nt, e, h) for each output the lane has */
#pragma unroll
                for (int nt = 0; nt < NTL; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
#pragma unroll
                        for (int h = 0; h < 2; h++)
                            if (ok(nt, e, h))
                                f(nt, e, h);
            };
            /* every value added to is read before any output is written:
             * the L2 trips in flight together, not one after another */
            float old[NTL][2][2] = {};
            if (p.out == CUK_OUT_ADD)
                each([&](int nt, int e, int h) { old[nt][e][h] = __ldcg(at(nt, e, h)); });
            each([&](int nt, int e, int h) {
                *at(nt, e, h) = p.out == CUK_OUT_ADD ? old[nt][e][h] + acc[nt][2 * h + e]
                                                     : acc[nt][2 * h + e];
            });
        }
    }
#pragma unroll
    for (int e = 0; e < 4 * NTL; e++)
        acc[e / 4][e % 4] = 0.0f;
}

/* W warps a block (8 or 16), one block an SM; DT: Q4_K or Q5_K; NT: 8
 * or 16 tokens at most. */
template <int DT, int NT, int IN, bool PAIR, int W>
__global__ void __launch_bounds__(W * 32, 1)
    k_gemv_qmma(const struct mmap p, const struct cuk_gemv_in in)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int NTL = NT / 8;
    extern __shared__ __align__(16) unsigned char qm_smem[];
    uint16_t *xs = (uint16_t *)qm_smem;
    const size_t xbytes = MMA_XBYTES(p.n, p.stride);
    float *scratch = (float *)(qm_smem + xbytes);
    float *sinv = (float *)(qm_smem + xbytes + p.ubytes);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
    /* a cluster of p.cl blocks takes the tiles one block would, each rank
     * its p.cols columns of them: the clusters are the grid */
    const int rank = (int)blockIdx.x % p.cl;
    const int grid = (int)gridDim.x / p.cl, blk = (int)blockIdx.x / p.cl;
    const size_t woff = (size_t)rank * (p.cols / 256) * qmma_fmt<DT>::BYTES;
    const int rounds = blk < p.bunits ? (p.bunits - blk + grid - 1) / grid : 0;
    const int nchunks = rounds * p.cpu;
    /* the warp's unit of a round */
    auto unit = [&](int round) { return mma_unit_of<PAIR>(p, (round * grid + blk) * W + warp); };
    using F = qmma_fmt<DT>;
    constexpr int SLOT = QMMA_SLOT(F::BB);
    unsigned char *ring = qm_smem + p.ring_off + (size_t)warp * p.slots * SLOT;
    float *sg = (float *)(qm_smem + p.ring_off + (size_t)W * p.slots * SLOT);
    const uint32_t ring_a = cuk_smem_addr(ring);
    /* The copies' cursor: chunk ij of round ir's unit iu (the lane's row
     * of it irow) goes to slot is next; moved chunk by chunk, the units
     * and rows worked out once a unit. */
    int ir = 0, ij = 0, is = 0;
    struct mma_unit iu = unit(0);
    const uint8_t *irow = qmma_row<PAIR>(p, iu, lane >> 1) + woff;
    auto issue = [&]() {
        qmma_issue<DT>(ring_a + is * SLOT, irow, p.w[0], iu.s0 / QMMA_U + ij,
                       iu.valid && iu.s0 + ij * QMMA_U < iu.s1, lane);
        is = is + 1 == p.slots ? 0 : is + 1;
        if (++ij == p.cpu) {
            ij = 0;
            iu = unit(++ir);
            irow = qmma_row<PAIR>(p, iu, lane >> 1) + woff;
        }
    };
    /* The weights never change: the first slots - 1 chunks go before the
     * wait for the previous kernel. A group is committed per chunk, even
     * an empty one, so that the waits count chunks. */
    for (int c = 0; c < p.slots - 1; c++) {
        if (c < nchunks)
            issue();
        cuk_cp_async_commit();
    }
    cuk_pdl_start();
    /* a norm over the window's (the cluster's) columns only where they
     * are the whole row */
    const bool defer = IN == CUK_IN_RMSNORM && p.cols * p.cl == p.xld;
    if (IN == CUK_IN_RMSNORM && !defer) {
        mma_rms_inv(sinv, in.x, p.n, p.xld, in.eps);
        __syncthreads();
    }
    /* the runs' sums of squares after x's sums (QMMA_SQ) */
    float *sq = (float *)((unsigned char *)sg + QMMA_SUMS(DT, p.n, p.cols) - QMMA_SQ);
    const int parts = p.parts;
    qmma_stage<IN, W>(xs, sinv, sq, in, p.n, p.cols, p.xld, p.xc0 + rank * p.cols, p.stride,
                      defer, parts, p.loads, p.cl == 1);
    if (p.cl > 1)
        cuk_cluster_sync(); /* every rank's sums of squares written */
    else
        __syncthreads();
    if (defer && (parts > 1 || p.cl > 1))
        qmma_rms_parts(sinv, sq, p.n, p.xld, parts, p.cl, in.eps);
    qmma_sums<DT, NTL, W>(sg, xs, p.stride, p.n, p.cols, g, tig);
    __syncthreads();
    float acc[NTL][4] = {};
    /* The products' cursor: chunk j of round's unit cu, in slot sl; Q6_K's
     * blocks start at their address % 16 in a slot row, so the lane keeps
     * the rows it reads (g, g + 8, and lane % 16 for the header). */
    int j = 0, round = 0, sl = 0;
    struct mma_unit cu = unit(0);
    const uint8_t *rows[3];
    auto unit_rows = [&]() {
        if (F::K6) {
            rows[0] = qmma_row<PAIR>(p, cu, g) + woff;
            rows[1] = qmma_row<PAIR>(p, cu, g + 8) + woff;
            rows[2] = qmma_row<PAIR>(p, cu, lane & 15) + woff;
        }
    };
    unit_rows();
    for (int c = 0; c < nchunks; c++) {
        __syncwarp(); /* chunk c - 1's coefficients read: its slot is free */
        if (c + p.slots - 1 < nchunks)
            issue();
        cuk_cp_async_commit();
        qmma_wait(p.slots);
        __syncwarp(); /* every lane's copies of chunk c landed */
        unsigned char *slot = ring + sl * SLOT;
        const size_t boff = (size_t)(cu.s0 / QMMA_U + j) * F::BYTES;
        auto skew = [&](int h) { return F::K6 ? (int)((uintptr_t)(rows[h] + boff) & 15) : 0; };
        const int sk[2] = {skew(0), skew(1)};
        qmma_raw r;
        qmma_read<DT>(r, slot, g, tig, sk);
        const uint4 hd = qmma_head<DT>(slot, lane & 15, skew(2), lane >> 4);
        __syncwarp(); /* the slot read: its first KB takes the coefficients */
        qmma_coefs<DT>((float4 *)slot, hd, lane);
        __syncwarp();
        qmma_step<DT, NTL>(acc, r, (const float4 *)slot, cu, j, xs, sg, p.stride, p.n, g, tig);
        sl = sl + 1 == p.slots ? 0 : sl + 1;
        if (++j == p.cpu) {
            qmma_finish<PAIR, NTL, W>(acc, p, cu, round, scratch, defer ? sinv : nullptr, g,
                                      tig, rank);
            j = 0;
            cu = unit(++round);
            unit_rows();
        }
    }
    if (p.cl > 1)
        cuk_cluster_sync(); /* rank 0's reads of the last round's slots done */
#else
    cuk_pdl_start();
#endif
}

template <int DT, int NT, int IN, bool PAIR>
static cudaError_t qmma_launch(cudaStream_t s, const struct mmap &p, const struct cuk_gemv_in &in,
                               int grid, size_t smem, int w)
{
    static struct cuk_opted opted[2]; /* per instantiation, see cuk_smem_opt_in */
    auto k = w == 16 ? k_gemv_qmma<DT, NT, IN, PAIR, 16> : k_gemv_qmma<DT, NT, IN, PAIR, 8>;
    cudaError_t err = cuk_smem_opt_in(k, smem, &opted[w == 16]);
    if (err != cudaSuccess)
        return err;
    if (p.cl > 1) {
        /* no more clusters than run at once (a GPC's SMs need not be a
         * multiple of p.cl): the clusters are persistent, a later wave
         * only waits; measured per instantiation, warps, size and shared
         * memory (the last asked for each) */
        static struct {
            size_t smem;
            int m;
        } most[2][3];
        auto &mc = most[w == 16][p.cl == 2 ? 0 : p.cl == 4 ? 1 : 2];
        if (mc.smem != smem) {
            int m = 0;
            cudaLaunchAttribute at;
            at.id = cudaLaunchAttributeClusterDimension;
            at.val.clusterDim.x = (unsigned)p.cl;
            at.val.clusterDim.y = at.val.clusterDim.z = 1;
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3((unsigned)grid);
            cfg.blockDim = dim3((unsigned)w * 32);
            cfg.dynamicSmemBytes = smem;
            cfg.attrs = &at;
            cfg.numAttrs = 1;
            if ((err = cudaOccupancyMaxActiveClusters(&m, k, &cfg)) != cudaSuccess)
                return err;
            if (m < 1)
                return cudaErrorNotSupported;
            mc.smem = smem;
            mc.m = m;
        }
        if (grid > mc.m * p.cl)
            grid = mc.m * p.cl;
    }
    return cuk_launch_cluster(k, (unsigned)grid, (unsigned)w * 32, smem, s, dim3(p.cl, 1, 1), p,
                              in);
}

template <int DT, int NT>
static cudaError_t qmma_launch_in(cudaStream_t s, const struct mmap &p,
                                  const struct cuk_gemv_in &in, int grid, size_t smem, int w)
{
    if (p.out == CUK_OUT_SWIGLU)
        return qmma_launch<DT, NT, CUK_IN_RMSNORM, true>(s, p, in, grid, smem, w);
    if (in.kind == CUK_IN_RMSNORM)
        return qmma_launch<DT, NT, CUK_IN_RMSNORM, false>(s, p, in, grid, smem, w);
    if (in.kind == CUK_IN_SWIGLU)
        return qmma_launch<DT, NT, CUK_IN_SWIGLU, false>(s, p, in, grid, smem, w);
    return qmma_launch<DT, NT, CUK_IN_X, false>(s, p, in, grid, smem, w);
}

cudaError_t mma_launch_quant(cudaStream_t s, int dt, int n, const struct mmap &p,
                             const struct cuk_gemv_in &in, int grid, size_t smem, int w)
{
    if (dt == DT_Q4_K)
        return n <= 8 ? qmma_launch_in<DT_Q4_K, 8>(s, p, in, grid, smem, w)
                      : qmma_launch_in<DT_Q4_K, 16>(s, p, in, grid, smem, w);
    if (dt == DT_Q5_K)
        return n <= 8 ? qmma_launch_in<DT_Q5_K, 8>(s, p, in, grid, smem, w)
                      : qmma_launch_in<DT_Q5_K, 16>(s, p, in, grid, smem, w);
    if (dt == DT_Q6_K)
        return n <= 8 ? qmma_launch_in<DT_Q6_K, 8>(s, p, in, grid, smem, w)
                      : qmma_launch_in<DT_Q6_K, 16>(s, p, in, grid, smem, w);
    return cudaErrorNotSupported;
}
