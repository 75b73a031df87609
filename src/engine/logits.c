/* logits.c - logit bias, repetition penalties and reported log-probabilities
 * on a sequence's logits row (logits.h). */
#include "engine/logits.h"

#include <math.h>

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

double logits_lse(const float *row, int n)
{
    float m = -INFINITY;
    for (int i = 0; i < n; i++)
        m = row[i] > m ? row[i] : m; /* NaN never wins */
    if (isinf(m))
        return m;
    /* float exponentials (libm's expf costs a third of exp), summed in
     * double: off by about a float ulp of a log-probability */
    double s = 0;
    for (int i = 0; i < n; i++)
        if (!isnan(row[i]))
            s += expf(row[i] - m);
    return (double)m + log(s);
}

void logprobs_top(const float *row, int n, int k, double lse, struct token_logprobs *lp)
{
    if (k > LOGPROBS_TOP_MAX)
        k = LOGPROBS_TOP_MAX;
    if (k > n)
        k = n;
    /* insertion into a short sorted list: k <= 20, one pass over the row;
     * cut is the value an entry must beat once the list is full */
    int m = 0, id[LOGPROBS_TOP_MAX];
    float cut = -INFINITY;
    bool full = false;
    for (int i = 0; i < n && k > 0; i++) {
        float v = row[i];
        if (isnan(v) || (full && !(v > cut)))
            continue; /* ties keep the lower id already there */
        int j = m < k ? m++ : k - 1;
        while (j > 0 && v > row[id[j - 1]]) {
            id[j] = id[j - 1];
            j--;
        }
        id[j] = i;
        full = m == k;
        cut = row[id[m - 1]];
    }
    lp->n_top = m;
    for (int j = 0; j < m; j++) {
        lp->top_id[j] = id[j];
        lp->top_lp[j] = (float)((double)row[id[j]] - lse);
    }
}
