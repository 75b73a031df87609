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
/* Draws the next token from logits (not modified). */
int sampler_sample(struct sampler *s, const float *logits);

#endif
