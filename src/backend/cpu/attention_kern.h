/* attention_kern.h - the CPU attention's kernels, included once per
 * instruction set (attention_v4.c, attention_v3.c, attention_base.c), each
 * compiled for its own: ATT_KERNELS names the table it defines. The math is
 * written over groups of 16 lanes (a K panel's keys, a softmax's values)
 * held as 16 / ATT_W native vectors of ATT_W floats, ATT_W the widest the
 * compiler targets here: a 64-byte vector type where no register holds
 * one is kept in memory by the compiler, and the AVX2 build of that had
 * run at a tenth of the AVX-512 one's speed (docs/benchmarks.md). Each
 * lane's operations are the same whatever ATT_W, so builds with fused
 * multiply-adds (AVX2, AVX-512) give the same bits. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/attention_impl.h"
#include "base/half.h"

#if defined(__AVX512F__)
#define ATT_W 16
#elif defined(__AVX__)
#define ATT_W 8
#else
#define ATT_W 4 /* SSE2, NEON and the like: 16-byte registers */
#endif
#define ATT_NP (16 / ATT_W) /* native vectors in a group of 16 lanes */
/* Query rows a pass of the scores takes (with two 16-key groups: RB x 2 x
 * ATT_NP sums), and vectors of columns a pass of P.V holds (two rows: 2 x
 * ATT_PVC sums), as the registers allow: 32 of 64 bytes (AVX-512); 16 of
 * 32 (AVX2); 16 of 16 (SSE2; NEON has 32) */
#if ATT_W == 16
#define ATT_RB 4
#define ATT_PVC 8
#elif ATT_W == 8
#define ATT_RB 2
#define ATT_PVC 4
#else
#define ATT_RB 1
#define ATT_PVC 4
#endif

#define ATT_RBMAX (ATT_RB > 2 ? ATT_RB : 2)

#define ATT_INLINE static inline __attribute__((always_inline))
#define ATT_UNROLL _Pragma("GCC unroll 16")

/* ATT_W floats: one register. Loaded and stored with memcpy (rows are only
 * 4-byte aligned). */
typedef float att_nv __attribute__((vector_size(ATT_W * 4)));
typedef int32_t att_ni __attribute__((vector_size(ATT_W * 4)));

/* n (ATT_W, or ATT_W / 2 when ATT_W is 16) cache elements at row + i as
 * floats into dst's lanes from lane0: f32 as they are, bf16 widened
 * (exactly: a bf16 is the top half of an f32). bf16 is a constant at every
 * call, so each job function keeps only its own branch. */
ATT_INLINE void att_load_n(att_nv *dst, int lane0, int n, const void *row, size_t i, bool bf16)
{
    if (bf16 && n == ATT_W) {
        typedef uint16_t u16xw __attribute__((vector_size(ATT_W * 2)));
        u16xw h;
        memcpy(&h, (const uint16_t *)row + i, sizeof h);
        att_ni w = (att_ni)(__builtin_convertvector(h, att_ni) << 16);
        memcpy((char *)dst + lane0 * 4, &w, sizeof w);
    } else if (bf16) { /* half a vector: 8 lanes */
        typedef uint16_t u16x8 __attribute__((vector_size(16)));
        typedef int32_t i32x8 __attribute__((vector_size(32)));
        u16x8 h;
        memcpy(&h, (const uint16_t *)row + i, sizeof h);
        i32x8 w = __builtin_convertvector(h, i32x8) << 16;
        memcpy((char *)dst + lane0 * 4, &w, sizeof w);
    } else {
        memcpy((char *)dst + lane0 * 4, (const float *)row + i, (size_t)n * 4);
    }
}

ATT_INLINE float att_elt(const void *row, int d, bool bf16)
{
    return bf16 ? bf16_to_f32(((const uint16_t *)row)[d]) : ((const float *)row)[d];
}

/* The 16 keys of one 16-key group at dimension d, as ATT_NP vectors: their
 * K run pair h[0], h[1] (8 positions each) read pw elements per dimension
 * apart. In 16-position panels the pair is one run of 16 (h[1] = h[0] +
 * 8); with 8-position blocks the halves may lie in two blocks. */
ATT_INLINE void att_load_keys(att_nv *dst, const void *const *h, int d, int pw, bool bf16)
{
    if (pw == 16) {
        ATT_UNROLL for (int u = 0; u < ATT_NP; u++)
            att_load_n(&dst[u], 0, ATT_W, h[0], (size_t)d * 16 + (size_t)(u * ATT_W), bf16);
        return;
    }
#if ATT_W == 16
    att_load_n(&dst[0], 0, 8, h[0], (size_t)d * 8, bf16);
    att_load_n(&dst[0], 8, 8, h[1], (size_t)d * 8, bf16);
#else
    ATT_UNROLL for (int u = 0; u < ATT_NP; u++)
        att_load_n(&dst[u], 0, ATT_W, h[u * ATT_W / 8], (size_t)d * 8 + (size_t)(u * ATT_W % 8),
                   bf16);
#endif
}

