/* sample_ref.c - see sample_ref.h. */
#include "sample_ref.h"

#include <math.h>
#include <stdlib.h>

static const float *ref_keys;

static int ref_cmp(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    if (ref_keys[x] != ref_keys[y])
        return ref_keys[x] > ref_keys[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

void sample_ref_init(struct sample_ref *r, const struct sampler_params *p, const float *logits,
                     int n)
{
    r->n = n;
    r->forced = -1;
    r->keep = 0;
    r->sum = 0;
    r->last = -1;
    r->order = malloc(sizeof(int) * (size_t)n);
    r->p = calloc((size_t)n, sizeof(float));
    r->cum = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    float *x = malloc(sizeof(float) * (size_t)n);
    if (p->temperature <= 0) {
        r->forced = sample_argmax(logits, n);
        free(x);
        return;
    }
    float inv_t = 1.0f / p->temperature;
    int m = 0, best = -1;
    for (int i = 0; i < n; i++) {
        x[i] = logits[i] * inv_t;
        if (isnan(x[i]))
            continue;
        r->order[m++] = i; /* id order */
        if (best < 0 || x[i] > x[best])
            best = i;
    }
    if (best < 0 || isinf(x[best])) {
        r->forced = best < 0 ? 0 : best;
        free(x);
        return;
    }
    bool topk = p->top_k > 0 && p->top_k < m;
    int keep = m;
    if (topk || p->top_p < 1) { /* the descending walk */
        ref_keys = x;
        qsort(r->order, (size_t)m, sizeof(int), ref_cmp);
        if (topk)
            keep = p->top_k;
    }
    double sum = 0;
    for (int i = 0; i < keep; i++) {
        r->p[r->order[i]] = expf(x[r->order[i]] - x[best]);
        sum += r->p[r->order[i]];
    }
    if (p->top_p < 1) {
        double cum = 0;
        for (int i = 0; i < keep; i++) {
            cum += r->p[r->order[i]] / sum;
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0) {
        float top = 0;
        for (int i = 0; i < keep; i++)
            top = r->p[r->order[i]] > top ? r->p[r->order[i]] : top;
        int w = 0;
        for (int i = 0; i < keep; i++)
            if (r->p[r->order[i]] >= p->min_p * top)
                r->order[w++] = r->order[i];
        keep = w;
    }
    for (int i = 0; i < n; i++) /* only the kept keep a p */
        x[i] = 0;
    for (int i = 0; i < keep; i++)
        x[r->order[i]] = r->p[r->order[i]];
    for (int i = 0; i < n; i++)
        r->p[i] = x[i];
    for (int i = 0; i < keep; i++) {
        r->sum += r->p[r->order[i]];
        r->cum[i] = r->sum;
        if (r->p[r->order[i]] > 0)
            r->last = r->order[i];
    }
    r->keep = keep;
    free(x);
}

void sample_ref_free(struct sample_ref *r)
{
    free(r->order);
    free(r->p);
    free(r->cum);
    r->order = NULL;
    r->p = NULL;
    r->cum = NULL;
}

int sample_ref_pick(const struct sample_ref *r, double u)
{
    if (r->forced >= 0)
        return r->forced;
    /* the first running sum above u * sum (the host's walk, r < acc) */
    double t = u * r->sum;
    int lo = 0, hi = r->keep;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (t < r->cum[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo < r->keep ? r->order[lo] : r->last;
}

double sample_ref_prob(const struct sample_ref *r, int i)
{
    if (r->forced >= 0)
        return i == r->forced;
    return r->sum > 0 ? r->p[i] / r->sum : 0;
}

double sample_test_u(uint64_t *rng)
{
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    return (double)(*rng >> 11) * 0x1.0p-53;
}

void sample_test_row(float *x, int n, int shape, int variant, uint64_t *rng)
{
    for (int i = 0; i < n; i++) {
        double a = sample_test_u(rng), b = sample_test_u(rng);
        float g = (float)(sqrt(-2 * log(a + 1e-300)) * cos(6.283185307179586 * b));
        switch (shape) {
        case 0: x[i] = g * 2.5f; break;
        case 1: x[i] = (float)(a * 20 - 10); break;
        case 2: x[i] = g; break;
        case 3:
            x[i] = roundf(g * 4) * 0.5f;
            if (x[i] == 0 && b < 0.5)
                x[i] = -0.0f;
            break;
        case 4: x[i] = a < 0.1 ? -INFINITY : b < 0.05 ? NAN : g * 3; break;
        default: x[i] = variant == 0 ? NAN : variant == 1 ? -INFINITY : g; break;
        }
    }
    if (shape == 2)
        for (int k = 0; k < 5; k++)
            x[(int)(sample_test_u(rng) * n)] = 12.0f - (float)k;
    if (shape == 5 && variant == 2) {
        x[n / 3] = INFINITY;
        x[n / 2] = INFINITY;
    }
    if (shape == 5 && variant == 3) {
        for (int i = 0; i < n; i++)
            x[i] = i % 2 ? NAN : -INFINITY;
        x[n > 1 ? n - 2 : 0] = 1.5f;
    }
}

const struct sampler_params sample_test_combos[] = {
    {1.0f, 0, 1.0f, 0, 0},     {0.7f, 50, 1.0f, 0, 0},      {1.3f, 0, 0.9f, 0, 0},
    {0.8f, 0, 1.0f, 0.05f, 0}, {1.0f, 40, 0.95f, 0.02f, 0}, {0.5f, 1, 1.0f, 0, 0},
    {1.0f, 0, 1e-4f, 0, 0},    {1.0f, 0, 1.0f, 1.0f, 0},    {2.0f, 0, 0.5f, 0.1f, 0},
    {1.0f, 5000, 1.0f, 0, 0},  {1.5f, 0, 0.99f, 0, 0},      {0.0f, 0, 1.0f, 0, 0},
    {1.0f, 3000, 0.999f, 0, 0}, {1e-3f, 0, 1.0f, 0, 0},
};
const int sample_test_n_combos = (int)(sizeof sample_test_combos / sizeof sample_test_combos[0]);
