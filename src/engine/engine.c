/* engine.c - the engine thread, its bounded FIFO queue and the per-request
 * event channels, and the continuous-batching scheduler: each step runs the
 * decode tokens of all running sequences and prefill chunks of admitted ones
 * as one ragged batch (forward_batch), checking every request's cancel flag
 * before it. */
#include "engine/engine.h"
#include "base/clock.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "engine/drafter.h"
#include "kv/kv_cache.h"
#include "kv/kv_disk.h"
#include "kv/prefix_cache.h"
#include "model/forward.h"


struct engine_request {
    int *prompt;
    int n_prompt;
    struct engine_params p;
    int *stop_ids;
    int *bias_ids;           /* p.proc's arrays, owned */
    float *bias;
    atomic_int refs;
    atomic_bool cancel;
    int n_cached;            /* prompt tokens served from the prefix cache */
    int spec_steps, spec_drafted, spec_accepted; /* its speculation (engine thread) */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct engine_event *ev; /* events not yet read: [head, n) */
    int head, n, cap;
    bool done;               /* final event queued */

    /* Queue membership, guarded by the engine lock: a request cancelled
     * while still waiting leaves the queue at once, freeing its slot. */
    struct engine *eng;
    bool queued;
    struct engine_request *next;
};

struct engine {
    const struct model *m;
    struct engine_config cfg;
    struct backend *be;
    struct forward_state fs;
    struct kv_pool pool;
    struct prefix_cache pc;
    struct kv_disk *disk;    /* --ssd-cache, or NULL */
    bool disk_dirty;         /* blocks may lack files: flush while idle */
    struct kv_disk_stats disk_st; /* copied under the lock, for stats */
    struct drafter *drafter; /* --draft-model, or NULL */
    /* The sequence decoding alone one step ahead (ahead_step) whose step,
     * fed its last token, is in flight; NULL when none is. */
    struct seq *ahead;
    int *spec_span;          /* speculation: the last token and the drafts */
    float *spec_logits;      /* their rows */
    float *plp_rows;         /* prompt logprobs: PLP_ROWS rows, made on first use */
    int *match;              /* prefix_cache_lookup's output */
    float *logits;

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct engine_request *q_head, *q_tail;
    /* Scheduler state, touched by the engine thread only (the lock guards
     * the list updates that stats read). run: admission order. pre:
     * preempted, oldest first; they go before new requests. */
    struct seq **run, **pre;
    int n_run, n_pre;
    uint64_t admitted;
    struct cand *cands;
    struct forward_seg *segs;
    int queued, running;     /* running = n_run + n_pre: the engine holds pool state */
    bool stopping;
    bool cap_pending;        /* engine_set_prompt_cache while running */
    long long cap_bytes;
    long long block_bytes;   /* bytes of one pool block */
    int bs;                  /* tokens per pool block (engine_config.kv_block_size) */
    char kv_sizing[160];     /* engine_stats.kv_sizing */
    char device[128];
    long long proj_total;    /* projected KV bytes of run + pre (engine lock) */
    struct engine_stats st;
};

/* ---- request channel ---- */

struct engine_request *engine_request_new(const int *prompt, int n_prompt,
                                          const struct engine_params *p, struct err *e)
{
    if (n_prompt <= 0) {
        err_set(e, "empty prompt");
        return NULL;
    }
    if (p->grammar && !p->grammar_vocab) {
        err_set(e, "a grammar needs the vocabulary to match tokens against");
        return NULL;
    }
    struct sampler tmp;
    if (sampler_init(&tmp, &p->sp, 1, e))
        return NULL;
    sampler_free(&tmp);
    if (p->logprobs && (p->top_logprobs < 0 || p->top_logprobs > LOGPROBS_TOP_MAX)) {
        err_set(e, "top_logprobs must be in [0, %d] (got %d)", LOGPROBS_TOP_MAX,
                p->top_logprobs);
        return NULL;
    }
    if (logits_params_check(&p->proc, INT32_MAX, e)) /* ids against the model at submit */
        return NULL;
    struct engine_request *r = calloc(1, sizeof *r);
    if (!r)
        goto oom;
    r->prompt = malloc(sizeof(int) * (size_t)n_prompt);
    r->stop_ids = malloc(sizeof(int) * (size_t)(p->n_stop_ids > 0 ? p->n_stop_ids : 1));
    int nb = p->proc.n_bias > 0 ? p->proc.n_bias : 1;
    r->bias_ids = malloc(sizeof(int) * (size_t)nb);
    r->bias = malloc(sizeof(float) * (size_t)nb);
    if (!r->prompt || !r->stop_ids || !r->bias_ids || !r->bias)
        goto oom;
    memcpy(r->prompt, prompt, sizeof(int) * (size_t)n_prompt);
    r->n_prompt = n_prompt;
    r->p = *p;
    if (p->n_stop_ids > 0)
        memcpy(r->stop_ids, p->stop_ids, sizeof(int) * (size_t)p->n_stop_ids);
    r->p.stop_ids = r->stop_ids;
    if (p->proc.n_bias > 0) {
        memcpy(r->bias_ids, p->proc.bias_ids, sizeof(int) * (size_t)p->proc.n_bias);
        memcpy(r->bias, p->proc.bias, sizeof(float) * (size_t)p->proc.n_bias);
    }
    r->p.proc.bias_ids = r->bias_ids;
    r->p.proc.bias = r->bias;
    atomic_init(&r->refs, 1);
    atomic_init(&r->cancel, false);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    return r;
oom:
    if (r) {
        free(r->prompt);
        free(r->stop_ids);
        free(r->bias_ids);
        free(r->bias);
        free(r);
    }
    err_set(e, "out of memory");
    return NULL;
}

void engine_request_release(struct engine_request *r)
{
    if (!r || atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->ev);
    free(r->prompt);
    free(r->stop_ids);
    free(r->bias_ids);
    free(r->bias);
    grammar_free(r->p.grammar);
    free(r);
}

static void finish(struct engine_request *r, enum engine_finish why, int n_gen, const char *msg);

void engine_request_cancel(struct engine_request *r)
{
    atomic_store(&r->cancel, true);
    struct engine *eng = r->eng;
    if (!eng)
        return;
    bool unlinked = false;
    pthread_mutex_lock(&eng->mu);
    if (r->queued) {
        struct engine_request **pp = &eng->q_head, *prev = NULL;
        while (*pp && *pp != r) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp) {
            *pp = r->next;
            if (eng->q_tail == r)
                eng->q_tail = prev;
            eng->queued--;
            eng->st.requests_cancelled++;
            r->queued = false;
            unlinked = true;
        }
    }
    pthread_mutex_unlock(&eng->mu);
    if (unlinked) {
        finish(r, ENGINE_FINISH_CANCELLED, 0, NULL);
        engine_request_release(r); /* the queue's reference */
    }
}

static void push_event(struct engine_request *r, const struct engine_event *ev)
{
    pthread_mutex_lock(&r->mu);
    if (!r->done) {
        if (r->n == r->cap) {
            if (r->head > 0) { /* reuse consumed space before growing */
                memmove(r->ev, r->ev + r->head, sizeof *r->ev * (size_t)(r->n - r->head));
                r->n -= r->head;
                r->head = 0;
            }
            if (r->n == r->cap) {
                int cap = r->cap ? r->cap * 2 : 16;
                struct engine_event *ne = realloc(r->ev, sizeof *ne * (size_t)cap);
                if (!ne) { /* cannot queue: end the stream with what fits */
                    r->done = true;
                    pthread_cond_broadcast(&r->cv);
                    pthread_mutex_unlock(&r->mu);
                    return;
                }
                r->ev = ne;
                r->cap = cap;
            }
        }
        r->ev[r->n] = *ev;
        r->ev[r->n++].t = clock_now_s();
        if (ev->finish != ENGINE_FINISH_NONE)
            r->done = true;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

int engine_request_next(struct engine_request *r, struct engine_event *ev, int timeout_ms)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&r->mu);
    while (r->head == r->n) {
        if (pthread_cond_timedwait(&r->cv, &r->mu, &dl) == ETIMEDOUT && r->head == r->n) {
            pthread_mutex_unlock(&r->mu);
            return 0;
        }
    }
    *ev = r->ev[r->head++];
    pthread_mutex_unlock(&r->mu);
    return 1;
}

/* ---- generation ---- */

static void finish(struct engine_request *r, enum engine_finish why, int n_gen, const char *msg)
{
    struct engine_event ev = {.token = -1, .finish = why, .n_prompt = r->n_prompt,
                              .n_generated = n_gen, .n_cached = r->n_cached,
                              .spec_steps = r->spec_steps, .spec_drafted = r->spec_drafted,
                              .spec_accepted = r->spec_accepted};
    if (msg)
        snprintf(ev.error, sizeof ev.error, "%s", msg);
    push_event(r, &ev);
}