/* sc[r][16 g..16 g + 16) = q[r] . key * scale for RB query rows and the NG
 * 16-key groups g0.. of a tile: one vector of keys' sums a row and native
 * vector, a multiply-add per dimension, each key's sum in the order of d
 * whatever RB, NG or the lanes beside it. Each key vector loaded serves
 * every row. */
ATT_INLINE void att_scores_block(int RB, int NG, float *const *sc, const float *const *q,
                                 const void *const *kh, int g0, int hd, float scale, int pw,
                                 bool bf16)
{
    att_nv acc[ATT_RBMAX][2 * ATT_NP], y[2 * ATT_NP];
    ATT_UNROLL for (int r = 0; r < RB; r++)
        ATT_UNROLL for (int u = 0; u < NG * ATT_NP; u++)
            acc[r][u] = (att_nv){0};
    for (int d = 0; d < hd; d++) {
        ATT_UNROLL for (int g = 0; g < NG; g++)
            att_load_keys(y + g * ATT_NP, kh + 2 * (g0 + g), d, pw, bf16);
        ATT_UNROLL for (int r = 0; r < RB; r++)
        {
            float x = q[r][d];
            ATT_UNROLL for (int u = 0; u < NG * ATT_NP; u++)
                acc[r][u] += x * y[u];
        }
    }
    ATT_UNROLL for (int r = 0; r < RB; r++)
        ATT_UNROLL for (int u = 0; u < NG * ATT_NP; u++)
        {
            acc[r][u] *= scale;
            memcpy(sc[r] + 16 * g0 + ATT_W * u, &acc[r][u], ATT_W * 4);
        }
}

/* A tile's query rows: row r is token i0 + r / nh's query head h0 + r % nh,
 * its scores at sc + r * ATT_KT. */
struct att_qrows {
    const float *q; /* the call's queries, [token][n_heads][head_dim] */
    float *sc;
    int i0, h0, nh, n_heads;
};

/* att_scores_block for rb rows (ATT_RB, 2 or 1), RB and NG spelled out as
 * constants at each call: the inlined loops then unroll and keep the sums
 * in registers. */
ATT_INLINE void att_scores_rb(int rb, int NG, float *const *sc, const float *const *q,
                              const void *const *kh, int g0, int hd, float scale, int pw,
                              bool bf16)
{
    if (rb == ATT_RB)
        att_scores_block(ATT_RB, NG, sc, q, kh, g0, hd, scale, pw, bf16);
    else if (rb == 2)
        att_scores_block(2, NG, sc, q, kh, g0, hd, scale, pw, bf16);
    else
        att_scores_block(1, NG, sc, q, kh, g0, hd, scale, pw, bf16);
}

ATT_INLINE void att_scores_pw(const struct att_qrows *qr, int nr, const void *const *kh, int g0,
                              int ng, int hd, float scale, int pw, bool bf16)
{
    for (int r = 0; r < nr;) {
        int rb = nr - r >= ATT_RB ? ATT_RB : nr - r >= 2 ? 2 : 1;
        const float *q[ATT_RBMAX];
        float *sc[ATT_RBMAX];
        for (int u = 0; u < rb; u++) {
            int i = qr->i0 + (r + u) / qr->nh, h = qr->h0 + (r + u) % qr->nh;
            q[u] = qr->q + ((size_t)i * qr->n_heads + h) * hd;
            sc[u] = qr->sc + (size_t)(r + u) * ATT_KT;
        }
        for (int g = g0; g < g0 + ng; g += 2) /* two groups a pass */
            if (g + 2 <= g0 + ng)
                att_scores_rb(rb, 2, sc, q, kh, g, hd, scale, pw, bf16);
            else
                att_scores_rb(rb, 1, sc, q, kh, g, hd, scale, pw, bf16);
        r += rb;
    }
}

/* The scores of rows [0, nr) of qr against a tile's keys in its 16-key
 * groups [g0, g0 + ng), two a pass, from the tile's K runs kh (two a
 * group). pw becomes a constant in each branch. */
ATT_INLINE void att_scores(const struct att_qrows *qr, int nr, const void *const *kh, int g0,
                           int ng, int hd, float scale, int pw, bool bf16)
{
    if (pw == 16)
        att_scores_pw(qr, nr, kh, g0, ng, hd, scale, 16, bf16);
    else
        att_scores_pw(qr, nr, kh, g0, ng, hd, scale, 8, bf16);
}

