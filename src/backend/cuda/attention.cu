/* attention.cu - causal attention over the paged KV cache, for prefill (n
 * query tokens of one sequence) and decode alike. One block of 4 warps
 * takes one (query, head) pair and one split of its key range; warps take
 * keys in groups of 4 and keep an online softmax (running max, sum and
 * weighted V sum, one head-dim slice per lane). With several splits
 * ("flash-decoding", for long contexts with few queries) each block writes
 * its unnormalized partial result and the last block of a (query, head) to
 * finish merges them. */
#include <math.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"

#define ATT_WARPS 4
#define ATT_KEYS 4 /* keys per warp per step */
#define ATT_MAX_HD 256
#define ATT_MAX_SPLITS 64 /* cuk_attention_splits never exceeds it */

/* Workspace layout for n_splits > 1: o[rows][hd], then m[rows], then l[rows]
 * with rows = n * n_heads * n_splits, row = (i * n_heads + h) * n_splits + sp. */

/* The segment of batch row `row` (see cuk_rope_kv_attention_batch). */
static __device__ __forceinline__ int meta_seg(const int *meta, const struct cuk_attn &g, int row)
{
    return meta[g.pos0 + row];
}

/* Merges the n_splits partial results of (query i, head h). The partials
 * were written by other blocks of this grid: read through L2 (__ldcg),
 * never a stale L1 line. */
static __device__ __forceinline__ void merge_block(float *out, const struct cuk_attn &g, int i,
                                                   int h, int n_splits, const float *ws)
{
    __shared__ float cw[ATT_MAX_SPLITS], sL;
    __shared__ bool cv[ATT_MAX_SPLITS]; /* split saw a key */
    int hd = g.head_dim;
    size_t rows = (size_t)g.n * g.n_heads * n_splits;
    size_t row0 = ((size_t)i * g.n_heads + h) * n_splits;
    const float *wm = ws + rows * hd + row0, *wl = ws + rows * hd + rows + row0;
    if (threadIdx.x == 0) {
        float M = -INFINITY;
        for (int s = 0; s < n_splits; s++)
            M = fmaxf(M, __ldcg(wm + s));
        float L = 0.0f;
        for (int s = 0; s < n_splits; s++) {
            float m = __ldcg(wm + s);
            cv[s] = m != -INFINITY;
            cw[s] = cv[s] ? expf(m - M) : 0.0f;
            if (cv[s])
                L += __ldcg(wl + s) * cw[s];
        }
        sL = L;
    }
    __syncthreads();
    for (int dd = threadIdx.x; dd < hd; dd += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < n_splits; s++)
            if (cv[s])
                o += __ldcg(ws + (row0 + s) * hd + dd) * cw[s];
        out[((size_t)i * g.n_heads + h) * hd + dd] = o / sL;
    }
}