static bool is_stop(const struct engine *eng, const struct engine_request *r, int tok)
{
    if (!r->p.ignore_eos)
        for (int i = 0; i < eng->m->cfg.n_eos; i++)
            if (tok == eng->m->cfg.eos_ids[i])
                return true;
    for (int i = 0; i < r->p.n_stop_ids; i++)
        if (tok == r->p.stop_ids[i])
            return true;
    return false;
}

/* ---- scheduler ----
 *
 * Every step builds one ragged batch: the decode token of each running
 * sequence plus prefill chunks of the others (admission order) up to the
 * step's token budget, and runs it through forward_batch. A sequence's
 * tokens (prompt, then generated ids) live in seq->toks; its K/V cover
 * toks[0, kv.n_tokens). Whenever the K/V catch up with toks, the step
 * returns that sequence's logits and it samples its next token; so decode
 * is a one-token span and a preempted sequence resumes by recomputing
 * (mostly from the prefix cache) what it had, then sampling on. */

struct seq {
    struct engine_request *r;
    struct kv_seq kv;
    struct sampler smp;
    int *toks, n_toks;       /* prompt + generated ids */
    int n_gen, max_gen;
    uint64_t order;          /* admission order: larger = younger */
    long long proj;          /* projected KV bytes, counted in eng->proj_total */
    bool prompt_done;        /* the original prompt was prefilled once */
    struct grammar_matcher *gm; /* structured output: where the text stands */
    /* the row comes back to the host (a grammar, logits processing, or
     * logprobs where the backend cannot make them); processed: bias or
     * penalties; raw: the row before processing, when logprobs need it;
     * mark: logits_process's scratch */
    bool host_row, processed;
    float *raw;
    uint8_t *mark;
    int plp_next; /* prompt_logprobs: the next prompt index to report */
    /* speculation's back-off: steps left without drafts, and how many the
     * next round that keeps none will skip */
    int spec_skip, spec_backoff;
};

static void seq_free(struct seq *s)
{
    sampler_free(&s->smp);
    grammar_matcher_free(s->gm);
    free(s->raw);
    free(s->mark);
    free(s->toks);
    free(s);
}

static void list_remove(struct seq **a, int *n, struct seq *s)
{
    for (int i = 0; i < *n; i++)
        if (a[i] == s) {
            memmove(a + i, a + i + 1, sizeof *a * (size_t)(*n - i - 1));
            (*n)--;
            return;
        }
}

/* Ends a sequence: final event, prefix registration, blocks back at once. */
static void retire(struct engine *eng, struct seq *s, enum engine_finish why, const char *msg)
{
    struct engine_request *r = s->r;
    /* Index every full block computed (prompt and generated), then drop the
     * sequence's references: indexed blocks stay cached, idle. */
    if (why != ENGINE_FINISH_ERROR && s->kv.n_blocks > 0)
        prefix_cache_register(&eng->pc, &s->kv, s->toks);
    kv_seq_release(&eng->pool, &s->kv);
    /* counted before the final event goes out: a client that has its
     * answer finds it in the stats */
    pthread_mutex_lock(&eng->mu);
    eng->st.tokens_generated += (uint64_t)s->n_gen;
    if (why == ENGINE_FINISH_CANCELLED)
        eng->st.requests_cancelled++;
    else if (why == ENGINE_FINISH_STOP || why == ENGINE_FINISH_LENGTH)
        eng->st.requests_completed++;
    list_remove(eng->run, &eng->n_run, s);
    list_remove(eng->pre, &eng->n_pre, s);
    eng->running = eng->n_run + eng->n_pre;
    eng->proj_total -= s->proj;
    pthread_mutex_unlock(&eng->mu);
    finish(r, why, s->n_gen, msg);
    seq_free(s);
    engine_request_release(r);
}

/* Frees the youngest running sequence's blocks (its full blocks stay in
 * the prefix cache) and requeues it ahead of new requests. */
static void preempt(struct engine *eng, struct seq *s)
{
    prefix_cache_register(&eng->pc, &s->kv, s->toks);
    kv_seq_release(&eng->pool, &s->kv);
    pthread_mutex_lock(&eng->mu);
    list_remove(eng->run, &eng->n_run, s);
    int i = eng->n_pre; /* oldest first */
    while (i > 0 && eng->pre[i - 1]->order > s->order) {
        eng->pre[i] = eng->pre[i - 1];
        i--;
    }
    eng->pre[i] = s;
    eng->n_pre++;
    eng->st.preemptions++;
    pthread_mutex_unlock(&eng->mu);
}

static int blocks_for(const struct engine *eng, int n_tokens)
{
    return (n_tokens + eng->pool.block_size - 1) / eng->pool.block_size;
}

/* Blocks the running sequences still need to reach their known tokens. */
static int blocks_outstanding(const struct engine *eng)
{
    int n = 0;
    for (int i = 0; i < eng->n_run; i++) {
        const struct seq *s = eng->run[i];
        int need = blocks_for(eng, s->n_toks + 1) - s->kv.n_blocks;
        n += need > 0 ? need : 0;
    }
    return n;
}

/* Tokens a request may come to hold in the KV: its prompt plus max_tokens,
 * or plus the rest of the context when max_tokens is unset. */
static int projected_tokens(const struct engine *eng, const struct engine_request *r)
{
    int room = eng->cfg.ctx_len - r->n_prompt;
    if (r->p.max_tokens > 0 && r->p.max_tokens < room)
        room = r->p.max_tokens;
    return r->n_prompt + (room > 0 ? room : 0);
}

/* The same in bytes, whole blocks (what --kv-budget counts). */
static long long projected_bytes(const struct engine *eng, const struct engine_request *r)
{
    return (long long)blocks_for(eng, projected_tokens(eng, r)) * eng->block_bytes;
}

/* A new sequence for a request taken off the queue (engine lock held). */
static struct seq *seq_new(struct engine *eng, struct engine_request *r, struct err *e)
{
    struct seq *s = calloc(1, sizeof *s);
    if (!s || !(s->toks = malloc(sizeof(int) * (size_t)eng->cfg.ctx_len))) {
        free(s);
        err_set(e, "out of memory");
        return NULL;
    }
    if (sampler_init(&s->smp, &r->p.sp, eng->m->cfg.vocab_size, e)) {
        free(s->toks);
        free(s);
        return NULL;
    }
    if (r->p.grammar && !(s->gm = grammar_matcher_new(r->p.grammar, r->p.grammar_vocab, e))) {
        seq_free(s);
        return NULL;
    }
    const size_t vocab = (size_t)eng->m->cfg.vocab_size;
    s->processed = logits_params_active(&r->p.proc);
    /* logprobs alone: the device's pick and statistics where the backend
     * makes them (row_logprobs), else the row */
    s->host_row = s->gm || s->processed || (r->p.logprobs && !eng->be->ops->row_logprobs);
    if ((s->processed && !(s->mark = calloc(vocab, 1))) ||
        (r->p.logprobs && (s->gm || s->processed) && !(s->raw = malloc(vocab * sizeof(float))))) {
        seq_free(s);
        err_set(e, "out of memory");
        return NULL;
    }
    s->r = r;
    memcpy(s->toks, r->prompt, sizeof(int) * (size_t)r->n_prompt);
    s->n_toks = r->n_prompt;
    s->max_gen = eng->cfg.ctx_len - r->n_prompt;
    if (r->p.max_tokens > 0 && r->p.max_tokens < s->max_gen)
        s->max_gen = r->p.max_tokens;
    return s;
}

/* Admits preempted sequences, then queued requests, in order, while the
 * batch has room and the pool has blocks for their tokens. Engine lock
 * held; returns requests that failed to start (their errors in errs). */