/* o[r][d..d + C ATT_W) = o * c[r] + sum over k of p[r][k] * v[k] for the R
 * rows: the R*C vectors' sums in registers across the keys, C independent
 * chains per row so the adds are not bound by their latency, and each V
 * load feeding every row. c == 1 leaves o as it is (the same bits as
 * multiplying). Each column sums its keys in order, whatever R and C. */
ATT_INLINE void att_pv_cols(int R, int C, float *const *o, const float *c,
                            const float *const *p, const void *const *v, int nk, int d,
                            bool bf16)
{
    att_nv acc[4][ATT_PVC], y;
    ATT_UNROLL for (int r = 0; r < R; r++)
        ATT_UNROLL for (int u = 0; u < C; u++)
        {
            memcpy(&acc[r][u], o[r] + d + ATT_W * u, ATT_W * 4);
            if (c[r] != 1.0f)
                acc[r][u] *= c[r];
        }
    for (int k = 0; k < nk; k++)
        ATT_UNROLL for (int u = 0; u < C; u++)
        {
            att_load_n(&y, 0, ATT_W, v[k], (size_t)(d + ATT_W * u), bf16);
            ATT_UNROLL for (int r = 0; r < R; r++)
                acc[r][u] += p[r][k] * y;
        }
    ATT_UNROLL for (int r = 0; r < R; r++)
        ATT_UNROLL for (int u = 0; u < C; u++)
            memcpy(o[r] + d + ATT_W * u, &acc[r][u], ATT_W * 4);
}

/* P.V of a tile for R (1, 2 or 4) rows over the same keys: o[r] = o[r] * c[r]
 * + sum over k of p[r][k] * v[k], ATT_PVC vectors of columns at a time,
 * then two, then one, and the last ones one by one. */
ATT_INLINE void att_pv(int R, float *const *o, const float *c, const float *const *p,
                       const void *const *v, int nk, int hd, bool bf16)
{
    /* four rows hold half the columns two do: the same registers */
    const int C = R > 2 ? ATT_PVC / 2 : ATT_PVC;
    int d = 0;
    for (; d + C * ATT_W <= hd; d += C * ATT_W)
        att_pv_cols(R, C, o, c, p, v, nk, d, bf16);
    for (; d + 2 * ATT_W <= hd; d += 2 * ATT_W)
        att_pv_cols(R, 2, o, c, p, v, nk, d, bf16);
    for (; d + ATT_W <= hd; d += ATT_W)
        att_pv_cols(R, 1, o, c, p, v, nk, d, bf16);
    for (; d < hd; d++)
        for (int r = 0; r < R; r++) {
            float a = c[r] != 1.0f ? o[r][d] * c[r] : o[r][d];
            for (int k = 0; k < nk; k++)
                a += p[r][k] * att_elt(v[k], d, bf16);
            o[r][d] = a;
        }
}

/* dst[i] = e^(src[i] - mn) for 16 values at most mn (scores less their
 * maximum): x = n ln2 + r with |r| <= ln2 / 2, e^r by a degree-7
 * polynomial (the Cephes coefficients), 2^n put into the exponent; within
 * 2 ulp of expf. Below -87 it gives e^-87 (1.6e-38), not less: a key that
 * far below the row's best weighs nothing either way. Each lane the same
 * operations, so a value depends on nothing but its input. */
ATT_INLINE void att_exp16(float *dst, const float *src, float mn)
{
    ATT_UNROLL for (int u = 0; u < ATT_NP; u++)
    {
        att_nv x, n, r, p, y, s, clamp;
        att_ni low, xb, cb, e, yb;
        memcpy(&x, src + ATT_W * u, ATT_W * 4);
        x -= mn;
        low = x < -87.0f; /* all ones where below */
        clamp = x - x - 87.0f;
        memcpy(&xb, &x, sizeof x);
        memcpy(&cb, &clamp, sizeof x);
        xb = (xb & ~low) | (cb & low);
        memcpy(&x, &xb, sizeof x);
        /* n = round(x log2 e): adding 1.5 * 2^23 rounds to an integer */
        n = x * 1.44269504088896341f + 12582912.0f;
        n -= 12582912.0f;
        r = x - n * 0.693359375f;
        r = r - n * -2.12194440e-4f;
        p = r * 1.9875691500e-4f + 1.3981999507e-3f;
        p = p * r + 8.3334519073e-3f;
        p = p * r + 4.1665795894e-2f;
        p = p * r + 1.6666665459e-1f;
        p = p * r + 5.0000001201e-1f;
        y = p * (r * r) + r + 1.0f;
        e = (__builtin_convertvector(n, att_ni) + 127) << 23;
        memcpy(&s, &e, sizeof s);
        y *= s;
        memcpy(&yb, &y, sizeof y);
        memcpy(dst + ATT_W * u, &yb, sizeof yb);
    }
}

