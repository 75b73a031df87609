/* attention_tiled.cu - causal attention over the paged KV cache for prefill
 * chunks. The per-query kernel (attention.cu) reads every key once per
 * query and head, which makes a long prefill read K/V n x group times; here
 * a block takes a tile of queries of all the query heads that share one KV
 * head, stages 32-key tiles of K and V in shared memory once for all of
 * them, and keeps an online softmax per (query, head) row. Each warp owns
 * RPW rows outright (a lane holds one key's score per row and a slice of
 * head dims of each row's output), so the softmax needs no block-wide
 * synchronisation. */
#include <math.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"

#define TA_WARPS 8
#define TA_KEYS 32 /* keys per tile: one per lane */
#define TA_MIN_N 8 /* fewer queries: the per-query kernel */

/* 16 bytes of K/V cache (raw) widened to f32: 4 f32 or 8 bf16 elements;
 * the pointer only selects the element type. */
static __device__ __forceinline__ void kv_cvt(const float *, uint4 x, float *f)
{
    f[0] = __uint_as_float(x.x);
    f[1] = __uint_as_float(x.y);
    f[2] = __uint_as_float(x.z);
    f[3] = __uint_as_float(x.w);
}

static __device__ __forceinline__ void kv_cvt(const uint16_t *, uint4 x, float *f)
{
    uint32_t u[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        f[2 * k] = __uint_as_float(u[k] << 16);
        f[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
    }
}

template <int HD, int RPW>
static constexpr size_t ta_smem_bytes()
{
    return sizeof(float) * ((size_t)TA_WARPS * RPW * HD      /* q tile */
                            + (size_t)TA_KEYS * (HD + 4)     /* k tile, padded rows */
                            + (size_t)TA_KEYS * HD           /* v tile */
                            + (size_t)TA_WARPS * RPW * TA_KEYS); /* probabilities */
}

/* Key splits of a block's rows (n_splits > 1, short segments of a batch
 * step): split sp takes the keys of 32-aligned chunk sp, writes its
 * unnormalized partial (acc, max, sum) to ws, and the last split of the
 * block to finish merges them in split order. */
struct ta_split {
    int n_splits, sp;
    float *ws;     /* [g.n * n_heads * n_splits][HD], then max, then sum */
    unsigned *cnt; /* this block's counter (zero before, re-armed after) */
};

/* One block's work: queries q0 .. q0+bq-1 (of g.n) of every query head of
 * KV head kvh (all keys, or one split of them). */
template <int HD, int RPW, typename T>
static __device__ __forceinline__ void tiled_block(float *out, const float *q, const T *kc,
                                                   const T *vc, const int *table,
                                                   const struct cuk_attn &g, int bq, int q0,
                                                   int kvh, struct ta_split sp)
{
    constexpr int R = TA_WARPS * RPW; /* rows of the block: (query, head) pairs */
    constexpr int KS = HD + 4;        /* k row stride: float4 reads by 8 lanes hit 32 banks */
    constexpr int DPL = HD / 32;      /* output dims per lane */
    extern __shared__ float4 ta_smem[];
    float *qs = (float *)ta_smem;   /* [R][HD] */
    float *ks = qs + R * HD;        /* [TA_KEYS][KS] */
    float *vs = ks + TA_KEYS * KS;  /* [TA_KEYS][HD] */
    float *ps = vs + TA_KEYS * HD;  /* [R][TA_KEYS] */

    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int G = g.n_heads / g.n_kv_heads;
    int nq = min(bq, g.n - q0), rows = nq * G;
    /* row r = qi * G + hh: query q0 + qi, head kvh * G + hh */

    for (int idx = threadIdx.x; idx < R * HD / 4; idx += blockDim.x) {
        int r = idx / (HD / 4), d4 = idx % (HD / 4);
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < rows) {
            int qi = r / G, hh = r % G;
            v = ((const float4 *)(q + ((size_t)(q0 + qi) * g.n_heads + kvh * G + hh) * HD))[d4];
        }
        ((float4 *)qs)[idx] = v;
    }

    float m[RPW], l[RPW], acc[RPW][DPL];
    int pos[RPW], start[RPW];
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        int r = warp * RPW + i;
        pos[i] = r < rows ? g.pos0 + q0 + r / G : -1; /* -1: no query, all keys masked */
        start[i] = 0;
        if (g.window > 0 && pos[i] - g.window + 1 > 0)
            start[i] = pos[i] - g.window + 1;
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int d = 0; d < DPL; d++)
            acc[i][d] = 0.0f;
    }

    int p_first = g.pos0 + q0, p_last = g.pos0 + q0 + nq - 1;
    int k_lo = 0;
    if (g.window > 0 && p_first - g.window + 1 > 0)
        k_lo = p_first - g.window + 1;
    k_lo &= ~(TA_KEYS - 1); /* tiles at multiples of 32 whatever the query tiling */
    int k_end = p_last + 1; /* keys [k_lo, k_end) */
    if (sp.n_splits > 1) {
        int chunk = (k_end - k_lo + sp.n_splits - 1) / sp.n_splits;
        chunk = (chunk + TA_KEYS - 1) & ~(TA_KEYS - 1);
        k_lo += sp.sp * chunk;
        k_end = min(k_end, k_lo + chunk);
    }
    int t_max = k_end - 1; /* last key of this block's range */

    /* 16-byte loads, VEC elements of one key's head slice each; a thread
     * holds LPT of them per tile. The next tile's loads are issued before
     * the current tile is computed, so the wait for memory (block table,
     * then K/V) overlaps the arithmetic instead of following it. */
    constexpr int VEC = 16 / sizeof(T), NV = HD / VEC;
    constexpr int LPT = (TA_KEYS * NV + TA_WARPS * 32 - 1) / (TA_WARPS * 32);
    uint4 kraw[LPT], vraw[LPT];
    auto load_tile = [&](int t0) {
#pragma unroll
        for (int u = 0; u < LPT; u++) {
            int idx = threadIdx.x + u * TA_WARPS * 32, j = idx / NV, c = idx % NV, t = t0 + j;
            kraw[u] = vraw[u] = make_uint4(0, 0, 0, 0);
            if (idx < TA_KEYS * NV && t <= t_max) {
                /* 16-byte chunks: VEC elements of bf16 (swizzled) or f32 */
                size_t off = cuk_kv_row(&g, table, t, kvh) + cuk_kv_col(&g, t, c * VEC);
                kraw[u] = *(const uint4 *)(kc + off);
                vraw[u] = *(const uint4 *)(vc + off);
            }
        }
    };
    if (k_lo <= t_max)
        load_tile(k_lo);

    for (int t0 = k_lo; t0 <= t_max; t0 += TA_KEYS) {
        __syncthreads(); /* the previous tile (and the q tile) are in place / consumed */
#pragma unroll
        for (int u = 0; u < LPT; u++) {
            int idx = threadIdx.x + u * TA_WARPS * 32, j = idx / NV, c = idx % NV;
            if (idx >= TA_KEYS * NV)
                continue;
            float kf[VEC], vf[VEC];
            kv_cvt(kc, kraw[u], kf); /* zeros stay zeros */
            kv_cvt(vc, vraw[u], vf);
#pragma unroll
            for (int e = 0; e < VEC; e += 4) {
                *(float4 *)(ks + j * KS + c * VEC + e) = make_float4(kf[e], kf[e + 1], kf[e + 2], kf[e + 3]);
                *(float4 *)(vs + j * HD + c * VEC + e) = make_float4(vf[e], vf[e + 1], vf[e + 2], vf[e + 3]);
            }
        }
        __syncthreads();
        if (t0 + TA_KEYS <= t_max)
            load_tile(t0 + TA_KEYS);

        float s[RPW];
#pragma unroll
        for (int i = 0; i < RPW; i++)
            s[i] = 0.0f;
        const float4 *kr = (const float4 *)(ks + lane * KS);
#pragma unroll 4
        for (int d4 = 0; d4 < HD / 4; d4++) {
            float4 kk = kr[d4];
#pragma unroll
            for (int i = 0; i < RPW; i++) {
                float4 qq = ((const float4 *)(qs + (warp * RPW + i) * HD))[d4];
                float a = s[i];
                a = fmaf(qq.x, kk.x, a);
                a = fmaf(qq.y, kk.y, a);
                a = fmaf(qq.z, kk.z, a);
                a = fmaf(qq.w, kk.w, a);
                s[i] = a;
            }
        }
        int t = t0 + lane;
#pragma unroll
        for (int i = 0; i < RPW; i++) {
            bool ok = t <= pos[i] && t >= start[i] && t <= t_max;
            float sc = ok ? s[i] * g.scale : -INFINITY;
            float mx = sc;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float mnew = fmaxf(m[i], mx), p = 0.0f, corr = 1.0f;
            if (mnew != -INFINITY) { /* warp-uniform */
                p = ok ? expf(sc - mnew) : 0.0f;
                corr = expf(m[i] - mnew); /* 0 when m was -inf (acc and l are 0 then) */
            }
            l[i] = l[i] * corr + p; /* this lane's share; summed over lanes at the end */
#pragma unroll
            for (int d = 0; d < DPL; d++)
                acc[i][d] *= corr;
            m[i] = mnew;
            ps[(warp * RPW + i) * TA_KEYS + lane] = p;
        }
        __syncwarp();
#pragma unroll 2
        for (int j = 0; j < TA_KEYS; j += 4) {
            float v[4][DPL];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const float *vr = vs + (j + u) * HD + lane * DPL;
                if constexpr (DPL == 4) {
                    float4 x = *(const float4 *)vr;
                    v[u][0] = x.x;
                    v[u][1] = x.y;
                    v[u][2] = x.z;
                    v[u][3] = x.w;
                } else {
                    float2 x = *(const float2 *)vr;
                    v[u][0] = x.x;
                    v[u][1] = x.y;
                }
            }
#pragma unroll
            for (int i = 0; i < RPW; i++) {
                float4 pp = ((const float4 *)(ps + (warp * RPW + i) * TA_KEYS))[j / 4];
#pragma unroll
                for (int d = 0; d < DPL; d++) {
                    float a = acc[i][d];
                    a = fmaf(pp.x, v[0][d], a);
                    a = fmaf(pp.y, v[1][d], a);
                    a = fmaf(pp.z, v[2][d], a);
                    a = fmaf(pp.w, v[3][d], a);
                    acc[i][d] = a;
                }
            }
        }
        __syncwarp();
    }

    /* Unsplit: the output rows. Split: the partial of (query, head) row
     * qh = (q0 + qi) * n_heads + h, split s, at ws[(qh * n_splits + s) *
     * HD + d], its max at wm[qh * n_splits + s], its sum at wl[...]. */
    const bool split = sp.n_splits > 1;
    size_t nrow = (size_t)g.n * g.n_heads * sp.n_splits;
    float *wm = split ? sp.ws + nrow * HD : nullptr, *wl = split ? wm + nrow : nullptr;
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        float L = cuk_warp_sum(l[i]);
        int r = warp * RPW + i;
        if (r >= rows)
            continue;
        size_t qh = (size_t)(q0 + r / G) * g.n_heads + kvh * G + r % G;
        if (!split) {
            float *o = out + qh * HD + lane * DPL;
#pragma unroll
            for (int d = 0; d < DPL; d++)
                o[d] = acc[i][d] / L;
            continue;
        }
        size_t rs = qh * sp.n_splits + sp.sp;
