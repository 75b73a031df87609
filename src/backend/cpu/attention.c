/* attention.c - the CPU's paged attention over the KV cache (f32 or bf16) as an
 * online softmax over tiles of keys: a job takes a KV head (or some of the
 * query heads sharing it) and a tile of query tokens, and reads each tile
 * of keys and values once for all of its rows, so a long prompt's K/V come
 * from cache rather than memory once per (token, head). The loops over
 * head_dim are built for AVX-512, AVX2 and the baseline and one is picked
 * at load (target_clones). */
#include "backend/cpu/attention.h"

#include <math.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"
#include "base/threadpool.h"
#include "model/tensor.h"

/* Query tokens per job: with 2-8 query heads per KV head, 32-128 rows share
 * each key tile. */
#define ATT_QT 16
/* Keys per tile. Tiles start at multiples of ATT_KT positions, so a row's
 * online softmax steps through the same tiles whatever call or job it is
 * in: prefilling a prompt in one call or in chunks gives the same bits. */
#define ATT_KT 32

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ATT_CLONES
#endif
#define ATT_INLINE static inline __attribute__((always_inline))

/* 16 floats: one AVX-512 register, two AVX2 ones, four SSE ones. Loaded
 * and stored with memcpy (rows are only 4-byte aligned); never passed by
 * value, so no clone's calling convention depends on it. */
typedef float att_v16 __attribute__((vector_size(64)));

/* 16 cache elements at row + d as floats: f32 as they are, bf16 widened
 * (exactly: a bf16 is the top half of an f32). bf16 is a constant at every
 * call, so each job function keeps only its own branch. */
ATT_INLINE void att_load(att_v16 *dst, const void *row, int d, bool bf16)
{
    if (bf16) {
        typedef uint16_t u16x16 __attribute__((vector_size(32)));
        typedef uint32_t u32x16 __attribute__((vector_size(64)));
        u16x16 h;
        memcpy(&h, (const uint16_t *)row + d, 32);
        u32x16 w = __builtin_convertvector(h, u32x16) << 16;
        memcpy(dst, &w, 64);
    } else {
        memcpy(dst, (const float *)row + d, 64);
    }
}

ATT_INLINE float att_elt(const void *row, int d, bool bf16)
{
    return bf16 ? bf16_to_f32(((const uint16_t *)row)[d]) : ((const float *)row)[d];
}

/* The sum of v's 16 lanes, halving: 8 + 8, 4 + 4, then the last four. */
ATT_INLINE float att_hsum(const att_v16 *v)
{
    typedef float v8 __attribute__((vector_size(32)));
    typedef float v4 __attribute__((vector_size(16)));
    v8 a, b;
    memcpy(&a, v, 32);
    memcpy(&b, (const char *)v + 32, 32);
    a += b;
    v4 c, d;
    memcpy(&c, &a, 16);
    memcpy(&d, (const char *)&a + 16, 16);
    c += d;
    return (c[0] + c[2]) + (c[1] + c[3]);
}

/* sc[k] = q . key[k] * scale for k in [k0, k1), four keys at a time so each
 * chunk of q is loaded once for four independent sums. Each score is the
 * same sum of products in the same order however many keys it is computed
 * with (lane d%16 of chunk d/16, then the halving). */
ATT_INLINE void att_scores(float *sc, const float *q, const void *const *key, int k0, int k1,
                           int hd, float scale, bool bf16)
{
    int k = k0;
    for (; k + 4 <= k1; k += 4) {
        att_v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, x, y;
        for (int d = 0; d + 16 <= hd; d += 16) {
            memcpy(&x, q + d, 64);
            att_load(&y, key[k], d, bf16);
            a0 += x * y;
            att_load(&y, key[k + 1], d, bf16);
            a1 += x * y;
            att_load(&y, key[k + 2], d, bf16);
            a2 += x * y;
            att_load(&y, key[k + 3], d, bf16);
            a3 += x * y;
        }
        float s[4] = {att_hsum(&a0), att_hsum(&a1), att_hsum(&a2), att_hsum(&a3)};
        for (int u = 0; u < 4; u++) {
            for (int d = hd / 16 * 16; d < hd; d++)
                s[u] += q[d] * att_elt(key[k + u], d, bf16);
            sc[k + u] = s[u] * scale;
        }
    }
    for (; k < k1; k++) {
        att_v16 a0 = {0}, x, y;
        for (int d = 0; d + 16 <= hd; d += 16) {
            memcpy(&x, q + d, 64);
            att_load(&y, key[k], d, bf16);
            a0 += x * y;
        }
        float s = att_hsum(&a0);
        for (int d = hd / 16 * 16; d < hd; d++)
            s += q[d] * att_elt(key[k], d, bf16);
        sc[k] = s * scale;
    }
}

