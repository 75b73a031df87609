/* attention_mma.cu - causal prefill attention on tensor cores, for a bf16
 * K/V cache. The FlashAttention-2 scheme with mma.sync m16n8k16 (bf16 in,
 * f32 accumulate): a block owns 64 (query, head) rows of the query heads
 * that share one KV head, each warp 16 of them; 64-key tiles of K and V are
 * copied from the paged cache into shared memory with cp.async, double
 * buffered so the next tile's copy overlaps this tile's arithmetic. Scores
 * and the output stay in registers: S = Q K^T (Q pre-scaled by
 * scale * log2 e and rounded to bf16, held as A fragments for the whole
 * kernel), the online softmax runs in base 2, and P (rounded to bf16) is
 * fed back as the A operand of O += P V.
 *
 * Rounding Q and P to bf16 is what makes this path differ from the f32
 * tiled kernel (attention_tiled.cu): about 2^-9 relative per product, the
 * same order as the bf16 cache itself; an f32 cache (CLLM_KV_DTYPE=f32,
 * CLLM_CUDA_PRECISE) never comes here. */
#include <math.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/dec_probe.cuh"

#define AM_WARPS 4
#define AM_ROWS (AM_WARPS * 16) /* (query, head) rows of a block */
#define AM_KEYS 64              /* keys per tile */
static_assert(AM_KEYS == CUK_DEC_TILE_KEYS, "the host's tile size is the kernels'");
#define AM_MMA_MAX_SPLITS 32    /* key splits of the prefill kernel */

static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* .x (lo) in the low half */
    return *(uint32_t *)&v;
}

static __device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* r / G for the row numbers of a block (0 <= r < 1024, 1 <= G <= 64) by a
 * multiply and a shift instead of a division's ~25 instructions: with
 * m = ceil(2^16 / G), m G - 2^16 < G, so (r m) >> 16 is exact while
 * r (m G - 2^16) < 2^16. */
struct row_div {
    int G, m;
};
static __device__ __forceinline__ struct row_div row_div_of(int G)
{
    return row_div{G, (65536 + G - 1) / G};
}
static __device__ __forceinline__ int row_q(const struct row_div &d, int r)
{
    return (r * d.m) >> 16;
}
/* (query q0 + r / G) * n_heads + kvh * G + r % G: row r's (query, head) */
static __device__ __forceinline__ size_t row_qh(const struct row_div &d, int r, int q0, int kvh,
                                                int n_heads)
{
    int qi = row_q(d, r);
    return (size_t)(q0 + qi) * n_heads + kvh * d.G + (r - qi * d.G);
}

/* A K or V tile is [AM_KEYS][HD] bf16 with 16-byte chunk c of key row j
 * stored at chunk c ^ (j & 7): the 8 rows an ldmatrix reads (8 consecutive
 * keys, one logical chunk) then sit in 8 distinct bank groups. */
template <int HD>
static __device__ __forceinline__ uint32_t tile_addr(uint32_t base, int key, int chunk)
{
    return base + (uint32_t)(key * HD * 2 + ((chunk ^ (key & 7)) << 4));
}

/* A block's key range in 64-key tiles: keys [k_lo, k_end), k_lo the
 * first query's window start (p_first - window + 1) rounded down to a
 * tile, so tiles sit at multiples of 64 positions whatever the chunking;
 * split sp of n_splits takes the run of whole tiles [tb, te). Splits from
 * n_used on have none (a short range, or a split count fixed in advance). */
struct key_run {
    int k_lo, n_tiles, n_used, tb, te;
};

static __device__ __forceinline__ struct key_run key_run_of(const struct cuk_attn &g, int p_first,
                                                            int k_end, int n_splits, int sp)
{
    struct key_run kr;
    kr.k_lo = 0;
    if (g.window > 0 && p_first - g.window + 1 > 0)
        kr.k_lo = p_first - g.window + 1;
    kr.k_lo &= ~(AM_KEYS - 1);
    kr.n_tiles = (k_end - kr.k_lo + AM_KEYS - 1) / AM_KEYS;
    int per = (kr.n_tiles + n_splits - 1) / n_splits;
    kr.n_used = (kr.n_tiles + per - 1) / per;
    kr.tb = sp * per;
    kr.te = min(kr.n_tiles, kr.tb + per);
    return kr;
}

/* Copies the K and V rows (KV head kvh) of keys t0 .. t0 + 63 from the
 * paged cache into the tiles at kt and vt, as one cp.async group; keys at
 * k_end and past are zero-filled. The pool's rows are swizzled as the
 * tiles' (cuk_kv_col), so chunk position p of a row goes to position p. */
template <int HD>
static __device__ __forceinline__ void load_kv_tile(uint32_t kt, uint32_t vt, const uint16_t *kc,
                                                    const uint16_t *vc, const int *table,
                                                    const struct cuk_attn &g, int kvh, int t0,
                                                    int k_end)
{
    constexpr int NCH = HD / 8;                   /* 16-byte chunks per key row */
    constexpr int STEP = AM_WARPS * 32 / NCH;     /* keys between a thread's copies */
    static_assert(AM_WARPS * 32 % NCH == 0, "a thread copies one chunk column");
    static_assert(STEP % 8 == 0, "a thread's keys share their swizzle");
    const int c = threadIdx.x % NCH, j0 = threadIdx.x / NCH, bs = g.block_size;
    /* the thread's keys t0 + j0 + STEP u as (table entry, row in block),
     * stepped on instead of divided anew for each key (cuk_kv_row's
     * arithmetic, a fraction of its code) */
    int bi = (t0 + j0) / bs, rem = t0 + j0 - bi * bs;
    const size_t blk_elems = (size_t)bs * HD; /* a pool block of one head */
    const int pc = c ^ ((t0 + j0) & 7);       /* the chunk's place in the row */
    const uint16_t *kb = kc + cuk_kv_head0(&g, kvh) + (size_t)pc * 8;
    const uint16_t *vb = vc + (kb - kc);
#pragma unroll
    for (int u = 0; u < AM_KEYS / STEP; u++) {
        const int j = j0 + u * STEP;
        const bool ok = t0 + j < k_end;
        const size_t off = ok ? (size_t)table[bi] * blk_elems + (size_t)rem * HD : 0;
        /* tile_addr(j, c) is chunk position c ^ (j & 7) = pc: t0 % 8 == 0 */
        cuk_cp_async16(tile_addr<HD>(kt, j, c), kb + off, ok);
        cuk_cp_async16(tile_addr<HD>(vt, j, c), vb + off, ok);
        for (rem += STEP; rem >= bs; rem -= bs)
            bi++;
    }
    cuk_cp_async_commit();
}

/* A row's sum l over the four threads (tig 0..3) of its quad that hold
 * its share, in every one of them, in the same order everywhere. */
static __device__ __forceinline__ float quad_sum(float l)
{
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    return l + __shfl_xor_sync(0xffffffffu, l, 2);
}

/* One key tile's online-softmax step (base 2) for a thread's two rows
 * (gid: h 0, gid + 8: h 1) of an m16 tile: the scores of n-tiles j (keys
 * kb + 8 j + 2 tig + e % 2) outside a row's range [start, pos] are masked,
 * the running max m moves to the tile's, the running sum l (this thread's
 * share) and the output accumulators o are rescaled to it, and the scores
 * become probabilities. A row that has seen no key yet keeps m = -inf,
 * l = 0, o = 0. */
template <int NT, int DT, bool SKIP = false>
static __device__ __forceinline__ void online_softmax(float (&s)[NT][4], float (&o)[DT][4],
                                                      float (&m)[2], float (&l)[2],
                                                      const int (&pos)[2], const int (&start)[2],
                                                      int kb, int tig)
{
    /* SKIP: a tile every key of which both rows see needs no mask (H200,
     * prefill of 32K tokens: 8B 15,230 -> 15,480 tok/s; the decode kernel
     * keeps its registers without the test) */
    if (!SKIP || kb + 8 * NT - 1 > min(pos[0], pos[1]) || kb < max(start[0], start[1]))
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int h = e >> 1, t = kb + 8 * j + 2 * tig + (e & 1);
                bool ok = t <= pos[h] && t >= start[h];
                s[j][e] = ok ? s[j][e] : -INFINITY;
            }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
    float corr[2], msub[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float mnew = fmaxf(m[h], mx[h]);
        corr[h] = mnew == -INFINITY ? 1.0f : exp2f(m[h] - mnew);
        /* a row with no key yet has only -inf scores: exp2(-inf - 0) = 0,
         * so the test is made once a row, not once a score */
        msub[h] = mnew == -INFINITY ? 0.0f : mnew;
        m[h] = mnew;
        l[h] *= corr[h];
    }
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int h = e >> 1;
            float p = exp2f(s[j][e] - msub[h]);
            s[j][e] = p;
            l[h] += p;
        }
#pragma unroll
    for (int j = 0; j < DT; j++) {
        o[j][0] *= corr[0];
        o[j][1] *= corr[0];
        o[j][2] *= corr[1];
        o[j][3] *= corr[1];
    }
}

/* The key splits of one block's rows (n_used > 1 of n_splits): each block
 * has written its rows' unnormalized partials to ws, laid out as
 * cuk_attention's workspace (o[nrow][HD], then m, then l, nrow = queries x
 * heads x n_splits; partial of (query qi, head h, split sp) at row
 * (qi * n_heads + h) * n_splits + sp; m and l in base 2); splits n_used and
 * up had no keys and wrote nothing. The last block of the set to arrive at
 * cnt merges them into out and re-arms cnt. Rows r < rows are query q0 +
 * r / G, head kvh * G + r % G. Uses shared memory of (2 * rows * n_used +
 * rows) floats at smem. */