static void admit(struct engine *eng)
{
    while (eng->n_run < eng->cfg.max_running) {
        bool resumed = eng->n_pre > 0;
        struct seq *s = resumed ? eng->pre[0] : NULL;
        struct engine_request *r = resumed ? s->r : eng->q_head;
        if (!r)
            return;
        const int *toks = resumed ? s->toks : r->prompt;
        int n = resumed ? s->n_toks : r->n_prompt;
        /* Start on the longest cached chain of full blocks, but compute at
         * least the last known token (its logits are needed); not where
         * the prompt's rows are still to be reported. */
        int n_match = 0;
        if (!r->p.prompt_logprobs || (s && s->plp_next >= r->n_prompt)) {
            n_match = prefix_cache_lookup(&eng->pc, toks, n, (n - 1) / eng->bs, eng->match);
            n_match = prefix_cache_restore(&eng->pc, toks, n, (n - 1) / eng->bs, eng->match,
                                           n_match);
        }
        int avail = eng->pool.n_free + eng->pc.n_idle - blocks_outstanding(eng);
        if (eng->n_run > 0 && blocks_for(eng, n + 1) - n_match > avail)
            return; /* wait for blocks */
        /* --kv-budget: a joiner waits (arrival order kept) until the
         * admitted sequences' projections leave room for its own. */
        if (!resumed && eng->cfg.kv_budget_bytes > 0 && eng->n_run + eng->n_pre > 0 &&
            eng->proj_total + projected_bytes(eng, r) > eng->cfg.kv_budget_bytes)
            return;
        struct err e = {{0}};
        if (resumed) {
            memmove(eng->pre, eng->pre + 1, sizeof *eng->pre * (size_t)(eng->n_pre - 1));
            eng->n_pre--;
        } else {
            eng->q_head = r->next;
            if (!eng->q_head)
                eng->q_tail = NULL;
            r->queued = false;
            eng->queued--;
            s = seq_new(eng, r, &e);
            if (!s) {
                finish(r, ENGINE_FINISH_ERROR, 0, e.msg);
                engine_request_release(r);
                continue;
            }
            s->order = ++eng->admitted;
            s->proj = projected_bytes(eng, r);
            eng->proj_total += s->proj;
        }
        if (n_match > 0 && prefix_cache_attach(&eng->pc, &s->kv, eng->match, n_match, &e)) {
            eng->run[eng->n_run++] = s; /* retire() unlinks it */
            eng->running = eng->n_run + eng->n_pre;
            pthread_mutex_unlock(&eng->mu);
            retire(eng, s, ENGINE_FINISH_ERROR, e.msg);
            pthread_mutex_lock(&eng->mu);
            continue;
        }
        if (!resumed) {
            r->n_cached = s->kv.n_tokens;
            if (eng->pc.max_idle > 0) {
                if (n_match > 0)
                    eng->st.cache_hits++;
                else
                    eng->st.cache_misses++;
                eng->st.cache_tokens += (uint64_t)r->n_cached;
            }
        }
        eng->run[eng->n_run++] = s;
        eng->running = eng->n_run + eng->n_pre;
    }
}

struct cand {
    struct seq *s;
    int n;
    int tok;                  /* the id the step took (greedy or sampled), -1: none */
    struct sample_params sp;  /* a sampled sequence's parameters and draw */
    struct token_logprobs lp; /* with logprobs and no host row: the step's statistics */
};

/* Appends the sequence's next token (sampled from its logits row, or its
 * greedy id from the step): stop checks, the event, the length limit.
 * False when that ended the sequence (it is retired and freed). */
static bool take_token(struct engine *eng, struct seq *s, int tok,
                       const struct token_logprobs *lp)
{
    struct engine_request *r = s->r;
    if (is_stop(eng, r, tok)) {
        retire(eng, s, ENGINE_FINISH_STOP, NULL);
        return false;
    }
    struct err e = {{0}};
    if (s->gm && grammar_matcher_feed_token(s->gm, tok, &e)) { /* the mask allowed it: a bug */
        retire(eng, s, ENGINE_FINISH_ERROR, e.msg);
        return false;
    }
    s->n_gen++;
    struct engine_event ev = {.token = tok, .n_prompt = r->n_prompt, .n_generated = s->n_gen,
                              .n_cached = r->n_cached, .has_logprobs = lp != NULL,
                              .spec_steps = r->spec_steps, .spec_drafted = r->spec_drafted,
                              .spec_accepted = r->spec_accepted};
    if (lp)
        ev.lp = *lp;
    push_event(r, &ev);
    if (s->gm && grammar_matcher_must_end(s->gm)) { /* the sentence is whole */
        retire(eng, s, ENGINE_FINISH_STOP, NULL);
        return false;
    }
    if (s->n_gen == s->max_gen) {
        retire(eng, s, ENGINE_FINISH_LENGTH, NULL);
        return false;
    }
    s->toks[s->n_toks++] = tok;
    return true;
}

/* Structured output: only tokens that continue the grammar keep their
 * logits; the end ids (EOS unless ignored, stop ids) only where the
 * sentence may end. Retires the sequence (and returns -1) when nothing in
 * the vocabulary can continue it. */
static int mask_row(struct engine *eng, struct seq *s, float *row)
{
    const struct engine_request *r = s->r;
    int ends[64], n = 0;
    for (int i = 0; !r->p.ignore_eos && i < eng->m->cfg.n_eos && n < 64; i++)
        ends[n++] = eng->m->cfg.eos_ids[i];
    for (int i = 0; i < r->p.n_stop_ids && n < 64; i++)
        ends[n++] = r->p.stop_ids[i];
    struct err e = {{0}};
    int left = grammar_matcher_mask(s->gm, row, ends, n, &e);
    if (left > 0)
        return 0;
    retire(eng, s, ENGINE_FINISH_ERROR,
           left < 0 ? e.msg : "the grammar allows no token of the vocabulary here");
    return -1;
}

/* ---- speculation: prompt-lookup drafts, verified in one forward ----
 *
 * A sequence decoding alone (the common case of one agent talking to the
 * server) proposes the tokens that followed an earlier occurrence of its
 * own last n tokens (n from ngram_max down to ngram_min; the first
 * occurrence in the prompt and what it generated wins), feeds its
 * last token and the drafts as one span, and keeps the drafts up to the
 * first the row's pick rejects, plus that pick. Greedy: every kept token
 * is the model's argmax after the ones before it, so the output is what
 * one token a step gives, in fewer steps when drafts land — up to the few
 * ulps a row of a longer span may differ by (design.md, "Batch
 * invariance"): a near-tie may resolve the other way, as in a batch.
 * Sampled: speculative sampling (sampler_verify), whose tokens follow the
 * same distribution as one-at-a-time sampling's; a seed still gives the
 * same tokens run to run, but other ones than without speculation (the
 * draws are spent differently). */

/* Plain steps after a run of rounds that kept nothing (docs/benchmarks.md,
 * "Two-model speculation": with nothing kept, a round of 3 drafts costs the
 * 8B two steps' time; backing off to 16 brings that to ~5% over plain). */
#define SPEC_BACKOFF_MAX 16

/* A round that keeps nothing cost a verify of its rows (and a draft
 * model's steps) for one token, and a draft model that declines to draft
 * (--draft-p-min) cost it a step for none: after either, decode 1, 2, 4
 * .. 16 steps plainly before trying again, until a round keeps something.
 * It depends on the tokens alone, so a request's steps (and a seed's
 * draws) are the same run to run. */
static void spec_back_off(struct seq *s)
{
    s->spec_backoff = s->spec_backoff ? s->spec_backoff * 2 : 1;
    s->spec_backoff = s->spec_backoff < SPEC_BACKOFF_MAX ? s->spec_backoff : SPEC_BACKOFF_MAX;
    s->spec_skip = s->spec_backoff;
}

/* Up to max drafts for s into d: the tokens after the first earlier
 * occurrence of its last n tokens, longest n first. */
static int propose(const struct engine *eng, const struct seq *s, int *d, int max)
{
    const int *t = s->toks, L = s->n_toks;
    for (int n = eng->cfg.ngram_max; n >= eng->cfg.ngram_min; n--) {
        if (n >= L)
            continue;
        const int *tail = t + L - n;
        for (int i = 0; i + n < L; i++) {
            if (memcmp(t + i, tail, sizeof *t * (size_t)n))
                continue;
            int k = 0;
            while (k < max && i + n + k < L)
                d[k] = t[i + n + k], k++;
            if (k > 0)
                return k;
        }
    }
    return 0;
}

/* A decode of s alone, with drafts: returns 1 when it ran (tokens
 * taken), 0 when there was nothing to try (the caller steps as usual), -1
 * when the forward failed (s retired). */