/* att_scores for two query rows over the same keys: each key load feeds
 * both rows' sums. Per row the same operations in the same order as
 * att_scores, so the same bits. */
ATT_INLINE void att_scores2(float *sc1, float *sc2, const float *q1, const float *q2,
                            const void *const *key, int k0, int k1, int hd, float scale,
                            bool bf16)
{
    int k = k0, tail = hd / 16 * 16;
    for (; k + 4 <= k1; k += 4) {
        att_v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
        att_v16 x1, x2, y;
        for (int d = 0; d + 16 <= hd; d += 16) {
            memcpy(&x1, q1 + d, 64);
            memcpy(&x2, q2 + d, 64);
            att_load(&y, key[k], d, bf16);
            a0 += x1 * y;
            b0 += x2 * y;
            att_load(&y, key[k + 1], d, bf16);
            a1 += x1 * y;
            b1 += x2 * y;
            att_load(&y, key[k + 2], d, bf16);
            a2 += x1 * y;
            b2 += x2 * y;
            att_load(&y, key[k + 3], d, bf16);
            a3 += x1 * y;
            b3 += x2 * y;
        }
        float s1[4] = {att_hsum(&a0), att_hsum(&a1), att_hsum(&a2), att_hsum(&a3)};
        float s2[4] = {att_hsum(&b0), att_hsum(&b1), att_hsum(&b2), att_hsum(&b3)};
        for (int u = 0; u < 4; u++) {
            for (int d = tail; d < hd; d++) {
                s1[u] += q1[d] * att_elt(key[k + u], d, bf16);
                s2[u] += q2[d] * att_elt(key[k + u], d, bf16);
            }
            sc1[k + u] = s1[u] * scale;
            sc2[k + u] = s2[u] * scale;
        }
    }
    if (k < k1) {
        att_scores(sc1, q1, key, k, k1, hd, scale, bf16);
        att_scores(sc2, q2, key, k, k1, hd, scale, bf16);
    }
}

/* o[0..W*16) = o * corr + sum over k of p[k] * v[k], the W vectors' sums
 * in registers across the keys: W independent chains, so the adds are not
 * bound by their latency. corr == 1 leaves o as it is (the same bits as
 * multiplying). Each column sums its keys in order, whatever W. */
#define ATT_PV_CHUNK(W)                                                                \
    do {                                                                               \
        att_v16 acc[W], y;                                                             \
        _Pragma("GCC unroll 8") for (int u = 0; u < (W); u++)                           \
        {                                                                              \
            memcpy(&acc[u], o + d + 16 * u, 64);                                       \
            if (corr != 1.0f)                                                          \
                acc[u] *= corr;                                                        \
        }                                                                              \
        for (int k = 0; k < nk; k++) {                                                 \
            _Pragma("GCC unroll 8") for (int u = 0; u < (W); u++)                       \
            {                                                                          \
                att_load(&y, v[k], d + 16 * u, bf16);                                  \
                acc[u] += p[k] * y;                                                    \
            }                                                                          \
        }                                                                              \
        _Pragma("GCC unroll 8") for (int u = 0; u < (W); u++)                           \
            memcpy(o + d + 16 * u, &acc[u], 64);                                       \
        d += 16 * (W);                                                                 \
    } while (0)

ATT_INLINE void att_pv(float *o, float corr, const float *p, const void *const *v, int nk,
                       int hd, bool bf16)
{
    int d = 0;
    while (d + 128 <= hd)
        ATT_PV_CHUNK(8);
    while (d + 32 <= hd)
        ATT_PV_CHUNK(2);
    if (d + 16 <= hd)
        ATT_PV_CHUNK(1);
    for (; d < hd; d++) {
        float a = corr != 1.0f ? o[d] * corr : o[d];
        for (int k = 0; k < nk; k++)
            a += p[k] * att_elt(v[k], d, bf16);
        o[d] = a;
    }
}

/* att_pv for two rows over the same keys (two query heads of one token):
 * each V load feeds both rows' sums. Per row the same operations in the
 * same order as att_pv, so the same bits. */
