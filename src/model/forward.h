/* forward.h - runs the llama-family transformer (llama, mistral, qwen2,
 * qwen3) through the backend op set over a ragged batch: spans of new tokens
 * of several sequences, concatenated so every matmul reads the weights once
 * per step for all of them. forward_tokens is the one-sequence case. */
#ifndef CLLM_MODEL_FORWARD_H
#define CLLM_MODEL_FORWARD_H

#include <stdbool.h>

#include "backend/backend.h"
#include "kv/kv_cache.h"
#include "model/model.h"

/* forward_pipe_issue's queue: the ids of up to two steps, oldest at head
 * (on a backend with argmax_async still on the device until taken). */
struct forward_pipe {
    int n, head;
    int ids[2];
    float *row; /* host, vocab: the logits row without argmax_async, made on first use */
};

/* Activation buffers for up to max_tokens tokens per call, and the LM
 * head's output for up to logit_rows rows of one call, in backend memory. */
struct forward_state {
    const struct model *m;
    struct backend *be;
    int max_tokens;
    int logit_rows;
    float *inv_freq; /* host, head_dim/2, rope scaling applied */
    int *ids;        /* host, max_tokens: the step's token ids, concatenated */
    int *greedy;     /* host, max_tokens: greedy or sampled ids of a step's segments */
    struct sample_params *sparams; /* host, max_tokens: sample_rows' parameters */
    struct token_logprobs *lps; /* host, max_tokens: row_logprobs' output, made on first use */
    struct batch_seg *bsegs; /* host, max_tokens: a multi-sequence step's segments
                              * as rope_kv_attention_batch takes them */
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2, *logits;
    struct forward_pipe pipe;
};

int forward_init(struct forward_state *fs, const struct model *m, struct backend *be,
                 int max_tokens, struct err *e);
/* forward_init with room for logits of only logit_rows (1..max_tokens) rows
 * a call: a step with logits for more rows fails with a message, and
 * forward_tokens with all_logits runs in passes of that many tokens. The
 * logits of every row of a long prefill chunk are never wanted, and at
 * vocab_size floats a row they were the largest activation buffer (2,048
 * rows of a 151,936-id vocabulary: 1.2 GB). */
int forward_init_rows(struct forward_state *fs, const struct model *m, struct backend *be,
                      int max_tokens, int logit_rows, struct err *e);
void forward_free(struct forward_state *fs);

/* Computes RoPE inverse frequencies with the config's scaling (exposed for
 * tests). inv_freq has head_dim/2 entries. */
void rope_inv_freq(const struct model_config *c, float *inv_freq);

/* Feeds tokens[0..n) at positions seq->n_tokens.. (n may exceed max_tokens:
 * it is split into chunks), appends their K/V to seq, and writes logits:
 * all n rows [n][vocab] when all_logits, else only the last row [vocab].
 * logits is host memory. */
int forward_tokens(struct forward_state *fs, struct kv_pool *pool, struct kv_seq *seq,
                   const int *tokens, int n, bool all_logits, float *logits, struct err *e);
/* forward_tokens without all_logits, for greedy decoding: *next = the index
 * of the largest last-row logit (the lowest on ties). A backend with an
 * argmax op takes it on the device and copies only the id (logits is then
 * left as it was); otherwise logits is written as by forward_tokens and the
 * argmax taken on the host. */
int forward_tokens_greedy(struct forward_state *fs, struct kv_pool *pool, struct kv_seq *seq,
                          const int *tokens, int n, float *logits, int *next, struct err *e);
/* forward_tokens with every row's greedy pick instead of its logits (a
 * speculative step's verification): ids[i] = the index of the largest
 * logit of row i (sample_argmax's rule), taken on the device by a backend
 * with argmax_rows (logits left as it was), else on the host from the rows
 * downloaded to logits (room for n rows). n <= max_tokens. */
int forward_tokens_argmax(struct forward_state *fs, struct kv_pool *pool, struct kv_seq *seq,
                          const int *tokens, int n, float *logits, int *ids, struct err *e);
/* forward_tokens_greedy for sampled decoding: *next = the token the
 * backend's sample_rows picks from the last row with sp (parameters and
 * draw), logits left as it was; a backend without sample_rows writes the
 * last row to logits as forward_tokens does and sets *next = -1 (sample it
 * on the host: sampler_pick with sp->u). */