template <int HD>
static __device__ __forceinline__ void merge_splits(float *out, const float *ws, size_t nrow,
                                                    int rows, int n_splits, int n_used, int q0,
                                                    int G, int kvh, int n_heads, float *smem)
{
    /* Each split's weight per row first (every (row, split) pair loaded at
     * once, not one split after another), then every output element sums
     * its splits with independent loads. The partials were written by
     * other blocks: read through L2 (__ldcg). */
    const float *wm = ws + nrow * HD, *wl = wm + nrow;
    float *cw = smem, *cl = cw + rows * n_used, *cL = cl + rows * n_used;
    const struct row_div rd = row_div_of(G);
    auto qh_of = [&](int r) { return row_qh(rd, r, q0, kvh, n_heads); };
    for (int i = threadIdx.x; i < rows * n_used; i += blockDim.x) {
        size_t pr = qh_of(i / n_used) * n_splits + i % n_used;
        cw[i] = __ldcg(wm + pr);
        cl[i] = __ldcg(wl + pr);
    }
    __syncthreads();
    for (int r = threadIdx.x; r < rows; r += blockDim.x)
        cL[r] = cuk_split_weights(cw + r * n_used, cl + r * n_used, n_used);
    __syncthreads();
    for (int idx = threadIdx.x; idx < rows * HD; idx += blockDim.x) {
        int r = idx / HD, d = idx % HD;
        size_t qh = qh_of(r);
        const float *src = ws + qh * n_splits * HD + d, *c = cw + r * n_used;
        float O = 0.0f;
#pragma unroll 8
        for (int s2 = 0; s2 < n_used; s2++, src += HD) /* offsets: immediates */
            O = fmaf(__ldcg(src), c[s2], O);
        float L = cL[r];
        out[qh * HD + d] = L > 0.0f ? O / L : 0.0f;
    }
}

/* The last block of the set to arrive at cnt merges (merge_splits) and
 * re-arms cnt. */
template <int HD>
static __device__ __forceinline__ void split_merge(float *out, const float *ws, size_t nrow,
                                                   int rows, int n_splits, int n_used, int q0,
                                                   int G, int kvh,
                                                   int n_heads, unsigned *cnt, float *smem,
                                                   bool dec = false /* the probe build's */)
{
    if (!cuk_last_block(cnt, (unsigned)n_used))
        return;
    merge_splits<HD>(out, ws, nrow, rows, n_splits, n_used, q0, G, kvh, n_heads, smem);
    PROBE(dec, 5);
}

/* Trip it of a block's tiles [.., te) starting at key t0 in buffer b: the
 * next tile's copies go out into the other buffer (released at the end of
 * trip it - 1), then this one's are waited for (the caller's barrier then
 * makes every thread's copies visible). */
template <typename L>
static __device__ __forceinline__ void next_tile(int it, int te, int t0, int b, const L &load_tile)
{
    if (it + 1 < te) {
        load_tile(t0 + AM_KEYS, b ^ 1);
        cuk_cp_async_wait<1>();
    } else {
        cuk_cp_async_wait<0>();
    }
}

template <int HD>
__global__ void __launch_bounds__(AM_WARPS * 32)
    k_attention_mma(float *out, const float *q, const uint16_t *kc, const uint16_t *vc,
                    const int *table, struct cuk_attn g, int bq, int n_splits, float *ws,
                    unsigned *cnt)
{
    constexpr int TILE = AM_KEYS * HD * 2; /* bytes of one K or V tile */
    constexpr int KT = AM_KEYS / 8;      /* n-tiles of S */
    constexpr int DT = HD / 8;           /* n-tiles of O */
    constexpr int QK = HD / 16;          /* k-steps of Q K^T */
    extern __shared__ float4 am_smem[];
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(am_smem);
    /* [buffer][K, V] */
    auto ktile = [&](int b) { return sbase + (uint32_t)(2 * b * TILE); };
    auto vtile = [&](int b) { return sbase + (uint32_t)((2 * b + 1) * TILE); };

    cuk_pdl_start();
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int gid = lane >> 2, tig = lane & 3;
    const int G = g.n_heads / g.n_kv_heads, kvh = blockIdx.y;
    const struct row_div rd = row_div_of(G);
    /* the causal diagonal makes later query tiles longer: start them first */
    const int q0 = (gridDim.x - 1 - blockIdx.x) * bq;
    const int nq = min(bq, g.n - q0), rows = nq * G;

    /* This thread's two rows (gid and gid + 8 of the warp's 16): row r is
     * query q0 + r / G, head kvh * G + r % G; -1: no such row. */
    int pos[2], start[2];
    const float *qrow[2];
    float *orow[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int r = warp * 16 + gid + 8 * h;
        pos[h] = -1;
        start[h] = 0;
        qrow[h] = nullptr;
        orow[h] = nullptr;
        if (r < rows) {
            size_t qh = row_qh(rd, r, q0, kvh, g.n_heads);
            pos[h] = g.pos0 + q0 + row_q(rd, r);
            if (g.window > 0 && pos[h] - g.window + 1 > 0)
                start[h] = pos[h] - g.window + 1;
            qrow[h] = q + qh * HD;
            orow[h] = out + qh * HD;
        }
    }
    /* Q as A fragments: k-step s covers dims 16s..16s+15; register 0/1 are
     * rows gid / gid+8 at dims 2 tig, +1; 2/3 the same 8 dims later. */
    const float qscale = g.scale * 1.4426950408889634f;
    uint32_t qf[QK][4];
#pragma unroll
    for (int s = 0; s < QK; s++)
#pragma unroll
        for (int half = 0; half < 2; half++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float2 v = make_float2(0.0f, 0.0f);
                if (qrow[h])
                    v = *(const float2 *)(qrow[h] + 16 * s + 8 * half + 2 * tig);
                qf[s][2 * half + h] = pack_bf16(v.x * qscale, v.y * qscale);
            }

    float o[DT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < DT; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

    /* split blockIdx.z takes a run of whole tiles of keys up to the last
     * query's; splits past the last tile (a short causal range) have none */
    const int sp = blockIdx.z;
    const struct key_run kr = key_run_of(g, g.pos0 + q0, g.pos0 + q0 + nq, n_splits, sp);
    const int k_lo = kr.k_lo, n_used = kr.n_used, tb = kr.tb, te = kr.te;
    if (sp >= n_used)
        return;
    auto load_tile = [&](int t0, int b) {
        load_kv_tile<HD>(ktile(b), vtile(b), kc, vc, table, g, kvh, t0, g.pos0 + q0 + nq);
    };
    if (tb < te)
        load_tile(k_lo + tb * AM_KEYS, 0);

    for (int it = tb; it < te; it++) {
        const int t0 = k_lo + it * AM_KEYS, b = (it - tb) & 1;
        next_tile(it, te, t0, b, load_tile);
        __syncthreads();

        /* S = Q K^T for the warp's 16 rows and the tile's 64 keys */
        float s[KT][4];
#pragma unroll
        for (int j = 0; j < KT; j++)
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < QK; ks += 2)
#pragma unroll
            for (int j = 0; j < KT; j++) {
                /* matrices: keys 8j..8j+7 at dims 16ks + 8 * (0..3) */
                uint32_t kb[4];
                cuk_ldsm_x4(kb, tile_addr<HD>(ktile(b), 8 * j + (lane & 7), 2 * ks + (lane >> 3)));
                cuk_mma16816(s[j], qf[ks], kb[0], kb[1]);
                cuk_mma16816(s[j], qf[ks + 1], kb[2], kb[3]);
            }

        online_softmax<KT, DT, true>(s, o, m, l, pos, start, t0, tig);

        /* O += P V: P's S accumulators become A fragments (k-step kk =
         * keys 16kk..16kk+15 = S n-tiles 2kk, 2kk+1) */
#pragma unroll
        for (int kk = 0; kk < AM_KEYS / 16; kk++) {
            uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]),
                              pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int j2 = 0; j2 < DT / 2; j2++) {
                /* matrices (transposed): keys 16kk + 8 * (0, 1) at dims
                 * 16 j2 .. +7, then the same keys at dims 16 j2 + 8 .. +15 */
                int mi = lane >> 3, key = 16 * kk + (mi & 1) * 8 + (lane & 7);
                uint32_t vb[4];
                ldsm_x4_trans(vb, tile_addr<HD>(vtile(b), key, 2 * j2 + (mi >> 1)));
                cuk_mma16816(o[2 * j2], pa, vb[0], vb[1]);
                cuk_mma16816(o[2 * j2 + 1], pa, vb[2], vb[3]);
            }
        }
        __syncthreads(); /* every warp is done with buffer b before it is refilled */
    }

    const size_t nrow = (size_t)g.n * g.n_heads * n_splits;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float L = quad_sum(l[h]);
        if (!orow[h])
            continue;
        if (n_used > 1) { /* this split's partial of the row */
            size_t pr = (size_t)(orow[h] - out) / HD * n_splits + sp;
#pragma unroll
            for (int j = 0; j < DT; j++)
                *(float2 *)(ws + pr * HD + 8 * j + 2 * tig) = make_float2(o[j][2 * h], o[j][2 * h + 1]);
            if (tig == 0) {
                ws[nrow * HD + pr] = m[h];
                ws[nrow * HD + nrow + pr] = L;
            }
            continue;
        }
        float inv = L > 0.0f ? 1.0f / L : 0.0f;
