/* engine.c - the engine thread, its bounded FIFO queue and the per-request
 * event channels. Generation is serial for now: the thread takes the oldest
 * request, prefills it chunk by chunk, then decodes token by token, checking
 * the request's cancel flag before every forward pass. */
#include "engine/engine.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "kv/kv_cache.h"
#include "kv/prefix_cache.h"
#include "model/forward.h"

#define KV_BLOCK 16

struct engine_request {
    int *prompt;
    int n_prompt;
    struct engine_params p;
    int *stop_ids;
    atomic_int refs;
    atomic_bool cancel;
    int n_cached;            /* prompt tokens served from the prefix cache */

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
    int *toks;               /* ids behind the running sequence's K/V */
    int *match;              /* prefix_cache_lookup's output */
    float *logits;

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct engine_request *q_head, *q_tail;
    struct engine_request *current; /* the running request, for shutdown */
    int queued, running;
    bool stopping;
    bool cap_pending;        /* engine_set_prompt_cache while running */
    long long cap_bytes;
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
    struct sampler tmp;
    if (sampler_init(&tmp, &p->sp, 1, e))
        return NULL;
    sampler_free(&tmp);
    struct engine_request *r = calloc(1, sizeof *r);
    if (!r)
        goto oom;
    r->prompt = malloc(sizeof(int) * (size_t)n_prompt);
    r->stop_ids = malloc(sizeof(int) * (size_t)(p->n_stop_ids > 0 ? p->n_stop_ids : 1));
    if (!r->prompt || !r->stop_ids)
        goto oom;
    memcpy(r->prompt, prompt, sizeof(int) * (size_t)n_prompt);
    r->n_prompt = n_prompt;
    r->p = *p;
    if (p->n_stop_ids > 0)
        memcpy(r->stop_ids, p->stop_ids, sizeof(int) * (size_t)p->n_stop_ids);
    r->p.stop_ids = r->stop_ids;
    atomic_init(&r->refs, 1);
    atomic_init(&r->cancel, false);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    return r;
oom:
    if (r) {
        free(r->prompt);
        free(r->stop_ids);
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
        r->ev[r->n++] = *ev;
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
                              .n_generated = n_gen, .n_cached = r->n_cached};
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

static void run_request(struct engine *eng, struct engine_request *r)
{
    struct err e = {{0}};
    struct kv_seq seq = {0};
    struct sampler smp;
    int n_gen = 0, vocab = eng->m->cfg.vocab_size;
    if (sampler_init(&smp, &r->p.sp, vocab, &e)) {
        finish(r, ENGINE_FINISH_ERROR, 0, e.msg);
        return;
    }
    int max_gen = eng->cfg.ctx_len - r->n_prompt;
    if (r->p.max_tokens > 0 && r->p.max_tokens < max_gen)
        max_gen = r->p.max_tokens;
    enum engine_finish why = ENGINE_FINISH_LENGTH;
    /* Prefix cache: start on the longest cached chain of full blocks, but
     * compute at least the last prompt token (its logits are needed). */
    memcpy(eng->toks, r->prompt, sizeof(int) * (size_t)r->n_prompt);
    int n_match = prefix_cache_lookup(&eng->pc, r->prompt, r->n_prompt,
                                      (r->n_prompt - 1) / KV_BLOCK, eng->match);
    if (n_match > 0 && prefix_cache_attach(&eng->pc, &seq, eng->match, n_match, &e)) {
        why = ENGINE_FINISH_ERROR;
        goto out;
    }
    r->n_cached = seq.n_tokens;
    pthread_mutex_lock(&eng->mu);
    if (eng->pc.max_idle > 0) {
        if (n_match > 0)
            eng->st.cache_hits++;
        else
            eng->st.cache_misses++;
        eng->st.cache_tokens += (uint64_t)r->n_cached;
    }
    pthread_mutex_unlock(&eng->mu);
    for (int done = seq.n_tokens; done < r->n_prompt;) {
        if (atomic_load(&r->cancel)) {
            why = ENGINE_FINISH_CANCELLED;
            goto out;
        }
        int k = r->n_prompt - done;
        if (k > eng->cfg.prefill_chunk)
            k = eng->cfg.prefill_chunk;
        assert(seq.n_tokens == done && kv_seq_writable(&eng->pool, &seq, done));
        if (forward_tokens(&eng->fs, &eng->pool, &seq, r->prompt + done, k, false, eng->logits, &e)) {
            why = ENGINE_FINISH_ERROR;
            goto out;
        }
        done += k;
    }
    prefix_cache_register(&eng->pc, &seq, eng->toks);
    pthread_mutex_lock(&eng->mu);
    eng->st.tokens_prompt += (uint64_t)r->n_prompt;
    pthread_mutex_unlock(&eng->mu);
    while (n_gen < max_gen) {
        if (atomic_load(&r->cancel)) {
            why = ENGINE_FINISH_CANCELLED;
            goto out;
        }
        int tok = sampler_sample(&smp, eng->logits);
        if (is_stop(eng, r, tok)) {
            why = ENGINE_FINISH_STOP;
            goto out;
        }
        n_gen++;
        struct engine_event ev = {.token = tok, .n_prompt = r->n_prompt, .n_generated = n_gen,
                                  .n_cached = r->n_cached};
        push_event(r, &ev);
        if (n_gen == max_gen)
            break;
        assert(kv_seq_writable(&eng->pool, &seq, seq.n_tokens));
        eng->toks[seq.n_tokens] = tok;
        if (forward_tokens(&eng->fs, &eng->pool, &seq, &tok, 1, false, eng->logits, &e)) {
            why = ENGINE_FINISH_ERROR;
            goto out;
        }
    }
out:
    pthread_mutex_lock(&eng->mu);
    eng->st.tokens_generated += (uint64_t)n_gen;
    if (why == ENGINE_FINISH_CANCELLED)
        eng->st.requests_cancelled++;
    pthread_mutex_unlock(&eng->mu);
    /* Index every full block computed (prompt and generated), then drop the
     * sequence's references: indexed blocks stay cached, idle. */
    if (why != ENGINE_FINISH_ERROR)
        prefix_cache_register(&eng->pc, &seq, eng->toks);
    finish(r, why, n_gen, why == ENGINE_FINISH_ERROR ? e.msg : NULL);
    kv_seq_release(&eng->pool, &seq);
    sampler_free(&smp);
}

static int cap_blocks(const struct engine *eng, long long bytes)
{
    if (bytes < 0)
        return 0;
    if (bytes == 0)
        return eng->pool.n_blocks;
    size_t per = kv_pool_bytes_per_block(eng->pool.n_layers, eng->pool.kv_dim, eng->pool.block_size);
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
        while (!eng->stopping && !eng->q_head)
            pthread_cond_wait(&eng->cv, &eng->mu);
        if (eng->stopping)
            break;
        struct engine_request *r = eng->q_head;
        eng->q_head = r->next;
        if (!eng->q_head)
            eng->q_tail = NULL;
        r->queued = false;
        eng->queued--;
        eng->running++;
        eng->current = r;
        if (eng->cap_pending) {
            prefix_cache_set_cap(&eng->pc, cap_blocks(eng, eng->cap_bytes));
            eng->cap_pending = false;
        }
        pthread_mutex_unlock(&eng->mu);
        run_request(eng, r);
        pthread_mutex_lock(&eng->mu);
        eng->current = NULL;
        eng->running--;
        pthread_mutex_unlock(&eng->mu);
        engine_request_release(r);
        pthread_mutex_lock(&eng->mu);
    }
    /* Shutdown: nothing queued may be lost silently; each gets a final event. */
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
    if (eng->cfg.prefill_chunk <= 0)
        eng->cfg.prefill_chunk = 128;
    if (eng->cfg.max_queue <= 0)
        eng->cfg.max_queue = 64;
    const struct model_config *c = &m->cfg;
    eng->be = backend_create(cfg->device, cfg->n_threads, e);
    eng->logits = malloc(sizeof(float) * (size_t)c->vocab_size);
    eng->toks = malloc(sizeof(int) * (size_t)eng->cfg.ctx_len);
    eng->match = malloc(sizeof(int) * (size_t)(eng->cfg.ctx_len / KV_BLOCK + 1));
    if (!eng->toks || !eng->match) {
        free(eng->logits);
        eng->logits = NULL;
    }
    /* The model fingerprint seeds every chain key: blocks computed by a
     * different model, weights file or KV scheme can never match. */
    char fp[1400];
    snprintf(fp, sizeof fp,
             "cllm-kv-v1|%s|%s|%s|dim=%d ff=%d L=%d H=%d KV=%d hd=%d V=%d eps=%a theta=%a "
             "rope=%d/%d/%a/%a/%a/%d bias=%d qkn=%d tied=%d swa=%d|kv=f32|block=%d",
             m->path, m->format, c->arch, c->dim, c->hidden_dim, c->n_layers, c->n_heads,
             c->n_kv_heads, c->head_dim, c->vocab_size, (double)c->norm_eps,
             (double)c->rope_theta, c->rope_interleaved, (int)c->rope_scaling,
             (double)c->rope_factor, (double)c->rope_low_freq_factor,
             (double)c->rope_high_freq_factor, c->rope_orig_max_seq, c->qkv_bias, c->qk_norm,
             c->tied_embeddings, c->sliding_window, KV_BLOCK);
    if (!eng->be || !eng->logits || backend_load_weights(eng->be, m, e) ||
        forward_init(&eng->fs, m, eng->be, eng->cfg.prefill_chunk, e) ||
        kv_pool_init(&eng->pool, eng->be, c->n_layers, c->n_kv_heads * c->head_dim, KV_BLOCK,
                     (eng->cfg.kv_tokens + KV_BLOCK - 1) / KV_BLOCK, e))
        goto fail;
    if (prefix_cache_init(&eng->pc, &eng->pool, prefix_hash_bytes(fp, strlen(fp)), 0, e))
        goto fail;
    prefix_cache_set_cap(&eng->pc, cap_blocks(eng, cfg->prompt_cache_bytes));
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
    if (!eng->logits)
        err_set(e, "out of memory");
    prefix_cache_free(&eng->pc);
    kv_pool_free(&eng->pool);
    forward_free(&eng->fs);
    backend_destroy(eng->be);
    free(eng->logits);
    free(eng->toks);
    free(eng->match);
    free(eng);
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
    if (eng->current)
        atomic_store(&eng->current->cancel, true);
    pthread_cond_broadcast(&eng->cv);
    pthread_mutex_unlock(&eng->mu);
    pthread_join(eng->thread, NULL);
    pthread_mutex_destroy(&eng->mu);
    pthread_cond_destroy(&eng->cv);
    prefix_cache_free(&eng->pc);
    kv_pool_free(&eng->pool);
    forward_free(&eng->fs);
    backend_destroy(eng->be);
    free(eng->logits);
    free(eng->toks);
    free(eng->match);
    free(eng);
}