/* The sum of 16 lanes by halving (8 + 8, 4 + 4, then the last four): a
 * fixed order, so a sum depends on nothing but its values. */
ATT_INLINE float att_hsum16(const att_nv *v)
{
    float t[16], a[8];
    memcpy(t, v, 64);
    for (int i = 0; i < 8; i++)
        a[i] = t[i] + t[i + 8];
    for (int i = 0; i < 4; i++)
        a[i] += a[i + 4];
    return (a[0] + a[2]) + (a[1] + a[3]);
}

/* *acc = the lane-wise larger of *acc and *x (a blend on the comparison's
 * mask: C has no ?: on vectors). */
ATT_INLINE void att_vmax(att_nv *acc, const att_nv *x)
{
    att_ni gt = *x > *acc, xa, aa;
    memcpy(&xa, x, sizeof xa);
    memcpy(&aa, acc, sizeof aa);
    aa = (xa & gt) | (aa & ~gt);
    memcpy(acc, &aa, sizeof aa);
}

/* One tile of a row's online softmax: sc[k0..k1) holds its scores and gets
 * e^(score - max); *m and *l, the row's running max and sum, move on.
 * Returns what the row's output so far must be scaled by. The max and the
 * sum go 16 lanes at a time (a scalar chain of a tile's dependent adds cost as
 * much as a tile's multiply-adds), the sum folded by halving. */
ATT_INLINE float att_softmax_step(float *sc, int k0, int k1, float *m, float *l)
{
    att_nv vm[ATT_NP], vs[ATT_NP], x;
    int k = k0;
    ATT_UNROLL for (int u = 0; u < ATT_NP; u++)
    {
        vs[u] = (att_nv){0};
        vm[u] = vs[u] - INFINITY;
    }
    for (; k + 16 <= k1; k += 16)
        ATT_UNROLL for (int u = 0; u < ATT_NP; u++)
        {
            memcpy(&x, sc + k + ATT_W * u, sizeof x);
            att_vmax(&vm[u], &x);
        }
    float mt = -INFINITY, lanes[16]; /* a max is exact: any order */
    memcpy(lanes, vm, 64);
    for (int u = 0; u < 16; u++)
        mt = lanes[u] > mt ? lanes[u] : mt;
    for (; k < k1; k++)
        mt = sc[k] > mt ? sc[k] : mt;
    float mn = mt > *m ? mt : *m;
    /* the row's first keys: *m is -inf, exp gives 0 */
    float corr = mn == *m ? 1.0f : expf(*m - mn);
    for (k = k0; k + 16 <= k1; k += 16) {
        att_exp16(sc + k, sc + k, mn);
        ATT_UNROLL for (int u = 0; u < ATT_NP; u++)
        {
            memcpy(&x, sc + k + ATT_W * u, sizeof x);
            vs[u] += x;
        }
    }
    if (k < k1) { /* the last few through a padded copy: the same lanes' arithmetic */
        float t[16];
        int nt = k1 - k;
        memcpy(t, sc + k, (size_t)nt * sizeof(float));
        for (int i = nt; i < 16; i++)
            t[i] = mn;
        att_exp16(t, t, mn);
        memcpy(sc + k, t, (size_t)nt * sizeof(float));
        for (int i = nt; i < 16; i++)
            t[i] = 0.0f;
        ATT_UNROLL for (int u = 0; u < ATT_NP; u++)
        {
            memcpy(&x, t + ATT_W * u, sizeof x);
            vs[u] += x;
        }
    }
    *l = *l * corr + att_hsum16(vs);
    *m = mn;
    return corr;
}

/* Folds a chunk's unnormalised output o (its running max m and sum l)
 * into a row's total (to, *tm, *tl); the first chunk (first) is copied.
 * One function, not inlined, so both paths fold with the same code. */
static void att_fold(float *to, float *tm, float *tl, bool first, const float *o,
                                float m, float l, int hd)
{
    if (first) {
        memcpy(to, o, (size_t)hd * sizeof(float));
        *tm = m;
        *tl = l;
        return;
    }
    float mn = m > *tm ? m : *tm, a = expf(*tm - mn), b = expf(m - mn);
    for (int d = 0; d < hd; d++)
        to[d] = to[d] * a + o[d] * b;
    *tl = *tl * a + l * b;
    *tm = mn;
}

/* The cache offsets of KV head kvh's keys of the tile at t0 within [lo,
 * hi]: V's rows into row[t - t0], and K's runs of 8 positions into kh[h]
 * (positions t0 + 8 h.., d = 0: kv_k_offset's panels, two runs a 16-key
 * group). A run none of whose keys are there points at one of the tile's
 * runs that has some, so a group can always be read; those lanes go
 * unused. With pf, every cache line of those V rows and K runs asked into
 * L2 as well (a hint: nothing waits on it). */