static int spec_step(struct engine *eng, struct seq *s)
{
    const int vocab = eng->m->cfg.vocab_size;
    int room = s->max_gen - s->n_gen - 1; /* the last token needs no draft */
    int ctx_room = eng->cfg.ctx_len - s->n_toks - 1;
    int max = eng->cfg.spec_draft;
    max = max < room ? max : room;
    max = max < ctx_room ? max : ctx_room;
    max = max < eng->fs.max_tokens - 1 ? max : eng->fs.max_tokens - 1; /* one forward */
    int *span = eng->spec_span;
    struct err e = {{0}};
    int k = 0;
    if (max > 0 && eng->drafter) {
        k = drafter_propose(eng->drafter, s->toks, s->n_toks, vocab, eng->cfg.draft_p_min,
                            span + 1, max, &e);
        struct drafter_stats ds;
        drafter_get_stats(eng->drafter, &ds);
        pthread_mutex_lock(&eng->mu);
        eng->st.draft_computed = ds.computed;
        eng->st.draft_cached = ds.cached;
        if (k < 0)
            snprintf(eng->st.spec_error, sizeof eng->st.spec_error, "%s", e.msg);
        pthread_mutex_unlock(&eng->mu);
        if (k < 0) { /* the request goes on without drafts, and so do later ones */
            fprintf(stderr, "cllm: speculation off: %s\n", e.msg);
            eng->cfg.spec_draft = 0;
            return 0;
        }
        if (k == 0)
            spec_back_off(s);
    } else if (max > 0) {
        k = propose(eng, s, span + 1, max);
    }
    if (k == 0)
        return 0;
    int base = s->kv.n_tokens; /* = n_toks - 1: the last token has no K/V yet */
    if (kv_seq_reserve(&eng->pool, &s->kv, base + k + 1, &e))
        return 0; /* no room for the drafts now: one token, as usual */
    span[0] = s->toks[s->n_toks - 1];
    /* Greedy, each row's pick is all the step needs: taken where the rows
     * are (on a GPU only the ids cross). */
    bool greedy = sampler_is_greedy(&s->smp);
    int a = 0, pick[ENGINE_SPEC_MAX + 1];
    if (greedy ? forward_tokens_argmax(&eng->fs, &eng->pool, &s->kv, span, k + 1,
                                       eng->spec_logits, pick, &e)
               : forward_tokens(&eng->fs, &eng->pool, &s->kv, span, k + 1, true,
                                eng->spec_logits, &e)) {
        retire(eng, s, ENGINE_FINISH_ERROR, e.msg);
        return -1;
    }
    /* Greedy: a draft is kept when it is the row's argmax. Sampled: kept
     * with the row's probability of it, else the row's pick without it
     * (sampler_verify: speculative sampling, whose tokens are distributed
     * as one-at-a-time sampling's); after every draft kept, the next row's
     * own pick. Two draws a verified draft, one for the last pick. */
    for (int i = 0; i <= k; i++) {
        const float *row = eng->spec_logits + (size_t)i * vocab;
        if (greedy) { /* the forward picked */
        } else if (i == k) {
            pick[i] = sampler_pick(&s->smp.p, row, vocab, rng_uniform(&s->smp.rng),
                                   s->smp.probs, s->smp.idx);
        } else {
            double ua = rng_uniform(&s->smp.rng), u = rng_uniform(&s->smp.rng);
            pick[i] = sampler_verify(&s->smp.p, row, vocab, span[1 + i], ua, u, s->smp.probs,
                                     s->smp.idx);
        }
        if (i == k || pick[i] != span[1 + i])
            break;
        a++;
    }
    /* K/V past the last kept draft belong to drafts the model did not
     * pick: positions from there on are written again */
    s->kv.n_tokens = base + a + 1;
    if (a == 0)
        spec_back_off(s);
    else
        s->spec_backoff = 0;
    pthread_mutex_lock(&eng->mu);
    eng->st.batch_steps++;
    eng->st.batch_rows++;
    eng->st.spec_steps++;
    eng->st.spec_drafted += (uint64_t)k;
    eng->st.spec_accepted += (uint64_t)a;
    pthread_mutex_unlock(&eng->mu);
    s->r->spec_steps++;
    s->r->spec_drafted += k;
    s->r->spec_accepted += a;
    for (int i = 0; i <= a; i++)
        if (!take_token(eng, s, pick[i], NULL))
            break;
    return 1;
}

/* ---- prompt logprobs ----
 *
 * The batch returns each sequence's last row only, so a sequence whose
 * prompt's log-probabilities are asked for (completions' echo) computes
 * its prompt here first, PLP_ROWS tokens a forward with every row, and
 * reports each prompt token's entry from the row before it. Its last
 * prompt token then goes through the batch as any sequence's does (its row
 * is the first generated token's). Preempted and resumed, it computes its
 * prompt again but reports only what it had not. */

#define PLP_ROWS 16

static bool plp_pending(const struct seq *s)
{
    return s->r->p.prompt_logprobs && s->plp_next < s->r->n_prompt;
}

/* One chunk of s's prompt: 1 when it ran, 0 when there was no room yet,
 * -1 when s was retired (the forward failed). */
static int plp_step(struct engine *eng, struct seq *s)
{
    struct engine_request *r = s->r;
    const int vocab = eng->m->cfg.vocab_size;
    struct err e = {{0}};
    if (s->plp_next == 0) { /* the first token: nothing predicts it */
        struct engine_event ev = {.token = r->prompt[0], .prompt = true,
                                  .n_prompt = r->n_prompt, .n_cached = r->n_cached};
        push_event(r, &ev);
        s->plp_next = 1;
    }
    int from = s->kv.n_tokens, end = r->n_prompt - 1;
    if (end - from > PLP_ROWS)
        end = from + PLP_ROWS;
    if (end <= from) { /* a one-token prompt */
        s->plp_next = r->n_prompt;
        return 1;
    }
    if (!eng->plp_rows &&
        !(eng->plp_rows = malloc(sizeof(float) * (size_t)vocab * PLP_ROWS))) {
        retire(eng, s, ENGINE_FINISH_ERROR, "out of memory");
        return -1;
    }
    if (kv_seq_reserve(&eng->pool, &s->kv, end, &e)) {
        if (eng->n_run > 1)
            return 0; /* the others' blocks come free as they end */
        retire(eng, s, ENGINE_FINISH_ERROR, e.msg); /* alone and no room: never */
        return -1;
    }
    if (forward_tokens(&eng->fs, &eng->pool, &s->kv, s->toks + from, end - from, true,
                       eng->plp_rows, &e)) {
        retire(eng, s, ENGINE_FINISH_ERROR, e.msg);
        return -1;
    }
    for (int i = from + 1; i <= end; i++) {
        if (i < s->plp_next)
            continue; /* reported before a preemption */
        const float *row = eng->plp_rows + (size_t)(i - 1 - from) * vocab;
        struct engine_event ev = {.token = r->prompt[i], .prompt = true, .has_logprobs = true,
                                  .n_prompt = r->n_prompt, .n_cached = r->n_cached};
        double lse = logits_lse(row, vocab);
        logprobs_top(row, vocab, r->p.top_logprobs, lse, &ev.lp);
        ev.lp.logprob = (float)((double)row[r->prompt[i]] - lse);
        push_event(r, &ev);
    }
    if (end + 1 > s->plp_next)
        s->plp_next = end + 1;
    pthread_mutex_lock(&eng->mu);
    eng->st.batch_steps++;
    eng->st.batch_rows++;
    pthread_mutex_unlock(&eng->mu);
    return 1;
}

/* ---- one step ahead: a greedy sequence decoding alone ----
 *
 * A sequence alone in the batch, greedy, whose rows never come to the host
 * decodes one step ahead of the host (forward_pipe_issue): the step fed
 * its pick is queued before that pick is read, so the device goes from
 * step to step without waiting for the id's copy, the stop checks, the
 * event and the next step's issue. While such a step is in flight the
 * sequence's K/V cover all of toks (kv.n_tokens == n_toks). A pick that
 * ends the sequence drops the step it was fed to (its K/V are not kept);
 * anything else that changes the batch (a request joining, a cancel)
 * first takes the in-flight step's pick as a plain step would have. */

/* Whether s may decode (or go on decoding) one step ahead. */
static bool ahead_fits(const struct engine *eng, const struct seq *s)
{
    return eng->cfg.spec_draft == 0 && eng->n_run == 1 && eng->n_pre == 0 &&
           eng->run[0] == s && s->prompt_done && !s->host_row && !s->r->p.logprobs &&
           !s->r->p.prompt_only && !plp_pending(s) && sampler_is_greedy(&s->smp) &&
           (eng->cfg.decode_ahead > 0 ||
            (eng->cfg.decode_ahead == 0 && forward_pipe_on_device(&eng->fs))) &&
           !atomic_load(&s->r->cancel);
}

/* Ends eng->ahead's step in flight: its pick is taken as a plain step's
 * (take_token), or dropped when the request was cancelled meanwhile. */
static void ahead_settle(struct engine *eng)
{
    struct seq *s = eng->ahead;
    eng->ahead = NULL;
    struct err e = {{0}};
    int tok;
    if (forward_pipe_take(&eng->fs, &tok, &e)) {
        retire(eng, s, ENGINE_FINISH_ERROR, e.msg);
        return;
    }
    if (!atomic_load(&s->r->cancel))
        take_token(eng, s, tok, NULL);
}

/* Forgets eng->ahead's step in flight, its pick unread (the sequence is
 * about to end; a failure stays with the backend for the next step). */
static void ahead_drop(struct engine *eng)
{
    struct err ignored = {{0}};
    forward_pipe_drop(&eng->fs, &ignored);
    eng->ahead = NULL;
}

/* A decode step of s alone, one ahead (see above): queues the step fed
 * its last token unless that is in flight, then the step fed that step's
 * pick unless the pick is the last the request may take, then takes the
 * pick. */
