/* kernels.cu - the element-wise and row-wise CUDA kernels of the op set:
 * embedding gather, RMSNorm, bias, SwiGLU, residual add, RoPE, paged KV
 * store, and the dtype conversions used around cuBLAS. Arithmetic follows
 * the CPU backend (f32, RMSNorm's sum of squares in double) so both meet the
 * same oracle contract. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <limits.h>
#include <math.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/order_key.cuh"
#include "backend/cuda/row_split.h"

/* ---- launch mode ---- */

static int pdl_on;

extern "C" void cuk_set_pdl(int on) { pdl_on = on; }
int cuk_pdl_enabled(void) { return pdl_on; }

/* ---- embedding gather ---- */

#define EMBED_THREADS 256
#define EMBED_PER_THREAD 16 /* a 4,096-column row in one round */

__global__ void __launch_bounds__(EMBED_THREADS) k_embed(float *out, struct cuk_weight t, const int *ids,
                                                           const int *last)
{
    cuk_pdl_start();
    int id = ids[blockIdx.x];
    size_t r = (size_t)(id < 0 ? *last : id);
    int cols = t.cols;
    float *o = out + (size_t)blockIdx.x * cols;
    /* A round's loads all go out before its stores: load, store, load ...
     * left them one memory trip after another (H200, a 0.6B model's
     * 1,024 columns: 2.65 -> 1.67 us) */
    for (int j0 = 0; j0 < cols; j0 += EMBED_THREADS * EMBED_PER_THREAD) {
        float v[EMBED_PER_THREAD];
#pragma unroll
        for (int k = 0; k < EMBED_PER_THREAD; k++) {
            const int j = j0 + k * EMBED_THREADS + (int)threadIdx.x;
            v[k] = j < cols ? cuk_load_weight(&t, r, j) : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < EMBED_PER_THREAD; k++) {
            const int j = j0 + k * EMBED_THREADS + (int)threadIdx.x;
            if (j < cols)
                o[j] = v[k];
        }
    }
}

extern "C" cudaError_t cuk_embed(cudaStream_t s, float *out, const struct cuk_weight *table,
                                 const int *ids, const int *last, int n)
{
    cuk_launch(k_embed, n, EMBED_THREADS, 0, s, out, *table, ids, last);
    return cudaGetLastError();
}

/* ---- RMSNorm ---- */

/* One warp per row (small rows: q/k norm over a head). */
/* y (may be NULL): x += y first (the residual add fused in); each thread
 * reads y[j] before it writes out[j], so out may equal y (or x). */
/* oh (may be NULL): out rounded to bf16/f16 as well, for a following
 * tensor-core GEMM (saves its conversion launch). */
__global__ void k_rmsnorm_warp(float *out, float *x, const float *y, const float *w, int n,
                               int dim, float eps, uint16_t *oh, int bf16)
{
    cuk_pdl_start();
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= n)
        return;
    float *xr = x + (size_t)row * dim;
    float *o = out + (size_t)row * dim;
    double ss = 0;
    if (y) {
        const float *yr = y + (size_t)row * dim;
        for (int j = lane; j < dim; j += 32)
            xr[j] += yr[j];
    }
    for (int j = lane; j < dim; j += 32)
        ss += (double)xr[j] * xr[j];
    ss = cuk_warp_sum_d(ss);
    float inv = cuk_rms_inv(ss, dim, eps);
    uint16_t *ohr = oh ? oh + (size_t)row * dim : NULL;
    for (int j = lane; j < dim; j += 32) {
        float v = cuk_rms_scale(w[j], xr[j], inv);
        o[j] = v;
        if (ohr)
            ohr[j] = cuk_to_half(v, bf16);
    }
}

/* One block per row (hidden-size rows). */
__global__ void k_rmsnorm_block(float *out, float *x, const float *y, const float *w, int dim,
                                float eps, uint16_t *oh, int bf16)
{
    cuk_pdl_start();
    __shared__ double part[32];
    float *xr = x + (size_t)blockIdx.x * dim;
    float *o = out + (size_t)blockIdx.x * dim;
    double ss = 0;
    if (y) { /* the sum and its square in one pass */
        const float *yr = y + (size_t)blockIdx.x * dim;
        for (int j = threadIdx.x; j < dim; j += blockDim.x) {
            float v = xr[j] + yr[j];
            xr[j] = v;
            ss += (double)v * v;
        }
    } else {
        for (int j = threadIdx.x; j < dim; j += blockDim.x)
            ss += (double)xr[j] * xr[j];
    }
    float inv = cuk_rms_inv(cuk_block_sum_d(ss, part), dim, eps);
    uint16_t *ohr = oh ? oh + (size_t)blockIdx.x * dim : NULL;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        float v = cuk_rms_scale(w[j], xr[j], inv);
        o[j] = v;
        if (ohr)
            ohr[j] = cuk_to_half(v, bf16);
    }
}