int forward_tokens_sampled(struct forward_state *fs, struct kv_pool *pool, struct kv_seq *seq,
                           const int *tokens, int n, float *logits,
                           const struct sample_params *sp, int *next, struct err *e);

/* Greedy decoding of one sequence one step ahead of the host: a step is
 * queued before the previous step's id reaches the host, so the device does
 * not wait for the host's turn between steps (copying the id, deciding to
 * go on, issuing the next step). A backend with argmax_async keeps each id
 * on the device for the next step; on another every step runs at once and
 * its id waits in the queue, so callers have one loop for both:
 *
 *     forward_pipe_issue(fs, pool, seq, &tok, e);      the first step
 *     for (;;) {
 *         if (more steps may follow) forward_pipe_issue(fs, pool, seq, NULL, e);
 *         forward_pipe_take(fs, &next, e);             the oldest step's id
 *         if (next ends it) { forward_pipe_drop(fs, e); break; }
 *     }
 *
 * forward_pipe_issue: the decode step of one token at seq's next position,
 *   *tok or (tok NULL) the id of the step issued last; at most two steps
 *   in flight. seq moves past the token at once.
 * forward_pipe_take: waits for the oldest step in flight, *next = its id
 *   (forward_tokens_greedy's).
 * forward_pipe_drop: waits for every step in flight and drops their ids.
 *   A dropped step's K/V stay in seq: the token it was fed is the
 *   sequence's (a stop token the caller took), only its pick is unused.
 * Other forward calls on fs fail while steps are in flight. The ids are
 * those forward_tokens_greedy gives, step by step. */
int forward_pipe_issue(struct forward_state *fs, struct kv_pool *pool, struct kv_seq *seq,
                       const int *tok, struct err *e);
int forward_pipe_take(struct forward_state *fs, int *next, struct err *e);
int forward_pipe_drop(struct forward_state *fs, struct err *e);
/* Whether fs's backend keeps the pipe's ids on the device (argmax_async
 * and argmax_take): only then does decoding ahead save the host's turn. */
bool forward_pipe_on_device(const struct forward_state *fs);

/* One sequence's part of a ragged step: n new tokens at positions
 * seq->n_tokens.. (a decode token or a prefill chunk). logits: the step
 * returns the logits of its last row, or, when next is set too, only its
 * token, so that row never crosses to the host:
 *   - sample NULL (or its temperature <= 0): *next = the greedy token, the
 *     index of the largest last-row logit (the lowest on ties, NaNs never
 *     win: sample_argmax's rule), taken on the device when the backend can
 *     (argmax_rows / argmax), else on the host from the downloaded row;
 *   - sample set: *next = the token the backend's sample_rows picks with
 *     those parameters and draw. A backend without it returns the logits
 *     row as for a segment without next and sets *next = -1: the caller
 *     then samples on the host (sampler_pick, same draw). */
struct forward_seg {
    struct kv_seq *seq;
    const int *tokens;
    int n;
    bool logits;
    int *next;                         /* host; NULL: return the logits row */
    const struct sample_params *sample; /* host; with next: sample, see above */
    /* host; with next, on a backend with row_logprobs: also the picked
     * token's log-probability and its row's lp_k most likely ids' */
    struct token_logprobs *lp;
    int lp_k;
};

/* One step over n_seg segments of distinct sequences; their tokens total at
 * most fs->max_tokens. The matmuls run once over all rows; RoPE, the K/V
 * store and attention run per segment. Reserves K/V blocks (fails with a
 * message when the pool is exhausted; the caller may reserve first), appends
 * every segment's K/V, writes the token of each segment with logits and
 * next set to *next (see struct forward_seg), and the logits rows of the
 * other segments with logits set (next NULL, or sampled without
 * sample_rows), in segment order, to logits (host, [rows][vocab]): the LM
 * head runs over just the rows with logits. logits must have room for one
 * row per segment with logits set (greedy ones included: without a device
 * argmax their rows are downloaded behind the others and reduced on the
 * host); rows past the returned ones are scratch. */
int forward_batch(struct forward_state *fs, struct kv_pool *pool, struct forward_seg *segs,
                  int n_seg, float *logits, struct err *e);

#endif