static void ahead_step(struct engine *eng, struct seq *s)
{
    struct err e = {{0}};
    if (!eng->ahead) {
        if (forward_pipe_issue(&eng->fs, &eng->pool, &s->kv, &s->toks[s->n_toks - 1], &e)) {
            retire(eng, s, ENGINE_FINISH_ERROR, e.msg);
            return;
        }
        eng->ahead = s;
    }
    /* no room in the pool for one more token: this pick is taken plainly,
     * and the next step finds the pool as a plain step would */
    bool more = s->n_gen + 1 < s->max_gen &&
                kv_seq_reserve(&eng->pool, &s->kv, s->kv.n_tokens + 1, &e) == 0;
    e.msg[0] = 0;
    int tok = -1;
    if ((more && forward_pipe_issue(&eng->fs, &eng->pool, &s->kv, NULL, &e)) ||
        forward_pipe_take(&eng->fs, &tok, &e)) {
        ahead_drop(eng);
        retire(eng, s, ENGINE_FINISH_ERROR, e.msg);
        return;
    }
    pthread_mutex_lock(&eng->mu);
    eng->st.batch_steps++;
    eng->st.batch_rows++;
    eng->st.steps_ahead += more;
    pthread_mutex_unlock(&eng->mu);
    if (more && is_stop(eng, s->r, tok)) { /* the step fed the stop id is not the sequence's */
        if (forward_pipe_drop(&eng->fs, &e)) {
            eng->ahead = NULL;
            retire(eng, s, ENGINE_FINISH_ERROR, e.msg);
            return;
        }
        s->kv.n_tokens--;
        more = false;
    }
    if (!more)
        eng->ahead = NULL;
    take_token(eng, s, tok, NULL); /* retires s exactly when !more */
}

/* One engine step over the running sequences. */
static void engine_step(struct engine *eng)
{
    const int vocab = eng->m->cfg.vocab_size;
    if (eng->ahead && !ahead_fits(eng, eng->ahead))
        ahead_settle(eng); /* the batch changes: the step in flight ends as a plain one */
    /* Cancellation, every step, running and preempted alike. */
    for (int i = eng->n_run - 1; i >= 0; i--)
        if (atomic_load(&eng->run[i]->r->cancel)) {
            if (eng->run[i] == eng->ahead) /* cancelled since the check above */
                ahead_drop(eng);
            retire(eng, eng->run[i], ENGINE_FINISH_CANCELLED, NULL);
        }
    for (int i = eng->n_pre - 1; i >= 0; i--)
        if (atomic_load(&eng->pre[i]->r->cancel))
            retire(eng, eng->pre[i], ENGINE_FINISH_CANCELLED, NULL);
    for (int i = 0; i < eng->n_run; i++)
        if (plp_pending(eng->run[i]) && plp_step(eng, eng->run[i]) < 0)
            i--; /* retired: the next one moved into its place */
    for (int i = eng->n_run - 1; i >= 0; i--)
        if (eng->run[i]->r->p.prompt_only && !plp_pending(eng->run[i]))
            retire(eng, eng->run[i], ENGINE_FINISH_LENGTH, NULL);
    if (eng->n_run == 0)
        return;
    struct seq *lone = eng->n_run == 1 && eng->n_pre == 0 ? eng->run[0] : NULL;
    if (eng->cfg.spec_draft > 0 && lone && lone->prompt_done && !lone->host_row &&
        !lone->r->p.logprobs && lone->n_toks - lone->kv.n_tokens == 1 &&
        (lone->spec_skip > 0 ? (lone->spec_skip--, false) : spec_step(eng, lone) != 0))
        return;
    if (lone && ahead_fits(eng, lone) &&
        (eng->ahead == lone || lone->n_toks - lone->kv.n_tokens == 1)) {
        ahead_step(eng, lone);
        return;
    }
    /* Decodes first (one token each), then prefill chunks in admission
     * order with what is left of the budget. */
    struct cand *cands = eng->cands;
    int n_cand = 0, budget = eng->cfg.batch_tokens, n_dec = 0;
    for (int i = 0; i < eng->n_run; i++)
        if (eng->run[i]->n_toks - eng->run[i]->kv.n_tokens == 1)
            n_dec++;
    budget -= n_dec;
    /* Beside decodes, fewer prompt tokens, for all prefills together: the
     * decodes' next tokens wait for the whole step. */
    const int chunk = n_dec ? eng->cfg.prefill_chunk_shared : eng->cfg.prefill_chunk;
    if (n_dec && budget > chunk)
        budget = chunk;
    for (int i = 0; i < eng->n_run; i++) {
        struct seq *s = eng->run[i];
        int left = s->n_toks - s->kv.n_tokens, k = 1;
        if (plp_pending(s))
            continue; /* its prompt goes through plp_step */
        if (left > 1) {
            k = left < chunk ? left : chunk;
            if (k > budget)
                k = budget;
            if (k <= 0)
                continue;
            budget -= k;
        }
        cands[n_cand++] = (struct cand){.s = s, .n = k, .tok = -1};
    }
    /* Blocks for every span, oldest first; on exhaustion preempt the
     * youngest running sequence rather than fail. */
    for (int i = 0; i < n_cand; i++) {
        struct seq *s = cands[i].s;
        struct err e = {{0}};
        while (kv_seq_reserve(&eng->pool, &s->kv, s->kv.n_tokens + cands[i].n, &e)) {
            struct seq *victim = eng->run[eng->n_run - 1];
            if (eng->n_run == 1) { /* alone and still no room: it can never fit */
                retire(eng, s, ENGINE_FINISH_ERROR, e.msg);
                return;
            }
            for (int j = i; j < n_cand; j++)
                if (cands[j].s == victim) {
                    memmove(cands + j, cands + j + 1, sizeof *cands * (size_t)(n_cand - j - 1));
                    n_cand--;
                    break;
                }
            preempt(eng, victim);
            if (victim == s)
                break;
        }
        if (i < n_cand && cands[i].s != s)
            i--; /* s was preempted: cands[i] is the next one */
    }
    if (n_cand == 0)
        return;
    /* Every sequence whose token this step yields asks for the token, not
     * its logits row: a device with argmax_rows / sample_rows copies only
     * the ids to the host. A sampled sequence draws its uniform now, once
     * per token as the host sampler always has, so the device and the host
     * (a backend without sample_rows returns the row: sampler_pick below,
     * same draw) give the same token for the same seed. */
    struct forward_seg *segs = eng->segs;
    for (int i = 0; i < n_cand; i++) {
        struct seq *s = cands[i].s;
        assert(kv_seq_writable(&eng->pool, &s->kv, s->kv.n_tokens));
        bool logits = s->kv.n_tokens + cands[i].n == s->n_toks;
        bool sampled = logits && !sampler_is_greedy(&s->smp);
        /* a grammar's mask and logits processing are the host's (and
         * logprobs, on a backend without row_logprobs): the row comes back */
        bool host = logits && s->host_row;
        if (sampled) {
            const struct sampler_params *p = &s->smp.p;
            cands[i].sp = (struct sample_params){.temperature = p->temperature,
                                                 .top_k = p->top_k, .top_p = p->top_p,
                                                 .min_p = p->min_p,
                                                 .u = rng_uniform(&s->smp.rng)};
        }
        segs[i] = (struct forward_seg){.seq = &s->kv, .tokens = s->toks + s->kv.n_tokens,
                                       .n = cands[i].n, .logits = logits,
                                       .next = logits && !host ? &cands[i].tok : NULL,
                                       .sample = sampled && !host ? &cands[i].sp : NULL,
                                       .lp = logits && !host && s->r->p.logprobs ? &cands[i].lp
                                                                                 : NULL,
                                       .lp_k = s->r->p.top_logprobs};
    }
    struct err e = {{0}};
    if (forward_batch(&eng->fs, &eng->pool, segs, n_cand, eng->logits, &e)) {
        for (int i = 0; i < n_cand; i++)
            retire(eng, cands[i].s, ENGINE_FINISH_ERROR, e.msg);
        return;
    }
    pthread_mutex_lock(&eng->mu);
    eng->st.batch_steps++;
    eng->st.batch_rows += (uint64_t)n_cand;
    pthread_mutex_unlock(&eng->mu);
    for (int i = 0, row = 0; i < n_cand; i++) {
        struct seq *s = cands[i].s;
        if (!segs[i].logits)
            continue;
        if (cands[i].n > 1 || !s->prompt_done) /* a prefill (or resume) caught up */
            prefix_cache_register(&eng->pc, &s->kv, s->toks);
        if (!s->prompt_done) {
            s->prompt_done = true;
            pthread_mutex_lock(&eng->mu);
            eng->st.tokens_prompt += (uint64_t)s->r->n_prompt;
            pthread_mutex_unlock(&eng->mu);
        }
        int tok = cands[i].tok;
        struct token_logprobs lp, *lpp = segs[i].lp; /* the device's, when it made them */
        if (tok < 0) { /* sampled from its logits row on the host, with the step's draw */
            float *lr = eng->logits + (size_t)row++ * vocab;
            const struct engine_params *p = &s->r->p;
            const float *raw = lr;
            double lse = 0;
            if (p->logprobs) { /* of the model's row, before anything changes it */
                lse = logits_lse(lr, vocab);
                logprobs_top(lr, vocab, p->top_logprobs, lse, &lp);
                if (s->raw) {
                    memcpy(s->raw, lr, sizeof(float) * (size_t)vocab);
                    raw = s->raw;
                }
                lpp = &lp;
            }
            if (s->processed)
                logits_process(&p->proc, s->toks, s->n_toks, lr, s->mark);
            if (s->gm && mask_row(eng, s, lr))
                continue;
            tok = sampler_pick(&s->smp.p, lr, vocab, cands[i].sp.u, s->smp.probs, s->smp.idx);
            if (lpp)
                lp.logprob = (float)((double)raw[tok] - lse);
        }
        take_token(eng, s, tok, lpp);
    }
}