/* Pieces of the vector RMSNorms: the residual add of element i (written
 * back to x), its sum of squares, and its normalized output (and half copy). */
static __device__ __forceinline__ void rms_add(float4 &v, float4 *xr, const float4 *yr, int i)
{
    float4 b = yr[i];
    v.x += b.x;
    v.y += b.y;
    v.z += b.z;
    v.w += b.w;
    xr[i] = v;
}

static __device__ __forceinline__ void rms_out(float4 v, float inv, const float4 *w4, float4 *o,
                                               uint16_t *ohr, int i, int bf16)
{
    float4 ww = w4[i], r;
    r.x = cuk_rms_scale(ww.x, v.x, inv);
    r.y = cuk_rms_scale(ww.y, v.y, inv);
    r.z = cuk_rms_scale(ww.z, v.z, inv);
    r.w = cuk_rms_scale(ww.w, v.w, inv);
    o[i] = r;
    if (ohr) {
        ohr[4 * i] = cuk_to_half(r.x, bf16);
        ohr[4 * i + 1] = cuk_to_half(r.y, bf16);
        ohr[4 * i + 2] = cuk_to_half(r.z, bf16);
        ohr[4 * i + 3] = cuk_to_half(r.w, bf16);
    }
}

/* The same norm with every load issued before any arithmetic: VPT float4
 * per thread held in registers (dim % 4 == 0, dim <= 4 * VPT * threads).
 * A row is thousands of floats and the loops above wait on one load at a
 * time; this is what a decode step's hidden-size norms need. */
template <int VPT>
__global__ void __launch_bounds__(256) k_rmsnorm_vec(float *out, float *x, const float *y,
                                                     const float *w, int dim, float eps,
                                                     uint16_t *oh, int bf16)
{
    cuk_pdl_start();
    __shared__ double part[32];
    int nv = dim / 4;
    float4 *xr = (float4 *)(x + (size_t)blockIdx.x * dim);
    float4 v[VPT];
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        int i = threadIdx.x + k * blockDim.x;
        v[k] = i < nv ? xr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (y) {
        const float4 *yr = (const float4 *)(y + (size_t)blockIdx.x * dim);
#pragma unroll
        for (int k = 0; k < VPT; k++) {
            int i = threadIdx.x + k * blockDim.x;
            if (i < nv)
                rms_add(v[k], xr, yr, i);
        }
    }
    double ss = 0;
#pragma unroll
    for (int k = 0; k < VPT; k++)
        ss += cuk_rms_sq(v[k]);
    float inv = cuk_rms_inv(cuk_block_sum_d(ss, part), dim, eps);
    float4 *o = (float4 *)(out + (size_t)blockIdx.x * dim);
    const float4 *w4 = (const float4 *)w;
    uint16_t *ohr = oh ? oh + (size_t)blockIdx.x * dim : NULL;
#pragma unroll
    for (int k = 0; k < VPT; k++) {
        int i = threadIdx.x + k * blockDim.x;
        if (i < nv)
            rms_out(v[k], inv, w4, o, ohr, i, bf16);
    }
}

/* k_rmsnorm_warp with its loads issued up front: VPL float4 per lane
 * (dim == 128 * VPL); for the per-head q/k norms. */
template <int VPL>
__global__ void k_rmsnorm_warp_vec(float *out, float *x, const float *y, const float *w, int n,
                                   int dim, float eps, uint16_t *oh, int bf16)
{
    cuk_pdl_start();
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= n)
        return;
    float4 *xr = (float4 *)(x + (size_t)row * dim);
    float4 v[VPL];
#pragma unroll
    for (int k = 0; k < VPL; k++)
        v[k] = xr[lane + 32 * k];
    if (y) {
        const float4 *yr = (const float4 *)(y + (size_t)row * dim);
#pragma unroll
        for (int k = 0; k < VPL; k++)
            rms_add(v[k], xr, yr, lane + 32 * k);
    }
    double ss = 0;
#pragma unroll
    for (int k = 0; k < VPL; k++)
        ss += cuk_rms_sq(v[k]);
    ss = cuk_warp_sum_d(ss);
    float inv = cuk_rms_inv(ss, dim, eps);
    float4 *o = (float4 *)(out + (size_t)row * dim);
    const float4 *w4 = (const float4 *)w;
    uint16_t *ohr = oh ? oh + (size_t)row * dim : NULL;
#pragma unroll
    for (int k = 0; k < VPL; k++)
        rms_out(v[k], inv, w4, o, ohr, lane + 32 * k, bf16);
}

/* k_rmsnorm_vec, k_rmsnorm_block or k_rmsnorm_warp for the shape. Vector
 * loads need 16-byte aligned rows and weights. The choice fixes the order
 * in which a row's squares are summed, and the fused norms reproduce it to
 * give the same bits (gemv.cu's gemv_rms_inv for model-width rows,
 * warp_rms_inv below for q/k heads): change them together. */