int engine_submit(struct engine *eng, struct engine_request *r, struct err *e)
{
    if (r->n_prompt >= eng->cfg.ctx_len)
        return err_set(e, "the prompt has %d tokens but the context is %d tokens (at least one "
                          "must remain for the answer)", r->n_prompt, eng->cfg.ctx_len);
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= eng->m->cfg.vocab_size)
            return err_set(e, "token id %d is outside the vocabulary (0..%d)", r->prompt[i],
                           eng->m->cfg.vocab_size - 1);
    pthread_mutex_lock(&eng->mu);
    if (eng->stopping) {
        pthread_mutex_unlock(&eng->mu);
        return err_set(e, "the server is shutting down");
    }
    if (eng->queued >= eng->cfg.max_queue) {
        pthread_mutex_unlock(&eng->mu);
        return err_set(e, "too many requests waiting (%d queued); retry later", eng->queued);
    }
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
    pthread_cond_signal(&eng->cv);
    pthread_mutex_unlock(&eng->mu);
    return 0;
}

void engine_get_stats(struct engine *eng, struct engine_stats *out)
{
    pthread_mutex_lock(&eng->mu);
    *out = eng->st;
    out->queued = eng->queued;
    out->running = eng->running;
    out->kv_blocks_total = eng->pool.n_blocks;
    out->kv_blocks_free = eng->pool.n_free;
    out->cache_blocks = eng->pc.n_indexed;
    out->cache_blocks_idle = eng->pc.n_idle;
    out->cache_max_blocks = eng->pc.max_idle;
    out->cache_evictions = eng->pc.evictions;
    pthread_mutex_unlock(&eng->mu);
}
