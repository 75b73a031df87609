/* gemv_staged.cu - the one-token GEMV of decode for large matrices, its
 * weights copied into shared memory by bulk asynchronous copies
 * (cp.async.bulk completing on mbarriers) instead of streamed through
 * registers (gemv.cu).
 *
 * Why: a GEMV is bound by how many weight bytes are in flight. Through
 * registers that is a few vectors per lane; a ring in shared memory holds
 * 160 KB per SM whatever the registers, and the first copies go out
 * before the kernel waits for its predecessor (programmatic dependent
 * launch). The norm's weights are loaded before the wait too, and x is
 * read once for the norm and its staging. Measured on the H200 (cllm
 * bench, decode): an 8B model 207 -> 224 tok/s, a 0.6B model 983 -> 1,030
 * (its o, gate/up and down staged). Rows under 4 KB stay with gemv.cu:
 * each slot costs a wait and a refill, and at 2 KB that outweighs the
 * depth (a 0.6B model's 1,024-column LM head: 110 us staged, 78 us not).
 * A smaller ring, so that the next kernel's block fits beside this one,
 * was slower (112 KB: 8B 194 tok/s), as was a larger one (200 KB: 218).
 *
 * Shape: one block per SM, GEMV_WARPS warps. The units (output rows over
 * the k matrices; (gate, up) row pairs for the SwiGLU output) are dealt
 * round-robin over all the grid's warps, unit u to warp u mod (blocks x
 * warps), so a launch's last round is whole warps of every block. (Runs
 * of units per block, dealt over the block's warps, left the last round to
 * some blocks' warps: 8B 241.3 -> 245.5 tok/s, 0.6B 1,182 -> 1,208 dealt
 * over the grid, docs/benchmarks.md twenty-second pass.) Each warp owns a
 * ring of slots; a slot holds one column chunk of the warp's current unit
 * (its one or two rows). Lane 0 issues the copies and refills a slot as
 * soon as the warp has read it; no block barrier after x is staged.
 *
 * Arithmetic: gemv.cu's, so the outputs are cuk_gemv_fused's bits: x (or
 * rmsnorm(x), silu(x) * x2) staged by gemv_stage, lane l accumulating the
 * row's 16-byte vectors l, l+32, ... in increasing order with fmaf (a
 * chunk is whole multiples of 32 vectors, so lane l sees the same vectors
 * in the same order), then the same xor butterfly. sm_90 and later only
 * (the bulk copies); the caller checks. */
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/gemv_probe.cuh"

#define SG_MAX_SLOTS 32
#define SG_HDR 512          /* after the x tile: the norm's 1/rms and block sum */
#define SG_NORM_F4 8        /* float4 of x per thread in sg_norm_stage: cols <= 8192 */
#define SG_CHUNK_DEFAULT 2048 /* columns per copy at most (4 KB of bf16) */
#define SG_BATCH 4            /* vectors per lane loaded together */

