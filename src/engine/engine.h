/* engine.h - the generation engine: one thread that owns the model, the KV
 * pool and the forward state, fed by a bounded request queue. Requests come
 * in as token ids and go out as a stream of token events on a per-request
 * channel; the HTTP side never blocks the engine and never touches the model.
 *
 * Scheduling is continuous batching: every step runs the decode tokens of up
 * to max_running sequences plus prefill chunks of newly admitted ones as one
 * ragged batch; max_running 1 is strict serial (FIFO, one at a time).
 *
 * Ownership: the caller allocates a request with engine_request_new, submits
 * it, reads events with engine_request_next until a final event, and drops
 * its reference with engine_request_release. The engine holds its own
 * reference while the request is queued or running, so either side may go
 * first (a disconnected client releases early; the engine notices the
 * cancel flag at the next step and frees the sequence). */
#ifndef CLLM_ENGINE_ENGINE_H
#define CLLM_ENGINE_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/err.h"
#include "engine/logits.h"
#include "engine/sampler.h"
#include "grammar/grammar.h"
#include "model/model.h"

struct engine;
struct engine_request;

struct engine_config {
    int n_threads;       /* CPU threads; <= 0 all cores */
    int ctx_len;         /* max tokens per sequence (prompt + generated) */
    int kv_tokens;       /* KV pool capacity in tokens (>= ctx_len) when
                          * memory_budget_bytes is 0 */
    int prefill_chunk;   /* tokens per prefill forward (<= 0: 2048 on a device backend such as
                          * CUDA, 128 on the CPU) */
    int prefill_chunk_shared; /* prompt tokens, all prefills together, of a step where
                               * running sequences decode too, so that they wait less for
                               * their tokens (<= 0: 512 on a device, 128 on the CPU; at most
                               * prefill_chunk) */
    int max_queue;       /* waiting requests before submit fails (429) */
    const char *device;  /* "cpu" (NULL), "cuda[:N]", "auto"; see backend_create */
    /* Prompt (prefix) cache: bytes of K/V that idle cached blocks may keep.
     * 0: the whole pool (default); < 0: no prompt cache. */
    long long prompt_cache_bytes;
    /* Sequences running at once (--batch; <= 0: 8; 1 = strict serial) and
     * tokens per step (decodes + prefill chunks; <= 0: prefill_chunk +
     * max_running). */
    int max_running;
    int batch_tokens;
    /* --kv-budget: bytes of projected KV (prompt + max_tokens, or the rest
     * of the context when max_tokens is unset, in whole blocks) that the
     * admitted sequences may claim together; a joiner that would push the
     * total over waits in the queue, and a request over it alone is refused
     * at submit (ENGINE_SUBMIT_ADMISSION). <= 0: no budget. */
    long long kv_budget_bytes;
    /* How the KV pool is sized (--memory-budget), once the backend exists
     * and the weights are loaded, in blocks of the backend's KV element
     * type:
     *   0: kv_tokens (at least ctx_len): cllm run, tests, benches;
     *   > 0: a budget for weights + pool: the pool gets what the weights
     *        (model_weight_bytes_per_token) leave; engine_create fails when
     *        they alone exceed it or leave less than two blocks;
     *   ENGINE_MEMORY_DEFAULT: the spec's default: 75% of RAM (the cgroup
     *        limit when lower) minus the weights on the CPU; the device's
     *        free memory after weights and activations, less a margin
     *        (max(1 GiB, 10%)), on CUDA; either capped at what can be used:
     *        max_running sequences of ctx_len tokens plus the prompt cache's
     *        share (prompt_cache_bytes; by default as much again, at most
     *        8 GiB; none when the cache is off).
     * A pool of fewer than ctx_len tokens lowers ctx_len to what it holds
     * (engine_get_stats reports both). */
    long long memory_budget_bytes;
    /* Tokens per KV block (--kv-block-size): the unit of the pool, of
     * prefix sharing and of admission; <= 0: ENGINE_KV_BLOCK_DEFAULT. A
     * power of two, 8..256 (engine_create refuses others). */
    int kv_block_size;
    /* --ssd-cache DIR: the prompt cache's SSD tier (kv/kv_disk.h) under DIR,
     * or NULL. Blocks the RAM cache evicts, and those the engine has not yet
     * written while idle, become files; a prompt whose chain continues past
     * the RAM cache is restored from them, across restarts. ssd_max_bytes
     * (--ssd-cache-max) caps the files (<= 0: no cap). */
    const char *ssd_dir;
    long long ssd_max_bytes;
    /* Speculation: a sequence decoding alone drafts up to spec_draft tokens
     * (1..ENGINE_SPEC_MAX; 0 off) and keeps those the model's own picks
     * confirm (engine.c). The drafts come from draft_model when it is set
     * (--draft-model: its greedy picks; it must read token ids as m does,
     * and outlive the engine), else from an earlier occurrence of the
     * sequence's last ngram_max .. ngram_min tokens (--draft-kind ngram). */
    int spec_draft, ngram_min, ngram_max;
    const struct model *draft_model;
    /* with draft_model: a round's drafts stop before the first the draft
     * model gives less than this probability (0..1; 0: never) */
    float draft_p_min;
    /* A greedy sequence decoding alone queues each step before the last
     * one's id is read (engine.c, "one step ahead"): 0 when the backend
     * keeps that id on the device (argmax_async: CUDA), 1 always (tests:
     * on another backend each step then runs at once, a step ahead of the
     * events), -1 never. */
    int decode_ahead;
    /* Decode steps recorded as graphs and replayed (--compiled-decode), on
     * backends that have them (CUDA), the draft model's too: 1 on, -1 off,
     * 0 the backend's default (on, or CLLM_COMPILED_DECODE). The same
     * outputs either way. */
    int compiled_decode;
};

