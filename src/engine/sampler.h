/* sampler.h - turns a row of logits into the next token: greedy, or
 * temperature -> top-k -> top-p -> min-p (Hugging Face's warper order) with
 * a per-request seeded RNG, so one request's draws never depend on another's. */
#ifndef CLLM_ENGINE_SAMPLER_H
#define CLLM_ENGINE_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"

struct sampler_params {
    float temperature; /* <= 0: greedy */
    int top_k;         /* <= 0: off */
    float top_p;       /* >= 1: off */
    float min_p;       /* <= 0: off */
    uint64_t seed;
};

struct rng {
    uint64_t s[4];
};

void rng_seed(struct rng *r, uint64_t seed);
uint64_t rng_next(struct rng *r);
/* Uniform in [0, 1). */
double rng_uniform(struct rng *r);

struct sampler {
    struct sampler_params p;
    struct rng rng;
    int vocab;
    /* scratch sized to the vocabulary */
    float *probs;
    int *idx;
};

/* Validates params (a clear message for out-of-range values). */
int sampler_init(struct sampler *s, const struct sampler_params *p, int vocab, struct err *e);
void sampler_free(struct sampler *s);

/* Index of the largest logit; ties go to the lowest id (as torch.argmax);
 * NaNs never win (0 when every logit is NaN), as the device argmax ops. */
int sample_argmax(const float *logits, int n);
/* True when sampler_sample is sample_argmax (temperature 0): it then draws
 * nothing from the RNG, so the engine may take the id from the device. */
bool sampler_is_greedy(const struct sampler *s);
/* Draws the next token from logits (not modified): sample_argmax when
 * greedy, else sampler_pick with one rng_uniform draw. */
int sampler_sample(struct sampler *s, const float *logits);

/* The token a sampled step picks from logits[n] for the uniform draw u in
 * [0, 1); pure, so the device sampler (the sample_rows op) and this host
 * path consume the RNG alike and this is the reference. pr and idx are
 * scratch of n entries. Greedy params (temperature <= 0) give
 * sample_argmax. Otherwise, with x = logit * (1/temperature) in float:
 *   - NaN values are no candidates; when nothing is left to normalize (all
 *     NaN or -inf, or an infinite maximum) the argmax rule decides;
 *   - top_k: the k largest x, the lower id on ties at the k-th value;
 *   - p = expf(x - max x) over them; top_p: the shortest prefix, in
 *     descending x (lower id first on ties), whose cumulative p / sum
 *     reaches top_p; min_p: then only p >= min_p (the largest p is 1);
 *   - the first kept token where the running sum of p exceeds u * (sum of
 *     kept p), walking in descending x when top_k or top_p is active and
 *     in id order otherwise (the order sampling has always used). */
int sampler_pick(const struct sampler_params *p, const float *logits, int n, double u,
                 float *pr, int *idx);

/* Speculative sampling's step for a drafted token d (a draft that came
 * from elsewhere, with probability 1): with P the distribution sampler_pick
 * draws from for p and logits, returns d when u_accept * 1 < P(d) (d kept
 * with probability P(d)), else a token drawn with u from P without d,
 * renormalized (walked as sampler_pick walks). Over uniform u_accept and u
 * the result is distributed as P itself. A point-mass P (greedy, the argmax
 * rule's cases) returns its token. pr, idx: scratch of n entries. */
int sampler_verify(const struct sampler_params *p, const float *logits, int n, int d,
                   double u_accept, double u, float *pr, int *idx);

#endif