#pragma unroll
        for (int j = 0; j < DT; j++)
            *(float2 *)(orow[h] + 8 * j + 2 * tig) =
                make_float2(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
    }
    if (n_used > 1) /* the tiles' shared memory is free: the last loop trip synced */
        split_merge<HD>(out, ws, nrow, rows, n_splits, n_used, q0, G, kvh, g.n_heads,
                        cnt + (size_t)blockIdx.x * g.n_kv_heads + kvh, (float *)am_smem);
}

/* Two 16-row slices a warp, FlashAttention-2's shape: each K or V fragment
 * a warp loads from shared memory feeds two mma instead of one, and a block
 * (AM2_ROWS rows) copies each tile for twice the rows. Q waits in shared
 * memory as bf16 (the tiles' swizzle) and is read per k-step, which leaves
 * the registers to the two slices' scores and outputs. Every row's
 * arithmetic is k_attention_mma's, in the same order: the same bits for the
 * same key splits. Shared memory: the four tiles, then Q. */
#define AM2_ROWS (AM_WARPS * 32)

template <int HD> static __host__ __device__ constexpr size_t mma2_smem()
{
    return 4 * (size_t)AM_KEYS * HD * 2 + (size_t)AM2_ROWS * HD * 2;
}

template <int HD>
__global__ void __launch_bounds__(AM_WARPS * 32)
    k_attention_mma2(float *out, const float *q, const uint16_t *kc, const uint16_t *vc,
                     const int *table, struct cuk_attn g, int bq, int n_splits, float *ws,
                     unsigned *cnt)
{
    constexpr int TILE = AM_KEYS * HD * 2, KT = AM_KEYS / 8, DT = HD / 8, QK = HD / 16;
    constexpr int NCH = HD / 8;
    extern __shared__ float4 am_smem[];
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(am_smem);
    auto ktile = [&](int b) { return sbase + (uint32_t)(2 * b * TILE); };
    auto vtile = [&](int b) { return sbase + (uint32_t)((2 * b + 1) * TILE); };
    const uint32_t qs = sbase + 4 * TILE;

    cuk_pdl_start();
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int gid = lane >> 2, tig = lane & 3;
    const int G = g.n_heads / g.n_kv_heads, kvh = blockIdx.y;
    const struct row_div rd = row_div_of(G);
    const int q0 = (gridDim.x - 1 - blockIdx.x) * bq;
    const int nq = min(bq, g.n - q0), rows = nq * G;

    /* Q * scale * log2 e in bf16, as k_attention_mma rounds it; rows past
     * the block's are zeros */
    const float qscale = g.scale * 1.4426950408889634f;
    for (int idx = threadIdx.x; idx < AM2_ROWS * NCH; idx += blockDim.x) {
        const int r = idx / NCH, c = idx % NCH;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < rows) {
            const float4 *src =
                (const float4 *)(q + row_qh(rd, r, q0, kvh, g.n_heads) * HD + 8 * c);
            const float4 a = src[0], b = src[1];
            v = make_uint4(pack_bf16(a.x * qscale, a.y * qscale),
                           pack_bf16(a.z * qscale, a.w * qscale),
                           pack_bf16(b.x * qscale, b.y * qscale),
                           pack_bf16(b.z * qscale, b.w * qscale));
        }
        *(uint4 *)((char *)am_smem + (tile_addr<HD>(qs, r, c) - sbase)) = v;
    }

    /* the thread's rows: slice mt's gid and gid + 8 (h) */
    int pos[2][2], start[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = warp * 32 + mt * 16 + gid + 8 * h;
            pos[mt][h] = -1;
            start[mt][h] = 0;
            if (r < rows) {
                pos[mt][h] = g.pos0 + q0 + row_q(rd, r);
                if (g.window > 0 && pos[mt][h] - g.window + 1 > 0)
                    start[mt][h] = pos[mt][h] - g.window + 1;
            }
        }

    float o[2][DT][4], m[2][2], l[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; mt++) {
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
        for (int j = 0; j < DT; j++)
            o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.0f;
    }

    const int sp = blockIdx.z;
    const struct key_run kr = key_run_of(g, g.pos0 + q0, g.pos0 + q0 + nq, n_splits, sp);
    const int k_lo = kr.k_lo, n_used = kr.n_used, tb = kr.tb, te = kr.te;
    if (sp >= n_used)
        return;
    auto load_tile = [&](int t0, int b) {
        load_kv_tile<HD>(ktile(b), vtile(b), kc, vc, table, g, kvh, t0, g.pos0 + q0 + nq);
    };
    if (tb < te)
        load_tile(k_lo + tb * AM_KEYS, 0);

    for (int it = tb; it < te; it++) {
        const int t0 = k_lo + it * AM_KEYS, b = (it - tb) & 1;
        next_tile(it, te, t0, b, load_tile);
        __syncthreads(); /* the tile, and on the first trip Q, are in shared memory */

        float s[2][KT][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int j = 0; j < KT; j++)
                s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
        /* one k-step at a time (each score still sums its k-steps in
         * order): fewer fragments live at once */
#pragma unroll
        for (int k = 0; k < QK; k++) {
            uint32_t qa[2][4]; /* the slices' A fragments of k-step k */
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                cuk_ldsm_x4(qa[mt], tile_addr<HD>(qs, warp * 32 + mt * 16 + (lane & 15),
                                                  2 * k + (lane >> 4)));
#pragma unroll
            for (int j = 0; j < KT; j++) {
                uint32_t kb[2]; /* keys 8j .. +7 at dims 16k .. 16k + 15 */
                cuk_ldsm_x2(kb, tile_addr<HD>(ktile(b), 8 * j + (lane & 7),
                                              2 * k + ((lane >> 3) & 1)));
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
                    cuk_mma16816(s[mt][j], qa[mt], kb[0], kb[1]);
            }
        }
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
            online_softmax<KT, DT, true>(s[mt], o[mt], m[mt], l[mt], pos[mt], start[mt],
                                          t0, tig);
#pragma unroll
        for (int kk = 0; kk < AM_KEYS / 16; kk++) {
            uint32_t pa[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                pa[mt][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                pa[mt][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                pa[mt][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                pa[mt][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int j2 = 0; j2 < DT / 2; j2++) {
                int mi = lane >> 3, key = 16 * kk + (mi & 1) * 8 + (lane & 7);
                uint32_t vb[4];
                ldsm_x4_trans(vb, tile_addr<HD>(vtile(b), key, 2 * j2 + (mi >> 1)));
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    cuk_mma16816(o[mt][2 * j2], pa[mt], vb[0], vb[1]);
                    cuk_mma16816(o[mt][2 * j2 + 1], pa[mt], vb[2], vb[3]);
                }
            }
        }
        __syncthreads(); /* every warp is done with buffer b before it is refilled */
    }

    const size_t nrow = (size_t)g.n * g.n_heads * n_splits;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float L = quad_sum(l[mt][h]);
            const int r = warp * 32 + mt * 16 + gid + 8 * h;
            if (r >= rows)
                continue;
            const size_t qh = row_qh(rd, r, q0, kvh, g.n_heads);
            if (n_used > 1) { /* this split's partial of the row */
                const size_t pr = qh * n_splits + sp;
#pragma unroll
                for (int j = 0; j < DT; j++)
                    *(float2 *)(ws + pr * HD + 8 * j + 2 * tig) =
                        make_float2(o[mt][j][2 * h], o[mt][j][2 * h + 1]);
                if (tig == 0) {
                    ws[nrow * HD + pr] = m[mt][h];
                    ws[nrow * HD + nrow + pr] = L;
                }
                continue;
            }
            const float inv = L > 0.0f ? 1.0f / L : 0.0f;
            float *orow = out + qh * HD;
#pragma unroll
            for (int j = 0; j < DT; j++)
                *(float2 *)(orow + 8 * j + 2 * tig) =
                    make_float2(o[mt][j][2 * h] * inv, o[mt][j][2 * h + 1] * inv);
        }
    if (n_used > 1)
        split_merge<HD>(out, ws, nrow, rows, n_splits, n_used, q0, G, kvh, g.n_heads,
                        cnt + (size_t)blockIdx.x * g.n_kv_heads + kvh, (float *)am_smem);
}
static_assert((2 * AM2_ROWS * AM_MMA_MAX_SPLITS + AM2_ROWS) * 4 <= mma2_smem<64>(),
              "the split merge fits in k_attention_mma2's shared memory");

extern "C" int cuk_attention_mma_ok(const struct cuk_attn *g)
{
    /* the tiles are copied as the pool holds them: swizzled rows */
    return g->mma && g->kv_bf16 && g->kv_swz && g->n >= 1 &&
           (g->head_dim == 64 || g->head_dim == 128) &&
           g->n_kv_heads > 0 && g->n_heads % g->n_kv_heads == 0 &&
           g->n_heads / g->n_kv_heads <= AM_ROWS && g->kv_dim % 8 == 0;
}

/* Rows of a prefill block: k_attention_mma2's AM2_ROWS where its grid
 * has at least 8 blocks for every multiprocessor (a long prompt in one
 * pass, where attention is most of the work: measured faster at 32K
 * tokens, not yet at 4K, which this leaves out for an 8B model), or a
 * wave of them over at least as many earlier keys as the pass has queries
 * (a later chunk of a long prompt: 2,048-token chunks of a 32K prompt
 * 1.14x (8B) and 1.22x (0.6B) faster end to end than by k_attention_mma;
 * docs/benchmarks.md twenty-fifth pass); else k_attention_mma's AM_ROWS.
 * Both give the same bits. g->pf_mt 1 or 2 picks one. */
static int mma_rows(const struct cuk_attn *g)
{
    if (g->pf_mt)
        return g->pf_mt == 2 ? AM2_ROWS : AM_ROWS;
    int G = g->n_heads / g->n_kv_heads, bq = AM2_ROWS / G;
    long blocks = (long)((g->n + bq - 1) / bq) * g->n_kv_heads;
    if (g->n_sms <= 0)
        return AM_ROWS;
    return blocks >= 8L * g->n_sms || (blocks >= g->n_sms && g->pos0 >= g->n) ? AM2_ROWS
                                                                                : AM_ROWS;
}

template <int HD>
static cudaError_t launch_mma(cudaStream_t s, float *out, const float *q, const uint16_t *kc,
                              const uint16_t *vc, const int *table, const struct cuk_attn *g,
                              int n_splits, float *ws, unsigned *cnt, int rows)
{
    int G = g->n_heads / g->n_kv_heads, bq = rows / G;
    dim3 grid((unsigned)((g->n + bq - 1) / bq), (unsigned)g->n_kv_heads, (unsigned)n_splits);
    if (rows == AM2_ROWS) {
        static struct cuk_opted opted2;
        cudaError_t err = cuk_smem_opt_in(k_attention_mma2<HD>, mma2_smem<HD>(), &opted2);
        if (err != cudaSuccess)
            return err;
        return cuk_launch(k_attention_mma2<HD>, grid, AM_WARPS * 32, mma2_smem<HD>(), s, out, q,
                          kc, vc, table, *g, bq, n_splits, ws, cnt);
    }
    size_t smem = 4 * (size_t)AM_KEYS * HD * 2; /* K and V, two buffers each */
    static struct cuk_opted opted;
    cudaError_t err = cuk_smem_opt_in(k_attention_mma<HD>, smem, &opted);
    if (err != cudaSuccess)
        return err;
    return cuk_launch(k_attention_mma<HD>, grid, AM_WARPS * 32, smem, s, out, q, kc, vc, table,
                      *g, bq, n_splits, ws, cnt);
}
static_assert((2 * AM_ROWS * AM_MMA_MAX_SPLITS + AM_ROWS) * 4 <= 4 * AM_KEYS * 64 * 2,
              "the split merge fits in the tiles' shared memory");

/* How many blocks of the prefill kernel of `rows` rows a multiprocessor
 * holds at once (its registers and shared memory decide), from the
 * occupancy calculator, per device; 1 when it cannot say. */
template <int HD> static int mma_blocks_per_sm(int rows)
{
    static int known[2][CUK_MAX_DEVICES];
    static struct cuk_opted opted[2];
    const bool two = rows == AM2_ROWS;
    int dev = 0, nb = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= CUK_MAX_DEVICES) {
        cudaGetLastError();
        return 1;
    }
    if (known[two][dev])
        return known[two][dev];
    const size_t smem = two ? mma2_smem<HD>() : 4 * (size_t)AM_KEYS * HD * 2;
    cudaError_t err =
        two ? cuk_smem_opt_in(k_attention_mma2<HD>, smem, &opted[1])
            : cuk_smem_opt_in(k_attention_mma<HD>, smem, &opted[0]);
    if (err == cudaSuccess)
        err = two ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k_attention_mma2<HD>,
                                                                  AM_WARPS * 32, smem)
                  : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, k_attention_mma<HD>,
                                                                  AM_WARPS * 32, smem);
    if (err != cudaSuccess || nb < 1) {
        cudaGetLastError();
        nb = 1;
    }
    return known[two][dev] = nb;
}