#pragma unroll
        for (int d = 0; d < DPL; d++)
            sp.ws[rs * HD + lane * DPL + d] = acc[i][d];
        if (lane == 0) {
            wm[rs] = m[i];
            wl[rs] = L;
        }
    }
    if (!split)
        return;
    if (!cuk_last_block(sp.cnt, (unsigned)sp.n_splits))
        return;
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        int r = warp * RPW + i;
        if (r >= rows)
            continue;
        int qi = r / G, hh = r % G;
        size_t qh = (size_t)(q0 + qi) * g.n_heads + kvh * G + hh, r0 = qh * sp.n_splits;
        float M = -INFINITY;
        for (int s2 = 0; s2 < sp.n_splits; s2++)
            M = fmaxf(M, __ldcg(wm + r0 + s2));
        float L = 0.0f, o[DPL];
#pragma unroll
        for (int d = 0; d < DPL; d++)
            o[d] = 0.0f;
        for (int s2 = 0; s2 < sp.n_splits; s2++) {
            float ms = __ldcg(wm + r0 + s2);
            if (ms == -INFINITY) /* a split that saw no key of this row */
                continue;
            float c = expf(ms - M);
            L += __ldcg(wl + r0 + s2) * c;
#pragma unroll
            for (int d = 0; d < DPL; d++)
                o[d] += __ldcg(sp.ws + (r0 + s2) * HD + lane * DPL + d) * c;
        }
        float *out_r = out + qh * HD + lane * DPL;