/* One block's work of k_attention: query i (of g.n) of head h, split sp. */
template <int DPL, typename T> /* head dims per lane: ceil(head_dim / 32); KV type */
__device__ __forceinline__ void att_block(float *out, const float *q, const T *kc,
                                          const T *vc, const int *table,
                                          const struct cuk_attn &g, int pos0, int i, int h,
                                          int sp, int n_splits, float *ws, unsigned *cnt)
{
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int hd = g.head_dim, kvh = h / (g.n_heads / g.n_kv_heads);
    int pos = pos0 + i;
    int start = 0;
    if (g.window > 0 && pos - g.window + 1 > 0)
        start = pos - g.window + 1;
    int len = pos - start + 1, per = (len + n_splits - 1) / n_splits;
    int kb = start + sp * per, ke = min(kb + per, pos + 1);

    const float *qp = q + ((size_t)i * g.n_heads + h) * hd;
    float qr[DPL], acc[DPL];
#pragma unroll
    for (int d = 0; d < DPL; d++) {
        int dd = lane + 32 * d;
        qr[d] = dd < hd ? qp[dd] : 0.0f;
        acc[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;

    for (int t0 = kb + warp * ATT_KEYS; t0 < ke; t0 += ATT_WARPS * ATT_KEYS) {
        float s[ATT_KEYS];
        size_t off[ATT_KEYS];
#pragma unroll
        for (int u = 0; u < ATT_KEYS; u++) {
            int t = t0 + u;
            float dot = 0.0f;
            off[u] = 0;
            if (t < ke) { /* uniform across the warp */
                off[u] = cuk_kv_row(&g, table, t, kvh);
                const T *kp = kc + off[u];
#pragma unroll
                for (int d = 0; d < DPL; d++) {
                    int dd = lane + 32 * d;
                    if (dd < hd)
                        dot += qr[d] * kv_ld(kp, cuk_kv_col(&g, t, dd));
                }
            }
            s[u] = dot;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int u = 0; u < ATT_KEYS; u++)
                s[u] += __shfl_xor_sync(0xffffffffu, s[u], o);
        float mnew = m;
#pragma unroll
        for (int u = 0; u < ATT_KEYS; u++)
            if (t0 + u < ke) {
                s[u] *= g.scale;
                mnew = fmaxf(mnew, s[u]);
            }
        float corr = expf(m - mnew); /* m = -inf on the first step: 0 */
        l *= corr;
#pragma unroll
        for (int d = 0; d < DPL; d++)
            acc[d] *= corr;
#pragma unroll
        for (int u = 0; u < ATT_KEYS; u++)
            if (t0 + u < ke) {
                float p = expf(s[u] - mnew);
                l += p;
                const T *vp = vc + off[u];
#pragma unroll
                for (int d = 0; d < DPL; d++) {
                    int dd = lane + 32 * d;
                    if (dd < hd)
                        acc[d] += p * kv_ld(vp, cuk_kv_col(&g, t0 + u, dd));
                }
            }
        m = mnew;
    }

    __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][ATT_MAX_HD];
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int d = 0; d < DPL; d++) {
        int dd = lane + 32 * d;
        if (dd < hd)
            sm_acc[warp][dd] = acc[d];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++)
        M = fmaxf(M, sm_m[w]);
    float c[ATT_WARPS], L = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++) {
        c[w] = sm_m[w] == -INFINITY ? 0.0f : expf(sm_m[w] - M);
        L += sm_l[w] * c[w];
    }
    size_t row = ((size_t)i * g.n_heads + h) * n_splits + sp;
    for (int dd = threadIdx.x; dd < hd; dd += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            o += sm_acc[w][dd] * c[w];
        if (n_splits == 1)
            out[((size_t)i * g.n_heads + h) * hd + dd] = o / L;
        else
            ws[row * hd + dd] = o;
    }
    if (n_splits == 1)
        return;
    if (threadIdx.x == 0) {
        size_t rows = (size_t)g.n * g.n_heads * n_splits;
        ws[rows * hd + row] = M;
        ws[rows * hd + rows + row] = L;
    }
    /* The last split of (i, h) to finish merges all of them (what a
     * separate merge launch would do, in the same order), then re-arms the
     * counter for the next call. */
    if (cuk_last_block(cnt + (size_t)i * g.n_heads + h, (unsigned)n_splits))
        merge_block(out, g, i, h, n_splits, ws);
}

template <int DPL, typename T>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    k_attention(float *out, const float *q, const T *kc, const T *vc, const int *table,
                struct cuk_attn g, const int *dpos, int n_splits, float *ws, unsigned *cnt)
{
    cuk_pdl_start();
    att_block<DPL, T>(out, q, kc, vc, table, g, dpos ? *dpos : g.pos0, blockIdx.x, blockIdx.y,
                      blockIdx.z, n_splits, ws, cnt);
}

/* Every sequence of a batch step in one launch: blockIdx.x is the row of
 * the concatenated batch, its segment (from row_seg) gives the sequence's
 * geometry, so each block does exactly what k_attention does for it. */
template <int DPL, typename T>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    k_attention_batch(float *out, const float *q, const T *kc, const T *vc,
                      const int *meta, struct cuk_attn g, float *ws, unsigned *cnt)
{
    cuk_pdl_start();
    const struct cuk_bseg *sg = (const struct cuk_bseg *)meta + meta_seg(meta, g, blockIdx.x);
    if ((int)blockIdx.z >= sg->splits || sg->tiled)
        return;
    size_t qd = (size_t)g.n_heads * g.head_dim;
    struct cuk_attn gs = g;
    gs.n = sg->n;
    gs.pos0 = sg->pos0;
    att_block<DPL, T>(out + sg->row0 * qd, q + sg->row0 * qd, kc, vc, meta + sg->tab_off, gs,
                      sg->pos0, blockIdx.x - sg->row0, blockIdx.y, blockIdx.z, sg->splits,
                      ws + sg->ws_off, cnt + (size_t)sg->row0 * g.n_heads);
}

extern "C" int cuk_attention_splits(int n, int n_heads, int kv_len, int n_sms)
{
    long blocks = (long)n * n_heads, target = 2L * n_sms;
    if (blocks >= target || kv_len <= 256)
        return 1;
    long s = (target + blocks - 1) / blocks, by_len = (kv_len + 127) / 128;
    if (s > by_len)
        s = by_len;
    if (s > 64)
        s = 64;
    return s < 1 ? 1 : (int)s;
}

extern "C" size_t cuk_attention_ws_floats(const struct cuk_attn *g, int n_splits)
{
    if (n_splits <= 1)
        return 0;
    size_t rows = (size_t)g->n * g->n_heads * n_splits;
    return rows * (size_t)g->head_dim + 2 * rows;
}