ATT_INLINE void att_rows(const struct att_job *j, int kvh, int t0, int lo, int hi, int hd,
                         size_t eb, bool pf, size_t *row, size_t *kh)
{
    int t = t0 > lo ? t0 : lo, te = t0 + ATT_KT <= hi + 1 ? t0 + ATT_KT : hi + 1;
    if (t >= te)
        return; /* a tile ahead of the last (the prefetch ring) */
    const int first = t, pw = kv_panel(j->pool);
    for (; t < te; t++) {
        size_t off = kv_offset(j->pool, j->seq, j->layer, t, kvh);
        row[t - t0] = off;
        if (!pf)
            continue;
        const char *vr = (const char *)j->pool->v + off * eb;
        for (size_t b = 0; b < (size_t)hd * eb; b += 64)
            __builtin_prefetch(vr + b, 0, 2);
    }
    for (int h = 0; h < ATT_KT / 8; h++) {
        int run = pw == 16 ? t0 + 16 * (h / 2) : t0 + 8 * h;
        int ph = run < first ? first : run >= te ? te - 1 : run;
        kh[h] = kv_k_offset(j->pool, j->seq, j->layer, ph, kvh) - (size_t)(ph % pw) +
                (pw == 16 ? (size_t)(8 * (h % 2)) : 0);
        /* a panel (pw 16: asked once, at its first run) or a run of 8 lies
         * in one piece: hd * pw elements */
        if (!pf || (pw == 16 && h % 2) || run + pw <= first || run >= te)
            continue;
        const char *kr = (const char *)j->pool->k + kh[h] * eb;
        for (size_t b = 0; b < (size_t)hd * (size_t)pw * eb; b += 64)
            __builtin_prefetch(kr + b, 0, 2);
    }
}

/* A tile's K runs and V rows as pointers, from att_rows' offsets (KV head
 * 0's, or any head's) moved on by add elements: keys [first, t1) of the
 * tile at t0. */
ATT_INLINE void att_tile_ptrs(const struct att_job *j, const size_t *row, const size_t *kr,
                              size_t add, int t0, int first, int t1, size_t eb, const void **kp,
                              const void **vp)
{
    for (int t = first; t < t1; t++)
        vp[t - t0] = (const char *)j->pool->v + (row[t - t0] + add) * eb;
    for (int h = 0; h < ATT_KT / 8; h++)
        kp[h] = (const char *)j->pool->k + (kr[h] + add) * eb;
}

/* Row i's keys within the tile [t0, t1), as offsets from t0: false when
 * it has none there. */
ATT_INLINE bool att_row_keys(const struct attn_args *a, int i, int t0, int t1, int *k0, int *k1)
{
    int pos = a->pos0 + i, s0 = att_start(a, pos);
    *k0 = (s0 > t0 ? s0 : t0) - t0;
    *k1 = (pos + 1 < t1 ? pos + 1 : t1) - t0;
    return *k0 < *k1;
}

/* The rest of a tile for query head h of a token, and h + 1 with it when R
 * is 2, whose scores are in rs[0], rs[1] (a tile's lanes): each row's
 * softmax step over keys [k0, k1) on its running (*m[u], *l[u]), then P.V
 * into o[u] (each V row loaded serves both). The tile step of both paths,
 * so a row gets the same bits from either. */
ATT_INLINE void att_tile_heads(int R, float *const *rs, float *const *o, float *const *m,
                               float *const *l, const void *const *vp, int k0, int k1, int hd,
                               bool bf16)
{
    float corr[4];
    const float *ps[4];
    for (int u = 0; u < R; u++) {
        corr[u] = att_softmax_step(rs[u], k0, k1, m[u], l[u]);
        ps[u] = rs[u] + k0;
    }
    /* R spelled out as a constant at each call: the inlined loops over rows
     * then unroll and keep the sums in registers */
    if (R == 4)
        att_pv(4, o, corr, ps, vp + k0, k1 - k0, hd, bf16);
    else if (R == 2)
        att_pv(2, o, corr, ps, vp + k0, k1 - k0, hd, bf16);
    else
        att_pv(1, o, corr, ps, vp + k0, k1 - k0, hd, bf16);
}

/* The tokens of [i0, i1) with keys in the tile [t0, t1): a run [*ia, *ib),
 * since a token's first key is at most its position and both rise with
 * the token. */
