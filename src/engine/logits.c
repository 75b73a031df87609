/* logits.c - logit bias, repetition penalties and reported log-probabilities
 * on a sequence's logits row (logits.h). */
#include "engine/logits.h"

#include <math.h>
#include <string.h>

bool logits_params_active(const struct logits_params *p)
{
    return p->n_bias > 0 || (p->repetition != 0 && p->repetition != 1) || p->presence != 0 ||
           p->frequency != 0;
}

int logits_params_check(const struct logits_params *p, int vocab, struct err *e)
{
    if (p->n_bias < 0 || p->n_bias > LOGIT_BIAS_MAX)
        return err_set(e, "logit_bias has %d entries; at most %d are allowed", p->n_bias,
                       LOGIT_BIAS_MAX);
    for (int i = 0; i < p->n_bias; i++) {
        if (p->bias_ids[i] < 0 || p->bias_ids[i] >= vocab)
            return err_set(e, "logit_bias: token id %d is outside the vocabulary (0..%d)",
                           p->bias_ids[i], vocab - 1);
        if (!(p->bias[i] >= -100 && p->bias[i] <= 100))
            return err_set(e, "logit_bias: the bias of token %d must be in [-100, 100] (got %g)",
                           p->bias_ids[i], p->bias[i]);
    }
    if (!(p->repetition >= 0) || isinf(p->repetition))
        return err_set(e, "repetition_penalty must be a finite number >= 0 (got %g)",
                       p->repetition);
    if (!(p->presence >= -2 && p->presence <= 2))
        return err_set(e, "presence_penalty must be in [-2, 2] (got %g)", p->presence);
    if (!(p->frequency >= -2 && p->frequency <= 2))
        return err_set(e, "frequency_penalty must be in [-2, 2] (got %g)", p->frequency);
    return 0;
}

static int window(int w) { return w > 0 ? w : PENALTY_WINDOW_DEFAULT; }

void logits_process(const struct logits_params *p, const int *toks, int n, float *row,
                    uint8_t *mark)
{
    for (int i = 0; i < p->n_bias; i++)
        row[p->bias_ids[i]] += p->bias[i];
    if (p->repetition != 0 && p->repetition != 1) {
        int from = n - window(p->repetition_window);
        for (int i = from > 0 ? from : 0; i < n; i++) {
            int t = toks[i];
            if (mark[t])
                continue;
            mark[t] = 1;
            row[t] = row[t] < 0 ? row[t] * p->repetition : row[t] / p->repetition;
        }
        for (int i = from > 0 ? from : 0; i < n; i++)
            mark[toks[i]] = 0;
    }
    if (p->presence != 0) {
        int from = n - window(p->presence_window);
        for (int i = from > 0 ? from : 0; i < n; i++) {
            int t = toks[i];
            if (!mark[t]) {
                mark[t] = 1;
                row[t] -= p->presence;
            }
        }
        for (int i = from > 0 ? from : 0; i < n; i++)
            mark[toks[i]] = 0;
    }
    if (p->frequency != 0) {
        int from = n - window(p->frequency_window);
        for (int i = from > 0 ? from : 0; i < n; i++)
            row[toks[i]] -= p->frequency;
    }
}

/* Four lanes in the compiler's vector types (SSE2 on any x86-64, NEON on
 * arm64): a logits row is 150k wide and libm's expf, one call an entry,
 * made logprobs cost ~1 ms a token on the H200's host. */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