template <typename T>
static void launch_attention(cudaStream_t s, float *out, const float *q, const T *kc,
                             const T *vc, const int *table, const struct cuk_attn *g,
                             const int *dpos, int n_splits, float *ws, unsigned *cnt)
{
    dim3 grid(g->n, g->n_heads, n_splits);
    int dpl = (g->head_dim + 31) / 32;
    if (dpl == 1)
        cuk_launch(k_attention<1, T>, grid, ATT_WARPS * 32, 0, s, out, q, kc, vc, table, *g, dpos,
                                                          n_splits, ws, cnt);
    else if (dpl == 2)
        cuk_launch(k_attention<2, T>, grid, ATT_WARPS * 32, 0, s, out, q, kc, vc, table, *g, dpos,
                                                          n_splits, ws, cnt);
    else if (dpl <= 4)
        cuk_launch(k_attention<4, T>, grid, ATT_WARPS * 32, 0, s, out, q, kc, vc, table, *g, dpos,
                                                          n_splits, ws, cnt);
    else
        cuk_launch(k_attention<8, T>, grid, ATT_WARPS * 32, 0, s, out, q, kc, vc, table, *g, dpos,
                                                          n_splits, ws, cnt);
}

extern "C" cudaError_t cuk_attention(cudaStream_t s, float *out, const float *q, const void *kc,
                                     const void *vc, const int *table, const struct cuk_attn *g,
                                     const int *dpos, int n_splits, float *ws, unsigned *cnt)
{
    if (g->head_dim > ATT_MAX_HD || g->head_dim <= 0 || g->n_kv_heads <= 0 ||
        g->n_heads % g->n_kv_heads)
        return cudaErrorInvalidValue;
    if (n_splits == 1 && !dpos && cuk_attention_tiled_ok(g))
        return cuk_attention_tiled(s, out, q, kc, vc, table, g);
    if (g->kv_bf16)
        launch_attention(s, out, q, (const uint16_t *)kc, (const uint16_t *)vc, table, g, dpos,
                         n_splits, ws, cnt);
    else
        launch_attention(s, out, q, (const float *)kc, (const float *)vc, table, g, dpos,
                         n_splits, ws, cnt);
    return cudaGetLastError();
}

template <typename T>
static void launch_attention_batch(cudaStream_t s, float *out, const float *q, const T *kc,
                                   const T *vc, const int *meta, const struct cuk_attn *g,
                                   int max_splits, float *ws, unsigned *cnt)
{
    dim3 grid(g->n, g->n_heads, max_splits);
    int dpl = (g->head_dim + 31) / 32;
    if (dpl == 1)
        cuk_launch(k_attention_batch<1, T>, grid, ATT_WARPS * 32, 0, s, out, q, kc, vc, meta, *g, ws, cnt);
    else if (dpl == 2)
        cuk_launch(k_attention_batch<2, T>, grid, ATT_WARPS * 32, 0, s, out, q, kc, vc, meta, *g, ws, cnt);
    else if (dpl <= 4)
        cuk_launch(k_attention_batch<4, T>, grid, ATT_WARPS * 32, 0, s, out, q, kc, vc, meta, *g, ws, cnt);
    else
        cuk_launch(k_attention_batch<8, T>, grid, ATT_WARPS * 32, 0, s, out, q, kc, vc, meta, *g, ws, cnt);
}

extern "C" cudaError_t cuk_rope_kv_attention_batch(cudaStream_t s, float *out, float *q, float *k,
                                                   const float *v, void *kc, void *vc,
                                                   const int *meta, const struct cuk_attn *g,
                                                   int max_splits, const float *inv_freq,
                                                   int interleaved, const float *q_norm,
                                                   const float *k_norm, float eps, float *ws,
                                                   unsigned *cnt)
{
    if (g->head_dim > ATT_MAX_HD || g->head_dim <= 0 || g->n_kv_heads <= 0 ||
        g->n_heads % g->n_kv_heads)
        return cudaErrorInvalidValue;
    cudaError_t err = cuk_rope_kv_store_batch(s, q, k, v, kc, vc, meta, g, inv_freq, interleaved,
                                              q_norm, k_norm, eps);
    if (err != cudaSuccess || max_splits == 0) /* 0: every segment's attention is the caller's */
        return err;
    if (g->kv_bf16)
        launch_attention_batch(s, out, q, (const uint16_t *)kc, (const uint16_t *)vc, meta, g,
                               max_splits, ws, cnt);
    else
        launch_attention_batch(s, out, q, (const float *)kc, (const float *)vc, meta, g,
                               max_splits, ws, cnt);
    return cudaGetLastError();
}
