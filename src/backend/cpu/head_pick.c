/* head_pick.c - a greedy step's LM head on the CPU from an int8 copy that
 * rules rows out (see head_pick.h). */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/cpu/head_pick.h"
#include "backend/head_bound.h"
#include "base/half.h"
#include "model/quant.h"

#define HP_CHUNK 256     /* rows a worker takes at a time */
#define HP_FLUSH 512     /* columns summed in int32 before a flush to int64 */
#define HP_MAX_COLS (1 << 16) /* sum |q| stays exact in a float */

/* ---- the copy ---- */

/* v rounded to the nearest integer, ties to even, for |v| <= 2^22 (adding
 * 1.5 x 2^23 leaves no fraction bits); rintf is a libm call in a baseline
 * x86-64 build. */
static inline float round_even(float v)
{
    volatile float big = 12582912.0f; /* kept from being folded away */
    return (v + big) - big;
}


/* q = round(w / s), s = max|w| / 127, *qa = sum |q|; false when a weight
 * is not finite. w x (1 / s) is within a few ulps of w / s, so |w - s q|
 * stays under s (1/2 + 2^-16). */
static bool quantize_row(const float *w, int64_t cols, int8_t *q, float *s_out, float *qa_out)
{
    float m = 0.0f, fin = 0.0f;
    for (int64_t i = 0; i < cols; i++) {
        const float a = fabsf(w[i]);
        m = a > m ? a : m;
        fin += w[i] * 0.0f; /* NaN once any weight is infinite or NaN */
    }
    const float s = m / 127.0f, inv = s > 0.0f ? 1.0f / s : 0.0f;
    int32_t qa = 0;
    for (int64_t i = 0; i < cols; i++) {
        float v = round_even(w[i] * inv);
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
        q[i] = (int8_t)v;
        qa += q[i] < 0 ? -q[i] : q[i];
    }
    *s_out = s;
    *qa_out = (float)qa; /* exact: at most 127 x 2^16 < 2^24 */
    return fin == 0.0f;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static bool quantize_row_avx2(const float *w, int64_t cols,
                                                              int8_t *q, float *s_out,
                                                              float *qa_out)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 vm = _mm256_setzero_ps(), un = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= cols; i += 8) {
        const __m256 v = _mm256_loadu_ps(w + i);
        vm = _mm256_max_ps(vm, _mm256_and_ps(v, absmask));
        un = _mm256_or_ps(un, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float lanes[8], m = 0.0f;
    _mm256_storeu_ps(lanes, vm);
    for (int k = 0; k < 8; k++)
        m = lanes[k] > m ? lanes[k] : m;
    bool ok = _mm256_movemask_ps(un) == 0;
    for (int64_t k = i; k < cols; k++) {
        const float a = fabsf(w[k]);
        ok = ok && a == a;
        m = a > m ? a : m;
    }
    if (!ok || m == INFINITY)
        return false;
    const float s = m / 127.0f, inv = s > 0.0f ? 1.0f / s : 0.0f;
    const __m256 vinv = _mm256_set1_ps(inv);
    const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
    __m256i qa = _mm256_setzero_si256();
    for (i = 0; i + 8 <= cols; i += 8) {
        /* the default rounding mode: to nearest, ties to even */
        __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(w + i), vinv));
        r = _mm256_max_epi32(_mm256_min_epi32(r, hi), lo);
        qa = _mm256_add_epi32(qa, _mm256_abs_epi32(r));
        const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(r, r), _mm256_setzero_si256());
        const int32_t q0 = _mm_cvtsi128_si32(_mm256_castsi256_si128(b));
        const int32_t q1 = _mm_cvtsi128_si32(_mm256_extracti128_si256(b, 1));
        memcpy(q + i, &q0, 4);
        memcpy(q + i + 4, &q1, 4);
    }
    int32_t sum[8], total = 0;
    _mm256_storeu_si256((__m256i *)sum, qa);
    for (int k = 0; k < 8; k++)
        total += sum[k];
    for (; i < cols; i++) {
        float v = round_even(w[i] * inv);
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
        q[i] = (int8_t)v;
        total += q[i] < 0 ? -q[i] : q[i];
    }
    *s_out = s;
    *qa_out = (float)total;
    return true;
}
#endif