/* Key splits of a chunk whose blocks would not fill the GPU: up to two
 * blocks a multiprocessor, or as many as it holds at once when fewer,
 * rounded down, so that the blocks run as one wave (rounded up, a
 * 512-token chunk of a 0.6B model over a 30K-token prefix had 384 blocks
 * for 264 places: a second wave as long as the first, the attention at
 * half the rate of a 2,048-token chunk's; docs/benchmarks.md twenty-fifth
 * pass). More than two a multiprocessor (head_dim 64 fits more) was never
 * measured. */
extern "C" int cuk_attention_mma_splits(const struct cuk_attn *g, int kv_len, int n_sms)
{
    if (!cuk_attention_mma_ok(g))
        return 1;
    const int rows = mma_rows(g), G = g->n_heads / g->n_kv_heads, bq = rows / G;
    long blocks = (long)((g->n + bq - 1) / bq) * g->n_kv_heads;
    if (blocks >= n_sms)
        return 1;
    long per_sm = g->head_dim == 64 ? mma_blocks_per_sm<64>(rows) : mma_blocks_per_sm<128>(rows);
    per_sm = per_sm < 2 ? per_sm : 2;
    long s = per_sm * n_sms / blocks, by_len = (kv_len + AM_KEYS - 1) / AM_KEYS;
    s = s < by_len ? s : by_len;
    s = s < AM_MMA_MAX_SPLITS ? s : AM_MMA_MAX_SPLITS;
    return s < 1 ? 1 : (int)s;
}

extern "C" cudaError_t cuk_attention_mma(cudaStream_t s, float *out, const float *q,
                                         const void *kc, const void *vc, const int *table,
                                         const struct cuk_attn *g, int n_splits, float *ws,
                                         unsigned *cnt)
{
    if (!cuk_attention_mma_ok(g) || n_splits < 1 || n_splits > AM_MMA_MAX_SPLITS ||
        (n_splits > 1 && (!ws || !cnt)))
        return cudaErrorInvalidValue;
    const int rows = mma_rows(g);
    if (g->head_dim == 64)
        return launch_mma<64>(s, out, q, (const uint16_t *)kc, (const uint16_t *)vc, table, g,
                              n_splits, ws, cnt, rows);
    return launch_mma<128>(s, out, q, (const uint16_t *)kc, (const uint16_t *)vc, table, g,
                           n_splits, ws, cnt, rows);
}

/* ---- decode: a few queries per sequence over a long key range ----------
 * One block per (sequence, KV head, key split), reading each K/V row once
 * for all the query heads that share it: the rows (query, head) of the
 * sequence's n queries fill one m16 tile (n * group <= 16). The block's
 * threads copy 64-key tiles as above; each warp computes a 16-key quarter
 * of every tile with its own online softmax, and the warps (then the
 * splits, by the last block to finish) are merged at the end. Decode is
 * bound by reading K/V, so the products are done at about f32 precision
 * for free: q and p are each split into a bf16 high part and a bf16
 * remainder, two mma each (K and V are exact in bf16). */

/* A 16x16 A fragment from its four f32 pairs: x = hi + lo in bf16. */
static __device__ __forceinline__ void split_pair(float a, float b, uint32_t *hi, uint32_t *lo)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    float2 hf = __bfloat1622float2(h);
    *hi = *(uint32_t *)&h;
    *lo = pack_bf16(__fsub_rn(a, hf.x), __fsub_rn(b, hf.y));
}

/* The decode kernels' tiles come by bulk copies (sm_90 on), else by
 * cp.async. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DEC_BULK 1
#else
#define DEC_BULK 0
#endif

/* Shared memory of the decode kernels: the double-buffered tiles, which
 * the warp merge reuses (it needs less), then with RoPE the query and new
 * key rows, and last the tiles' two mbarriers. */
template <int HD> static __host__ __device__ constexpr size_t dec_smem(bool rope)
{
    return 4 * (size_t)AM_KEYS * HD * 2 /* tiles */ +
           (rope ? 16 * HD * 4 /* qs */ + 2 * 16 * HD * 2 /* nks, nvs */ : 0) + 16;
}

/* The key-split merge of the RoPE decode kernel's cluster (one block a
 * split, cluster rank = split), done by the n_used blocks with keys
 * together: each block's partial (o[rows][HD], then m[16] and l[16] in
 * base 2) lies in its own shared memory at `part`, and each output
 * element is merge_splits' arithmetic on those values read across the
 * cluster (cuk_split_weights' weights, then o's sum in split order), so
 * the same bits as the merge through global memory, without its counter,
 * fences and dependent L2 trips. Every (row, split) value an element
 * needs is loaded before any is used. */
template <int HD>
static __device__ __forceinline__ void cluster_merge(float *out, uint32_t part, int rows,
                                                     int n_used, int sp, const struct row_div &rd,
                                                     int kvh, int n_heads)
{
    uint32_t peer[CUK_DEC_CLUSTER_MAX];
#pragma unroll
    for (int s = 0; s < CUK_DEC_CLUSTER_MAX; s++)
        peer[s] = s < n_used ? cuk_dsmem_addr(part, s) : 0;
    const uint32_t ml = (uint32_t)(rows * HD) * 4;
    for (int idx = sp * (int)blockDim.x + (int)threadIdx.x; idx < rows * HD;
         idx += n_used * (int)blockDim.x) {
        const int r = idx / HD, d = idx - r * HD;
        float ms[CUK_DEC_CLUSTER_MAX], ls[CUK_DEC_CLUSTER_MAX], os[CUK_DEC_CLUSTER_MAX];
#pragma unroll
        for (int s = 0; s < CUK_DEC_CLUSTER_MAX; s++)
            if (s < n_used) {
                ms[s] = cuk_dsmem_ld(peer[s] + ml + (uint32_t)r * 4);
                ls[s] = cuk_dsmem_ld(peer[s] + ml + (uint32_t)(16 + r) * 4);
                os[s] = cuk_dsmem_ld(peer[s] + (uint32_t)idx * 4);
            }
        const float L = cuk_split_weights<CUK_DEC_CLUSTER_MAX>(ms, ls, n_used);
        float O = 0.0f;
#pragma unroll
        for (int s = 0; s < CUK_DEC_CLUSTER_MAX; s++)
            if (s < n_used)
                O = fmaf(os[s], ms[s], O);
        out[row_qh(rd, r, 0, kvh, n_heads) * HD + d] = L > 0.0f ? O / L : 0.0f;
    }
}