#pragma unroll
        for (int d = 0; d < DPL; d++)
            out_r[d] = o[d] / L;
    }
}

template <int HD, int RPW, typename T>
__global__ void __launch_bounds__(TA_WARPS * 32)
    k_attention_tiled(float *out, const float *q, const T *kc, const T *vc, const int *table,
                      struct cuk_attn g, int bq)
{
    cuk_pdl_start();
    tiled_block<HD, RPW, T>(out, q, kc, vc, table, g, bq, blockIdx.x * bq, blockIdx.y,
                            ta_split{1, 0, nullptr, nullptr});
}

/* The short segments of a batch step (cuk_bseg.tiled == 2: at most bq
 * rows), one block per (segment, KV head): blockIdx.x runs over the rows
 * of the step and the block of a segment's first row does its work. */
template <int HD, int RPW, typename T>
__global__ void __launch_bounds__(TA_WARPS * 32)
    k_attention_tiled_batch(float *out, const float *q, const T *kc, const T *vc,
                            const int *meta, struct cuk_attn g, int bq, float *ws,
                            unsigned *cnt, int max_splits)
{
    cuk_pdl_start();
    struct cuk_attn gs;
    const struct cuk_bseg *sg = cuk_bseg_of_block(meta, g, &gs);
    if (!sg)
        return;
    size_t qd = (size_t)g.n_heads * HD;
    struct ta_split sp = {sg->splits, (int)blockIdx.z, cuk_bseg_ws(sg, g, ws, max_splits, HD),
                          cuk_bseg_cnt(sg, g, cnt, blockIdx.y)};
    tiled_block<HD, RPW, T>(out + sg->row0 * qd, q + sg->row0 * qd, kc, vc, meta + sg->tab_off,
                            gs, bq, 0, blockIdx.y, sp);
}