static void launch_rmsnorm(cudaStream_t s, float *out, float *x, const float *y, const float *w,
                           int n, int dim, float eps, uint16_t *oh, int bf16)
{
    bool vec = dim % 4 == 0 && dim > 512 && ((uintptr_t)x & 15) == 0 &&
               ((uintptr_t)out & 15) == 0 && ((uintptr_t)w & 15) == 0 &&
               (!y || ((uintptr_t)y & 15) == 0);
    int nv = dim / 4;
    if (vec && nv <= 256 * 2)
        cuk_launch(k_rmsnorm_vec<2>, n, 256, 0, s, out, x, y, w, dim, eps, oh, bf16);
    else if (vec && nv <= 256 * 4)
        cuk_launch(k_rmsnorm_vec<4>, n, 256, 0, s, out, x, y, w, dim, eps, oh, bf16);
    else if (vec && nv <= 256 * 8)
        cuk_launch(k_rmsnorm_vec<8>, n, 256, 0, s, out, x, y, w, dim, eps, oh, bf16);
    else if (dim % 128 == 0 && dim <= 512 && ((uintptr_t)x & 15) == 0 &&
             ((uintptr_t)out & 15) == 0 && ((uintptr_t)w & 15) == 0 &&
             (!y || ((uintptr_t)y & 15) == 0)) {
        if (dim == 128)
            cuk_launch(k_rmsnorm_warp_vec<1>, (n + 3) / 4, 128, 0, s, out, x, y, w, n, dim, eps,
                       oh, bf16);
        else if (dim == 256)
            cuk_launch(k_rmsnorm_warp_vec<2>, (n + 3) / 4, 128, 0, s, out, x, y, w, n, dim, eps,
                       oh, bf16);
        else if (dim == 384)
            cuk_launch(k_rmsnorm_warp_vec<3>, (n + 3) / 4, 128, 0, s, out, x, y, w, n, dim, eps,
                       oh, bf16);
        else
            cuk_launch(k_rmsnorm_warp_vec<4>, (n + 3) / 4, 128, 0, s, out, x, y, w, n, dim, eps,
                       oh, bf16);
    } else if (dim <= 512)
        cuk_launch(k_rmsnorm_warp, (n + 3) / 4, 128, 0, s, out, x, y, w, n, dim, eps, oh, bf16);
    else
        cuk_launch(k_rmsnorm_block, n, 256, 0, s, out, x, y, w, dim, eps, oh, bf16);
}

extern "C" cudaError_t cuk_rmsnorm(cudaStream_t s, float *out, const float *x, const float *w,
                                   int n, int dim, float eps, uint16_t *out_half, int bf16)
{
    launch_rmsnorm(s, out, (float *)x, nullptr, w, n, dim, eps, out_half, bf16);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_add_rmsnorm(cudaStream_t s, float *out, float *x, const float *y,
                                       const float *w, int n, int dim, float eps,
                                       uint16_t *out_half, int bf16)
{
    launch_rmsnorm(s, out, x, y, w, n, dim, eps, out_half, bf16);
    return cudaGetLastError();
}

/* ---- element-wise ---- */

__global__ void k_add_bias(float *x, const float *b, size_t total, int dim)
{
    cuk_pdl_start();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total)
        x[i] += b[i % dim];
}

__global__ void k_silu_mul(float *g, const float *u, size_t n, uint16_t *gh, int bf16)
{
    cuk_pdl_start();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = cuk_silu_mul1(g[i], u[i]);
        g[i] = v;
        if (gh)
            gh[i] = cuk_to_half(v, bf16);
    }
}

__global__ void k_add(float *x, const float *y, size_t n)
{
    cuk_pdl_start();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += y[i];
}