/* The block's work for one sequence: g.n queries at positions g.pos0..;
 * out and q point at its first row; ws (n_splits > 1) holds its partials
 * laid out as cuk_attention's workspace for g.n queries and n_splits
 * splits (m and l in base 2), cnt is its counter for this KV head. RP:
 * the block does the RoPE + K/V store too, from rope (read only then; a
 * reference to the kernel parameter, not a pointer: a pointer to it put
 * the struct in local memory).
 *
 * It waits for the previous kernel itself (cuk_pdl_start), after starting
 * what does not depend on it: the first key tile's loads when that tile
 * holds only keys of earlier steps (with RP always: the new keys come from
 * shared memory), and with RP the RoPE cosines and sines of the first
 * position and, in the block of the last tile, the new keys' cache slots.
 * Those keys, the block table and *dpos were written before the previous
 * kernel began (this kernel is launched only once every block of that one
 * has waited for its own predecessor), so they are visible.
 *
 * CL (with RP): the grid runs as clusters of the n_splits blocks of a KV
 * head, cluster rank = sp, and the splits are merged there
 * (cluster_merge) instead of through ws and cnt. */
template <int HD, bool RP, bool CL = false>
static __device__ __forceinline__ void dec_block(float *out, const float *q, uint16_t *kc,
                                                 uint16_t *vc, const int *table,
                                                 const struct cuk_attn &g, int kvh, int sp,
                                                 int n_splits, float *ws, unsigned *cnt,
                                                 const struct cuk_dec_rope &rope, int *dnused)
{
    constexpr int NCH = HD / 8, TILE = AM_KEYS * HD * 2, QK = HD / 16, DT = HD / 8;
    extern __shared__ float4 am_smem[];
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(am_smem);
    auto ktile = [&](int b) { return sbase + (uint32_t)(2 * b * TILE); };
    auto vtile = [&](int b) { return sbase + (uint32_t)((2 * b + 1) * TILE); };
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int gid = lane >> 2, tig = lane & 3;
    const int G = g.n_heads / g.n_kv_heads, rows = g.n * G;
    const struct row_div rd = row_div_of(G);

    /* keys up to the last query's, in 64-key tiles; this split takes a
     * run of whole tiles. The split count comes from the block-table bucket
     * (graph replays split like eager steps); splits past the last tile
     * have nothing and leave at once, the merge waits only for those that
     * do. */
    const int k_end = g.pos0 + g.n;
    const struct key_run kr = key_run_of(g, g.pos0, k_end, n_splits, sp);
    const int k_lo = kr.k_lo, n_tiles = kr.n_tiles, n_used = kr.n_used, tb = kr.tb, te = kr.te;
    if (sp >= n_used) { /* reads and writes nothing: no need to wait */
        /* Leaving counts as releasing the next launch (cuk_pdl_release).
         * In a cluster too: an exited block holds no cluster barrier up
         * (PTX exit) and nobody reads its shared memory, so the blocks
         * with keys meet without it, and its SM is free for the next
         * kernel's blocks (o's, whose rings then fill beside this
         * attention; H200, 512 tokens: 0.6B 1,255 -> 1,272 tok/s,
         * docs/benchmarks.md thirty-first pass). */
        return;
    }

    /* A tile's keys from the pool, [t0, lim): with RP the new keys come
     * from nks / nvs. Thread 0 copies them with one bulk copy per run of
     * adjacent pool blocks (cuk_kv_row's layout; the rows are swizzled as
     * the tile's), completing on the buffer's mbarrier; rows up to the end
     * of the last block are copied too, and the reader zeroes every row
     * from lim on (V rows must be zeros: 0 * garbage may be NaN). */
    const int lim = RP ? g.pos0 : k_end;
#if DEC_BULK
    uint64_t *tbar = (uint64_t *)((char *)am_smem + dec_smem<HD>(RP) - 16); /* [2] */
    const uint16_t *const kh = kc + cuk_kv_head0(&g, kvh), *const vh = vc + (kh - kc);
    auto load_tile = [&](int t0, int b) {
        if (threadIdx.x)
            return;
        const int bs = g.block_size, kl = min(t0 + AM_KEYS, lim);
        const int kcopy = kl <= t0 ? t0 : min(t0 + AM_KEYS, (kl + bs - 1) / bs * bs);
        cuk_mbar_expect(tbar + b, (unsigned)(2 * (kcopy - t0) * HD * 2));
        const uint64_t pol = cuk_l2_evict_first();
        char *const smem_c = (char *)am_smem;
        for (int k = t0; k < kcopy;) {
            const int bi = k / bs, rem = k - bi * bs, blk = table[bi];
            int n = min(bs - rem, kcopy - k);
            for (int nb = 1; k + n < kcopy && table[bi + nb] == blk + nb; nb++)
                n += min(bs, kcopy - k - n);
            const size_t src = ((size_t)blk * bs + rem) * HD;
            const size_t dst = (size_t)(k - t0) * HD * 2;
            cuk_bulk_copy(smem_c + (ktile(b) - sbase) + dst, kh + src, (unsigned)(n * HD * 2),
                          tbar + b, pol);
            cuk_bulk_copy(smem_c + (vtile(b) - sbase) + dst, vh + src, (unsigned)(n * HD * 2),
                          tbar + b, pol);
            k += n;
        }
    };
    if (threadIdx.x < 32) {
        if (threadIdx.x == 0) {
            cuk_mbar_init(tbar, 1);
            cuk_mbar_init(tbar + 1, 1);
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        __syncwarp(); /* racecheck: the init is ordered before the arrivals */
    }
#else /* before sm_90: 16-byte cp.async copies, zero-filled from lim on */
    auto load_tile = [&](int t0, int b) {
        load_kv_tile<HD>(ktile(b), vtile(b), kc, vc, table, g, kvh, t0, lim);
    };
#endif
    const bool early = tb < te && (RP || k_lo + (tb + 1) * AM_KEYS <= g.pos0);
    if (early)
        load_tile(k_lo + tb * AM_KEYS, 0);
    __syncthreads(); /* the barriers are initialised before anyone waits */
    /* With RP the query rows' A fragments come from shared memory (qh, ql:
     * [16][HD] bf16, the tiles' swizzle), high and low parts of q * qscale
     * written by the RoPE stage below; rows past the block's are zeros. */
    const uint32_t qh_s = sbase + 4 * TILE, ql_s = qh_s + 16 * HD * 2;
    char *const smem_c = (char *)am_smem; /* tile_addr is a shared-window address */
    const float qscale = g.scale * 1.4426950408889634f;
    if (RP)
        for (int idx = threadIdx.x; idx < (16 - rows) * NCH; idx += blockDim.x) {
            int r = rows + idx / NCH, c = idx % NCH;
            *(uint4 *)(smem_c + (tile_addr<HD>(qh_s, r, c) - sbase)) = make_uint4(0, 0, 0, 0);
            *(uint4 *)(smem_c + (tile_addr<HD>(ql_s, r, c) - sbase)) = make_uint4(0, 0, 0, 0);
        }
    /* the first position's rotation, lane's frequencies f = lane + 32 i */
    constexpr int NF = HD / 64;
    float cs0[NF], sn0[NF];
    if (RP)
#pragma unroll
        for (int i = 0; i < NF; i++) {
            float ang = cuk_rope_angle(g.pos0, rope.inv_freq[lane + 32 * i]);
            cs0[i] = cosf(ang);
            sn0[i] = sinf(ang);
        }
    /* The last tile's block writes the new keys and values to the cache
     * (below): where, worked out before the wait, so that its table read
     * is not a dependent access after it. That block was the last to have
     * its first tile ready (probe build, 8B: 5.6 -> 3.2 us after the
     * release, docs/benchmarks.md twelfth pass). */
    const bool keeper = RP && te == n_tiles;
    size_t new_off = 0;
    if (keeper && (int)threadIdx.x < g.n * NCH) {
        const int p = g.pos0 + (int)threadIdx.x / NCH, c = (int)threadIdx.x % NCH;
        new_off = cuk_kv_row(&g, table, p, kvh) + cuk_kv_col(&g, p, 8 * c);
    }
    cuk_pdl_start();
    PROBE(RP, 1);

    /* With RP the block first does what RoPE + K/V store would have done
     * for its KV head (the same arithmetic, so the same bits): its query
     * rows, normed and rotated, into qh / ql; the new positions' k (normed,
     * rotated) and v, rounded to bf16 as the cache keeps them, into nks /
     * nvs. Every block computes them for itself and puts them into its own
     * tiles, so no block waits for another's cache writes; the block of
     * the last tile writes them to the cache for later steps. */
    uint16_t *nks = (uint16_t *)((char *)am_smem + 4 * TILE + 16 * HD * 4); /* [16][HD] */
    uint16_t *nvs = nks + 16 * HD;                                         /* [16][HD] */
    /* element col of row r of qh / ql: q * qscale split as split_pair does */
    auto q_put = [&](int r, int col, float v) {
        float a = __fmul_rn(v, qscale);
        __nv_bfloat16 h = __float2bfloat16_rn(a);
        uint32_t off = tile_addr<HD>(0, r, col >> 3) + (col & 7) * 2;
        *(__nv_bfloat16 *)(smem_c + (qh_s - sbase) + off) = h;
        *(__nv_bfloat16 *)(smem_c + (ql_s - sbase) + off) =
            __float2bfloat16_rn(__fsub_rn(a, __bfloat162float(h)));
    };
    if (RP) {
        /* A warp's items two at a time (item, item + AM_WARPS), every load
         * of both issued before any is used: the rows were just written by
         * the previous kernel, so each is a trip to L2, and one after
         * another they were the stage's time. The arithmetic is
         * cuk_warp_rms_inv's and cuk_norm_rope_v's on the loaded values. */
        const int n_items = rows + g.n;
        struct rp_item { /* a query row, or (isk) the new key row of query qi */
            bool isk;
            int r, qi;
        };
        auto item_of = [&](int item) {
            const bool isk = item >= rows;
            const int r = isk ? item - rows : item;
            return rp_item{isk, r, isk ? r : row_q(rd, r)};
        };
        /* the pair of elements frequency f rotates */
        auto pair_a = [&](int f) { return rope.interleaved ? 2 * f : f; };
        auto pair_b = [&](int f) { return rope.interleaved ? 2 * f + 1 : f + HD / 2; };
        for (int i0 = warp; i0 < n_items; i0 += 2 * AM_WARPS) {
            float xa[2][NF], xb[2][NF], va[2][NF], vb[2][NF], nwa[2][NF], nwb[2][NF];
            float4 x4[2];
            float xs[2][HD / 32];
            bool vec[2]; /* cuk_warp_rms_inv's choice of sums */
#pragma unroll
            for (int u = 0; u < 2; u++) {
                if (i0 + u * AM_WARPS >= n_items)
                    break;
                const rp_item it = item_of(i0 + u * AM_WARPS);
                const float *x = it.isk ? rope.k + (size_t)it.qi * g.kv_dim + (size_t)kvh * HD
                                        : q + row_qh(rd, it.r, 0, kvh, g.n_heads) * HD;
                const float *vr = rope.v + (size_t)it.qi * g.kv_dim + (size_t)kvh * HD;
                const float *nw = it.isk ? rope.kn : rope.qn;
                vec[u] = cuk_rms_vec(x, nw, HD);
                if (nw) { /* cuk_warp_rms_inv's loads */
                    if (vec[u])
                        x4[u] = ((const float4 *)x)[lane];
                    else
#pragma unroll
                        for (int k = 0; k < HD / 32; k++)
                            xs[u][k] = x[lane + 32 * k];
                }
#pragma unroll
                for (int i = 0; i < NF; i++) {
                    const int a = pair_a(lane + 32 * i), b = pair_b(lane + 32 * i);
                    xa[u][i] = x[a];
                    xb[u][i] = x[b];
                    if (nw) {
                        nwa[u][i] = nw[a];
                        nwb[u][i] = nw[b];
                    }
                    if (it.isk) {
                        va[u][i] = vr[a];
                        vb[u][i] = vr[b];
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < 2; u++) {
                if (i0 + u * AM_WARPS >= n_items)
                    break;
                const rp_item it = item_of(i0 + u * AM_WARPS);
                const bool norm = (it.isk ? rope.kn : rope.qn) != nullptr;
                float inv = 0.0f;
                if (norm) { /* cuk_warp_rms_inv's sum */
                    double ss = 0;
                    if (vec[u]) {
                        ss += cuk_rms_sq(x4[u]);
                    } else {
#pragma unroll
                        for (int k = 0; k < HD / 32; k++)
                            ss += (double)xs[u][k] * xs[u][k];
                    }
                    inv = cuk_rms_inv(cuk_warp_sum_d(ss), HD, rope.eps);
                }
#pragma unroll
                for (int i = 0; i < NF; i++) {
                    const int f = lane + 32 * i, a = pair_a(f), b = pair_b(f);
                    float cs = cs0[i], sn = sn0[i];
                    if (it.qi > 0) {
                        float ang = cuk_rope_angle(g.pos0 + it.qi, rope.inv_freq[f]);
                        cs = cosf(ang);
                        sn = sinf(ang);
                    }
                    float ra, rb;
                    cuk_norm_rope_v(xa[u][i], xb[u][i], norm, nwa[u][i], nwb[u][i], inv, cs, sn,
                                    ra, rb);
                    if (!it.isk) {
                        q_put(it.r, a, ra);
                        q_put(it.r, b, rb);
                    } else {
                        kv_st(nks, (size_t)it.r * HD + a, ra);
                        kv_st(nks, (size_t)it.r * HD + b, rb);
                        kv_st(nvs, (size_t)it.r * HD + a, va[u][i]);
                        kv_st(nvs, (size_t)it.r * HD + b, vb[u][i]);
                    }
                }
            }
        }
        __syncthreads();
    }
    PROBE(RP, 2);

    int pos[2], start[2];
    uint32_t qhi[QK][4], qlo[QK][4];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int r = gid + 8 * h;
        pos[h] = -1;
        start[h] = 0;
        const float *qr = nullptr;
        if (r < rows) {
            pos[h] = g.pos0 + row_q(rd, r);
            if (g.window > 0 && pos[h] - g.window + 1 > 0)
                start[h] = pos[h] - g.window + 1;
            qr = q + row_qh(rd, r, 0, kvh, g.n_heads) * HD;
        }
        if (!RP)
#pragma unroll
            for (int s = 0; s < QK; s++)
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    float2 v = make_float2(0.0f, 0.0f);
                    if (qr)
                        v = *(const float2 *)(qr + 16 * s + 8 * half + 2 * tig);
                    split_pair(__fmul_rn(v.x, qscale), __fmul_rn(v.y, qscale),
                               &qhi[s][2 * half + h], &qlo[s][2 * half + h]);
                }
    }
    if (RP) /* rows lane & 15, k-halves lane >> 4: the m16k16 A fragment */
#pragma unroll
        for (int s = 0; s < QK; s++) {
            cuk_ldsm_x4(qhi[s], tile_addr<HD>(qh_s, lane & 15, 2 * s + (lane >> 4)));
            cuk_ldsm_x4(qlo[s], tile_addr<HD>(ql_s, lane & 15, 2 * s + (lane >> 4)));
        }

    if (keeper) /* the last tile's block keeps the cache */
        for (int idx = threadIdx.x; idx < g.n * NCH; idx += blockDim.x) {
            int r = idx / NCH, c = idx % NCH, p = g.pos0 + r;
            size_t off = idx == (int)threadIdx.x
                             ? new_off
                             : cuk_kv_row(&g, table, p, kvh) + cuk_kv_col(&g, p, 8 * c);
            *(uint4 *)(kc + off) = *(const uint4 *)(nks + r * HD + c * 8);
            *(uint4 *)(vc + off) = *(const uint4 *)(nvs + r * HD + c * 8);
        }

    float o[DT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < DT; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    if (tb < te && !early)
        load_tile(k_lo + tb * AM_KEYS, 0);
    for (int it = tb; it < te; it++) {
        const int t0 = k_lo + it * AM_KEYS, b = (it - tb) & 1;
        if (it + 1 < te)
            load_tile(t0 + AM_KEYS, b ^ 1);
#if DEC_BULK
        cuk_mbar_wait(tbar + b, (unsigned)((it - tb) >> 1) & 1u);
#else
        if (it + 1 < te)
            cuk_cp_async_wait<1>();
        else
            cuk_cp_async_wait<0>();
        __syncthreads();
#endif
        if (it == tb)
            PROBE(RP, 7); /* the first tile's keys are in shared memory */
        /* rows from lim on: the new positions (RP) from nks / nvs, then
         * (bulk copies) zeros; the same in every thread */
        const int zlo = DEC_BULK ? max(0, (RP ? k_end : lim) - t0) : AM_KEYS;
        if (lim < t0 + AM_KEYS) {
            char *smem = (char *)am_smem; /* tile_addr is a shared-window address */
            if (RP) {
                int lo = max(t0, g.pos0), hi = min(t0 + AM_KEYS, k_end);
                for (int idx = threadIdx.x; idx < max(0, hi - lo) * NCH; idx += blockDim.x) {
                    int j = lo - t0 + idx / NCH, c = idx % NCH, r = lo - g.pos0 + idx / NCH;
                    *(uint4 *)(smem + (tile_addr<HD>(ktile(b), j, c) - sbase)) =
                        *(const uint4 *)(nks + r * HD + c * 8);
                    *(uint4 *)(smem + (tile_addr<HD>(vtile(b), j, c) - sbase)) =
                        *(const uint4 *)(nvs + r * HD + c * 8);
                }
            }
            for (int idx = threadIdx.x; idx < (AM_KEYS - zlo) * NCH; idx += blockDim.x) {
                int j = zlo + idx / NCH, c = idx % NCH;
                *(uint4 *)(smem + (tile_addr<HD>(ktile(b), j, c) - sbase)) = make_uint4(0, 0, 0, 0);
                *(uint4 *)(smem + (tile_addr<HD>(vtile(b), j, c) - sbase)) = make_uint4(0, 0, 0, 0);
            }
#if DEC_BULK /* before any later bulk copy into these buffers */
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
        }
        if (DEC_BULK || (RP && lim < t0 + AM_KEYS))
            __syncthreads();

        /* this warp's keys: t0 + 16 warp .. +15 (S n-tiles jj = 0, 1) */
        float s[2][4];
#pragma unroll
        for (int jj = 0; jj < 2; jj++)
            s[jj][0] = s[jj][1] = s[jj][2] = s[jj][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < QK; ks += 2)
#pragma unroll
            for (int jj = 0; jj < 2; jj++) {
                uint32_t kb[4];
                cuk_ldsm_x4(kb, tile_addr<HD>(ktile(b), 16 * warp + 8 * jj + (lane & 7),
                                          2 * ks + (lane >> 3)));
                cuk_mma16816(s[jj], qhi[ks], kb[0], kb[1]);
                cuk_mma16816(s[jj], qlo[ks], kb[0], kb[1]);
                cuk_mma16816(s[jj], qhi[ks + 1], kb[2], kb[3]);
                cuk_mma16816(s[jj], qlo[ks + 1], kb[2], kb[3]);
            }
        online_softmax<2, DT>(s, o, m, l, pos, start, t0 + 16 * warp, tig);
        uint32_t phi[4], plo[4];
        split_pair(s[0][0], s[0][1], &phi[0], &plo[0]);
        split_pair(s[0][2], s[0][3], &phi[1], &plo[1]);
        split_pair(s[1][0], s[1][1], &phi[2], &plo[2]);
        split_pair(s[1][2], s[1][3], &phi[3], &plo[3]);
#pragma unroll
        for (int j2 = 0; j2 < DT / 2; j2++) {
            int mi = lane >> 3, key = 16 * warp + (mi & 1) * 8 + (lane & 7);
            uint32_t vb[4];
            ldsm_x4_trans(vb, tile_addr<HD>(vtile(b), key, 2 * j2 + (mi >> 1)));
            cuk_mma16816(o[2 * j2], phi, vb[0], vb[1]);
            cuk_mma16816(o[2 * j2], plo, vb[0], vb[1]);
            cuk_mma16816(o[2 * j2 + 1], phi, vb[2], vb[3]);
            cuk_mma16816(o[2 * j2 + 1], plo, vb[2], vb[3]);
        }
        __syncthreads();
    }

    PROBE(RP, 3);
    /* merge the warps (their key quarters) through shared memory, which
     * the tiles no longer use */
    float *so = (float *)am_smem;              /* [warp][16][HD] */
    float *sm = so + AM_WARPS * 16 * HD;       /* [warp][16] */
    float *sl = sm + AM_WARPS * 16;            /* [warp][16] */
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (h == 1 && rows <= 8) /* rows 8..15 are empty: nothing reads them */
            break;
        int r = gid + 8 * h;
        float L = quad_sum(l[h]);
        if (tig == 0) {
            sm[warp * 16 + r] = m[h];
            sl[warp * 16 + r] = L;
        }
#pragma unroll
        for (int j = 0; j < DT; j++)
            *(float2 *)(so + (warp * 16 + r) * HD + 8 * j + 2 * tig) =
                make_float2(o[j][2 * h], o[j][2 * h + 1]);
    }
    __syncthreads();
    const size_t nrow = (size_t)g.n * g.n_heads * n_splits;
    float *wm = ws + nrow * HD, *wl = wm + nrow; /* valid when n_splits > 1 */
    float *cpart = sl + AM_WARPS * 16; /* CL: o[rows][HD], m[16], l[16] */
    for (int idx = threadIdx.x; idx < rows * HD; idx += blockDim.x) {
        int r = idx / HD, d = idx % HD;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < AM_WARPS; w++)
            M = fmaxf(M, sm[w * 16 + r]);
        float L = 0.0f, O = 0.0f;
#pragma unroll
        for (int w = 0; w < AM_WARPS; w++) {
            float mw = sm[w * 16 + r];
            float c = mw == -INFINITY ? 0.0f : exp2f(mw - M);
            L += sl[w * 16 + r] * c;
            O += so[(w * 16 + r) * HD + d] * c;
        }
        size_t qh = row_qh(rd, r, 0, kvh, g.n_heads);
        if (n_used == 1 && !dnused) {
            out[qh * HD + d] = L > 0.0f ? O / L : 0.0f;
        } else if (CL) {
            cpart[idx] = O;
            if (d == 0) {
                cpart[rows * HD + r] = M;
                cpart[rows * HD + 16 + r] = L;
            }
        } else {
            size_t pr = qh * n_splits + sp;
            ws[pr * HD + d] = O;
            if (d == 0) {
                wm[pr] = M;
                wl[pr] = L;
            }
        }
    }
    PROBE(RP, 4);
    if (CL && n_used > 1) {
        cuk_cluster_sync(); /* every split's partial is in its block's shared memory */
        cluster_merge<HD>(out, (uint32_t)__cvta_generic_to_shared(cpart), rows, n_used, sp, rd,
                          kvh, g.n_heads);
        /* No block leaves while another reads its partial. Those reads
         * are done (their values are in out), so this meeting orders
         * nothing and waits for no store to be seen: H200, 512 tokens,
         * 0.6B +0.7-0.8 %, 8B +0.1-0.2 % (docs/benchmarks.md,
         * thirty-second pass). */
        cuk_cluster_sync_relaxed();
        return;
    }
    if (dnused) { /* the next kernel merges: all it needs besides ws */
        if (kvh == 0 && sp == 0 && threadIdx.x == 0)
            *dnused = n_used;
        return;
    }
    if (n_used > 1) /* the last split of this (sequence, KV head) merges them all */
        split_merge<HD>(out, ws, nrow, rows, n_splits, n_used, 0, G, kvh, g.n_heads, cnt, so,
                        RP);
}