#define ATT_PV2_CHUNK(W)                                                               \
    do {                                                                               \
        att_v16 x1[W], x2[W], y;                                                       \
        _Pragma("GCC unroll 8") for (int u = 0; u < (W); u++)                           \
        {                                                                              \
            memcpy(&x1[u], o1 + d + 16 * u, 64);                                       \
            memcpy(&x2[u], o2 + d + 16 * u, 64);                                       \
            if (c1 != 1.0f)                                                            \
                x1[u] *= c1;                                                           \
            if (c2 != 1.0f)                                                            \
                x2[u] *= c2;                                                           \
        }                                                                              \
        for (int k = 0; k < nk; k++) {                                                 \
            _Pragma("GCC unroll 8") for (int u = 0; u < (W); u++)                       \
            {                                                                          \
                att_load(&y, v[k], d + 16 * u, bf16);                                  \
                x1[u] += p1[k] * y;                                                    \
                x2[u] += p2[k] * y;                                                    \
            }                                                                          \
        }                                                                              \
        _Pragma("GCC unroll 8") for (int u = 0; u < (W); u++)                           \
        {                                                                              \
            memcpy(o1 + d + 16 * u, &x1[u], 64);                                       \
            memcpy(o2 + d + 16 * u, &x2[u], 64);                                       \
        }                                                                              \
        d += 16 * (W);                                                                 \
    } while (0)

ATT_INLINE void att_pv2(float *o1, float c1, const float *p1, float *o2, float c2,
                        const float *p2, const void *const *v, int nk, int hd, bool bf16)
{
    int d = 0;
    while (d + 128 <= hd)
        ATT_PV2_CHUNK(8);
    while (d + 32 <= hd)
        ATT_PV2_CHUNK(2);
    if (d + 16 <= hd)
        ATT_PV2_CHUNK(1);
    for (; d < hd; d++) {
        float a1 = c1 != 1.0f ? o1[d] * c1 : o1[d], a2 = c2 != 1.0f ? o2[d] * c2 : o2[d];
        for (int k = 0; k < nk; k++) {
            a1 += p1[k] * att_elt(v[k], d, bf16);
            a2 += p2[k] * att_elt(v[k], d, bf16);
        }
        o1[d] = a1;
        o2[d] = a2;
    }
}

/* One tile of a row's online softmax: sc[k0..k1) holds its scores and gets
 * e^(score - max); *m and *l, the row's running max and sum, move on.
 * Returns what the row's output so far must be scaled by. */
ATT_INLINE float att_softmax_step(float *sc, int k0, int k1, float *m, float *l)
{
    float mt = -INFINITY, sum = 0.0f;
    for (int k = k0; k < k1; k++)
        mt = sc[k] > mt ? sc[k] : mt;
    float mn = mt > *m ? mt : *m;
    /* the row's first keys: *m is -inf, exp gives 0 */
    float corr = mn == *m ? 1.0f : expf(*m - mn);
    for (int k = k0; k < k1; k++) {
        sc[k] = expf(sc[k] - mn);
        sum += sc[k];
    }
    *l = *l * corr + sum;
    *m = mn;
    return corr;
}

struct att_job {
    float *out;
    const float *q;
    const struct kv_pool *pool;
    const struct kv_seq *seq;
    int layer;
    const struct attn_args *a;
    int group;      /* query heads per KV head */
    int head_parts; /* jobs a KV head's query heads are split into */
    int n_qt;       /* query token tiles */
    int n_jobs;
    float *scratch;
    size_t per_slot;
    atomic_int next;
};