static v4f load4(const float *p)
{
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* a where mask (all ones), else b */
static v4f pick4(v4i mask, v4f a, v4f b) { return (v4f)((mask & (v4i)a) | (~mask & (v4i)b)); }

/* e^x for x <= 0: x = n ln2 + y with |y| <= ln2/2, e^y by its Taylor series
 * to y^7 (6e-9 relative), 2^n in the exponent bits. Below -87 (e^-87 ~
 * 1.6e-38) and for NaN, e^-87: as good as 0 in a sum whose largest term is
 * 1. */
static v4f exp4(v4f x)
{
    const v4f lo = {-87.0f, -87.0f, -87.0f, -87.0f};
    const v4f magic = {12582912.0f, 12582912.0f, 12582912.0f, 12582912.0f}; /* 1.5 * 2^23 */
    x = pick4(x > lo, x, lo);
    v4f n = (x * 1.44269504f + magic) - magic; /* round to an integer */
    v4f y = x - n * 0.693145752f - n * 1.42860677e-6f; /* ln 2, hi + lo */
    v4f p = y * (1.0f / 5040) + 1.0f / 720;
    p = p * y + 1.0f / 120;
    p = p * y + 1.0f / 24;
    p = p * y + 1.0f / 6;
    p = p * y + 0.5f;
    p = p * y + 1.0f;
    p = p * y + 1.0f;
    v4i k = (__builtin_convertvector(n, v4i) + 127) << 23;
    return p * (v4f)k;
}

double logits_lse(const float *row, int n)
{
    int body = n & ~3;
    v4f mx = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    for (int i = 0; i < body; i += 4) {
        v4f v = load4(row + i);
        mx = pick4(v > mx, v, mx); /* NaN never wins */
    }
    float m = -INFINITY;
    for (int j = 0; j < 4; j++)
        m = mx[j] > m ? mx[j] : m;
    for (int i = body; i < n; i++)
        m = row[i] > m ? row[i] : m;
    if (isinf(m))
        return m;
    const v4f mv = {m, m, m, m};
    v4f acc0 = {0}, acc1 = {0}; /* float lanes: ~40k terms of at most 1 each */
    int i = 0;
    for (; i + 8 <= body; i += 8) {
        acc0 += exp4(load4(row + i) - mv);
        acc1 += exp4(load4(row + i + 4) - mv);
    }
    for (; i < body; i += 4)
        acc0 += exp4(load4(row + i) - mv);
    double s = 0;
    for (int j = 0; j < 4; j++)
        s += (double)acc0[j] + (double)acc1[j];
    for (i = body; i < n; i++)
        if (!isnan(row[i]))
            s += expf(row[i] - m);
    return (double)m + log(s);
}

/* The top list's insertion of entry i (k <= 20 long, larger first, the
 * lower id first on ties: an equal value does not displace). */
struct top {
    int id[LOGPROBS_TOP_MAX], m, k;
    float cut; /* what an entry must beat once the list is full */
};

static void top_consider(struct top *t, const float *row, int i)
{
    float v = row[i];
    if (isnan(v) || (t->m == t->k && !(v > t->cut)))
        return;
    int j = t->m < t->k ? t->m++ : t->k - 1;
    while (j > 0 && v > row[t->id[j - 1]]) {
        t->id[j] = t->id[j - 1];
        j--;
    }
    t->id[j] = i;
    t->cut = t->m == t->k ? row[t->id[t->m - 1]] : -INFINITY;
}

void logprobs_top(const float *row, int n, int k, double lse, struct token_logprobs *lp)
{
    struct top t = {.k = k < LOGPROBS_TOP_MAX ? k : LOGPROBS_TOP_MAX, .cut = -INFINITY};
    if (t.k > n)
        t.k = n;
    int i = 0;
    if (t.k > 0) {
        for (; i < n && t.m < t.k; i++) /* fill the list */
            top_consider(&t, row, i);
        for (; i + 4 <= n; i += 4) { /* then most blocks of four beat nothing */
            v4f cut = {t.cut, t.cut, t.cut, t.cut};
            v4i gt = load4(row + i) > cut;
            if (gt[0] | gt[1] | gt[2] | gt[3])
                for (int j = 0; j < 4; j++)
                    top_consider(&t, row, i + j);
        }
        for (; i < n; i++)
            top_consider(&t, row, i);
    }
    lp->n_top = t.m;
    for (int j = 0; j < t.m; j++) {
        lp->top_id[j] = t.id[j];
        lp->top_lp[j] = (float)((double)row[t.id[j]] - lse);
    }
}
