/* gemv_mma.cu - the batched decode step's tensor-core GEMV
 * (gemv_mma.cuh): the launch shape, and the bf16 / f16 instances. */
#include "backend/cuda/gemv_mma.cuh"
#include "backend/cuda/qmma_rule.h"

extern "C" size_t cuk_gemv_mma_smem(int n, int cols)
{
    return mma_smem(n, cols, 2, 8);
}

extern "C" size_t cuk_gemv_qmma_smem(int dt, int n, int cols)
{
    if (!qmma_block_bytes(dt))
        return 0;
    return mma_smem(n, cols, 2, 8) + QMMA_RING(8, QMMA_MIN_SLOTS, qmma_block_bytes(dt)) +
           QMMA_SUMS(dt, n, cols);
}

extern "C" int cuk_qmma_cluster(const struct cuk_mma_cfg *cfg, int dt, int cols, int n)
{
    const int cl = cfg->qmma_cluster > 0 ? cfg->qmma_cluster : qmma_cluster_default(cols, n);
    return qmma_block_bytes(dt) > 0 && cl > 1 && cols % 256 == 0 && (cols / 256) % cl == 0 ? cl
                                                                                       : 1;
}

/* cuk_gemv_mma over columns [c0, c0 + cw) of the weights and of x (the
 * K-quants' windows; c0 = 0, cw = cols: all of them). */