template <int HD, bool RP, bool CL = false>
__global__ void __launch_bounds__(AM_WARPS * 32)
    k_attention_dec(float *out, const float *q, uint16_t *kc, uint16_t *vc, const int *table,
                    struct cuk_attn g, const int *dpos, int n_splits, float *ws, unsigned *cnt,
                    struct cuk_dec_rope rope, int *dnused)
{
    if (dpos) /* before waiting: see dec_block */
        g.pos0 = *dpos;
    PROBE(RP, 0);
    dec_block<HD, RP, CL>(out, q, kc, vc, table, g, blockIdx.x, blockIdx.y, n_splits, ws,
                          cnt + blockIdx.x, rope, dnused);
    PROBE_END(RP);
}

/* The decode segments of a batch step (cuk_bseg.tiled == 2), laid out as
 * for cuk_attention_short_batch: blockIdx.x runs over the step's rows and
 * the block of a segment's first row does its work. */
template <int HD>
__global__ void __launch_bounds__(AM_WARPS * 32)
    k_attention_dec_batch(float *out, const float *q, const uint16_t *kc, const uint16_t *vc,
                          const int *meta, struct cuk_attn g, float *ws, unsigned *cnt,
                          int max_splits)
{
    /* dec_block waits for the previous kernel; the step's metadata was
     * copied before it (see dec_block) */
    struct cuk_attn gs;
    const struct cuk_bseg *sg = cuk_bseg_of_block(meta, g, &gs);
    if (!sg)
        return;
    size_t qd = (size_t)g.n_heads * HD;
    /* without RoPE the block never writes the cache */
    dec_block<HD, false>(out + sg->row0 * qd, q + sg->row0 * qd, (uint16_t *)kc, (uint16_t *)vc,
                         meta + sg->tab_off, gs, blockIdx.y, blockIdx.z, sg->splits,
                         cuk_bseg_ws(sg, g, ws, max_splits, HD),
                         cuk_bseg_cnt(sg, g, cnt, blockIdx.y), cuk_dec_rope{}, nullptr);
}