ATT_INLINE void att_token_run(const struct attn_args *a, int i0, int i1, int t0, int t1, int *ia,
                              int *ib)
{
    int k0, k1, i = i0;
    while (i < i1 && !att_row_keys(a, i, t0, t1, &k0, &k1))
        i++;
    *ia = i;
    while (i < i1 && att_row_keys(a, i, t0, t1, &k0, &k1))
        i++;
    *ib = i;
}

/* Where a tile's rows keep their output and running max and sum: (token
 * i, query head h)'s at o, m and l + (i - i0) * tok + (h - h0) * head, in
 * floats (o has its own strides). */
struct att_sink {
    float *o, *m, *l;
    size_t o_tok, o_head, tok, head;
    int i0, h0;
};

/* The rest of a tile for tokens [ia, ib), every one with keys in it, and
 * qr's heads, whose scores att_scores put at qr's rows: query heads in
 * pairs, and two tokens together where they have the same keys (every
 * tile but a diagonal one or a window's edge), so each V row loaded
 * serves four rows. The row loop of both paths. */
ATT_INLINE void att_tile_rows(const struct attn_args *a, const struct att_sink *sk,
                              const struct att_qrows *qr, int ia, int ib, const void *const *vp,
                              int t0, int t1, int hd, bool bf16)
{
    const int h0 = qr->h0, h1 = qr->h0 + qr->nh;
    for (int i = ia; i < ib;) {
        int k0, k1, kb0, kb1, nt = 1;
        att_row_keys(a, i, t0, t1, &k0, &k1);
        if (qr->nh % 2 == 0 && i + 1 < ib && att_row_keys(a, i + 1, t0, t1, &kb0, &kb1) &&
            kb0 == k0 && kb1 == k1)
            nt = 2;
        for (int h = h0; h < h1; h += 2) {
            float *os[4], *ms[4], *ls[4], *rs[4];
            int R = 0;
            for (int ti = i; ti < i + nt; ti++)
                for (int hh = h; hh < h + 2 && hh < h1; hh++, R++) {
                    size_t at = (size_t)(ti - sk->i0) * sk->tok + (size_t)(hh - sk->h0) * sk->head;
                    os[R] = sk->o + (size_t)(ti - sk->i0) * sk->o_tok +
                            (size_t)(hh - sk->h0) * sk->o_head;
                    ms[R] = sk->m + at;
                    ls[R] = sk->l + at;
                    rs[R] = qr->sc + (size_t)((ti - qr->i0) * qr->nh + (hh - h0)) * ATT_KT;
                }
            att_tile_heads(R, rs, os, ms, ls, vp, k0, k1, hd, bf16);
        }
        i += nt;
    }
}

/* The 16-key groups [*g0, *g0 + *ng) of the tile at t0 that hold keys
 * [first, t1). */
ATT_INLINE void att_groups(int t0, int first, int t1, int *g0, int *ng)
{
    *g0 = (first - t0) / 16;
    *ng = (t1 - 1 - t0) / 16 + 1 - *g0;
}

/* Job jb: query tiles from the last (the most keys) to the first, each over
 * every KV head and head part, so the longest jobs are handed out first. */