static int att_start(const struct attn_args *a, int pos)
{
    return a->sliding_window > 0 && pos - a->sliding_window + 1 > 0 ? pos - a->sliding_window + 1
                                                                     : 0;
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
    int i0 = qt * ATT_QT, i1 = i0 + ATT_QT < a->n ? i0 + ATT_QT : a->n;
    int nh = h1 - h0;
    float *sc = scratch, *m = scratch + 2 * ATT_KT, *l = m + ATT_QT * j->group;
    for (int r = 0; r < (i1 - i0) * nh; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    for (int i = i0; i < i1; i++)
        memset(j->out + ((size_t)i * a->n_heads + h0) * hd, 0, (size_t)nh * hd * sizeof(float));

    const void *kp[ATT_KT], *vp[ATT_KT];
    size_t eb = bf16 ? 2 : 4;
    int lo = att_start(a, a->pos0 + i0), hi = a->pos0 + i1 - 1;
    for (int t0 = lo - lo % ATT_KT; t0 <= hi; t0 += ATT_KT) {
        int t1 = t0 + ATT_KT <= hi + 1 ? t0 + ATT_KT : hi + 1;
        int first = t0 > lo ? t0 : lo;
        for (int t = first; t < t1; t++) {
            size_t off = kv_offset(j->pool, j->seq, j->layer, t) + (size_t)kvh * hd;
            kp[t - t0] = (const char *)j->pool->k + off * eb;
            vp[t - t0] = (const char *)j->pool->v + off * eb;
        }
        for (int i = i0; i < i1; i++) {
            int pos = a->pos0 + i, s0 = att_start(a, pos);
            int k0 = (s0 > first ? s0 : first) - t0, k1 = (pos + 1 < t1 ? pos + 1 : t1) - t0;
            if (k0 >= k1)
                continue;
            /* query heads in pairs: each K and V row loaded serves both */
            for (int h = h0; h < h1; h += 2) {
                int pair = h + 1 < h1;
                float corr[2];
                const float *qh = j->q + ((size_t)i * a->n_heads + h) * hd;
                if (pair)
                    att_scores2(sc, sc + ATT_KT, qh, qh + hd, kp, k0, k1, hd, a->scale, bf16);
                else
                    att_scores(sc, qh, kp, k0, k1, hd, a->scale, bf16);
                for (int u = 0; u <= pair; u++) {
                    int r = (i - i0) * nh + (h + u - h0);
                    corr[u] = att_softmax_step(sc + u * ATT_KT, k0, k1, &m[r], &l[r]);
                }
                float *o = j->out + ((size_t)i * a->n_heads + h) * hd;
                if (pair)
                    att_pv2(o, corr[0], sc + k0, o + hd, corr[1], sc + ATT_KT + k0, vp + k0,
                            k1 - k0, hd, bf16);
                else
                    att_pv(o, corr[0], sc + k0, vp + k0, k1 - k0, hd, bf16);
            }
        }
    }
    for (int i = i0; i < i1; i++)
        for (int h = h0; h < h1; h++) {
            float inv = 1.0f / l[(i - i0) * nh + (h - h0)];
            float *o = j->out + ((size_t)i * a->n_heads + h) * hd;
            for (int d = 0; d < hd; d++)
                o[d] *= inv;
        }
}

ATT_CLONES static void att_run_job_f32(const struct att_job *j, int jb, float *scratch)
{
    att_job_body(j, jb, scratch, false);
}

ATT_CLONES static void att_run_job_bf16(const struct att_job *j, int jb, float *scratch)
{
    att_job_body(j, jb, scratch, true);
}

static void att_worker(void *ctx, int ith, int nth)
{
    (void)nth;
    struct att_job *j = ctx;
    float *scratch = j->scratch + (size_t)ith * j->per_slot;
    for (;;) {
        int jb = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (jb >= j->n_jobs)
            return;
        if (j->pool->dtype == DT_BF16)
            att_run_job_bf16(j, jb, scratch);
        else
            att_run_job_f32(j, jb, scratch);
    }
}

int cpu_paged_attention(struct threadpool *tp, struct cpu_att_scratch *s, float *out,
                      const float *q, const struct kv_pool *pool, const struct kv_seq *seq,
                      int layer, const struct attn_args *a, struct err *e)
{
    if (a->n <= 0)
        return 0;
    if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads != 0 || a->head_dim <= 0)
        return err_set(e, "attention: %d query heads do not group over %d KV heads",
                       a->n_heads, a->n_kv_heads);
    if (pool->dtype != DT_F32 && pool->dtype != DT_BF16)
        return err_set(e, "attention: the CPU reads K/V in f32 or bf16, not %s",
                       dtype_name((enum dtype)pool->dtype));
    int nth = tp_size(tp);
    struct att_job j = {.out = out, .q = q, .pool = pool, .seq = seq, .layer = layer, .a = a};
    j.group = a->n_heads / a->n_kv_heads;
    j.n_qt = (a->n + ATT_QT - 1) / ATT_QT;
    /* Too few jobs to keep every thread busy (one token, few KV heads):
     * split the query heads of a KV head, each part reading its keys. */
    j.head_parts = 1;
    while (j.head_parts < j.group && a->n_kv_heads * j.n_qt * j.head_parts < 2 * nth)
        j.head_parts *= 2;
    if (j.head_parts > j.group)
        j.head_parts = j.group;
    j.n_jobs = j.n_qt * a->n_kv_heads * j.head_parts;
    j.per_slot = 2 * ATT_KT + 2 * (size_t)ATT_QT * j.group;
    if (s->slots < nth || s->floats_per_slot < j.per_slot) {
        size_t per = s->floats_per_slot > j.per_slot ? s->floats_per_slot : j.per_slot;
        float *b = malloc(per * (size_t)nth * sizeof(float));
        if (!b)
            return err_set(e, "attention: out of memory for %d threads' scratch", nth);
        free(s->buf);
        s->buf = b;
        s->floats_per_slot = per;
        s->slots = nth;
    }
    j.per_slot = s->floats_per_slot;
    j.scratch = s->buf;
    atomic_init(&j.next, 0);
    if (nth > 1 && j.n_jobs > 1)
        tp_run(tp, att_worker, &j);
    else
        att_worker(&j, 0, 1);
    return 0;
}

void cpu_att_scratch_free(struct cpu_att_scratch *s)
{
    free(s->buf);
    s->buf = NULL;
    s->floats_per_slot = 0;
    s->slots = 0;
}