/* Physical RAM, or the cgroup's memory limit when that is lower (0 when
 * unknown). */
static long long ram_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    long long ram = pages > 0 && psz > 0 ? (long long)pages * psz : 0;
    const char *lim[] = {"/sys/fs/cgroup/memory.max",
                         "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
    for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++) {
        FILE *f = fopen(lim[i], "r");
        long long v = 0;
        if (!f)
            continue;
        if (fscanf(f, "%lld", &v) == 1 && v > 0 && (ram == 0 || v < ram))
            ram = v;
        fclose(f);
    }
    return ram;
}

#define GIB (1LL << 30)

/* The KV pool's blocks (see engine_config.memory_budget_bytes); fills
 * eng->kv_sizing. weights: model_weight_bytes_per_token; dev_free: the
 * device's free memory once weights and activations are allocated
 * (backend_dev_free; a device backend's default sizing). */
static long long pool_blocks(struct engine *eng, long long weights, size_t dev_free,
                             struct err *e)
{
    const long long bb = eng->block_bytes, mb = eng->cfg.memory_budget_bytes;
    long long n;
    if (mb == 0) {
        snprintf(eng->kv_sizing, sizeof eng->kv_sizing, "kv_tokens");
        n = ((long long)eng->cfg.kv_tokens + eng->bs - 1) / eng->bs;
    } else if (mb > 0) {
        snprintf(eng->kv_sizing, sizeof eng->kv_sizing, "--memory-budget");
        n = (mb - weights) / bb;
        if (n < 2)
            return err_set(e, "memory budget %lld bytes leaves %lld bytes for the KV pool after "
                              "%lld bytes of weights, less than two %lld-byte blocks (%d "
                              "tokens); raise it", mb, mb - weights, weights, bb, 2 * eng->bs);
    } else {
        bool dev = backend_on_device(eng->be);
        long long avail;
        if (dev) { /* weights and activations are allocated: what is left, less a margin */
            avail = (long long)dev_free - (long long)backend_dev_margin(dev_free);
            snprintf(eng->kv_sizing, sizeof eng->kv_sizing, "default: free GPU memory");
        } else {
            avail = ram_bytes() / 4 * 3 - weights;
            snprintf(eng->kv_sizing, sizeof eng->kv_sizing, "default: 75%% of RAM");
        }
        n = avail > 0 ? avail / bb : 0;
        /* No more than can ever be used: every running sequence at a full
         * context, plus what the prompt cache may keep idle. */
        long long live = (long long)eng->cfg.max_running *
                         ((eng->cfg.ctx_len + eng->bs - 1) / eng->bs);
        long long pc = eng->cfg.prompt_cache_bytes, share;
        if (pc > 0)
            share = (pc + bb - 1) / bb;
        else if (pc < 0)
            share = 0;
        else
            share = live < 8 * GIB / bb ? live : 8 * GIB / bb;
        if (n > live + share) {
            n = live + share;
            size_t len = strlen(eng->kv_sizing);
            snprintf(eng->kv_sizing + len, sizeof eng->kv_sizing - len,
                     ", capped at %d x %d tokens + %lld prompt-cache blocks",
                     eng->cfg.max_running, eng->cfg.ctx_len, share);
        }
        if (n < 2)
            return err_set(e, "no room for a KV pool (%s): %lld bytes left after %lld bytes of "
                              "weights, less than two %lld-byte blocks; set a memory budget",
                           dev ? "free device memory" : "75% of RAM", avail > 0 ? avail : 0,
                           weights, bb);
    }
    const long long max_blocks = (1LL << 30) / eng->bs;
    return n > max_blocks ? max_blocks : n;
}

static int cap_blocks(const struct engine *eng, long long bytes)
{
    if (bytes < 0)
        return 0;
    if (bytes == 0)
        return eng->pool.n_blocks;
    size_t per = kv_pool_bytes_per_block(eng->pool.n_layers, eng->pool.kv_dim, eng->pool.block_size,
                                         eng->pool.elt_bytes);
    long long n = bytes / (long long)per;
    return n > eng->pool.n_blocks ? eng->pool.n_blocks : (int)n;
}

void engine_set_prompt_cache(struct engine *eng, long long bytes)
{
    pthread_mutex_lock(&eng->mu);
    if (eng->running == 0) { /* the engine thread touches the pool only while running */
        prefix_cache_set_cap(&eng->pc, cap_blocks(eng, bytes));
        eng->cap_pending = false;
    } else {
        eng->cap_bytes = bytes;
        eng->cap_pending = true;
    }
    pthread_mutex_unlock(&eng->mu);
}

static void *engine_main(void *arg)
{
    struct engine *eng = arg;
    pthread_mutex_lock(&eng->mu);
    for (;;) {
        while (!eng->stopping && !eng->q_head && eng->n_run == 0 && eng->n_pre == 0) {
            if (eng->disk_dirty) { /* idle: the SSD tier catches up, a few blocks at a time */
                pthread_mutex_unlock(&eng->mu);
                int k = prefix_cache_flush(&eng->pc, 8);
                pthread_mutex_lock(&eng->mu);
                eng->disk_dirty = k > 0;
                kv_disk_get_stats(eng->disk, &eng->disk_st);
                continue;
            }
            pthread_cond_wait(&eng->cv, &eng->mu);
        }
        if (eng->stopping)
            break;
        if (eng->cap_pending) { /* the engine thread owns the pool */
            prefix_cache_set_cap(&eng->pc, cap_blocks(eng, eng->cap_bytes));
            eng->cap_pending = false;
        }
        admit(eng);
        pthread_mutex_unlock(&eng->mu);
        engine_step(eng);
        pthread_mutex_lock(&eng->mu);
        if (eng->disk) {
            eng->disk_dirty = true;
            kv_disk_get_stats(eng->disk, &eng->disk_st);
        }
    }
    pthread_mutex_unlock(&eng->mu);
    /* Shutdown: nothing may be lost silently; each gets a final event. */
    if (eng->ahead) /* its pick is not wanted: the sequence ends here */
        ahead_drop(eng);
    while (eng->n_run > 0)
        retire(eng, eng->run[eng->n_run - 1], ENGINE_FINISH_CANCELLED, "server shutting down");
    while (eng->n_pre > 0)
        retire(eng, eng->pre[eng->n_pre - 1], ENGINE_FINISH_CANCELLED, "server shutting down");
    pthread_mutex_lock(&eng->mu);
    while (eng->q_head) {
        struct engine_request *r = eng->q_head;
        eng->q_head = r->next;
        r->queued = false;
        eng->queued--;
        finish(r, ENGINE_FINISH_CANCELLED, 0, "server shutting down");
        engine_request_release(r);
    }
    eng->q_tail = NULL;
    pthread_mutex_unlock(&eng->mu);
    return NULL;
}

/* Everything engine_create allocates (the pool through the backend that
 * made it, so before the backend), then the engine itself; any part may be
 * missing (a failed create). The thread and its lock are the caller's. */
static void engine_free_parts(struct engine *eng)
{
    if (eng->disk) /* what the SSD tier lacks is written before the pool goes */
        prefix_cache_flush(&eng->pc, INT_MAX);
    prefix_cache_free(&eng->pc);
    kv_disk_close(eng->disk);
    kv_pool_free(&eng->pool);
    forward_free(&eng->fs);
    backend_destroy(eng->be);
    drafter_free(eng->drafter);
    free(eng->logits);
    free(eng->match);
    free(eng->run);
    free(eng->pre);
    free(eng->cands);
    free(eng->segs);
    free(eng->spec_span);
    free(eng->spec_logits);
    free(eng->plp_rows);
    free(eng);
}

/* Sizes and times of the model's files (the path, or the files of its
 * directory), hashed: weights replaced in place make a new SSD tier. */