static unsigned blocks_for(size_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

extern "C" cudaError_t cuk_add_bias(cudaStream_t s, float *x, const float *b, int n, int dim)
{
    size_t total = (size_t)n * dim;
    cuk_launch(k_add_bias, blocks_for(total, 256), 256, 0, s, x, b, total, dim);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_silu_mul(cudaStream_t s, float *g, const float *u, size_t n,
                                    uint16_t *g_half, int bf16)
{
    cuk_launch(k_silu_mul, blocks_for(n, 256), 256, 0, s, g, u, n, g_half, bf16);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_add(cudaStream_t s, float *x, const float *y, size_t n)
{
    cuk_launch(k_add, blocks_for(n, 256), 256, 0, s, x, y, n);
    return cudaGetLastError();
}

/* ---- RoPE ---- */

__global__ void k_rope(float *x, size_t total, int n_heads, int head_dim, int pos0,
                       const int *dpos, const float *inv_freq, int interleaved)
{
    cuk_pdl_start();
    if (dpos)
        pos0 = *dpos;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total)
        return;
    int half = head_dim / 2;
    int f = (int)(idx % half);
    size_t rh = idx / half; /* row * n_heads + head */
    int i = (int)(rh / n_heads);
    float ang = cuk_rope_angle(pos0 + i, inv_freq[f]);
    float cs = cosf(ang), sn = sinf(ang);
    float *v = x + rh * head_dim;
    int a = interleaved ? 2 * f : f, b = interleaved ? 2 * f + 1 : f + half;
    float ra, rb;
    cuk_rope_rot(v[a], v[b], cs, sn, ra, rb);
    v[a] = ra;
    v[b] = rb;
}

extern "C" cudaError_t cuk_rope(cudaStream_t s, float *x, int n, int n_heads, int head_dim,
                                int pos0, const int *dpos, const float *inv_freq, int interleaved)
{
    size_t total = (size_t)n * n_heads * (head_dim / 2);
    cuk_launch(k_rope, blocks_for(total, 256), 256, 0, s, x, total, n_heads, head_dim, pos0, dpos,
                                                  inv_freq, interleaved);
    return cudaGetLastError();
}

#define RK_FREQS 8 /* rotation pairs per lane: head_dim <= 512 */

/* One warp's share of q/k norm + RoPE + K/V store: warp number
 * wid runs over the heads of q (g.n rows of n_heads heads), then of k
 * (n_kv_heads heads). With norm weights (qn for q heads, kn for k heads;
 * NULL: none) the head is first normalized as cuk_rmsnorm over head_dim
 * rows would (the sum of squares is read before any lane writes: every
 * lane's loads feed the warp sum, and the writes come after it). Each lane
 * then rotates the pairs f = lane, lane + 32, ... as k_rope does; a k pair
 * is stored rotated, with the same two entries of v, through the block
 * table. where(row, pos, table) gives a row's position and block table;
 * it is called before the wait for the previous kernel (cuk_pdl_start,
 * which this function does), so it may read only what the step's copies
 * put on the device, never a kernel's results. */
template <typename T, typename Where>
static __device__ __forceinline__ void rope_kv_head(float *q, float *k, const float *v, T *kc,
                                                    T *vc, const struct cuk_attn &g, int n_heads,
                                                    int head_dim, const float *inv_freq,
                                                    int interleaved, const float *qn,
                                                    const float *kn, float eps, Where where)
{
    size_t wid = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x & 31;
    size_t nq = (size_t)g.n * n_heads, nk = (size_t)g.n * g.n_kv_heads;
    if (wid >= nq + nk) /* whole warps: blockDim is a multiple of 32 */
        return;
    /* Before the wait: the position, the cache slot and the rotation, which
     * come from the step's metadata and tables (copied before the step's
     * first kernel), not from the previous kernel. */
    bool is_k = wid >= nq;
    size_t rh = is_k ? wid - nq : wid; /* row * heads + head */
    int heads = is_k ? g.n_kv_heads : n_heads;
    int i = (int)(rh / heads), pos;
    const int *table;
    where(i, pos, table);
    size_t off = is_k ? cuk_kv_row(&g, table, pos, (int)(rh % heads)) : 0;
    int half = head_dim / 2;
    float cs[RK_FREQS], sn[RK_FREQS];
#pragma unroll
    for (int r = 0; r < RK_FREQS; r++)
        if (lane + 32 * r < half) {
            float ang = cuk_rope_angle(pos, inv_freq[lane + 32 * r]);
            cs[r] = cosf(ang);
            sn[r] = sinf(ang);
        }
    cuk_pdl_start();
    float *x = (is_k ? k : q) + rh * head_dim;
    const float *nw = is_k ? kn : qn;
    float inv = nw ? cuk_warp_rms_inv(x, nw, head_dim, eps, lane) : 0.0f;
    const float *vr = is_k ? v + rh * head_dim : v;
#pragma unroll
    for (int r = 0; r < RK_FREQS; r++) {
        int f = lane + 32 * r;
        if (f >= half)
            break;
        int a = interleaved ? 2 * f : f, b = interleaved ? 2 * f + 1 : f + half;
        float ra, rb;
        cuk_norm_rope(x, nw, inv, a, b, cs[r], sn[r], ra, rb);
        x[a] = ra;
        x[b] = rb;
        if (is_k) {
            const size_t ca = off + cuk_kv_col(&g, pos, a), cb = off + cuk_kv_col(&g, pos, b);
            kv_st(kc, ca, ra);
            kv_st(kc, cb, rb);
            kv_st(vc, ca, vr[a]);
            kv_st(vc, cb, vr[b]);
        }
    }
}

/* Threads of the RoPE + K/V store kernels: a warp per head of q and k. */
static unsigned rope_kv_blocks(int n, int n_heads, int n_kv_heads)
{
    return blocks_for((size_t)n * (size_t)(n_heads + n_kv_heads) * 32, 256);
}

/* q/k norm and RoPE of one sequence in one launch, and the rotated k with
 * v written into the paged cache. */
template <typename T>
__global__ void k_rope_kv_store(float *q, float *k, const float *v, T *kc, T *vc,
                                const int *table, struct cuk_attn g, int n_heads, int head_dim,
                                int pos0, const int *dpos, const float *inv_freq, int interleaved,
                                const float *qn, const float *kn, float eps)
{
    if (dpos) /* the step record: copied before the step's first kernel */
        pos0 = *dpos;
    rope_kv_head(q, k, v, kc, vc, g, n_heads, head_dim, inv_freq, interleaved, qn, kn, eps,
                 [&](int i, int &pos, const int *&tab) {
                     pos = pos0 + i;
                     tab = table;
                 });
}

extern "C" cudaError_t cuk_rope_kv_store(cudaStream_t s, float *q, float *k, const float *v,
                                         void *kc, void *vc, const int *table,
                                         const struct cuk_attn *g, int n_heads, int head_dim,
                                         const int *dpos, const float *inv_freq, int interleaved,
                                         const float *q_norm, const float *k_norm, float eps)
{
    if (head_dim > 64 * RK_FREQS)
        return cudaErrorInvalidValue;
    unsigned blocks = rope_kv_blocks(g->n, n_heads, g->n_kv_heads);
    if (g->kv_bf16)
        cuk_launch(k_rope_kv_store<uint16_t>, blocks, 256, 0, s, q, k, v, (uint16_t *)kc,
                   (uint16_t *)vc, table, *g, n_heads, head_dim, g->pos0, dpos, inv_freq,
                   interleaved, q_norm, k_norm, eps);
    else
        cuk_launch(k_rope_kv_store<float>, blocks, 256, 0, s, q, k, v, (float *)kc, (float *)vc,
                   table, *g, n_heads, head_dim, g->pos0, dpos, inv_freq, interleaved, q_norm,
                   k_norm, eps);
    return cudaGetLastError();
}

/* k_rope_kv_store over every segment of a batch step: g->n rows in all,
 * row i's segment from the row map (meta + g->pos0), its position and block
 * table from that segment's cuk_bseg. */
template <typename T>
__global__ void k_rope_kv_store_batch(float *q, float *k, const float *v, T *kc, T *vc,
                                      const int *meta, struct cuk_attn g, const float *inv_freq,
                                      int interleaved, const float *qn, const float *kn,
                                      float eps)
{
    rope_kv_head(q, k, v, kc, vc, g, g.n_heads, g.head_dim, inv_freq, interleaved, qn, kn, eps,
                 [&](int i, int &pos, const int *&tab) {
                     const struct cuk_bseg *sg = (const struct cuk_bseg *)meta + meta[g.pos0 + i];
                     pos = sg->pos0 + (i - sg->row0);
                     tab = meta + sg->tab_off;
                 });
}

extern "C" cudaError_t cuk_rope_kv_store_batch(cudaStream_t s, float *q, float *k,
                                               const float *v, void *kc, void *vc,
                                               const int *meta, const struct cuk_attn *g,
                                               const float *inv_freq, int interleaved,
                                               const float *q_norm, const float *k_norm,
                                               float eps)
{
    if (g->head_dim > 64 * RK_FREQS)
        return cudaErrorInvalidValue;
    unsigned blocks = rope_kv_blocks(g->n, g->n_heads, g->n_kv_heads);
    if (g->kv_bf16)
        cuk_launch(k_rope_kv_store_batch<uint16_t>, blocks, 256, 0, s, q, k, v, (uint16_t *)kc,
                   (uint16_t *)vc, meta, *g, inv_freq, interleaved, q_norm, k_norm, eps);
    else
        cuk_launch(k_rope_kv_store_batch<float>, blocks, 256, 0, s, q, k, v, (float *)kc,
                   (float *)vc, meta, *g, inv_freq, interleaved, q_norm, k_norm, eps);
    return cudaGetLastError();
}

/* ---- paged KV store ---- */

template <typename T>
__global__ void k_kv_store(T *kc, T *vc, const int *table, struct cuk_attn g, const int *dpos,
                           const float *k, const float *v)
{
    cuk_pdl_start();
    int i = blockIdx.x, pos = (dpos ? *dpos : g.pos0) + i;
    const float *kr = k + (size_t)i * g.kv_dim, *vr = v + (size_t)i * g.kv_dim;
    for (int j = threadIdx.x; j < g.kv_dim; j += blockDim.x) {
        const int h = j / g.head_dim, d = j - h * g.head_dim;
        const size_t off = cuk_kv_row(&g, table, pos, h) + cuk_kv_col(&g, pos, d);
        kv_st(kc, off, kr[j]);
        kv_st(vc, off, vr[j]);
    }
}

extern "C" cudaError_t cuk_kv_store(cudaStream_t s, void *kc, void *vc, const int *table,
                                    const struct cuk_attn *g, const int *dpos, const float *k,
                                    const float *v)
{
    if (g->kv_bf16)
        cuk_launch(k_kv_store<uint16_t>, g->n, 256, 0, s, (uint16_t *)kc, (uint16_t *)vc, table, *g, dpos, k, v);
    else
        cuk_launch(k_kv_store<float>, g->n, 256, 0, s, (float *)kc, (float *)vc, table, *g, dpos, k, v);
    return cudaGetLastError();
}

/* ---- conversions ---- */

__global__ void k_dequant(float *dst, struct cuk_weight w, int row0, size_t total)
{
    cuk_pdl_start();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total)
        dst[i] = cuk_load_weight(&w, (size_t)row0 + i / w.cols, (int)(i % w.cols));
}

/* The widening of a quantized matrix's rows for a GEMM (cuda_matmul.c's
 * matmul_widened): GGUF's low-bit blocks (cuk_dq8: the host's bits) or
 * the device's Q8_0 (int8 values, an f16 scale a 32; d * q is exact in
 * f32, so it is rounded once), as f32 or rounded to bf16 / f16 (HALF: 1
 * bf16, 2 f16, 0 f32). A thread widens wq_units runs of eight values of
 * a row, its row's threads' width apart, so that a warp's loads and
 * 16-byte stores are contiguous and each thread has that many loads in
 * flight; the grid's y strides over rows, so no thread divides. The
 * kernel this replaced gave a thread one run, found by dividing a 64-bit
 * index, with the dtype switched on at run time: ~2.4x the bandwidth
 * floor (docs/benchmarks.md, session 56). */
enum { WQ_THREADS = 128 };
/* Runs a thread widens: 4 for the low-bit blocks (8B Q4_K prefill p512
 * 19,657 -> 20,118 tok/s against the old kernel, H100); Q8_0 ran 2 %
 * slower at 4 than the old one-run kernel (21,344 -> 20,886), so 1. The
 * kernel's count and its launch's. */
static __host__ __device__ constexpr int wq_units(int dt)
{
    return dt == DT_Q8_0 ? 1 : 4;
}

template <int DT>
static __device__ __forceinline__ void wq_load8(const struct cuk_weight &w, size_t row_bytes,
                                                int r, int c, float *v)
{
    if constexpr (DT == DT_Q8_0) {
        const size_t e = (size_t)r * w.cols + c; /* the first value's index in w */
        const uint2 q = __ldg((const uint2 *)((const int8_t *)w.data + e));
        const float d = cuk_f16(__ldg(w.scales + e / Q8_0_BLOCK));
#pragma unroll
        for (int i = 0; i < 8; i++)
            v[i] = d * (float)(int8_t)((i < 4 ? q.x : q.y) >> (8 * (i & 3)));
    } else {
        cuk_dq8<DT>((const uint8_t *)w.data + (size_t)r * row_bytes, c, v);
    }
}

template <int HALF>
static __device__ __forceinline__ void wq_store8(void *dst, size_t i, const float *v)
{
    if constexpr (HALF == 0) {
        float4 *o = (float4 *)((float *)dst + i);
        o[0] = make_float4(v[0], v[1], v[2], v[3]);
        o[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
        uint32_t h[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            h[k] = (uint32_t)cuk_to_half(v[2 * k], HALF == 1) |
                   (uint32_t)cuk_to_half(v[2 * k + 1], HALF == 1) << 16;
        *(uint4 *)((uint16_t *)dst + i) = make_uint4(h[0], h[1], h[2], h[3]);
    }
}

template <int DT, int HALF>
__global__ void __launch_bounds__(WQ_THREADS)
    k_widen_q(void *dst, struct cuk_weight w, size_t row_bytes, int row0, int nrows)
{
    cuk_pdl_start();
    constexpr int U = wq_units(DT);
    const int step = blockDim.x * 8; /* a unit's distance from the thread's previous one */
    const int c0 = blockIdx.x * step * U + threadIdx.x * 8;
    for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < nrows; r += gridDim.y * blockDim.y) {
        float v[U][8];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (c0 + u * step < w.cols)
                wq_load8<DT>(w, row_bytes, row0 + r, c0 + u * step, v[u]);
#pragma unroll
        for (int u = 0; u < U; u++)
            if (c0 + u * step < w.cols)
                wq_store8<HALF>(dst, (size_t)r * w.cols + c0 + u * step, v[u]);
    }
}

/* Rows row0 .. row0 + nrows - 1 of w (a low-bit dtype, or Q8_0 with HALF
 * != 0) widened into dst (16-aligned); cudaErrorNotSupported, nothing
 * launched, for any other dtype, cols not a multiple of 8 or dst not
 * 16-aligned. A row's threads are the
 * fewest whole warps that cover it in wq_units runs each (at most
 * WQ_THREADS; wider rows take several blocks), and a block takes as many
 * rows as fill WQ_THREADS: a 1,024-column Q4_K row is one warp's, four
 * rows a block. */
template <int HALF>
static cudaError_t widen_q(cudaStream_t s, void *dst, const struct cuk_weight *w, int row0,
                           int nrows)
{
    if (w->cols % 8 || ((uintptr_t)dst & 15))
        return cudaErrorNotSupported;
    if (nrows <= 0)
        return cudaSuccess;
    const int units = wq_units(w->dtype);
    int tx = (w->cols / 8 + units - 1) / units;
    tx = tx >= WQ_THREADS ? WQ_THREADS : (tx + 31) / 32 * 32;
    const int ty = WQ_THREADS / tx;
    const int span = tx * 8 * units, ry = (nrows + ty - 1) / ty;
    const dim3 grid((unsigned)((w->cols + span - 1) / span), (unsigned)(ry < 65535 ? ry : 65535)),
        block((unsigned)tx, (unsigned)ty);
    /* (cuk_q_row_bytes divides by a block's values: none for Q8_0, whose
     * rows are its int8 values) */
    const size_t rb = w->dtype == DT_Q8_0 ? 0 : cuk_q_row_bytes(w->dtype, w->cols);
    return cuk_q_dispatch(w->dtype, cudaErrorNotSupported, [&](auto d) {
        constexpr int DT = decltype(d)::value;
        if constexpr (DT == DT_Q8_0 && HALF == 0) /* Q8_0 to f32: k_dequant */
            return cudaErrorNotSupported;
        else
            return cuk_launch(k_widen_q<DT, HALF>, grid, block, 0, s, dst, *w, rb, row0, nrows);
    });
}

extern "C" cudaError_t cuk_dequant_f32(cudaStream_t s, float *dst, const struct cuk_weight *w,
                                       int row0, int nrows)
{
    size_t total = (size_t)nrows * w->cols;
    if (cuk_q_low_bit(w->dtype)) {
        cudaError_t err = widen_q<0>(s, dst, w, row0, nrows);
        return err != cudaSuccess ? err : cudaGetLastError();
    }
    cuk_launch(k_dequant, blocks_for(total, 256), 256, 0, s, dst, *w, row0, total);
    return cudaGetLastError();
}

extern "C" cudaError_t cuk_dequant_half(cudaStream_t s, uint16_t *dst, const struct cuk_weight *w,
                                        int row0, int nrows, int bf16)
{
    if ((uintptr_t)w->data & 7) /* the 8-byte loads */
        return cudaErrorNotSupported;
    cudaError_t err = bf16 ? widen_q<1>(s, dst, w, row0, nrows) : widen_q<2>(s, dst, w, row0, nrows);
    return err != cudaSuccess ? err : cudaGetLastError();
}

__global__ void k_to_half(uint16_t *dst, const float *x, size_t n, int bf16)
{
    cuk_pdl_start();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    if (bf16)
        dst[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
    else
        dst[i] = __half_as_ushort(__float2half_rn(x[i]));
}

extern "C" cudaError_t cuk_f32_to_half(cudaStream_t s, uint16_t *dst, const float *x, size_t n,
                                       int bf16)
{
    cuk_launch(k_to_half, blocks_for(n, 256), 256, 0, s, dst, x, n, bf16);
    return cudaGetLastError();
}

/* GGUF Q8_0 block: f16 scale then 32 int8 (34 bytes, 2-byte aligned). */
__global__ void k_q8_repack(int8_t *qs, uint16_t *scales, const uint8_t *src, size_t n_blocks)
{
    cuk_pdl_start();
    size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks)
        return;
    const uint8_t *blk = src + b * 34;
    scales[b] = (uint16_t)(blk[0] | (blk[1] << 8));
    for (int i = 0; i < 32; i++)
        qs[b * 32 + i] = (int8_t)blk[2 + i];
}

extern "C" cudaError_t cuk_q8_repack(cudaStream_t s, int8_t *qs, uint16_t *scales,
                                     const void *src, size_t n_blocks)
{
    cuk_launch(k_q8_repack, blocks_for(n_blocks, 256), 256, 0, s, qs, scales, (const uint8_t *)src,
                                                          n_blocks);
    return cudaGetLastError();
}

/* ---- greedy argmax ---- */

#define AM_BLOCKS 128
#define AM_THREADS 256

/* Keeps (bv, bi) the larger value, the lower index on ties; NaN never wins. */
static __device__ __forceinline__ void am_better(float &bv, int &bi, float v, int i)
{
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

static __device__ __forceinline__ void am_block(float &bv, int &bi, float *sv, int *si)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(0xffffffffu, bv, o);
        int j = __shfl_xor_sync(0xffffffffu, bi, o);
        am_better(bv, bi, v, j);
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    __syncthreads(); /* sv/si may still be read from a previous round */
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < (int)blockDim.x / 32; w++)
            am_better(bv, bi, sv[w], si[w]);
}

/* Each block reduces a strided share into ws; the last block to finish
 * (cuk_last_arrival, which re-arms the counter) reduces the blocks'
 * results and writes the index, to host too when host is not NULL. */
__global__ void __launch_bounds__(AM_THREADS)
    k_argmax(int *out, int *host, const float *x, int n, float *pv, int *pi, unsigned *count)
{
    cuk_pdl_start();
    __shared__ float sv[AM_THREADS / 32];
    __shared__ int si[AM_THREADS / 32];
    __shared__ bool last;
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        am_better(bv, bi, x[i], i);
    am_block(bv, bi, sv, si);
    if (threadIdx.x == 0) {
        pv[blockIdx.x] = bv;
        pi[blockIdx.x] = bi;
        last = cuk_last_arrival(count, gridDim.x);
    }
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    bv = -INFINITY;
    bi = INT_MAX;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x)
        am_better(bv, bi, ((volatile float *)pv)[b], ((volatile int *)pi)[b]);
    am_block(bv, bi, sv, si);
    if (threadIdx.x == 0) {
        const int id = bi == INT_MAX ? 0 : bi;
        *out = id;
        if (host) /* mapped host memory: seen there once the kernel is done, no fence needed */
            *(volatile int *)host = id;
    }
}

