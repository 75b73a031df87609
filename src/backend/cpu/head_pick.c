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
#include "base/half.h"

#define HP_CHUNK 256     /* rows a worker takes at a time */
#define HP_XQ_MAX 16383  /* the input as int16: |x q| at most this */
#define HP_FLUSH 512     /* columns summed in int32 before a flush to int64 */
#define HP_MAX_COLS (1 << 20)

/* ---- the copy ---- */

static float widen(enum dtype dt, const uint8_t *row, int64_t i)
{
    switch (dt) {
    case DT_F32: {
        float f;
        memcpy(&f, row + 4 * i, 4);
        return f;
    }
    case DT_F16: {
        uint16_t h;
        memcpy(&h, row + 2 * i, 2);
        return f16_to_f32(h);
    }
    default: {
        uint16_t h;
        memcpy(&h, row + 2 * i, 2);
        return bf16_to_f32(h);
    }
    }
}

struct build_task {
    struct head_screen *hs;
    const struct tensor *head;
    size_t stride;
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
    for (;;) {
        int64_t r0 = atomic_fetch_add_explicit(&t->next, HP_CHUNK, memory_order_relaxed);
        if (r0 >= hs->rows)
            break;
        int64_t r1 = r0 + HP_CHUNK < hs->rows ? r0 + HP_CHUNK : hs->rows;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *row = (const uint8_t *)t->head->data + (size_t)r * t->stride;
            float m = 0.0f;
            for (int64_t i = 0; i < cols; i++)
                m = fmaxf(m, fabsf(widen(t->head->dtype, row, i)));
            for (int64_t i = 0; i < cols; i++) /* fmaxf drops NaNs */
                if (!isfinite(widen(t->head->dtype, row, i)))
                    atomic_store(&t->bad, 1);
            const float s = m / 127.0f;
            int8_t *q = hs->q + (size_t)r * (size_t)cols;
            float qa = 0.0f;
            for (int64_t i = 0; i < cols; i++) {
                long v = s > 0.0f ? lrintf(widen(t->head->dtype, row, i) / s) : 0;
                v = v > 127 ? 127 : v < -127 ? -127 : v;
                q[i] = (int8_t)v;
                qa += (float)labs(v); /* exact: at most 127 x 2^20 < 2^24 */
            }
            hs->scale[r] = s;
            hs->qabs[r] = qa;
        }
    }
}

void head_screen_free(struct head_screen *hs)
{
    free(hs->q);
    free(hs->scale);
    free(hs->qabs);
    free(hs->approx);
    free(hs->bound);
    free(hs->xq);
    free(hs->lo_max);
    memset(hs, 0, sizeof *hs);
}

/* hs = the copy of head; 1 when the head cannot be screened. */
static int build(struct head_screen *hs, struct cpu_matmul *mm, const struct tensor *head,
                 struct err *e)
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
    hs->lo_max = malloc((size_t)(nth > 0 ? nth : 1) * sizeof *hs->lo_max);
    if (!hs->q || !hs->scale || !hs->qabs || !hs->approx || !hs->bound || !hs->xq ||
        !hs->lo_max) {
        head_screen_free(hs);
        return err_set(e, "head_pick: out of memory for the LM head's int8 copy (%zu MB; "
                          "CLLM_HEAD_SCREEN=0 turns it off)", rows * cols >> 20);
    }
    hs->rows = head->rows;
    hs->cols = head->cols;
    struct build_task t = {.hs = hs, .head = head, .stride = dtype_row_bytes(head->dtype, head->cols)};
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
    return 0;
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
    double sx, x1_term, xq_term; /* a_r = s_r sx dot; e_r = s_r (x1_term + xq_term qabs_r) */
    double *lo_max;              /* per worker: max_r (a_r - e_r) */
    atomic_llong next;
};