extern "C" int cuk_attention_dec_rows(const struct cuk_attn *g)
{
    if (!g->mma || !g->kv_bf16 || !g->kv_swz || (g->head_dim != 64 && g->head_dim != 128) ||
        g->n_kv_heads <= 0 || g->n_heads % g->n_kv_heads || g->kv_dim % 8)
        return 0;
    int G = g->n_heads / g->n_kv_heads;
    return G <= 16 ? 16 / G : 0;
}

extern "C" int cuk_attention_dec_splits(int n_kv_heads, int kv_cap, int max_blocks, int n_seqs)
{
    /* rounded down: a split more than fits is a second wave of blocks
     * (4 sequences x 8 KV heads x 9 splits on 264 slots: 23 us, ncu) */
    long blocks = (long)n_kv_heads * (n_seqs > 0 ? n_seqs : 1);
    long s = max_blocks / blocks, by_len = (kv_cap + AM_KEYS - 1) / AM_KEYS;
    if (s > by_len)
        s = by_len;
    if (s > 64)
        s = 64;
    return s < 1 ? 1 : (int)s;
}

static_assert(AM_WARPS * 16 * 128 * 4 + 2 * AM_WARPS * 16 * 4 <= 4 * AM_KEYS * 128 * 2,
              "the warp merge fits in the tiles' shared memory");
static_assert(AM_WARPS * 16 * 64 * 4 + 2 * AM_WARPS * 16 * 4 <= 4 * AM_KEYS * 64 * 2,
              "the warp merge fits in the tiles' shared memory");