extern "C" cudaError_t cuk_argmax(cudaStream_t s, int *out, int *host, const float *x, int n,
                                  void *ws)
{
    if (n < 1)
        return cudaErrorInvalidValue;
    int blocks = (n + AM_THREADS - 1) / AM_THREADS;
    if (blocks > AM_BLOCKS)
        blocks = AM_BLOCKS;
    float *pv = (float *)ws;
    int *pi = (int *)(pv + AM_BLOCKS);
    unsigned *count = (unsigned *)(pi + AM_BLOCKS);
    cuk_launch(k_argmax, blocks, AM_THREADS, 0, s, out, host, x, n, pv, pi, count);
    return cudaGetLastError();
}

/* Several rows at once (a batched step's greedy sequences): each row split
 * over blocks so that the launch fills the GPU (one block a row left a
 * step of 8 rows of 128,256 on 8 SMs for ~33 us). A block keeps the best
 * of its span by k_argmax's comparison and offers it to its row as one
 * cuk_best_key (order_key.cuh: the larger value, then the lower index; both
 * zeros as one value) by atomicMax; the row's last block reads the key,
 * writes the id and re-arms the row. So each id is the one k_argmax
 * would give for that row alone. */
#define AMR_THREADS 512
#define AMR_MIN_SPAN 4096 /* elements a block at least */