ATT_INLINE void att_job_body(const struct att_job *j, int jb, float *scratch, bool bf16)
{
    const struct attn_args *a = j->a;
    int hd = a->head_dim, per_tile = a->n_kv_heads * j->head_parts;
    int qt = j->n_qt - 1 - jb / per_tile, rest = jb % per_tile;
    int kvh = rest / j->head_parts, part = rest % j->head_parts;
    int h0 = kvh * j->group + part * j->group / j->head_parts;
    int h1 = kvh * j->group + (part + 1) * j->group / j->head_parts;
    int i0 = qt * j->qt, i1 = i0 + j->qt < a->n ? i0 + j->qt : a->n;
    int nh = h1 - h0, nr = j->qt * j->group;
    /* per row: its tile's scores (sc), the chunk's running max and sum (m,
     * l), and the chunks before it folded (tm, tl, to; tl 0 while there
     * are none) */
    float *sc = scratch, *m = sc + (size_t)nr * ATT_KT, *l = m + nr, *tm = l + nr, *tl = tm + nr;
    float *to = tl + nr;
    for (int r = 0; r < (i1 - i0) * nh; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        tl[r] = 0.0f;
    }
    for (int i = i0; i < i1; i++)
        memset(j->out + ((size_t)i * a->n_heads + h0) * hd, 0, (size_t)nh * hd * sizeof(float));

    const struct att_sink sink = {.o = j->out + ((size_t)i0 * a->n_heads + h0) * hd, .m = m, .l = l,
                                  .o_tok = (size_t)a->n_heads * hd, .o_head = (size_t)hd,
                                  .tok = (size_t)nh, .head = 1, .i0 = i0, .h0 = h0};
    const void *kp[ATT_KT / 8], *vp[ATT_KT];
    size_t eb = bf16 ? 2 : 4;
    int lo = att_start(a, a->pos0 + i0), hi = a->pos0 + i1 - 1, tb = lo - lo % ATT_KT;
    /* Decode works out each tile's rows ATT_PF_TILES tiles ahead, prefetching
     * them then, and keeps them in a ring until their turn; a prompt works
     * out each tile's when it comes. */
    const bool pf = i1 - i0 <= ATT_PF_ROWS;
    enum { RING = ATT_PF_TILES + 1 };
    size_t rows[RING][ATT_KT], kruns[RING][ATT_KT / 8];
    for (int k = 0; pf && k < ATT_PF_TILES; k++)
        att_rows(j, kvh, tb + k * ATT_KT, lo, hi, hd, eb, true, rows[k], kruns[k]);
    for (int t0 = tb; t0 <= hi; t0 += ATT_KT) {
        int t1 = t0 + ATT_KT <= hi + 1 ? t0 + ATT_KT : hi + 1;
        int first = t0 > lo ? t0 : lo, tile = (t0 - tb) / ATT_KT;
        if (t0 % ATT_KC == 0 && t0 > tb) /* a new chunk: fold the last one */
            for (int i = i0; i < i1; i++)
                for (int h = h0; h < h1; h++) {
                    int r = (i - i0) * nh + (h - h0);
                    if (m[r] == -INFINITY)
                        continue; /* no keys there */
                    float *o = j->out + ((size_t)i * a->n_heads + h) * hd;
                    att_fold(to + (size_t)r * hd, &tm[r], &tl[r], tl[r] == 0.0f, o, m[r], l[r], hd);
                    memset(o, 0, (size_t)hd * sizeof(float));
                    m[r] = -INFINITY;
                    l[r] = 0.0f;
                }
        int slot = pf ? tile % RING : 0;
        if (pf)
            att_rows(j, kvh, t0 + ATT_PF_TILES * ATT_KT, lo, hi, hd, eb, true,
                     rows[(tile + ATT_PF_TILES) % RING], kruns[(tile + ATT_PF_TILES) % RING]);
        else
            att_rows(j, kvh, t0, lo, hi, hd, eb, false, rows[0], kruns[0]);
        att_tile_ptrs(j, rows[slot], kruns[slot], 0, t0, first, t1, eb, kp, vp);
        int ia, ib;
        att_token_run(a, i0, i1, t0, t1, &ia, &ib);
        if (ia == ib)
            continue;
        int g0, ng;
        att_groups(t0, first, t1, &g0, &ng);
        struct att_qrows qr = {.q = j->q, .sc = sc, .i0 = ia, .h0 = h0, .nh = nh,
                               .n_heads = a->n_heads};
        att_scores(&qr, (ib - ia) * nh, kp, g0, ng, hd, a->scale, kv_panel(j->pool), bf16);
        att_tile_rows(a, &sink, &qr, ia, ib, vp, t0, t1, hd, bf16);
    }
    for (int i = i0; i < i1; i++)
        for (int h = h0; h < h1; h++) {
            int r = (i - i0) * nh + (h - h0);
            float *o = j->out + ((size_t)i * a->n_heads + h) * hd, sum = l[r];
            if (tl[r] != 0.0f) { /* earlier chunks: fold the last in, the total is the row's */
                if (m[r] != -INFINITY)
                    att_fold(to + (size_t)r * hd, &tm[r], &tl[r], false, o, m[r], l[r], hd);
                memcpy(o, to + (size_t)r * hd, (size_t)hd * sizeof(float));
                sum = tl[r];
            }
            float inv = 1.0f / sum;
            for (int d = 0; d < hd; d++)
                o[d] *= inv;
        }
}

/* A decode step's job jb: chunk c0 + jb / kv_parts of the keys, for the
 * KV heads of part jb % kv_parts, every query head over them and every
 * token (at most ATT_PF_ROWS), each (token, head) into its partial (left
 * at max -inf where the row has no keys in the chunk). */