extern "C" int cuk_attention_tiled_ok(const struct cuk_attn *g)
{
    return g->n >= TA_MIN_N && (g->head_dim == 64 || g->head_dim == 128) && g->n_kv_heads > 0 &&
           g->n_heads % g->n_kv_heads == 0 && g->n_heads / g->n_kv_heads <= TA_WARPS * 8;
}

template <int HD, int RPW, typename T>
static cudaError_t launch_tiled(cudaStream_t s, float *out, const float *q, const T *kc,
                                const T *vc, const int *table, const struct cuk_attn *g)
{
    int G = g->n_heads / g->n_kv_heads, bq = TA_WARPS * RPW / G;
    size_t smem = ta_smem_bytes<HD, RPW>();
    static struct cuk_opted opted;
    cudaError_t err = cuk_smem_opt_in(k_attention_tiled<HD, RPW, T>, smem, &opted);
    if (err != cudaSuccess)
        return err;
    dim3 grid((unsigned)((g->n + bq - 1) / bq), (unsigned)g->n_kv_heads);
    cuk_launch(k_attention_tiled<HD, RPW, T>, grid, TA_WARPS * 32, smem, s, out, q, kc, vc, table, *g,
                                                                     bq);
    return cudaGetLastError();
}

/* Rows per warp: 8 (more reuse of each K/V tile) unless that leaves fewer
 * blocks than two per multiprocessor, then 4; g->rows_per_warp fixes it. */
template <int HD, typename T>
static cudaError_t launch_tiled_hd(cudaStream_t s, float *out, const float *q, const T *kc,
                                   const T *vc, const int *table, const struct cuk_attn *g)
{
    int n_sms = g->n_sms > 0 ? g->n_sms : 1, rpw = g->rows_per_warp;
    int G = g->n_heads / g->n_kv_heads;
    long blocks8 = (long)((g->n + TA_WARPS * 8 / G - 1) / (TA_WARPS * 8 / G)) * g->n_kv_heads;
    if (rpw == 8 && G <= TA_WARPS * 8)
        return launch_tiled<HD, 8, T>(s, out, q, kc, vc, table, g);
    if (G <= TA_WARPS * 4 && (rpw == 4 || blocks8 < 2L * n_sms))
        return launch_tiled<HD, 4, T>(s, out, q, kc, vc, table, g);
    return launch_tiled<HD, 8, T>(s, out, q, kc, vc, table, g);
}

