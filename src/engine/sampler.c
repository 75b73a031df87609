/* sampler.c - greedy and stochastic token selection. */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/argmax.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void rng_seed(struct rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256** */
uint64_t rng_next(struct rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double rng_uniform(struct rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

int sampler_init(struct sampler *s, const struct sampler_params *p, int vocab, struct err *e)
{
    memset(s, 0, sizeof *s);
    if (!(p->temperature >= 0 && p->temperature < 1e6) || isnan(p->temperature))
        return err_set(e, "temperature must be >= 0 (got %g)", p->temperature);
    if (!(p->top_p > 0) || p->top_p > 1)
        return err_set(e, "top_p must be in (0, 1] (got %g)", p->top_p);
    if (!(p->min_p >= 0) || p->min_p > 1)
        return err_set(e, "min_p must be in [0, 1] (got %g)", p->min_p);
    if (p->top_k < 0)
        return err_set(e, "top_k must be >= 0 (got %d)", p->top_k);
    s->p = *p;
    s->vocab = vocab;
    rng_seed(&s->rng, p->seed);
    s->probs = malloc((size_t)vocab * sizeof(float));
    s->idx = malloc((size_t)vocab * sizeof(int));
    if (!s->probs || !s->idx) {
        sampler_free(s);
        return err_set(e, "out of memory");
    }
    return 0;
}

void sampler_free(struct sampler *s)
{
    free(s->probs);
    free(s->idx);
    s->probs = NULL;
    s->idx = NULL;
}

int sample_argmax(const float *logits, int n) { return argmax_f32(logits, n); }

bool sampler_is_greedy(const struct sampler *s) { return s->p.temperature <= 0; }

/* The order kept tokens are walked in when anything is sorted: larger value
 * first, the lower id on ties. A total order, so the top k of any row are
 * one set (ties at the k-th value go to the lower ids). */
static bool ranks_before(const float *key, int a, int b)
{
    return key[a] > key[b] || (key[a] == key[b] && a < b);
}

static int cmp_desc(const void *a, const void *b, void *keys)
{
    const float *key = keys;
    int x = *(const int *)a, y = *(const int *)b;
    return ranks_before(key, x, y) ? -1 : ranks_before(key, y, x) ? 1 : 0;
}

/* Moves the k largest entries of idx (by ranks_before) to the front,
 * sorted. The keys must not be NaN. */
static void partial_sort(int *idx, int n, int k, const float *key)
{
    if (k < n) { /* quickselect so only k entries get sorted */
        int lo = 0, hi = n - 1;
        while (lo < hi) {
            int pivot = idx[(lo + hi) / 2];
            int i = lo, j = hi;
            while (i <= j) {
                while (ranks_before(key, idx[i], pivot)) i++;
                while (ranks_before(key, pivot, idx[j])) j--;
                if (i <= j) {
                    int t = idx[i]; idx[i] = idx[j]; idx[j] = t;
                    i++; j--;
                }
            }
            if (k - 1 <= j) hi = j;
            else if (k - 1 >= i) lo = i;
            else break;
        }
    }
    qsort_r(idx, (size_t)(k < n ? k : n), sizeof(int), cmp_desc, (void *)key);
}

/* The distribution sampler_pick draws from: idx[0, *keep) are the kept
 * tokens in walking order with their unnormalized weights in pr. Returns
 * -1, or a token when the argmax rule decides instead (greedy, nothing to
 * normalize, an infinite maximum): a point mass. *best is the largest. */
static int warp(const struct sampler_params *p, const float *logits, int n, float *pr, int *idx,
                int *keep_out, int *best_out)
{
    if (p->temperature <= 0)
        return sample_argmax(logits, n);
    float inv_t = 1.0f / p->temperature;
    /* NaN logits are no candidates; best: the first of the largest value. */
    int m = 0, best = -1;
    for (int i = 0; i < n; i++) {
        pr[i] = logits[i] * inv_t;
        if (isnan(pr[i]))
            continue;
        idx[m++] = i;
        if (best < 0 || pr[i] > pr[best])
            best = i;
    }
    /* Nothing to normalize (every value NaN or -inf, or an infinite
     * maximum after scaling): the argmax rule decides. */
    if (best < 0)
        return 0;
    if (isinf(pr[best]))
        return best;
    int k = p->top_k > 0 && p->top_k < m ? p->top_k : m;
    /* Sorting the whole vocabulary is only needed for top-p; cap it otherwise. */
    int keep = k;
    if (p->top_p < 1 || k < m)
        partial_sort(idx, m, k, pr);
    else
        keep = m;
    float mx = pr[best];
    double sum = 0;
    for (int i = 0; i < keep; i++) {
        float e = expf(pr[idx[i]] - mx);
        pr[idx[i]] = e;
        sum += e;
    }
    if (p->top_p < 1) {
        /* Smallest prefix whose mass reaches top_p (at least one token). */
        double cum = 0;
        int cut = keep;
        for (int i = 0; i < keep; i++) {
            cum += pr[idx[i]] / sum;
            if (cum >= p->top_p) {
                cut = i + 1;
                break;
            }
        }
        keep = cut;
    }
    if (p->min_p > 0) {
        float top = 0;
        for (int i = 0; i < keep; i++)
            if (pr[idx[i]] > top)
                top = pr[idx[i]];
        int w = 0;
        for (int i = 0; i < keep; i++)
            if (pr[idx[i]] >= p->min_p * top)
                idx[w++] = idx[i];
        keep = w;
    }
    *keep_out = keep;
    *best_out = best;
    return -1;
}

/* The first kept token (but skip) where the running weight exceeds u times
 * the kept weight (without skip's). */
static int walk(const float *pr, const int *idx, int keep, int best, int skip, double u)
{
    double sum = 0;
    for (int i = 0; i < keep; i++)
        if (idx[i] != skip)
            sum += pr[idx[i]];
    double r = u * sum, acc = 0;
    int last = best == skip ? -1 : best; /* always kept, probability 1 before normalizing */
    for (int i = 0; i < keep; i++) {
        if (idx[i] == skip)
            continue;
        acc += pr[idx[i]];
        if (pr[idx[i]] > 0)
            last = idx[i];
        if (r < acc)
            return idx[i];
    }
    return last; /* u * sum rounded up to sum */
}

int sampler_pick(const struct sampler_params *p, const float *logits, int n, double u,
                 float *pr, int *idx)
{
    int keep, best, t = warp(p, logits, n, pr, idx, &keep, &best);
    return t >= 0 ? t : walk(pr, idx, keep, best, -1, u);
}

int sampler_verify(const struct sampler_params *p, const float *logits, int n, int d,
                   double u_accept, double u, float *pr, int *idx)
{
    int keep, best, t = warp(p, logits, n, pr, idx, &keep, &best);
    if (t >= 0) /* a point mass at t: d is accepted only if it is t */
        return t;
    double sum = 0, pd = 0;
    for (int i = 0; i < keep; i++) {
        sum += pr[idx[i]];
        if (idx[i] == d)
            pd = pr[idx[i]];
    }
    if (u_accept * sum < pd)
        return d;
    int r = walk(pr, idx, keep, best, d, u);
    return r >= 0 ? r : d; /* d held all the mass: nothing else to draw */
}

int sampler_sample(struct sampler *s, const float *logits)
{
    if (sampler_is_greedy(s)) /* no RNG draw */
        return sample_argmax(logits, s->vocab);
    return sampler_pick(&s->p, logits, s->vocab, rng_uniform(&s->rng), s->probs, s->idx);
}