static_assert((2 * 16 * 64 + 16) * 4 <= 4 * AM_KEYS * 64 * 2,
              "the decode split merge fits in the tiles' shared memory");
static_assert((AM_WARPS * 16 * 128 + 2 * AM_WARPS * 16 + 16 * 128 + 32) * 4 <=
                  4 * AM_KEYS * 128 * 2,
              "the cluster merge's partial fits after the warp merge's");
static_assert((AM_WARPS * 16 * 64 + 2 * AM_WARPS * 16 + 16 * 64 + 32) * 4 <= 4 * AM_KEYS * 64 * 2,
              "the cluster merge's partial fits after the warp merge's");

/* Whether clusters of n blocks of the RoPE decode kernel can run on this
 * device (their blocks on one GPC at once), asked once per device and
 * size; the kernel's shared memory is set up here, before the question,
 * for its launches too. */
template <int HD> static bool dec_cluster_ok(int n)
{
    static signed char known[CUK_MAX_DEVICES][CUK_DEC_CLUSTER_MAX + 1]; /* 1 yes, -1 no */
    int dev = 0;
    if (n < 2 || n > CUK_DEC_CLUSTER_MAX || cudaGetDevice(&dev) != cudaSuccess || dev < 0 ||
        dev >= CUK_MAX_DEVICES) {
        cudaGetLastError();
        return false;
    }
    if (known[dev][n])
        return known[dev][n] > 0;
    auto k = k_attention_dec<HD, true, true>;
    int nc = 0;
    static struct cuk_opted opted;
    bool ok = cuk_smem_opt_in(k, dec_smem<HD>(true), &opted, true) == cudaSuccess &&
              cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) ==
                  cudaSuccess;
    if (ok) {
        cudaLaunchAttribute at;
        at.id = cudaLaunchAttributeClusterDimension;
        at.val.clusterDim.x = 1;
        at.val.clusterDim.y = (unsigned)n;
        at.val.clusterDim.z = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(1, (unsigned)n);
        cfg.blockDim = dim3(AM_WARPS * 32);
        cfg.dynamicSmemBytes = dec_smem<HD>(true);
        cfg.attrs = &at;
        cfg.numAttrs = 1;
        ok = cudaOccupancyMaxActiveClusters(&nc, k, &cfg) == cudaSuccess && nc >= 1;
    }
    if (!ok)
        cudaGetLastError();
    known[dev][n] = ok ? 1 : -1;
    return ok;
}

extern "C" int cuk_attention_dec_cluster_ok(int head_dim, int n_splits)
{
    if (n_splits < 2 || n_splits > CUK_DEC_CLUSTER_MAX || (head_dim != 64 && head_dim != 128))
        return 0;
    return head_dim == 64 ? dec_cluster_ok<64>(n_splits) : dec_cluster_ok<128>(n_splits);
}

template <int HD, bool RP>
static cudaError_t launch_dec(cudaStream_t s, float *out, const float *q, void *kc, void *vc,
                              const int *table, const struct cuk_attn *g, const int *dpos,
                              int n_splits, float *ws, unsigned *cnt,
                              const struct cuk_dec_rope &rope, int *dnused)
{
    if constexpr (RP)
        if (g->dec_cluster) /* cuk_attention_dec checked the size (dec_cluster_ok opted in) */
            return cuk_launch_cluster(k_attention_dec<HD, true, true>,
                                      dim3((unsigned)g->n_kv_heads, (unsigned)n_splits),
                                      AM_WARPS * 32, dec_smem<HD>(true), s,
                                      dim3(1, (unsigned)n_splits, 1), out, q, (uint16_t *)kc,
                                      (uint16_t *)vc, table, *g, dpos, n_splits, ws, cnt, rope,
                                      dnused);
    /* with all unified memory as shared memory, the next GEMV's staged
     * block (gemv_staged.cu) fits beside this kernel's */
    static struct cuk_opted opted;
    cudaError_t err = cuk_smem_opt_in(k_attention_dec<HD, RP>, dec_smem<HD>(RP), &opted, true);
    if (err != cudaSuccess)
        return err;
    return cuk_launch(k_attention_dec<HD, RP>, dim3((unsigned)g->n_kv_heads, (unsigned)n_splits),
                      AM_WARPS * 32, dec_smem<HD>(RP), s, out, q, (uint16_t *)kc, (uint16_t *)vc,
                      table, *g, dpos, n_splits, ws, cnt, rope, dnused);
}

template <int HD>
static cudaError_t launch_dec_hd(cudaStream_t s, float *out, const float *q, void *kc, void *vc,
                                 const int *table, const struct cuk_attn *g, const int *dpos,
                                 int n_splits, float *ws, unsigned *cnt,
                                 const struct cuk_dec_rope *rope, int *dnused)
{
    if (rope)
        return launch_dec<HD, true>(s, out, q, kc, vc, table, g, dpos, n_splits, ws, cnt, *rope,
                                    dnused);
    return launch_dec<HD, false>(s, out, q, kc, vc, table, g, dpos, n_splits, ws, cnt,
                                 cuk_dec_rope{}, nullptr);
}

extern "C" cudaError_t cuk_attention_dec(cudaStream_t s, float *out, const float *q, void *kc,
                                         void *vc, const int *table, const struct cuk_attn *g,
                                         const int *dpos, int n_splits, float *ws, unsigned *cnt,
                                         const struct cuk_dec_rope *rope, int *dnused)
{
    int qmax = cuk_attention_dec_rows(g);
    if (!qmax || g->n < 1 || g->n > qmax || n_splits < 1 || n_splits > 64 ||
        (n_splits > 1 && (!ws || !cnt)) || (rope && g->kv_dim != g->n_kv_heads * g->head_dim) ||
        (dnused && (!rope || g->n != 1 || n_splits < 2)) ||
        (g->dec_cluster && (!rope || dnused || !cuk_attention_dec_cluster_ok(g->head_dim,
                                                                             n_splits))))
        return cudaErrorInvalidValue;
    if (g->head_dim == 64)
        return launch_dec_hd<64>(s, out, q, kc, vc, table, g, dpos, n_splits, ws, cnt, rope,
                                 dnused);
    return launch_dec_hd<128>(s, out, q, kc, vc, table, g, dpos, n_splits, ws, cnt, rope, dnused);
}

/* One block per KV head: its G rows of one query. */
template <int HD>
__global__ void __launch_bounds__(AM_WARPS * 32)
    k_attention_merge(float *out, const float *ws, const int *dnused, int n_heads, int n_kv_heads,
                      int n_splits)
{
    extern __shared__ float4 am_smem[];
    cuk_pdl_start(); /* ws and *dnused are the attention kernel's */
    const int G = n_heads / n_kv_heads;
    merge_splits<HD>(out, ws, (size_t)n_heads * n_splits, G, n_splits, *dnused, 0, G, blockIdx.x,
                     n_heads, (float *)am_smem);
}

extern "C" cudaError_t cuk_attention_merge(cudaStream_t s, float *out, const float *ws,
                                           const int *dnused, int n_heads, int n_kv_heads,
                                           int head_dim, int n_splits)
{
    if (!out || !ws || !dnused || n_kv_heads < 1 || n_heads % n_kv_heads || n_splits < 1 ||
        n_splits > 64 || (head_dim != 64 && head_dim != 128))
        return cudaErrorInvalidValue;
    const int G = n_heads / n_kv_heads;
    const size_t smem = (size_t)(2 * G * n_splits + G) * 4;
    if (smem > 48 * 1024)
        return cudaErrorInvalidValue;
    if (head_dim == 64)
        return cuk_launch(k_attention_merge<64>, (unsigned)n_kv_heads, AM_WARPS * 32, smem, s, out,
                          ws, dnused, n_heads, n_kv_heads, n_splits);
    return cuk_launch(k_attention_merge<128>, (unsigned)n_kv_heads, AM_WARPS * 32, smem, s, out,
                      ws, dnused, n_heads, n_kv_heads, n_splits);
}

template <int HD>
static cudaError_t launch_dec_batch(cudaStream_t s, float *out, const float *q, const void *kc,
                                    const void *vc, const int *meta, const struct cuk_attn *g,
                                    int max_splits, float *ws, unsigned *cnt)
{
    static struct cuk_opted opted;
    cudaError_t err = cuk_smem_opt_in(k_attention_dec_batch<HD>, dec_smem<HD>(false), &opted);
    if (err != cudaSuccess)
        return err;
    return cuk_launch(k_attention_dec_batch<HD>,
                      dim3((unsigned)g->n, (unsigned)g->n_kv_heads, (unsigned)max_splits),
                      AM_WARPS * 32, dec_smem<HD>(false), s, out, q, (const uint16_t *)kc,
                      (const uint16_t *)vc, meta, *g, ws, cnt, max_splits);
}

extern "C" cudaError_t cuk_attention_dec_batch(cudaStream_t s, float *out, const float *q,
                                               const void *kc, const void *vc, const int *meta,
                                               const struct cuk_attn *g, int max_splits,
                                               float *ws, unsigned *cnt)
{
    if (!cuk_attention_dec_rows(g) || max_splits < 1 || max_splits > 64 ||
        (max_splits > 1 && (!ws || !cnt)))
        return cudaErrorInvalidValue;
    if (g->head_dim == 64)
        return launch_dec_batch<64>(s, out, q, kc, vc, meta, g, max_splits, ws, cnt);
    return launch_dec_batch<128>(s, out, q, kc, vc, meta, g, max_splits, ws, cnt);
}