extern "C" cudaError_t cuk_attention_tiled(cudaStream_t s, float *out, const float *q,
                                           const void *kc, const void *vc, const int *table,
                                           const struct cuk_attn *g)
{
    if (!cuk_attention_tiled_ok(g))
        return cudaErrorInvalidValue;
    if (cuk_attention_mma_ok(g))
        return cuk_attention_mma(s, out, q, kc, vc, table, g, 1, nullptr, nullptr);
    if (g->head_dim == 64)
        return g->kv_bf16 ? launch_tiled_hd<64>(s, out, q, (const uint16_t *)kc,
                                                (const uint16_t *)vc, table, g)
                          : launch_tiled_hd<64>(s, out, q, (const float *)kc, (const float *)vc,
                                                table, g);
    return g->kv_bf16 ? launch_tiled_hd<128>(s, out, q, (const uint16_t *)kc,
                                             (const uint16_t *)vc, table, g)
                      : launch_tiled_hd<128>(s, out, q, (const float *)kc, (const float *)vc,
                                             table, g);
}

/* Rows per warp 1: a block holds 8 (query, head) rows, the query heads of
 * one KV head for up to 8 / group queries. */
extern "C" int cuk_attention_short_rows(const struct cuk_attn *g)
{
    if ((g->head_dim != 64 && g->head_dim != 128) || g->n_kv_heads <= 0 ||
        g->n_heads % g->n_kv_heads)
        return 0;
    int G = g->n_heads / g->n_kv_heads;
    return G <= TA_WARPS ? TA_WARPS / G : 0;
}

template <int HD, typename T>
static cudaError_t launch_short(cudaStream_t s, float *out, const float *q, const T *kc,
                                const T *vc, const int *meta, const struct cuk_attn *g,
                                int max_splits, float *ws, unsigned *cnt)
{
    int bq = cuk_attention_short_rows(g);
    size_t smem = ta_smem_bytes<HD, 1>();
    static struct cuk_opted opted;
    cudaError_t err = cuk_smem_opt_in(k_attention_tiled_batch<HD, 1, T>, smem, &opted);
    if (err != cudaSuccess)
        return err;
    return cuk_launch(k_attention_tiled_batch<HD, 1, T>,
                      dim3((unsigned)g->n, (unsigned)g->n_kv_heads, (unsigned)max_splits),
                      TA_WARPS * 32, smem, s, out, q, kc, vc, meta, *g, bq, ws, cnt,
                      max_splits);
}

extern "C" size_t cuk_attention_short_ws_floats(const struct cuk_attn *g, int max_splits)
{
    return max_splits > 1 ? (size_t)g->n * g->n_heads * max_splits * (g->head_dim + 2) : 0;
}

extern "C" cudaError_t cuk_attention_short_batch(cudaStream_t s, float *out, const float *q,
                                                 const void *kc, const void *vc,
                                                 const int *meta, const struct cuk_attn *g,
                                                 int max_splits, float *ws, unsigned *cnt)
{
    if (!cuk_attention_short_rows(g) || max_splits < 1 || (max_splits > 1 && (!ws || !cnt)))
        return cudaErrorInvalidValue;
    if (g->head_dim == 64)
        return g->kv_bf16 ? launch_short<64>(s, out, q, (const uint16_t *)kc,
                                             (const uint16_t *)vc, meta, g, max_splits, ws, cnt)
                          : launch_short<64>(s, out, q, (const float *)kc, (const float *)vc,
                                             meta, g, max_splits, ws, cnt);
    return g->kv_bf16 ? launch_short<128>(s, out, q, (const uint16_t *)kc, (const uint16_t *)vc,
                                          meta, g, max_splits, ws, cnt)
                      : launch_short<128>(s, out, q, (const float *)kc, (const float *)vc, meta,
                                          g, max_splits, ws, cnt);
}