ATT_INLINE void att_chunk_body(const struct att_job *j, int jb, float *scratch, bool bf16)
{
    const struct attn_args *a = j->a;
    int hd = a->head_dim, c = j->c0 + jb / j->kv_parts, part = jb % j->kv_parts;
    int kv0 = part * a->n_kv_heads / j->kv_parts, kv1 = (part + 1) * a->n_kv_heads / j->kv_parts;
    int lo = att_start(a, a->pos0), hi = a->pos0 + a->n - 1;
    int cs = c * ATT_KC > lo - lo % ATT_KT ? c * ATT_KC : lo - lo % ATT_KT;
    int ce = (c + 1) * ATT_KC - 1 < hi ? (c + 1) * ATT_KC - 1 : hi;
    float *sc = scratch;
    size_t eb = bf16 ? 2 : 4, stride = (size_t)(jb / j->kv_parts) * a->n * a->n_heads;
    for (int i = 0; i < a->n; i++)
        for (int h = kv0 * j->group; h < kv1 * j->group; h++) {
            float *pp = j->part + (stride + (size_t)i * a->n_heads + h) * (hd + 2);
            memset(pp, 0, (size_t)hd * sizeof(float));
            pp[hd] = -INFINITY;
            pp[hd + 1] = 0.0f;
        }
    const void *kp[ATT_KT / 8], *vp[ATT_KT];
    size_t rows[2][ATT_KT], kruns[2][ATT_KT / 8];
    const size_t hstride = (size_t)j->pool->block_size * hd; /* one KV head's rows to the next's */
    /* row (i, h)'s partial: output, then max and sum */
    float *p0 = j->part + stride * (hd + 2);
    const size_t pstep = (size_t)a->n_heads * (hd + 2);
    const struct att_sink sink = {.o = p0, .m = p0 + hd, .l = p0 + hd + 1, .o_tok = pstep,
                                  .o_head = (size_t)hd + 2, .tok = pstep, .head = (size_t)hd + 2};
    const int ntiles = (ce - cs) / ATT_KT + 1, pw = kv_panel(j->pool);
    att_rows(j, 0, cs, lo, ce, hd, eb, false, rows[0], kruns[0]);
    for (int tile = 0; tile < ntiles; tile++) {
        int t0 = cs + tile * ATT_KT, t1 = t0 + ATT_KT <= ce + 1 ? t0 + ATT_KT : ce + 1;
        int first = t0 > lo ? t0 : lo, g0, ng;
        size_t *row = rows[tile % 2], *kr = kruns[tile % 2];
        if (tile + 1 < ntiles)
            att_rows(j, 0, t1, lo, ce, hd, eb, false, rows[(tile + 1) % 2],
                     kruns[(tile + 1) % 2]);
        att_groups(t0, first, t1, &g0, &ng);
        for (int kvh = kv0; kvh < kv1; kvh++) {
            att_tile_ptrs(j, row, kr, (size_t)kvh * hstride, t0, first, t1, eb, kp, vp);
            /* the rows of this KV head of the tokens with keys in the tile
             * (a sliding window may start past it for the earlier ones) */
            int ia, ib;
            att_token_run(a, 0, a->n, t0, t1, &ia, &ib);
            struct att_qrows qr = {.q = j->q, .sc = sc, .i0 = ia, .h0 = kvh * j->group,
                                   .nh = j->group, .n_heads = a->n_heads};
            att_scores(&qr, (ib - ia) * j->group, kp, g0, ng, hd, a->scale, pw, bf16);
            att_tile_rows(a, &sink, &qr, ia, ib, vp, t0, t1, hd, bf16);
        }
    }
}

static void att_run_job_f32(const struct att_job *j, int jb, float *scratch)
{
    att_job_body(j, jb, scratch, false);
}

static void att_run_job_bf16(const struct att_job *j, int jb, float *scratch)
{
    att_job_body(j, jb, scratch, true);
}

static void att_run_chunk_f32(const struct att_job *j, int jb, float *scratch)
{
    att_chunk_body(j, jb, scratch, false);
}

static void att_run_chunk_bf16(const struct att_job *j, int jb, float *scratch)
{
    att_chunk_body(j, jb, scratch, true);
}

/* A decode step's rows from their chunks' partials, folded in order and
 * normalised. */
static void att_fold_chunks(const struct att_job *j)
{
    const struct attn_args *a = j->a;
    int hd = a->head_dim;
    for (int i = 0; i < a->n; i++)
        for (int h = 0; h < a->n_heads; h++) {
            float *o = j->out + ((size_t)i * a->n_heads + h) * hd, tm = 0.0f, tl = 0.0f;
            bool first = true;
            for (int c = 0; c < j->n_chunks; c++) {
                const float *pp = j->part + (((size_t)c * a->n + i) * a->n_heads + h) * (hd + 2);
                if (pp[hd] == -INFINITY)
                    continue; /* no keys there */
                att_fold(o, &tm, &tl, first, pp, pp[hd], pp[hd + 1], hd);
                first = false;
            }
            float inv = 1.0f / tl;
            for (int d = 0; d < hd; d++)
                o[d] *= inv;
        }
}

const struct att_kernels ATT_KERNELS = {
    .job = {att_run_job_f32, att_run_job_bf16},
    .chunk = {att_run_chunk_f32, att_run_chunk_bf16},
    .fold_chunks = att_fold_chunks,
};