static uint64_t weights_stamp(const char *path)
{
    struct stat sb;
    if (stat(path, &sb))
        return 0;
    uint64_t h = (uint64_t)sb.st_size ^ ((uint64_t)sb.st_mtim.tv_sec << 20) ^
                 (uint64_t)sb.st_mtim.tv_nsec;
    DIR *dh = S_ISDIR(sb.st_mode) ? opendir(path) : NULL;
    struct dirent *de;
    char p[4600];
    while (dh && (de = readdir(dh))) {
        if (de->d_name[0] == '.')
            continue;
        snprintf(p, sizeof p, "%s/%s", path, de->d_name);
        if (stat(p, &sb) || !S_ISREG(sb.st_mode))
            continue;
        uint64_t f[3] = {(uint64_t)sb.st_size, (uint64_t)sb.st_mtim.tv_sec,
                         (uint64_t)sb.st_mtim.tv_nsec};
        h ^= prefix_hash_bytes(f, sizeof f) ^ prefix_hash_bytes(de->d_name, strlen(de->d_name));
    }
    if (dh)
        closedir(dh);
    return h;
}

/* The SSD tier, named by everything the K/V depend on: the model
 * fingerprint (fp), the backend and the version of its block layout, the
 * weights' files. */
static int open_disk(struct engine *eng, const char *fp, struct err *e)
{
    char id[1700];
    snprintf(id, sizeof id, "%s|backend=%s|layout=%d|weights=%016llx", fp, eng->be->ops->name,
             eng->be->ops->kv_layout, (unsigned long long)weights_stamp(eng->m->path));
    struct kv_pool *p = &eng->pool;
    size_t bytes = kv_pool_bytes_per_block(p->n_layers, p->kv_dim, p->block_size, p->elt_bytes);
    eng->disk = kv_disk_open(eng->cfg.ssd_dir, prefix_hash_bytes(id, strlen(id)), eng->bs, bytes,
                             eng->cfg.ssd_max_bytes, e);
    if (!eng->disk || prefix_cache_set_disk(&eng->pc, eng->disk, e))
        return -1;
    kv_disk_get_stats(eng->disk, &eng->disk_st);
    return 0;
}

struct engine *engine_create(const struct model *m, const struct engine_config *cfg,
                             struct err *e)
{
    struct engine *eng = calloc(1, sizeof *eng);
    if (!eng) {
        err_set(e, "out of memory");
        return NULL;
    }
    eng->m = m;
    eng->cfg = *cfg;
    if (eng->cfg.ctx_len <= 0 || eng->cfg.ctx_len > m->cfg.max_seq)
        eng->cfg.ctx_len = m->cfg.max_seq;
    if (eng->cfg.kv_tokens < eng->cfg.ctx_len)
        eng->cfg.kv_tokens = eng->cfg.ctx_len;
    if (eng->cfg.max_running <= 0)
        eng->cfg.max_running = 8;
    if (eng->cfg.max_queue <= 0)
        eng->cfg.max_queue = 64;
    eng->bs = eng->cfg.kv_block_size > 0 ? eng->cfg.kv_block_size : ENGINE_KV_BLOCK_DEFAULT;
    if (eng->bs < 8 || eng->bs > 256 || (eng->bs & (eng->bs - 1))) {
        err_set(e, "KV block size %d: it must be a power of two from 8 to 256", eng->bs);
        free(eng);
        return NULL;
    }
    const struct model_config *c = &m->cfg;
    long long weights = (long long)model_weight_bytes_per_token(m);
    if (cfg->memory_budget_bytes > 0 && weights >= cfg->memory_budget_bytes) {
        err_set(e, "memory budget %lld bytes is not enough for the weights alone (%lld bytes); "
                   "raise it or leave it unset", cfg->memory_budget_bytes, weights);
        free(eng);
        return NULL;
    }
    bool oom = false;
    eng->be = backend_create(cfg->device, cfg->n_threads, e);
    if (eng->be)
        backend_set_compiled_decode(eng->be, cfg->compiled_decode);
    /* Prefill chunk of a step where no sequence decodes: on a GPU 2,048
     * tokens, where a long prompt's later chunks take the attention kernel
     * of long key ranges: a 32K prompt 1.19x (8B) to 1.84x (0.6B) faster
     * than in 512-token chunks, at 94-97% of one pass's speed (H200,
     * docs/benchmarks.md twenty-fifth pass). On the CPU 128: bound by
     * arithmetic, larger chunks gain nothing. */
    const bool dev = eng->be && backend_on_device(eng->be);
    if (eng->cfg.prefill_chunk <= 0)
        eng->cfg.prefill_chunk = dev ? 2048 : 128;
    /* Beside decodes: 512 tokens on a GPU (8B on the H200: the streams
     * decoding wait at most ~58 ms for a token while a 32K prompt is
     * prefilled, 179 ms with 2,048-token chunks), 128 on the CPU. */
    if (eng->cfg.prefill_chunk_shared <= 0)
        eng->cfg.prefill_chunk_shared = dev ? 512 : 128;
    if (eng->cfg.prefill_chunk_shared > eng->cfg.prefill_chunk)
        eng->cfg.prefill_chunk_shared = eng->cfg.prefill_chunk;
    /* Room for every decode plus one full prefill chunk. */
    if (eng->cfg.batch_tokens <= 0)
        eng->cfg.batch_tokens = eng->cfg.prefill_chunk + eng->cfg.max_running;
    if (eng->cfg.batch_tokens < eng->cfg.max_running)
        eng->cfg.batch_tokens = eng->cfg.max_running;
    int fw_tokens = eng->cfg.batch_tokens > eng->cfg.prefill_chunk ? eng->cfg.batch_tokens
                                                                   : eng->cfg.prefill_chunk;
    int kv_dt = eng->be ? backend_kv_dtype(eng->be) : DT_F32;
    eng->block_bytes = (long long)kv_pool_bytes_per_block(
        c->n_layers, c->n_kv_heads * c->head_dim, eng->bs, (int)dtype_row_bytes((enum dtype)kv_dt, 1));
    eng->logits = malloc(sizeof(float) * (size_t)c->vocab_size * (size_t)eng->cfg.max_running);
    size_t mr = (size_t)eng->cfg.max_running;
    eng->run = calloc(mr, sizeof *eng->run);
    eng->pre = calloc(mr, sizeof *eng->pre);
    eng->cands = calloc(mr, sizeof *eng->cands);
    eng->segs = calloc(mr, sizeof *eng->segs);
    if (eng->cfg.spec_draft > 0) {
        if (eng->cfg.spec_draft > ENGINE_SPEC_MAX ||
            !(eng->cfg.draft_p_min >= 0 && eng->cfg.draft_p_min <= 1) ||
            (!cfg->draft_model &&
             (eng->cfg.ngram_min < 1 || eng->cfg.ngram_max < eng->cfg.ngram_min))) {
            err_set(e, "speculation: %d draft tokens (1..%d), n-grams %d..%d (1 <= min <= max), "
                       "draft p-min %g (0..1)", eng->cfg.spec_draft, ENGINE_SPEC_MAX,
                    eng->cfg.ngram_min, eng->cfg.ngram_max, (double)eng->cfg.draft_p_min);
            goto fail;
        }
        eng->spec_span = malloc(sizeof(int) * (size_t)(eng->cfg.spec_draft + 1));
        eng->spec_logits = malloc(sizeof(float) * (size_t)c->vocab_size *
                                  (size_t)(eng->cfg.spec_draft + 1));
        if (!eng->spec_span || !eng->spec_logits) {
            oom = true;
            goto fail;
        }
    }
    if (eng->be && (!eng->logits || !eng->run || !eng->pre || !eng->cands || !eng->segs)) {
        oom = true;
        goto fail;
    }
    /* The model fingerprint seeds every chain key: blocks computed by a
     * different model, weights file or KV scheme can never match. */
    char fp[1400];
    snprintf(fp, sizeof fp,
             "cllm-kv-v1|%s|%s|%s|dim=%d ff=%d L=%d H=%d KV=%d hd=%d V=%d eps=%a theta=%a "
             "rope=%d/%d/%a/%a/%a/%d bias=%d qkn=%d tied=%d swa=%d|kv=%s|block=%d",
             m->path, m->format, c->arch, c->dim, c->hidden_dim, c->n_layers, c->n_heads,
             c->n_kv_heads, c->head_dim, c->vocab_size, (double)c->norm_eps,
             (double)c->rope_theta, c->rope_interleaved, (int)c->rope_scaling,
             (double)c->rope_factor, (double)c->rope_low_freq_factor,
             (double)c->rope_high_freq_factor, c->rope_orig_max_seq, c->qkv_bias, c->qk_norm,
             c->tied_embeddings, c->sliding_window, dtype_name(kv_dt), eng->bs);
    /* Logits rows a step asks for: one per running sequence, a verify
     * span's (ENGINE_SPEC_MAX + 1) or a prompt-logprobs pass (PLP_ROWS);
     * never a prefill chunk's every row. */
    int logit_rows = eng->cfg.max_running;
    if (eng->cfg.spec_draft > 0 && logit_rows < eng->cfg.spec_draft + 1)
        logit_rows = eng->cfg.spec_draft + 1;
    if (logit_rows < PLP_ROWS)
        logit_rows = PLP_ROWS;
    if (logit_rows > fw_tokens)
        logit_rows = fw_tokens;
    if (!eng->be || backend_load_weights(eng->be, m, e) ||
        forward_init_rows(&eng->fs, m, eng->be, fw_tokens, logit_rows, e))
        goto fail;
    /* The draft model before the pool: on a device the pool takes what
     * both models' weights left free. */
    if (eng->cfg.spec_draft > 0 && cfg->draft_model) {
        if (!(eng->drafter = drafter_create(cfg->draft_model, cfg->device, cfg->n_threads,
                                            eng->cfg.ctx_len, cfg->compiled_decode, e)))
            goto fail;
        eng->st.draft_bytes = (long long)drafter_bytes(eng->drafter);
        weights += eng->st.draft_bytes;
    }
    snprintf(eng->device, sizeof eng->device, "%s", eng->be->ops->name);
    if (eng->be->ops->mem_info) {
        struct backend_mem bm = {0};
        eng->be->ops->mem_info(eng->be, &bm);
        if (bm.device[0])
            snprintf(eng->device, sizeof eng->device, "%s", bm.device);
    }
    /* The pool comes last: its size may depend on what the weights and
     * activations left free on the device. */
    size_t free_before = backend_dev_free(eng->be);
    long long n_blocks = pool_blocks(eng, weights, free_before, e);
    if (n_blocks < 0)
        goto fail;
    if (n_blocks * eng->bs < eng->cfg.ctx_len) /* a request must always fit */
        eng->cfg.ctx_len = (int)(n_blocks * eng->bs);
    eng->match = malloc(sizeof(int) * (size_t)(eng->cfg.ctx_len / eng->bs + 1));
    if (!eng->match) {
        oom = true;
        goto fail;
    }
    if (kv_pool_init(&eng->pool, eng->be, c->n_layers, c->n_kv_heads, c->head_dim, eng->bs,
                     (int)n_blocks, e))
        goto fail;
    /* the backend's optional copies from what the pool left: none under a
     * --memory-budget, which bounds weights and pool together */
    if (eng->cfg.memory_budget_bytes <= 0 && backend_load_spare(eng->be, m, free_before, e))
        goto fail;
    if (prefix_cache_init(&eng->pc, &eng->pool, prefix_hash_bytes(fp, strlen(fp)), 0, e))
        goto fail;
    prefix_cache_set_cap(&eng->pc, cap_blocks(eng, cfg->prompt_cache_bytes));
    if (cfg->ssd_dir && open_disk(eng, fp, e))
        goto fail;
    pthread_mutex_init(&eng->mu, NULL);
    pthread_cond_init(&eng->cv, NULL);
    if (pthread_create(&eng->thread, NULL, engine_main, eng)) {
        err_set(e, "cannot start the engine thread");
        pthread_mutex_destroy(&eng->mu);
        pthread_cond_destroy(&eng->cv);
        goto fail;
    }
    return eng;
fail:
    if (oom)
        err_set(e, "out of memory");
    engine_free_parts(eng);
    return NULL;
}