static void screen_worker(void *ctx, int ith, int nth)
{
    (void)nth;
    struct screen_task *t = ctx;
    struct head_screen *hs = t->hs;
    double lo = -INFINITY;
    for (;;) {
        int64_t r0 = atomic_fetch_add_explicit(&t->next, HP_CHUNK, memory_order_relaxed);
        if (r0 >= hs->rows)
            break;
        int64_t r1 = r0 + HP_CHUNK < hs->rows ? r0 + HP_CHUNK : hs->rows;
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
            const double b = s * (t->x1_term + t->xq_term * hs->qabs[r]);
            /* kept as floats: the bound grows by more than a's rounding to
             * float (2^-24 |a|), so approx +- bound still brackets the logit */
            hs->approx[r] = (float)a;
            hs->bound[r] = (float)((b + 2e-7 * fabs(a)) * (1.0 + 1e-6));
            const double l = (double)hs->approx[r] - (double)hs->bound[r];
            lo = l > lo ? l : lo;
        }
    }
    t->lo_max[ith] = lo;
}

int head_screen_pick(struct head_screen *hs, struct cpu_matmul *mm, float *logits, const float *x,
                     const struct tensor *head, struct err *e)
{
    if (head->dtype != DT_F32 && head->dtype != DT_F16 && head->dtype != DT_BF16)
        return 1;
    if (head->cols > HP_MAX_COLS || head->rows < 2)
        return 1;
    if (hs->data != head->data || hs->rows != head->rows || hs->cols != head->cols) {
        if (build(hs, mm, head, e))
            return -1;
    }
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
    /* The input as int16, x_i ~ dx xq_i; |x_i - dx xq_i| <= dx (1/2 + 2^-10). */
    const float dx = mx / (float)HP_XQ_MAX;
    for (int64_t i = 0; i < cols; i++) {
        long v = lrintf(x[i] / dx);
        hs->xq[i] = (int16_t)(v > HP_XQ_MAX ? HP_XQ_MAX : v < -HP_XQ_MAX ? -HP_XQ_MAX : v);
    }
    /* e_r, for each row: the weights' rounding (|w - s q| <= s (1/2 +
     * 2^-16)) times sum |x|; the input's times s sum |q|; and the rounding
     * of the exact logit's own f32 sum in any order, gamma_n sum |w| |x|
     * with |w| <= 127.01 s. */
    const double u = ldexp(1.0, -24), gamma = (double)cols * u / (1.0 - (double)cols * u);
    const int nth = mm->tp ? tp_size(mm->tp) : 1;
    double *lo_max = hs->lo_max;
    struct screen_task t = {.hs = hs, .sx = dx,
                            .x1_term = (0.5 + 1.6e-5 + 127.01 * gamma) * x1 * (1.0 + 1e-6),
                            .xq_term = (0.5 + 1e-3) * dx * (1.0 + 1e-6),
                            .lo_max = lo_max};
#if defined(__x86_64__)
    t.avx2 = mm->isa >= CPU_ISA_AVX2;
    t.vnni = mm->vnni;
#endif
    atomic_init(&t.next, 0);
    for (int i = 0; i < nth; i++)
        lo_max[i] = -INFINITY;
    if (nth > 1)
        tp_run(mm->tp, screen_worker, &t);
    else
        screen_worker(&t, 0, 1);
    double L = -INFINITY;
    for (int i = 0; i < nth; i++)
        L = lo_max[i] > L ? lo_max[i] : L;
    /* The candidates: rows whose logit may reach L. Past a cap the full
     * product is cheaper than rescoring them one by one. */
    const int64_t cap = head->rows / 64 > 64 ? head->rows / 64 : 64;
    int64_t n_cand = 0;
    for (int64_t r = 0; r < head->rows && n_cand <= cap; r++)
        n_cand += (double)hs->approx[r] + (double)hs->bound[r] >= L;
    if (n_cand > cap)
        return cpu_matmul(mm, logits, x, 1, head, e);
    const size_t stride = dtype_row_bytes(head->dtype, head->cols);
    for (int64_t r = 0; r < head->rows; r++) {
        if ((double)hs->approx[r] + (double)hs->bound[r] < L) {
            logits[r] = -INFINITY;
            continue;
        }
        /* the row through cpu_matmul alone: the same kernel, the same bits */
        struct tensor one = *head;
        one.data = (const uint8_t *)head->data + (size_t)r * stride;
        one.rows = 1;
        if (cpu_matmul(mm, logits + r, x, 1, &one, e))
            return -1;
    }
    return 0;
}