struct sgp {
    float *outp[3];
    const char *w[3];
    int rows[3];
    int units;     /* rows of all k matrices, or (gate, up) row pairs */
    int out;       /* CUK_OUT_* */
    int cols, tile_cols, chunk, slots, slot_bytes;
    int xtra; /* bytes after SG_HDR: CUK_IN_SPLITS's weights */
    int pre;  /* slots a warp fills before the wait (the rest once x is staged) */
    int late; /* the next kernel launches once x is staged, not at the wait */
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* Matrix and row of unit u (not PAIR). */
static __device__ __forceinline__ int sg_row(const struct sgp &p, int u, int *m)
{
    *m = 0;
    if (u >= p.rows[0]) {
        u -= p.rows[0];
        *m = 1;
        if (u >= p.rows[1]) {
            u -= p.rows[1];
            *m = 2;
        }
    }
    return u;
}

/* Rows of matrix m; and the unit of its row `row` (sg_row's inverse).
 * No local copy of p: no indexing of its arrays. */
static __device__ __forceinline__ int sg_rows_of(const struct sgp &p, int m)
{
    return m == 0 ? p.rows[0] : m == 1 ? p.rows[1] : p.rows[2];
}
static __device__ __forceinline__ int sg_unit(const struct sgp &p, int m, int row)
{
    return row + (m >= 1 ? p.rows[0] : 0) + (m >= 2 ? p.rows[1] : 0);
}

/* Where unit u's output for token row r goes (not PAIR). */
static __device__ __forceinline__ float *sg_out(const struct sgp &p, int u, int r)
{
    int m, row = sg_row(p, u, &m);
    int mrows = sg_rows_of(p, m);
    return (m == 0 ? p.outp[0] : m == 1 ? p.outp[1] : p.outp[2]) + (size_t)r * mrows + row;
}

/* Lane 0's place in the warp's copy sequence: the next item's unit (its
 * matrix m and row; m stays 0 for pairs) and column chunk ch, and where
 * that chunk starts (src; for pairs src1, the up row's). Stepped along item
 * by item, so a refill does no 64-bit multiply or matrix lookup: the
 * refill runs between two slots' reading on every warp's critical path
 * (H200: 8B and 0.6B decode +0.3 %; a longer refill, in a run-time
 * dealing experiment, cost 2-4 %; docs/benchmarks.md, thirty-second
 * pass). */
struct sg_cur {
    const char *src, *src1;
    int m, row, ch;
};

/* The cursor at the first chunk of unit u. */
template <int BYTES, bool PAIR>
static __device__ __forceinline__ void sg_cur_at(const struct sgp &p, int u, sg_cur &c)
{
    c.m = 0;
    c.row = PAIR ? u : sg_row(p, u, &c.m);
    c.ch = 0;
    const char *w = c.m == 0 ? p.w[0] : c.m == 1 ? p.w[1] : p.w[2]; /* no local copy of p */
    const size_t off = (size_t)c.row * p.cols * BYTES;
    c.src = w + off;
    c.src1 = PAIR ? p.w[1] + off : nullptr;
}

/* The cursor one item on: the next chunk of the unit, or the first of the
 * unit ustride on (ustep bytes on from this one's last chunk, unless that
 * unit is in a later matrix). */
template <int BYTES, bool PAIR>
static __device__ __forceinline__ void sg_cur_next(const struct sgp &p, sg_cur &c, int nch,
                                                   int ustride, size_t ustep)
{
    if (++c.ch < nch) {
        c.src += (size_t)p.chunk * BYTES;
        if (PAIR)
            c.src1 += (size_t)p.chunk * BYTES;
        return;
    }
    c.ch = 0;
    c.row += ustride;
    if (!PAIR && c.row >= sg_rows_of(p, c.m)) {
        sg_cur_at<BYTES, PAIR>(p, sg_unit(p, c.m, c.row), c);
        return;
    }
    c.src += ustep;
    if (PAIR)
        c.src1 += ustep;
}

/* Lane 0: the copies of the cursor's item into slot dst (its barrier bar):
 * full bytes a chunk, last for a row's last. */
template <int BYTES, bool PAIR>
static __device__ __forceinline__ void sg_issue(const struct sgp &p, const sg_cur &c, int nch,
                                                unsigned full, unsigned last, unsigned char *dst,
                                                uint64_t *bar)
{
    const unsigned bytes = c.ch == nch - 1 ? last : full;
    const uint64_t pol = cuk_l2_evict_first();
    if (PAIR) {
        cuk_mbar_expect(bar, 2 * bytes);
        cuk_bulk_copy(dst, c.src, bytes, bar, pol);
        cuk_bulk_copy(dst + (size_t)p.chunk * BYTES, c.src1, bytes, bar, pol);
    } else {
        cuk_mbar_expect(bar, bytes);
        cuk_bulk_copy(dst, c.src, bytes, bar, pol);
    }
}
#endif

/* gemv_rms_inv + gemv_stage for one row of 512 < cols <= 8192 (the block
 * order: thread t sums the squares of float4 t, t + 256, ... in double,
 * then the block sum), the same bits with one read of x and one barrier
 * fewer: x is held in registers from the sum to the staging, the norm's
 * weights nwv were loaded before the PDL wait, and each warp sums the
 * warps' partials itself (in warp 0's order) instead of reading warp 0's.
 * part: GEMV_WARPS doubles of shared memory outside xs. Ends in a
 * barrier, as gemv_stage does. */
template <int WT>
static __device__ __forceinline__ void sg_norm_stage(float4 *xs, const float *x, const float4 *nwv,
                                                     int cols, float eps, double *part)
{
    constexpr int VE = gemv_cfg<WT>::VE;
    const int nf = cols / 4;
    float4 xv[SG_NORM_F4];
    double ss = 0;
#pragma unroll
    for (int k = 0; k < SG_NORM_F4; k++) {
        const int f = threadIdx.x + k * GEMV_THREADS;
        if (f < nf)
            xv[k] = __ldg((const float4 *)x + f);
    }
#pragma unroll
    for (int k = 0; k < SG_NORM_F4; k++)
        if (threadIdx.x + k * GEMV_THREADS < nf)
            ss += cuk_rms_sq(xv[k]);
    cuk_warp_part_d(ss, part);
    __syncthreads();
    ss = cuk_parts_sum_d(part, GEMV_WARPS);
    const float inv = cuk_rms_inv(ss, cols, eps);
#pragma unroll
    for (int k = 0; k < SG_NORM_F4; k++) {
        const int f = threadIdx.x + k * GEMV_THREADS;
        if (f < nf) {
            xs[gemv_xs_slot<VE>(f)] = gemv_in_op4<CUK_IN_RMSNORM>(xv[k], nwv[k], inv);
        }
    }
    __syncthreads();
}

/* The attention output of one query that cuk_attention_merge would write,
 * staged as x: its arithmetic (merge_splits in attention_mma.cu: each
 * head's split weights by cuk_split_weights, then each element the sum of
 * o c in split order, over L), so the same bits. in.x: the partials
 * (cuk_attention's workspace for one query and in.n_splits splits),
 * *in.nused of them with keys; cwl: shared memory of 2 heads x n_splits +
 * heads floats. Ends in a barrier. */
template <int WT>
static __device__ __forceinline__ void sg_splits_stage(float4 *xs, const struct cuk_gemv_in &in,
                                                       int cols, float *cwl)
{
    constexpr int VE = gemv_cfg<WT>::VE;
    const int hd = in.head_dim, S = in.n_splits, H = cols / hd, nu = *in.nused;
    const float *ws = in.x, *wm = ws + (size_t)H * S * hd, *wl = wm + (size_t)H * S;
    float *cw = cwl, *cl = cw + H * nu, *cL = cl + H * nu;
    for (int i = threadIdx.x; i < H * nu; i += GEMV_THREADS) {
        const int h = i / nu, sp = i - h * nu;
        cw[i] = __ldcg(wm + h * S + sp);
        cl[i] = __ldcg(wl + h * S + sp);
    }
    __syncthreads();
    for (int h = threadIdx.x; h < H; h += GEMV_THREADS)
        cL[h] = cuk_split_weights(cw + h * nu, cl + h * nu, nu);
    __syncthreads();
    for (int f = threadIdx.x; f < cols / 4; f += GEMV_THREADS) {
        const int h = 4 * f / hd, d = 4 * f - h * hd;
        const float4 *src = (const float4 *)(ws + (size_t)h * S * hd + d);
        const float *c = cw + h * nu;
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
        for (int sp = 0; sp < nu; sp++) {
            const float4 v = __ldcg(src + (size_t)sp * (hd / 4));
            o.x = fmaf(v.x, c[sp], o.x);
            o.y = fmaf(v.y, c[sp], o.y);
            o.z = fmaf(v.z, c[sp], o.z);
            o.w = fmaf(v.w, c[sp], o.w);
        }
        const float L = cL[h];
        xs[gemv_xs_slot<VE>(f)] = L > 0.0f ? make_float4(o.x / L, o.y / L, o.z / L, o.w / L)
                                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    __syncthreads();
}

/* (The 2 only caps registers at 128, which it stays under; its shared
 * memory leaves room for one block per SM.) NT: input rows (tokens), each
 * row of x staged as its own tile and accumulated on its own, in the
 * one-row order, as gemv.cu does for NT rows. */
template <int WT, int IN, bool PAIR, int NT>
__global__ void __launch_bounds__(GEMV_THREADS, 2)
    k_gemv_staged(const struct sgp p, const struct cuk_gemv_in in)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int VE = gemv_cfg<WT>::VE, BYTES = gemv_cfg<WT>::BYTES;
    extern __shared__ __align__(128) unsigned char sg_smem[];
    float4 *xs = (float4 *)sg_smem; /* NT tiles of tile_cols floats: multiples of 1 KB */
    const int tile_f4 = p.tile_cols / 4;
    float *sinv = (float *)(sg_smem + (size_t)NT * p.tile_cols * 4);
    uint64_t *bars = (uint64_t *)(sg_smem + (size_t)NT * p.tile_cols * 4 + SG_HDR + p.xtra);
    unsigned char *ring =
        (unsigned char *)bars + ((GEMV_WARPS * p.slots * 8 + 127) / 128) * 128;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#ifdef CUK_GEMV_PROBE
    gp_warp gpw;
    gpw.t0 = cuk_globaltimer();
#endif
    /* the warp's units: ubase, ubase + ustride, ... (nu of them) */
    const int ustride = (int)gridDim.x * GEMV_WARPS, ubase = (int)blockIdx.x * GEMV_WARPS + warp;
    const int nu = ubase < p.units ? (p.units - ubase + ustride - 1) / ustride : 0;
    const int nch = (p.cols + p.chunk - 1) / p.chunk, items = nu * nch;
    uint64_t *bar = bars + warp * p.slots;
    unsigned char *slot0 = ring + (size_t)warp * p.slots * p.slot_bytes;
    const unsigned cfull = (unsigned)(p.chunk * BYTES),
                   clast = (unsigned)((p.cols - (nch - 1) * p.chunk) * BYTES);
    const size_t ustep = (size_t)ustride * p.cols * BYTES - (size_t)(nch - 1) * p.chunk * BYTES;
    sg_cur cur; /* lane 0's: the next item to copy */
    const int first = min(items, p.slots), pre = min(first, p.pre);
    if (lane == 0) {
        for (int s = 0; s < p.slots; s++)
            cuk_mbar_init(bar + s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        if (items > 0)
            sg_cur_at<BYTES, PAIR>(p, ubase, cur);
        for (int i = 0; i < pre; i++) {
            sg_issue<BYTES, PAIR>(p, cur, nch, cfull, clast, slot0 + (size_t)i * p.slot_bytes,
                                  bar + i);
            if (i + 1 < items)
                sg_cur_next<BYTES, PAIR>(p, cur, nch, ustride, ustep);
        }
    }
    /* the norm's weights never change: load them before the wait too */
    const bool fast_norm =
        NT == 1 && IN == CUK_IN_RMSNORM && p.cols > 512 && p.cols <= 4 * GEMV_THREADS * SG_NORM_F4;
    float4 nwv[SG_NORM_F4];
    if (fast_norm) {
#pragma unroll
        for (int k = 0; k < SG_NORM_F4; k++) {
            const int f = threadIdx.x + k * GEMV_THREADS;
            if (f < p.cols / 4)
                nwv[k] = __ldg((const float4 *)in.nw + f);
        }
    }
    /* x and out are the previous kernel's */
    cuk_pdl_enter(p.late);
#ifdef CUK_GEMV_PROBE
    gp_released(gpw, p.cols, p.units, NT);
#endif
    /* Adding into out: lane k reads the value the warp's output k (unit
     * ubase + (k / NT) * ustride, token row k % NT) adds to, now, so that
     * its trip to L2 is not taken after each unit's sum, with the warp's
     * next weights waiting in the ring (outputs past 32 read it then). */
    float res = 0.0f;
    if (!PAIR && p.out == CUK_OUT_ADD && lane < nu * NT)
        res = __ldcg(sg_out(p, ubase + lane / NT * ustride, lane % NT));
    if (IN == CUK_IN_SPLITS) {
        sg_splits_stage<WT>(xs, in, p.cols, sinv + SG_HDR / 4);
    } else if (fast_norm) {
        sg_norm_stage<WT>(xs, in.x, nwv, p.cols, in.eps, (double *)(sinv + 4));
    } else {
        if (IN == CUK_IN_RMSNORM)
            gemv_rms_inv<NT, true>(sinv, in.x, p.cols, in.eps, (double *)xs);
        /* ends in a barrier */
        gemv_stage<WT, NT, IN, IN == CUK_IN_X ? 8 : 4>(xs, in, sinv, p.cols, 0, p.tile_cols);
    }
#ifdef CUK_GEMV_PROBE
    gp_stage(gpw, 2);
    bool gp_first = true;
#endif
    if (lane == 0)
        for (int i = pre; i < first; i++) {
            sg_issue<BYTES, PAIR>(p, cur, nch, cfull, clast, slot0 + (size_t)i * p.slot_bytes,
                                  bar + i);
            if (i + 1 < items)
                sg_cur_next<BYTES, PAIR>(p, cur, nch, ustride, ustep);
        }
    if (p.late)
        cuk_pdl_release();
    const int cvec = p.chunk / VE; /* vectors per chunk: a multiple of 32 */
    int s = 0;
    unsigned parity = 0;
    for (int j = 0, i = 0; j < nu; j++) {
        float acc0[NT], acc1[NT];
#pragma unroll
        for (int r = 0; r < NT; r++)
            acc0[r] = acc1[r] = 0.0f;
        for (int ch = 0; ch < nch; ch++, i++) {
            cuk_mbar_wait(bar + s, parity);
#ifdef CUK_GEMV_PROBE
            if (gp_first)
                gp_stage(gpw, 3);
            gp_first = false;
#endif
            const uint4 *wv = (const uint4 *)(slot0 + (size_t)s * p.slot_bytes);
            const int nvec = min(p.chunk, p.cols - ch * p.chunk) / VE;
            const float4 *xc = xs + (size_t)(ch * cvec / 32) * (8 * VE) + lane;
            /* SG_BATCH vectors per lane at a time: their loads in flight
             * together, then the FMAs in the row's order */
            for (int v0 = 0; v0 < nvec; v0 += 32 * SG_BATCH) {
                uint4 wb[SG_BATCH], ub[SG_BATCH];
                float4 xb[SG_BATCH][NT == 1 ? VE / 4 : 1];
#pragma unroll
                for (int b = 0; b < SG_BATCH; b++) {
                    const int v = v0 + 32 * b + lane;
                    if (v < nvec) {
                        wb[b] = wv[v];
                        if (PAIR)
                            ub[b] = wv[cvec + v];
                        if (NT == 1) /* one row: its x in flight with the weights */
#pragma unroll
                            for (int q = 0; q < VE / 4; q++) /* vector c's x: its 32-group, lane */
                                xb[b][q] = xc[(v0 / 32 + b) * (8 * VE) + q * 32];
                    }
                }
#pragma unroll
                for (int b = 0; b < SG_BATCH; b++) {
                    if (v0 + 32 * b + lane >= nvec)
                        break;
                    float f[VE], fu[VE];
                    unpack<WT>(wb[b], f);
                    if (PAIR)
                        unpack<WT>(ub[b], fu);
#pragma unroll
                    for (int r = 0; r < NT; r++) {
                        float4 xr[VE / 4];
#pragma unroll
                        for (int q = 0; q < VE / 4; q++)
                            xr[q] = NT == 1 ? xb[b][q]
                                            : xc[r * tile_f4 + (v0 / 32 + b) * (8 * VE) + q * 32];
                        const float *xv = (const float *)xr;
#pragma unroll
                        for (int e = 0; e < VE; e++)
                            acc0[r] = fmaf(f[e], xv[e], acc0[r]);
                        if (PAIR)
#pragma unroll
                            for (int e = 0; e < VE; e++)
                                acc1[r] = fmaf(fu[e], xv[e], acc1[r]);
                    }
                }
            }
            /* every lane has read the slot (its values are in the FMAs
             * above), so lane 0 may refill it */
            __syncwarp();
            if (lane == 0 && i + p.slots < items) {
                sg_issue<BYTES, PAIR>(p, cur, nch, cfull, clast, slot0 + (size_t)s * p.slot_bytes,
                                      bar + s);
                if (i + p.slots + 1 < items)
                    sg_cur_next<BYTES, PAIR>(p, cur, nch, ustride, ustep);
            }
            if (++s == p.slots) {
                s = 0;
                parity ^= 1u;
            }
        }
        const int u = ubase + j * ustride;
#pragma unroll
        for (int r = 0; r < NT; r++) {
            if (PAIR) {
                float gv = cuk_warp_sum(acc0[r]), uv = cuk_warp_sum(acc1[r]);
                if (lane == 0)
                    p.outp[0][(size_t)r * p.rows[0] + u] = cuk_silu_mul1(gv, uv);
            } else {
                float v = cuk_warp_sum(acc0[r]);
                const int k = j * NT + r;
                const float old = __shfl_sync(0xffffffffu, res, k & 31);
                if (lane == 0) {
                    float *o = sg_out(p, u, r);
                    *o = p.out == CUK_OUT_ADD ? (k < 32 ? old : *o) + v : v;
                }
            }
        }
    }
#ifdef CUK_GEMV_PROBE
    gp_end(gpw);
#endif
#else
    (void)p;
    (void)in;
#endif
}

template <int WT, int IN, bool PAIR, int NT>
static cudaError_t launch_staged(cudaStream_t st, struct sgp *p, const struct cuk_gemv_in *in,
                                 const struct cuk_stage_cfg *cfg)
{
    constexpr int BYTES = gemv_cfg<WT>::BYTES;
    int blocks = cfg && cfg->blocks > 0 ? cfg->blocks : 0;
    if (!blocks) {
        int dev = 0;
        cudaError_t err = cudaGetDevice(&dev);
        if (err == cudaSuccess)
            err = cudaDeviceGetAttribute(&blocks, cudaDevAttrMultiProcessorCount, dev);
        if (err != cudaSuccess)
            return err;
    }
    if (blocks > p->units)
        blocks = p->units;
    p->tile_cols = (p->cols + 255) / 256 * 256;
    int chunk = cfg && cfg->chunk_cols > 0 ? cfg->chunk_cols : SG_CHUNK_DEFAULT;
    if (chunk % 256)
        return cudaErrorInvalidValue;
    if (chunk > p->tile_cols)
        chunk = p->tile_cols;
    int budget = cfg && cfg->smem_bytes > 0 ? cfg->smem_bytes : CUK_STAGE_SMEM;
    int per_block = (p->units + blocks - 1) / blocks;
    int fixed = NT * p->tile_cols * 4 + SG_HDR + p->xtra;
    /* A slot is one wait and one refill: below 4 KB per slot that costs
     * more than the depth gains (a 0.6B model's LM head, 1,024 columns:
     * 110 us staged against 78 us, bench_gemv on the H200). */
    if (!(cfg && cfg->any_size) && (PAIR ? 2 : 1) * p->tile_cols * BYTES < 4096)
        return cudaErrorNotSupported;
    /* The widest copies (fewer waits per byte) that leave each warp two
     * slots (one to read while the other fills), then as many slots as fit,
     * but no more than a warp has items. */
    int slots = 0, items = 0;
    size_t smem = 0;
    for (;; chunk -= 256) {
        p->chunk = chunk;
        p->slot_bytes = (PAIR ? 2 : 1) * chunk * BYTES;
        int nch = (p->cols + chunk - 1) / chunk;
        items = (per_block + GEMV_WARPS - 1) / GEMV_WARPS * nch;
        for (slots = SG_MAX_SLOTS < items ? SG_MAX_SLOTS : items; slots >= 1; slots--) {
            smem = (size_t)fixed + (size_t)(GEMV_WARPS * slots * 8 + 127) / 128 * 128 +
                   (size_t)GEMV_WARPS * slots * p->slot_bytes;
            if (smem <= (size_t)budget)
                break;
        }
        if (slots >= 2 || (slots == 1 && items == 1))
            break;
        if (chunk == 256)
            return cudaErrorNotSupported; /* x leaves no room for two slots */
    }
    p->slots = slots;
    /* one token (wider x is measured only as it was): see cuk_stage_cfg */
    const int prewait = cfg ? cfg->prewait : 0;
    p->pre = NT > 1 ? slots : prewait > 0 ? prewait : slots >= items ? 1 : CUK_STAGE_PREWAIT;
    p->late = NT == 1 && !(cfg && cfg->early_launch);
    auto k = k_gemv_staged<WT, IN, PAIR, NT>;
    /* with all unified memory as shared memory, the decode attention
     * kernel's block fits beside this one */
    static struct cuk_opted opted;
    cudaError_t err = cuk_smem_opt_in(k, smem, &opted, true);
    if (err != cudaSuccess)
        return err;
    return cuk_launch(k, (unsigned)blocks, GEMV_THREADS, smem, st, *p, *in);
}

template <int WT, int NT>
static cudaError_t launch_staged_in(cudaStream_t st, struct sgp *p, const struct cuk_gemv_in *in,
                                    const struct cuk_stage_cfg *cfg)
{
    if (p->out == CUK_OUT_SWIGLU)
        return launch_staged<WT, CUK_IN_RMSNORM, true, NT>(st, p, in, cfg);
    if (in->kind == CUK_IN_RMSNORM)
        return launch_staged<WT, CUK_IN_RMSNORM, false, NT>(st, p, in, cfg);
    if (in->kind == CUK_IN_SWIGLU)
        return launch_staged<WT, CUK_IN_SWIGLU, false, NT>(st, p, in, cfg);
    if constexpr (NT == 1)
        if (in->kind == CUK_IN_SPLITS)
            return launch_staged<WT, CUK_IN_SPLITS, false, 1>(st, p, in, cfg);
    return launch_staged<WT, CUK_IN_X, false, NT>(st, p, in, cfg);
}

template <int WT>
static cudaError_t launch_staged_n(cudaStream_t st, struct sgp *p, const struct cuk_gemv_in *in,
                                   int n, const struct cuk_stage_cfg *cfg)
{
    switch (n) {
    case 1: return launch_staged_in<WT, 1>(st, p, in, cfg);
    case 2: return launch_staged_in<WT, 2>(st, p, in, cfg);
    case 3: return launch_staged_in<WT, 3>(st, p, in, cfg);
    default: return launch_staged_in<WT, 4>(st, p, in, cfg);
    }
}

extern "C" cudaError_t cuk_gemv_staged(cudaStream_t s, float *const *outs,
                                       const struct cuk_gemv_in *in, int n,
                                       const struct cuk_weight *const *ws, int k, int out,
                                       const struct cuk_stage_cfg *cfg)
{
    if (n < 1 || n > CUK_STAGE_MAX_N || k < 1 || k > 3 || !in || !in->x || in->kind < CUK_IN_X ||
        in->kind > CUK_IN_SPLITS ||
        out < CUK_OUT_STORE || out > CUK_OUT_SWIGLU ||
        (out == CUK_OUT_SWIGLU && (k != 2 || ws[0]->rows != ws[1]->rows)))
        return cudaErrorInvalidValue;
    /* the partials of one query, whole heads of 4-float groups */
    const bool splits = in->kind == CUK_IN_SPLITS;
    if (splits && (n != 1 || out == CUK_OUT_SWIGLU || !in->nused || in->n_splits < 1 ||
                   in->n_splits > 64 || in->head_dim < 4 || in->head_dim % 4 ||
                   ws[0]->cols % in->head_dim))
        return cudaErrorInvalidValue;
    /* as cuk_gemv_fused: the paired output only after the norm */
    if (out == CUK_OUT_SWIGLU && in->kind != CUK_IN_RMSNORM)
        return cudaErrorNotSupported;
    const float *x2 = in->kind == CUK_IN_RMSNORM ? in->nw
                      : in->kind == CUK_IN_SWIGLU ? in->x2
                                                  : NULL;
    if (((uintptr_t)in->x & 15) ||
        (in->kind != CUK_IN_X && !splits && (!x2 || ((uintptr_t)x2 & 15))))
        return cudaErrorNotSupported;
    int dt = ws[0]->dtype, cols = ws[0]->cols;
    if ((dt != DT_BF16 && dt != DT_F16) || cols <= 0 || cols % 8)
        return cudaErrorNotSupported;
    struct sgp p = {};
    p.out = out;
    p.cols = cols;
    if (splits) { /* each head's split weights and sum: 2 H S + H floats */
        int heads = cols / in->head_dim;
        p.xtra = ((2 * heads * in->n_splits + heads) * 4 + 127) / 128 * 128;
    }
    long long units = 0;
    for (int i = 0; i < k; i++) {
        if (ws[i]->dtype != dt || ws[i]->cols != cols || ((uintptr_t)ws[i]->data & 15))
            return cudaErrorNotSupported;
        p.outp[i] = outs[i];
        p.w[i] = (const char *)ws[i]->data;
        p.rows[i] = ws[i]->rows;
        units += ws[i]->rows;
    }
    if (out == CUK_OUT_SWIGLU)
        units = ws[0]->rows;
    if (units <= 0 || units > (1LL << 30))
        return units == 0 ? cudaSuccess : cudaErrorNotSupported;
    p.units = (int)units;
    cudaError_t err = dt == DT_BF16 ? launch_staged_n<WT_BF16>(s, &p, in, n, cfg)
                                    : launch_staged_n<WT_F16>(s, &p, in, n, cfg);
    cudaError_t last = cudaGetLastError();
    return err != cudaSuccess ? err : last;
}
