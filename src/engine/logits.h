/* logits.h - what the host does to a sequence's logits row around the pick:
 * the request's logit bias and repetition penalties (mlx-lm's logits
 * processors, each over a window of the latest tokens), and the
 * log-probabilities a token is reported with.
 *
 * A sequence that needs any of these gets its row back from the backend
 * instead of a token id chosen on the device (engine.c). */
#ifndef CLLM_ENGINE_LOGITS_H
#define CLLM_ENGINE_LOGITS_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h" /* struct token_logprobs */
#include "base/err.h"

#define LOGIT_BIAS_MAX 1024     /* logit_bias entries per request */
#define PENALTY_WINDOW_DEFAULT 20 /* mlx-lm's *_context_size default */

/* Applied in this order, as mlx-lm's make_logits_processors chains them,
 * the window being the last tokens of the sequence (prompt and generated):
 *   logit_bias: bias[i] added to bias_ids[i]'s logit;
 *   repetition (a factor; 0 or 1: off): each distinct token of its window
 *     has a negative logit multiplied by it, any other divided by it;
 *   presence: subtracted once from each distinct token of its window;
 *   frequency: subtracted once per occurrence in its window.
 * A window <= 0 means PENALTY_WINDOW_DEFAULT. */
struct logits_params {
    const int *bias_ids;
    const float *bias;
    int n_bias;
    float repetition, presence, frequency;
    int repetition_window, presence_window, frequency_window;
};

/* True when logits_process would change a row. */
bool logits_params_active(const struct logits_params *p);
/* A clear message for a value out of range: a bias id outside [0, vocab),
 * a bias outside [-100, 100], a repetition factor < 0, a penalty outside
 * [-2, 2], more than LOGIT_BIAS_MAX entries. */
int logits_params_check(const struct logits_params *p, int vocab, struct err *e);
/* Applies p to row for the context toks[0, n). mark: scratch of one byte
 * per vocabulary entry, all zero, left all zero. */
void logits_process(const struct logits_params *p, const int *toks, int n, float *row,
                    uint8_t *mark);

/* Reported log-probabilities (struct token_logprobs, backend.h) are of
 * the model's row before anything above, the sampler's warpers or a
 * grammar's mask changed it (vLLM's default, "raw" log-probabilities). */

/* log(sum exp(row)) in double; NaN entries are skipped; -inf when there is
 * nothing else, +inf when an entry is. */
double logits_lse(const float *row, int n);
/* lp->top_* from row: its k (<= LOGPROBS_TOP_MAX, <= n) largest entries,
 * NaN never, as log-probabilities under lse. */
void logprobs_top(const float *row, int n, int k, double lse, struct token_logprobs *lp);

#endif