#define ENGINE_SPEC_MAX 32

#define ENGINE_MEMORY_DEFAULT (-1LL)
/* Measured with `cllm bench --batch` (docs/benchmarks.md): no block size
 * from 8 to 64 changed the CPU's aggregate decode speed beyond noise, and
 * 16 loses the fewest tokens to a prefix match's last partial block. */
#define ENGINE_KV_BLOCK_DEFAULT 16

/* engine_submit's result: 0 on success, else one of these (< 0). */
enum engine_submit_error {
    ENGINE_SUBMIT_BUSY = -1,      /* queue full or shutting down (429 / 503) */
    ENGINE_SUBMIT_INVALID = -2,   /* prompt too long, bad token id (400) */
    ENGINE_SUBMIT_ADMISSION = -3, /* projected KV over --kv-budget alone (400 memory_admission) */
};

enum engine_finish {
    ENGINE_FINISH_NONE = 0,
    ENGINE_FINISH_STOP,      /* EOS / stop token */
    ENGINE_FINISH_LENGTH,    /* max_tokens or context exhausted */
    ENGINE_FINISH_CANCELLED, /* engine_request_cancel (client gone, stop string) */
    ENGINE_FINISH_ERROR,     /* message in the event */
};

struct engine_event {
    int token;                 /* valid when finish == NONE */
    enum engine_finish finish; /* != NONE on the final event */
    int n_prompt, n_generated; /* running usage counts */
    int n_cached;              /* prompt tokens served from cache */
    /* this request's speculation so far: verify steps, drafts fed, drafts
     * kept (0 without speculation) */
    int spec_steps, spec_drafted, spec_accepted;
    /* with engine_params.logprobs, on a token event: its log-probability
     * and the top_logprobs most likely ids' (logits.h) */
    bool has_logprobs;
    struct token_logprobs lp;
    /* with engine_params.prompt_logprobs: an event per prompt token, in
     * order and before any generated one (token = the prompt's id, the
     * first without logprobs: nothing predicts it); not counted as
     * generated */
    bool prompt;
    /* when the engine queued it: CLOCK_MONOTONIC seconds, so a reader that
     * was not scheduled when it came still knows (cllm bench's windows) */
    double t;
    char error[256];
};

struct engine_params {
    struct sampler_params sp;
    int max_tokens;         /* <= 0: until EOS or the context is full */
    bool ignore_eos;
    const int *stop_ids;    /* extra ids that end generation (copied) */
    int n_stop_ids;
    /* Structured output: every generated token must continue a sentence of
     * grammar (its bytes from grammar_vocab), which the request takes over
     * when engine_request_new succeeds (the caller frees it otherwise). The
     * end-of-sequence ids and stop_ids are allowed only where the sentence
     * may end, and generation stops once nothing may follow. The vocabulary
     * is borrowed: it must outlive the request. Both NULL: unconstrained. */
    struct grammar *grammar;
    const struct grammar_vocab *grammar_vocab;
    /* logit_bias and repetition penalties (logits.h; the bias arrays are
     * copied) */
    struct logits_params proc;
    /* every token event carries its log-probability and those of the
     * top_logprobs (0..LOGPROBS_TOP_MAX) most likely ids */
    bool logprobs;
    int top_logprobs;
    /* the prompt's tokens' logprobs too (completions' echo): the prompt is
     * computed outside the prefix cache, a few rows at a time */
    bool prompt_logprobs;
    /* generate nothing (completions' max_tokens 0): the request ends, as
     * LENGTH, once its prompt's logprobs are out (prompt_logprobs), else at
     * once */
    bool prompt_only;
};

