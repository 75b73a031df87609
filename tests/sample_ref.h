/* sample_ref.h - a second statement of the sampler's contract
 * (sampler_pick in engine/sampler.h) for the tests: a full sort where the
 * sampler selects, and the probability of every token. It forms the same
 * floats and doubles in the same order, so its picks equal sampler_pick's
 * bit for bit. */
#ifndef CLLM_TESTS_SAMPLE_REF_H
#define CLLM_TESTS_SAMPLE_REF_H

#include <stdint.h>

#include "engine/sampler.h"

/* What sampler_pick keeps for a row, and in which order it walks them. */
struct sample_ref {
    int n, forced;  /* forced >= 0: every draw gives it (greedy, degenerate row) */
    int keep;       /* the walk: order[0, keep) */
    int *order;
    float *p;       /* [n]: p of the kept tokens (exp(x - max)) */
    double *cum;    /* [keep]: running sum of p along the walk */
    double sum;     /* of the kept p, in walk order */
    int last;       /* the last kept token with p > 0 */
};

/* Fills r for logits[n] under params p (r owns its arrays: sample_ref_free). */
void sample_ref_init(struct sample_ref *r, const struct sampler_params *p, const float *logits,
                     int n);
void sample_ref_free(struct sample_ref *r);
/* The token for the uniform draw u (a binary search: many draws per row
 * stay cheap on large vocabularies). */
int sample_ref_pick(const struct sample_ref *r, double u);
/* The chance of token i for u uniform in [0, 1): 0 for a token never picked. */
double sample_ref_prob(const struct sample_ref *r, int i);

/* A test row of logits from the xorshift state *rng: shape 0 gaussian, 1
 * flat in [-10, 10], 2 peaked (five spikes over a gaussian), 3 ties (half
 * steps, -0 among them), 4 gaussian with -inf and NaN sprinkled, 5 the
 * variants 0 all NaN, 1 all -inf, 2 two +inf, 3 one finite among NaN and
 * -inf. */
#define SAMPLE_TEST_SHAPES 6
void sample_test_row(float *x, int n, int shape, int variant, uint64_t *rng);
/* Uniform in [0, 1) from *rng. */
double sample_test_u(uint64_t *rng);

/* Parameter sets the sampler tests share: temperature alone, each filter
 * alone and all together, top_k 1, a tiny top_p, min_p 1, top_k past the
 * device sampler's shared-memory capacity, a wide top_p, greedy, a tiny
 * temperature. */
extern const struct sampler_params sample_test_combos[];
extern const int sample_test_n_combos;

#endif