/* The next HP_CHUNK rows [*r0, *r1) of rows for a pool worker; false when
 * none are left. */
static bool take_rows(atomic_llong *next, int64_t rows, int64_t *r0, int64_t *r1)
{
    *r0 = atomic_fetch_add_explicit(next, HP_CHUNK, memory_order_relaxed);
    *r1 = *r0 + HP_CHUNK < rows ? *r0 + HP_CHUNK : rows;
    return *r0 < rows;
}

struct build_task {
    struct head_screen *hs;
    const struct tensor *head;
    size_t stride;
    bool avx2;
    atomic_llong next;
    atomic_int bad; /* a weight that is not finite */
};

static void build_worker(void *ctx, int ith, int nth)
{
    (void)ith;
    (void)nth;
    struct build_task *t = ctx;
    struct head_screen *hs = t->hs;
    const int64_t cols = hs->cols;
    float *w = malloc((size_t)cols * sizeof *w);
    if (!w) {
        atomic_store(&t->bad, 1);
        return;
    }
    for (int64_t r0, r1; take_rows(&t->next, hs->rows, &r0, &r1);) {
        for (int64_t r = r0; r < r1; r++) {
            quant_dequantize_row(t->head->dtype,
                                 (const uint8_t *)t->head->data + (size_t)r * t->stride, w, cols);
            int8_t *q = hs->q + (size_t)r * (size_t)cols;
#if defined(__x86_64__)
            const bool ok = t->avx2 ? quantize_row_avx2(w, cols, q, &hs->scale[r], &hs->qabs[r])
                                    : quantize_row(w, cols, q, &hs->scale[r], &hs->qabs[r]);
#else
            const bool ok = quantize_row(w, cols, q, &hs->scale[r], &hs->qabs[r]);
#endif
            if (!ok)
                atomic_store(&t->bad, 1);
        }
    }
    free(w);
}

void head_screen_free(struct head_screen *hs)
{
    free(hs->q);
    free(hs->scale);
    free(hs->qabs);
    free(hs->approx);
    free(hs->bound);
    free(hs->xq);
    free(hs->lo);
    memset(hs, 0, sizeof *hs);
}

/* hs = the copy of head, or hs->q NULL where it cannot be made (no
 * memory for it, a weight that is not finite). */
static void build(struct head_screen *hs, struct cpu_matmul *mm, const struct tensor *head)
{
    head_screen_free(hs);
    const size_t rows = (size_t)head->rows, cols = (size_t)head->cols;
    hs->q = malloc(rows * cols);
    hs->scale = malloc(rows * sizeof *hs->scale);
    hs->qabs = malloc(rows * sizeof *hs->qabs);
    hs->approx = malloc(rows * sizeof *hs->approx);
    hs->bound = malloc(rows * sizeof *hs->bound);
    hs->xq = malloc((cols + 16) * sizeof *hs->xq);
    const int nth = mm->tp ? tp_size(mm->tp) : 1;
    hs->lo = malloc((size_t)(nth > 0 ? nth : 1) * HEAD_PICK_MAX_K * sizeof *hs->lo);
    if (!hs->q || !hs->scale || !hs->qabs || !hs->approx || !hs->bound || !hs->xq ||
        !hs->lo) { /* no room for the copy: the full head, as without it */
        head_screen_free(hs);
        hs->data = head->data;
        hs->rows = head->rows;
        hs->cols = head->cols;
        return;
    }
    hs->rows = head->rows;
    hs->cols = head->cols;
    struct build_task t = {.hs = hs, .head = head,
                           .stride = dtype_row_bytes(head->dtype, head->cols),
                           .avx2 = mm->isa >= CPU_ISA_AVX2};
    atomic_init(&t.next, 0);
    atomic_init(&t.bad, 0);
    if (mm->tp && tp_size(mm->tp) > 1)
        tp_run(mm->tp, build_worker, &t);
    else
        build_worker(&t, 0, 1);
    hs->data = head->data;
    if (atomic_load(&t.bad)) { /* keep the copy's absence: every call returns 1 */
        free(hs->q);
        hs->q = NULL;
    }
}

/* ---- screening ---- */