__global__ void __launch_bounds__(AMR_THREADS)
    k_argmax_rows(int *out, const float *x, int n, unsigned long long *keys, unsigned *counts)
{
    cuk_pdl_start();
    __shared__ float sv[AMR_THREADS / 32];
    __shared__ int si[AMR_THREADS / 32];
    const int r = blockIdx.y, splits = gridDim.x;
    const float *row = x + (size_t)r * (size_t)n;
    const int end = (int)((long long)n * (blockIdx.x + 1) / splits);
    float bv = -INFINITY;
    int bi = INT_MAX, bd = blockDim.x;
    int i = (int)((long long)n * blockIdx.x / splits) + threadIdx.x;
    /* four loads in flight per thread (am_better does not depend on order) */
    for (; i + 3 * bd < end; i += 4 * bd) {
        float v0 = row[i], v1 = row[i + bd], v2 = row[i + 2 * bd], v3 = row[i + 3 * bd];
        am_better(bv, bi, v0, i);
        am_better(bv, bi, v1, i + bd);
        am_better(bv, bi, v2, i + 2 * bd);
        am_better(bv, bi, v3, i + 3 * bd);
    }
    for (; i < end; i += bd)
        am_better(bv, bi, row[i], i);
    am_block(bv, bi, sv, si);
    if (threadIdx.x != 0)
        return;
    if (splits == 1) {
        out[r] = bi == INT_MAX ? 0 : bi;
        return;
    }
    if (bi != INT_MAX) /* a span of NaNs offers nothing; 0 is below every key */
        atomicMax(keys + r, cuk_best_key(cuk_order_key(bv), bi));
    if (!cuk_last_arrival(counts + r, (unsigned)splits))
        return;
    const unsigned long long k = atomicExch(keys + r, 0ull);
    out[r] = k == 0 ? 0 : cuk_best_id(k);
}

extern "C" cudaError_t cuk_argmax_rows(cudaStream_t s, int *out, const float *x, int rows, int n,
                                       void *ws, int blocks)
{
    if (n < 1 || rows < 1 || rows > 65535 || !ws)
        return cudaErrorInvalidValue;
    const int splits = cuk_row_blocks(blocks, rows, n, AMR_MIN_SPAN, 0);
    unsigned long long *keys = (unsigned long long *)ws;
    cuk_launch(k_argmax_rows, dim3((unsigned)splits, (unsigned)rows), AMR_THREADS, 0, s, out, x,
               n, keys, (unsigned *)(keys + rows));
    return cudaGetLastError();
}