struct engine *engine_create(const struct model *m, const struct engine_config *cfg,
                             struct err *e);
/* Stops the engine thread after cancelling queued and running requests. */
void engine_destroy(struct engine *eng);

/* Copies prompt and params. NULL with a message on invalid params. */
struct engine_request *engine_request_new(const int *prompt, int n_prompt,
                                          const struct engine_params *p, struct err *e);
/* Queues the request. Fails (without taking it, err says why, a negative
 * enum engine_submit_error) when the queue is full (the HTTP layer answers
 * 429), the prompt does not fit the context (400 with the numbers), or its
 * projected KV alone exceeds the KV budget (400 memory_admission). */
int engine_submit(struct engine *eng, struct engine_request *r, struct err *e);
/* engine_submit for n requests at once, all or none: they enter the queue
 * together, so the engine's next step sees every one of them (what a
 * scheduling test needs to be independent of thread timing). */
int engine_submit_many(struct engine *eng, struct engine_request *const *rs, int n,
                       struct err *e);
/* Waits up to timeout_ms for the next event. Returns 1 with an event, 0 on
 * timeout. After a final event (finish != NONE) no more events come. */
int engine_request_next(struct engine_request *r, struct engine_event *ev, int timeout_ms);
/* Asks the engine to stop this request at its next step; a request still
 * waiting in the queue leaves it at once (its final event is CANCELLED).
 * Idempotent. Must not race with engine_destroy. */
void engine_request_cancel(struct engine_request *r);
void engine_request_release(struct engine_request *r);

struct engine_stats {
    int queued, running;     /* waiting in the queue; sequences in the batch */
    int pending;             /* queued + preempted (waiting to resume) */
    int max_running;         /* --batch */
    int prefill_chunk;       /* prompt tokens a forward (--prefill-chunk or the default) */
    int prefill_chunk_shared; /* the same beside decoding sequences */
    uint64_t preemptions;    /* sequences preempted under block pressure */
    uint64_t spec_steps, spec_drafted, spec_accepted; /* speculation: verify steps,
                                                       * drafts fed, drafts kept */
    char spec_error[256];    /* why a draft model stopped drafting ("" while it drafts) */
    /* the draft model's tokens: fed through it, and taken from its prefix
     * index instead */
    uint64_t draft_computed, draft_cached;
    long long draft_bytes;   /* the draft model's weights and K/V (0: none) */
    uint64_t batch_steps, batch_rows; /* forward steps; sequences summed over them */
    uint64_t steps_ahead; /* of them, queued before the step before them was read */
    /* requests submitted, ended cancelled, ended by EOS / a stop token / the
     * length (every request ends as exactly one of those or an error) */
    uint64_t requests_total, requests_cancelled, requests_completed, tokens_prompt,
        tokens_generated;
    int kv_blocks_total, kv_blocks_free;
    int kv_block_tokens;           /* tokens per block */
    long long kv_block_bytes;      /* bytes of one pool block (all layers, K and V) */
    int ctx_len;                   /* tokens per sequence (after the pool sizing) */
    char kv_sizing[160];           /* how the pool was sized: "--memory-budget",
                                    * "default: 75% of RAM", "default: free GPU
                                    * memory" (", capped at ..." when the cap
                                    * applied), "kv_tokens" */
    char device[128];              /* "cpu" or the device's description */
    long long kv_seq_bytes;        /* bytes of blocks held by sequences (not idle cache) */
    long long kv_budget_bytes;     /* --kv-budget, 0: none */
    long long kv_projected_bytes;  /* projections of the admitted sequences, summed */
    /* prefix cache: requests that reused >= 1 block / none, prompt tokens
     * served from cache, blocks in the index (idle = held only by it),
     * evicted blocks, the idle cap in blocks (0: disabled) */
    uint64_t cache_hits, cache_misses, cache_tokens, cache_evictions;
    int cache_blocks, cache_blocks_idle, cache_max_blocks;
    /* the SSD tier: on, its directory, blocks written / restored / refused
     * (corrupt or foreign files) / removed by the cap, bytes and files on
     * disk, the cap (0: none), the last write failure ("" when none) */
    bool ssd;
    char ssd_dir[512];
    uint64_t ssd_writes, ssd_reads, ssd_bad, ssd_evictions;
    long long ssd_bytes, ssd_files, ssd_max_bytes;
    char ssd_error[256];
};
void engine_get_stats(struct engine *eng, struct engine_stats *out);
/* Changes the prompt cache cap (same meaning as prompt_cache_bytes); < 0
 * empties the index. Applies at once when the engine is idle, else before
 * its next step. */
void engine_set_prompt_cache(struct engine *eng, long long bytes);

#endif