/* sum_i q[i] xq[i], exactly. */
static int64_t dot_scalar(const int8_t *q, const int16_t *xq, int64_t n)
{
    int64_t s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (int32_t)q[i] * xq[i];
    return s;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static int64_t dot_avx2(const int8_t *q, const int16_t *xq,
                                                        int64_t n)
{
    int64_t total = 0, i = 0;
    while (i + 16 <= n) {
        /* int32 lanes: each madd adds at most 2 x 127 x 16383, HP_FLUSH / 16
         * times before the flush, and the 8 lanes' sum stays below 2^31 */
        __m256i acc = _mm256_setzero_si256(), acc2 = _mm256_setzero_si256();
        const int64_t end = i + HP_FLUSH < n ? i + HP_FLUSH : n;
        for (; i + 32 <= end; i += 32) {
            __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + i)));
            __m256i w2 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + i + 16)));
            __m256i x = _mm256_loadu_si256((const __m256i *)(xq + i));
            __m256i x2 = _mm256_loadu_si256((const __m256i *)(xq + i + 16));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(w, x));
            acc2 = _mm256_add_epi32(acc2, _mm256_madd_epi16(w2, x2));
        }
        for (; i + 16 <= end; i += 16) {
            __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + i)));
            __m256i x = _mm256_loadu_si256((const __m256i *)(xq + i));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(w, x));
        }
        acc = _mm256_add_epi32(acc, acc2);
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
        total += _mm_cvtsi128_si32(s);
    }
    return total + dot_scalar(q + i, xq + i, n - i);
}

/* AVX-512 with VNNI: one multiply-add instruction per 32 columns. The
 * int32 lanes: each adds at most 2 x 127 x 16383 per step, HP_FLUSH / 32
 * times before the flush, and the 16 lanes' sum stays below 2^31. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static int64_t
dot_vnni(const int8_t *q, const int16_t *xq, int64_t n)
{
    int64_t total = 0, i = 0;
    while (i + 32 <= n) {
        __m512i acc = _mm512_setzero_si512(), acc2 = _mm512_setzero_si512();
        const int64_t end = i + HP_FLUSH < n ? i + HP_FLUSH : n;
        for (; i + 64 <= end; i += 64) {
            __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q + i)));
            __m512i w2 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q + i + 32)));
            acc = _mm512_dpwssd_epi32(acc, w, _mm512_loadu_si512(xq + i));
            acc2 = _mm512_dpwssd_epi32(acc2, w2, _mm512_loadu_si512(xq + i + 32));
        }
        for (; i + 32 <= end; i += 32) {
            __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q + i)));
            acc = _mm512_dpwssd_epi32(acc, w, _mm512_loadu_si512(xq + i));
        }
        total += _mm512_reduce_add_epi32(_mm512_add_epi32(acc, acc2));
    }
    return total + dot_scalar(q + i, xq + i, n - i);
}
#endif

struct screen_task {
    struct head_screen *hs;
    bool avx2, vnni;
    double sx, t1, tq; /* a_r = s_r sx dot; e_r: head_bound.h */
    int k;
    double *lo; /* per worker, HEAD_PICK_MAX_K apart: its k largest a_r - e_r, ascending */
    atomic_llong next;
};

/* top[0..k) ascending, the k largest values offered (-inf until k came). */
static void keep_largest(double *top, int k, double v)
{
    if (!(v > top[0]))
        return;
    int i = 0;
    while (i + 1 < k && top[i + 1] < v) {
        top[i] = top[i + 1];
        i++;
    }
    top[i] = v;
}

static void screen_worker(void *ctx, int ith, int nth)
{
    (void)nth;
    struct screen_task *t = ctx;
    struct head_screen *hs = t->hs;
    double *top = t->lo + (size_t)ith * HEAD_PICK_MAX_K;
    for (int i = 0; i < t->k; i++)
        top[i] = -INFINITY;
    for (int64_t r0, r1; take_rows(&t->next, hs->rows, &r0, &r1);) {
        for (int64_t r = r0; r < r1; r++) {
            const int8_t *q = hs->q + (size_t)r * (size_t)hs->cols;
#if defined(__x86_64__)
            int64_t d = t->vnni   ? dot_vnni(q, hs->xq, hs->cols)
                        : t->avx2 ? dot_avx2(q, hs->xq, hs->cols)
                                  : dot_scalar(q, hs->xq, hs->cols);
#else
            int64_t d = dot_scalar(q, hs->xq, hs->cols);
#endif
            const double s = hs->scale[r];
            const double a = s * t->sx * (double)d;
            hs->approx[r] = (float)a;
            hs->bound[r] = head_bound_e(a, s, t->t1, t->tq, hs->qabs[r]);
            keep_largest(top, t->k, (double)hs->approx[r] - (double)hs->bound[r]);
        }
    }
}