void engine_destroy(struct engine *eng)
{
    if (!eng)
        return;
    pthread_mutex_lock(&eng->mu);
    eng->stopping = true;
    /* The flags only: engine_request_cancel takes this lock itself. */
    for (struct engine_request *r = eng->q_head; r; r = r->next)
        atomic_store(&r->cancel, true);
    pthread_cond_broadcast(&eng->cv);
    pthread_mutex_unlock(&eng->mu);
    pthread_join(eng->thread, NULL);
    pthread_mutex_destroy(&eng->mu);
    pthread_cond_destroy(&eng->cv);
    engine_free_parts(eng);
}

/* What engine_submit refuses in a request before it takes the lock. */
static int submit_check(const struct engine *eng, const struct engine_request *r, struct err *e)
{
    if (r->n_prompt >= eng->cfg.ctx_len) {
        err_set(e, "the prompt has %d tokens but the context is %d tokens (at least one "
                   "must remain for the answer)", r->n_prompt, eng->cfg.ctx_len);
        return ENGINE_SUBMIT_INVALID;
    }
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= eng->m->cfg.vocab_size) {
            err_set(e, "token id %d is outside the vocabulary (0..%d)", r->prompt[i],
                    eng->m->cfg.vocab_size - 1);
            return ENGINE_SUBMIT_INVALID;
        }
    if (logits_params_check(&r->p.proc, eng->m->cfg.vocab_size, e))
        return ENGINE_SUBMIT_INVALID;
    if (eng->cfg.kv_budget_bytes > 0) {
        long long need = projected_bytes(eng, r);
        if (need > eng->cfg.kv_budget_bytes) {
            int nt = projected_tokens(eng, r);
            err_set(e, "the request's projected KV is %lld bytes (%d prompt + %d generated "
                       "tokens = %d blocks of %lld bytes) but the KV budget (--kv-budget) is "
                       "%lld bytes; lower max_tokens or shorten the prompt",
                    need, r->n_prompt, nt - r->n_prompt, blocks_for(eng, nt), eng->block_bytes,
                    eng->cfg.kv_budget_bytes);
            return ENGINE_SUBMIT_ADMISSION;
        }
    }
    return 0;
}

int engine_submit_many(struct engine *eng, struct engine_request *const *rs, int n, struct err *e)
{
    for (int i = 0; i < n; i++) {
        int rc = submit_check(eng, rs[i], e);
        if (rc)
            return rc;
    }
    pthread_mutex_lock(&eng->mu);
    if (eng->stopping) {
        pthread_mutex_unlock(&eng->mu);
        err_set(e, "the server is shutting down");
        return ENGINE_SUBMIT_BUSY;
    }
    if (eng->queued + n > eng->cfg.max_queue) {
        pthread_mutex_unlock(&eng->mu);
        err_set(e, "too many requests waiting (%d queued); retry later", eng->queued);
        return ENGINE_SUBMIT_BUSY;
    }
    for (int i = 0; i < n; i++) {
        struct engine_request *r = rs[i];
        atomic_fetch_add(&r->refs, 1);
        r->eng = eng;
        r->queued = true;
        r->next = NULL;
        if (eng->q_tail)
            eng->q_tail->next = r;
        else
            eng->q_head = r;
        eng->q_tail = r;
        eng->queued++;
        eng->st.requests_total++;
    }
    pthread_cond_signal(&eng->cv);
    pthread_mutex_unlock(&eng->mu);
    return 0;
}

int engine_submit(struct engine *eng, struct engine_request *r, struct err *e)
{
    return engine_submit_many(eng, &r, 1, e);
}

void engine_get_stats(struct engine *eng, struct engine_stats *out)
{
    pthread_mutex_lock(&eng->mu);
    *out = eng->st;
    out->queued = eng->queued;
    out->running = eng->n_run;
    out->pending = eng->queued + eng->n_pre;
    out->max_running = eng->cfg.max_running;
    out->prefill_chunk = eng->cfg.prefill_chunk;
    out->prefill_chunk_shared = eng->cfg.prefill_chunk_shared;
    out->kv_blocks_total = eng->pool.n_blocks;
    out->kv_blocks_free = eng->pool.n_free;
    out->kv_block_bytes = eng->block_bytes;
    out->kv_block_tokens = eng->bs;
    out->ctx_len = eng->cfg.ctx_len;
    snprintf(out->kv_sizing, sizeof out->kv_sizing, "%s", eng->kv_sizing);
    snprintf(out->device, sizeof out->device, "%s", eng->device);
    out->kv_seq_bytes = (long long)(eng->pool.n_blocks - eng->pool.n_free - eng->pc.n_idle) *
                        eng->block_bytes;
    out->kv_budget_bytes = eng->cfg.kv_budget_bytes > 0 ? eng->cfg.kv_budget_bytes : 0;
    out->kv_projected_bytes = eng->proj_total;
    out->cache_blocks = eng->pc.n_indexed;
    out->cache_blocks_idle = eng->pc.n_idle;
    out->cache_max_blocks = eng->pc.max_idle;
    out->cache_evictions = eng->pc.evictions;
    if (eng->disk) {
        const struct kv_disk_stats *d = &eng->disk_st;
        out->ssd = true;
        snprintf(out->ssd_dir, sizeof out->ssd_dir, "%s", kv_disk_path(eng->disk));
        out->ssd_writes = d->writes;
        out->ssd_reads = d->reads;
        out->ssd_bad = d->bad;
        out->ssd_evictions = d->evictions;
        out->ssd_bytes = d->bytes;
        out->ssd_files = d->files;
        out->ssd_max_bytes = d->max_bytes;
        snprintf(out->ssd_error, sizeof out->ssd_error, "%s", eng->pc.disk_err);
    }
    pthread_mutex_unlock(&eng->mu);
}