static cudaError_t gemv_mma(cudaStream_t s, float *const *outs, const struct cuk_gemv_in *in,
                            int n, const struct cuk_weight *const *ws, int k, int out, int c0,
                            int cw, const struct cuk_mma_cfg *cfg)
{
    if (n < 1 || n > CUK_MMA_MAX_N || k < 1 || k > 3 || !in || !cfg || cfg->n_sms < 1 ||
        in->kind < CUK_IN_X || in->kind > CUK_IN_SPLITS || out < CUK_OUT_STORE ||
        out > CUK_OUT_SWIGLU || (out == CUK_OUT_SWIGLU && (k != 2 || ws[0]->rows != ws[1]->rows)))
        return cudaErrorInvalidValue;
    /* what it does not take: the attention's partials, SwiGLU's output
     * without the norm (as a layer has it), other dtypes and shapes */
    if (in->kind == CUK_IN_SPLITS || (out == CUK_OUT_SWIGLU && in->kind != CUK_IN_RMSNORM))
        return cudaErrorNotSupported;
    const float *x2 = in->kind == CUK_IN_RMSNORM ? in->nw
                      : in->kind == CUK_IN_SWIGLU ? in->x2
                                                  : NULL;
    if (!in->x || ((uintptr_t)in->x & 15) || (in->kind != CUK_IN_X && (!x2 || ((uintptr_t)x2 & 15))))
        return cudaErrorNotSupported;
    const int dt = ws[0]->dtype;
    const int qbb = qmma_block_bytes(dt); /* gemv_mma_quant.cu's dtypes */
    const bool quant = qbb > 0;
    /* K-quants in clusters of cl blocks, each 1 / cl of the columns (not
     * with windows): x's traffic from L2 a cl-th */
    const int cl = c0 == 0 && cw == ws[0]->cols ? cuk_qmma_cluster(cfg, dt, cw, n) : 1;
    const int cols = cw / cl;
    /* a window: K-quants only, whole blocks, not a SwiGLU pair's (whose
     * sums must be whole before the SiLU) */
    const bool window = c0 != 0 || cw != ws[0]->cols;
    if (window && (!quant || c0 < 0 || cw < 256 || c0 % 256 || cw % 256 ||
                   c0 + cw > ws[0]->cols || out == CUK_OUT_SWIGLU))
        return cudaErrorInvalidValue;
    /* its blocks' warps: 8 or 16 as asked, else 16 where they fill the SMs */
    const int qwarps = cfg->qmma_warps > 0 ? cfg->qmma_warps : 16;
    if ((dt != DT_BF16 && dt != DT_F16 && !quant) || cols < 32 || cols % 32 ||
        (cuk_q_low_bit(dt) && cols % cuk_q_block_elems(dt)))
        return cudaErrorNotSupported;
    struct mmap p = {};
    p.out = out;
    p.n = n;
    p.cols = cols;
    p.stride = mma_stride(cols);
    p.xld = ws[0]->cols;
    p.xc0 = c0;
    p.cl = cl;
    p.row_bytes = dt == DT_Q8_0 ? (size_t)cols
                  : quant       ? cuk_q_row_bytes(dt, ws[0]->cols)
                                : (size_t)cols * 2;
    long tiles = 0;
    for (int i = 0; i < k; i++) {
        if (ws[i]->dtype != dt || ws[i]->cols != ws[0]->cols || ws[i]->rows < 1 ||
            ((uintptr_t)ws[i]->data & 15) || (dt == DT_Q8_0 && !ws[i]->scales))
            return cudaErrorNotSupported;
        p.outp[i] = outs[i];
        p.w[i] = (const uint8_t *)ws[i]->data + (quant ? cuk_q_row_bytes(dt, c0) : 0);
        p.sc[i] = dt == DT_Q8_0 ? ws[i]->scales : NULL;
        p.rows[i] = ws[i]->rows;
        p.tiles[i] = out == CUK_OUT_SWIGLU ? (i == 0 ? (ws[0]->rows + 7) / 8 : 0)
                                           : (ws[i]->rows + 15) / 16;
        tiles += p.tiles[i];
    }
    /* Warps a block: 16 (one block an SM, x staged once an SM) where
     * that fits, else 8. Column slices per tile (up to a block's warps):
     * the least time for the slowest warp, counted in chunks: per round of
     * units, its chunks plus one for the barrier and the slices' sums when
     * there are several; ties to fewer slices. (Without that one, 16
     * slices won an 8B model's q/k/v in three rounds and were slower than
     * 4 in one; with it, a 0.6B model's o and down projections take 16 and
     * twice the SMs: docs/benchmarks.md, nineteenth pass.) */
    const int steps = cols / 32;
    const size_t smem_max = cfg->smem_max > 0 ? (size_t)cfg->smem_max : 48 * 1024;
    long best = -1;
    int grid = 0, w = 0, blocks_sm = 1;
    for (int wi = 0; wi < 2 && best < 0; wi++) {
        const int ww = wi == 0 ? 16 : 8;
        if ((cfg->warps > 0 && cfg->warps != ww) || (quant && ww > qwarps))
            continue;
        for (int ks = 1; ks <= ww; ks *= 2) { /* a tile's slices in one block */
            size_t sm = mma_smem(n, cols, ks, ww) + (cl > 1 && ks == 1 ? MMA_SCRATCH(ww) : 0) +
                        (quant ? QMMA_RING(ww, QMMA_MIN_SLOTS, qbb) + QMMA_SUMS(dt, n, cols) : 0);
            if (sm > smem_max || (cfg->ks > 0 && ks != cfg->ks))
                continue;
            /* (K-quants: one block an SM, its ring as deep as fits) */
            int per_sm = !quant && ww == 8 && sm <= mma_block_room(cfg, 2, smem_max) ? 2 : 1;
            if (cfg->blocks_per_sm > 0 && cfg->blocks_per_sm < per_sm)
                per_sm = cfg->blocks_per_sm;
            long bunits = (tiles * ks + ww - 1) / ww;
            const long most = (long)cfg->n_sms / cl * per_sm; /* (clusters) */
            long gr = bunits < most ? bunits : most;
            int slice = (steps + ks - 1) / ks, cpu = (slice + MMA_U - 1) / MMA_U;
            if (quant) { /* slices of whole blocks, a block a chunk */
                slice = (slice + QMMA_U - 1) / QMMA_U * QMMA_U;
                cpu = slice / QMMA_U;
            }
            long cost = (bunits + gr - 1) / gr * (cpu + (ks > 1));
            if (best < 0 || cost < best) {
                best = cost;
                p.ks = ks;
                p.slice = slice;
                p.cpu = cpu;
                p.bunits = (int)bunits;
                grid = (int)gr * cl;
                w = ww;
                blocks_sm = per_sm;
            }
        }
        /* K-quants' 16-warp blocks, unless asked for, only where they
         * fill the SMs: forced, an 8B model's q/k/v (384 tiles, x of 16
         * tokens leaving no room for slices' sums) made 24 blocks and
         * ran at half speed; so chosen, H100, no copies, 5-16 streams,
         * 0.6B and 8-layer 8B Q4_K and Q4_K_M: -2 to +4 %, +1.4 % on
         * average against 8 warps everywhere (docs/benchmarks.md,
         * session 59) */
        if (quant && ww == 16 && cfg->qmma_warps <= 0 && best >= 0 && grid < cfg->n_sms)
            best = -1;
    }
    if (best < 0)
        return cudaErrorNotSupported;
    /* x copied in as f32 (mma_copy_x) where its rows fit beside the half
     * copy, in the slices' scratch and beyond, without costing the chosen
     * shape its blocks per SM, nor the L1 cache the room the weights'
     * loads in flight need (MMA_L1_KEEP); the choice above does not
     * depend on it. */
    const size_t xbytes = MMA_XBYTES(n, p.stride);
    const size_t scratch = p.ks > 1 || cl > 1 ? MMA_SCRATCH(w) : 0;
    const size_t f32 = (size_t)n * cols * 4 * (in->kind == CUK_IN_SWIGLU ? 2 : 1);
    const size_t area = f32 > scratch ? f32 : scratch;
    size_t limit = mma_block_room(cfg, blocks_sm, smem_max);
    if (cfg->smem_sm > MMA_L1_KEEP && limit > (size_t)cfg->smem_sm - MMA_L1_KEEP - 1024)
        limit = (size_t)cfg->smem_sm - MMA_L1_KEEP - 1024;
    size_t ring = 0;
    if (quant) { /* x's staging for the chosen warps; the ring as deep as fits */
        p.loads = cfg->qmma_stage_rows ? 8 : qmma_stage_loads(w);
        p.parts = cfg->qmma_stage_rows ? 1 : qmma_parts(n, cols, w, p.loads);
        const size_t sums = QMMA_SUMS(dt, n, cols);
        p.slots = QMMA_MAX_SLOTS;
        while (p.slots > QMMA_MIN_SLOTS &&
               xbytes + scratch + MMA_INV + QMMA_RING(w, p.slots, qbb) + sums > smem_max)
            p.slots--;
        ring = QMMA_RING(w, p.slots, qbb) + sums;
    }
    /* (not the K-quants': qmma_stage reads x once, its norm's sums on the way) */
    p.copy_x = !cfg->stage_regs && !quant && xbytes + area + MMA_INV <= limit;
    p.ubytes = (int)(p.copy_x ? area : scratch);
    p.ring_off = (int)(xbytes + p.ubytes + MMA_INV);
    const size_t smem = xbytes + p.ubytes + MMA_INV + ring;
    cudaError_t err;
    if (quant)
        err = mma_launch_quant(s, dt, n, p, *in, grid, smem, w);
    else if (dt == DT_F16)
        err = n <= 8 ? mma_launch_in<true, 8>(s, p, *in, grid, smem, w)
                     : mma_launch_in<true, 16>(s, p, *in, grid, smem, w);
    else
        err = n <= 8 ? mma_launch_in<false, 8>(s, p, *in, grid, smem, w)
                     : mma_launch_in<false, 16>(s, p, *in, grid, smem, w);
    cudaError_t last = cudaGetLastError();
    return err != cudaSuccess ? err : last;
}

extern "C" cudaError_t cuk_gemv_mma(cudaStream_t s, float *const *outs,
                                    const struct cuk_gemv_in *in, int n,
                                    const struct cuk_weight *const *ws, int k, int out,
                                    const struct cuk_mma_cfg *cfg)
{
    return gemv_mma(s, outs, in, n, ws, k, out, 0, k >= 1 && ws ? ws[0]->cols : 0, cfg);
}

extern "C" cudaError_t cuk_gemv_qmma_window(cudaStream_t s, float *const *outs,
                                            const struct cuk_gemv_in *in, int n,
                                            const struct cuk_weight *const *ws, int k, int out,
                                            int c0, int cw, const struct cuk_mma_cfg *cfg)
{
    if (k < 1 || !ws || !qmma_block_bytes(ws[0]->dtype))
        return cudaErrorInvalidValue;
    return gemv_mma(s, outs, in, n, ws, k, out, c0, cw, cfg);
}