int head_screen_pick(struct head_screen *hs, struct cpu_matmul *mm, float *logits, const float *x,
                     const struct tensor *head, int k, struct err *e)
{
    /* Q8_0 and GGUF's 2-6-bit formats no: their matmul rounds the input
     * to 8 bits, which the bound does not cover (and their own bytes are
     * no more than the copy's) */
    if (head->dtype != DT_F32 && head->dtype != DT_F16 && head->dtype != DT_BF16)
        return 1;
    if (k < 1 || k > HEAD_PICK_MAX_K)
        return 1;
    if (head->cols > HP_MAX_COLS || head->rows < 2)
        return 1;
    if (hs->data != head->data || hs->rows != head->rows || hs->cols != head->cols)
        build(hs, mm, head);
    if (!hs->q)
        return 1;
    const int64_t cols = head->cols;
    double x1 = 0.0;
    float mx = 0.0f;
    for (int64_t i = 0; i < cols; i++) {
        x1 += fabs((double)x[i]);
        mx = fmaxf(mx, fabsf(x[i]));
    }
    if (!isfinite(x1) || mx == 0.0f)
        return 1;
    /* The input as int16, x_i ~ dx xq_i (head_bound.h) */
    const float dx = mx / (float)HEAD_XQ_MAX;
    for (int64_t i = 0; i < cols; i++) {
        float v = round_even(x[i] / dx);
        v = v > HEAD_XQ_MAX ? HEAD_XQ_MAX : v < -HEAD_XQ_MAX ? -HEAD_XQ_MAX : v;
        hs->xq[i] = (int16_t)v;
    }
    /* e_r covers the f32 sums of the kept rows' logits (cpu_matmul's) */
    const int nth = mm->tp ? tp_size(mm->tp) : 1;
    struct screen_task t = {.hs = hs, .sx = dx, .t1 = head_bound_t1(x1, (int)cols, 1),
                            .tq = head_bound_tq(dx), .k = k, .lo = hs->lo};
#if defined(__x86_64__)
    t.avx2 = mm->isa >= CPU_ISA_AVX2;
    t.vnni = mm->vnni;
#endif
    atomic_init(&t.next, 0);
    if (nth > 1)
        tp_run(mm->tp, screen_worker, &t);
    else
        screen_worker(&t, 0, 1);
    /* L: the k-th largest a_r - e_r. At least k rows have exact logits of
     * L or more, so no row whose logit cannot reach L is among the k
     * largest. */
    double top[HEAD_PICK_MAX_K];
    for (int i = 0; i < k; i++)
        top[i] = -INFINITY;
    for (int w = 0; w < nth; w++)
        for (int i = 0; i < k; i++)
            keep_largest(top, k, hs->lo[(size_t)w * HEAD_PICK_MAX_K + i]);
    const double L = top[0];
    /* The candidates: rows whose logit may reach L, computed exactly as
     * they come. Past a cap the full product is cheaper than rescoring them
     * one by one (what was rescored by then is at most 1/64 of it). */
    const int64_t cap = head->rows / 64 > 64 ? head->rows / 64 : 64;
    const size_t stride = dtype_row_bytes(head->dtype, head->cols);
    int64_t n_cand = 0;
    for (int64_t r = 0; r < head->rows; r++) {
        if ((double)hs->approx[r] + (double)hs->bound[r] < L) {
            logits[r] = -INFINITY;
            continue;
        }
        if (++n_cand > cap)
            return cpu_matmul(mm, logits, x, 1, head, e);
        /* the row through cpu_matmul alone: the same kernel, the same bits */
        struct tensor one = *head;
        one.data = (const uint8_t *)head->data + (size_t)r * stride;
        one.rows = 1;
        if (cpu_matmul(mm, logits + r, x, 1, &one, e))
            return -1;
    }
    return 0;
}
