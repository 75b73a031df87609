/* drafter.c - the draft model of two-model speculation: a backend, forward
 * state and K/V of its own, the tokens its K/V holds, and a prefix index
 * over that K/V's blocks so that agents taking turns do not cost it their
 * prompts again. */
#include "engine/drafter.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/argmax.h"
#include "engine/logits.h"
#include "kv/kv_cache.h"
#include "kv/prefix_cache.h"
#include "model/forward.h"

#define DRAFT_BLOCK 16

struct drafter {
    const struct model *m;
    struct backend *be;
    struct forward_state fs;
    struct kv_pool pool;   /* one context's blocks, and half a context more for the index */
    struct prefix_cache pc;
    struct kv_seq seq;
    int ctx;       /* tokens the K/V may hold */
    int *toks;     /* what positions [0, seq.n_tokens) were computed from */
    int *match;    /* prefix_cache_lookup's output */
    float *logits; /* a row, where the backend has no device argmax */
    struct drafter_stats st;
};

void drafter_free(struct drafter *d)
{
    if (!d)
        return;
    kv_seq_release(&d->pool, &d->seq);
    prefix_cache_free(&d->pc);
    kv_pool_free(&d->pool);
    forward_free(&d->fs);
    backend_destroy(d->be);
    free(d->toks);
    free(d->match);
    free(d->logits);
    free(d);
}

struct drafter *drafter_create(const struct model *m, const char *device, int n_threads,
                               int ctx_len, int compiled_decode, struct err *e)
{
    struct drafter *d = calloc(1, sizeof *d);
    if (!d) {
        err_set(e, "out of memory");
        return NULL;
    }
    const struct model_config *c = &m->cfg;
    d->m = m;
    d->ctx = ctx_len > 0 && ctx_len < c->max_seq ? ctx_len : c->max_seq;
    int blocks = (d->ctx + DRAFT_BLOCK - 1) / DRAFT_BLOCK;
    d->toks = malloc(sizeof(int) * (size_t)d->ctx);
    d->match = malloc(sizeof(int) * (size_t)blocks);
    d->logits = malloc(sizeof(float) * (size_t)c->vocab_size);
    if (!d->toks || !d->match || !d->logits) {
        err_set(e, "out of memory");
        goto fail;
    }
    /* A backend of its own: a backend holds one model's weights. Its
     * forward takes a prompt's catch-up in chunks of 2,048 tokens on a
     * device, 128 on the CPU, as the engine's prefill does when it has the
     * step to itself (the draft's catch-up never shares one), and makes
     * the logits of one row: a step picks after the last token only. */
    if (!(d->be = backend_create(device, n_threads, e)))
        goto fail;
    backend_set_compiled_decode(d->be, compiled_decode);
    if (backend_load_weights(d->be, m, e) ||
        forward_init_rows(&d->fs, m, d->be, backend_on_device(d->be) ? 2048 : 128, 1, e))
        goto fail;
    /* The index's blocks are this pool's only: the seed need not tell
     * models apart. */
    if (kv_pool_init(&d->pool, d->be, c->n_layers, c->n_kv_heads, c->head_dim, DRAFT_BLOCK,
                     blocks + blocks / 2, e) ||
        prefix_cache_init(&d->pc, &d->pool, prefix_hash_bytes("cllm-draft", 10), blocks / 2,
                          e))
        goto fail;
    return d;
fail:
    err_wrap(e, "draft model %s", m->path);
    drafter_free(d);
    return NULL;
}

void drafter_get_stats(const struct drafter *d, struct drafter_stats *out)
{
    *out = d->st;
}

size_t drafter_bytes(const struct drafter *d)
{
    return model_weight_bytes_per_token(d->m) + kv_pool_bytes(&d->pool);
}

/* Feeds toks[0..n) (n - 1 of them already in the K/V at most) and picks
 * after the last: *next, and with want_p its probability in *p. The
 * probability comes from the device's row_logprobs where there is one,
 * else from the row. */
static int step(struct drafter *d, const int *toks, int n, bool want_p, int *next, float *p,
                struct err *e)
{
    const int V = d->m->cfg.vocab_size;
    if (!want_p)
        return forward_tokens_greedy(&d->fs, &d->pool, &d->seq, toks, n, d->logits, next, e);
    if (d->be->ops->row_logprobs && n <= d->fs.max_tokens) {
        struct token_logprobs lp;
        struct forward_seg seg = {.seq = &d->seq, .tokens = toks, .n = n, .logits = true,
                                  .next = next, .lp = &lp, .lp_k = 0};
        if (forward_batch(&d->fs, &d->pool, &seg, 1, d->logits, e))
            return -1;
        *p = expf(lp.logprob);
        return 0;
    }
    if (forward_tokens(&d->fs, &d->pool, &d->seq, toks, n, false, d->logits, e))
        return -1;
    *next = argmax_f32(d->logits, V);
    *p = (float)exp((double)d->logits[*next] - logits_lse(d->logits, V));
    return 0;
}

/* Starts the K/V again on the index's chain for toks (nb blocks, found by
 * lookup; what it held was registered before). Returns the tokens that
 * chain holds, -1 with a message. */
static int switch_chain(struct drafter *d, const int *toks, int nb, struct err *e)
{
    struct kv_seq next = {0};
    /* the chain's blocks are held before this context's are let go, so
     * none of them can be evicted in between */
    if (prefix_cache_attach(&d->pc, &next, d->match, nb, e))
        return -1;
    kv_seq_release(&d->pool, &d->seq);
    d->seq = next;
    memcpy(d->toks, toks, sizeof(int) * (size_t)next.n_tokens);
    d->st.cached += (uint64_t)next.n_tokens;
    return next.n_tokens;
}

/* Feeds toks[0..n) from where it differs from what the K/V holds (or from
 * where the index's chain for them ends, when that is further), and picks
 * after the last. */
static int feed(struct drafter *d, const int *toks, int n, bool want_p, int *next, float *p,
                struct err *e)
{
    int keep = 0, have = d->seq.n_tokens;
    while (keep < have && keep < n - 1 && d->toks[keep] == toks[keep])
        keep++;
    /* A context that would write over a full block of its own (another
     * request's turn) leaves its full blocks in the index first; blocks the
     * index holds are read-only, so one that parts from such a block goes
     * back to the chain; and a chain may hold more of toks than this
     * context does (a prompt seen a turn ago). */
    bool shared = keep < have && !kv_seq_writable(&d->pool, &d->seq, keep);
    bool leaving = have - keep >= DRAFT_BLOCK;
    if (shared || leaving || n - 1 - keep >= DRAFT_BLOCK) {
        if (shared || leaving)
            prefix_cache_register(&d->pc, &d->seq, d->toks);
        int nb = prefix_cache_lookup(&d->pc, toks, n - 1, (n - 1) / DRAFT_BLOCK, d->match);
        if (shared || leaving || nb * DRAFT_BLOCK > keep) {
            if ((keep = switch_chain(d, toks, nb, e)) < 0)
                return -1;
        }
    }
    d->seq.n_tokens = keep; /* positions from here on are written again */
    d->st.computed += (uint64_t)(n - keep);
    if (kv_seq_reserve(&d->pool, &d->seq, n, e) ||
        step(d, toks + keep, n - keep, want_p, next, p, e)) {
        d->seq.n_tokens = 0;
        return -1;
    }
    memcpy(d->toks + keep, toks + keep, sizeof(int) * (size_t)(n - keep));
    return 0;
}

int drafter_propose(struct drafter *d, const int *toks, int n, int vocab, float p_min, int *out,
                    int max, struct err *e)
{
    if (n <= 0 || max <= 0)
        return 0;
    if (n + max - 1 > d->ctx) /* the last draft's K/V is never needed */
        max = d->ctx - n + 1;
    if (max <= 0)
        return 0;
    int next;
    bool want_p = p_min > 0;
    float p = 1;
    if (feed(d, toks, n, want_p, &next, &p, e))
        return err_wrap(e, "draft model");
    int k = 0;
    while (next >= 0 && next < vocab && p >= p_min) {
        out[k++] = next;
        if (k == max)
            break;
        d->toks[d->seq.n_tokens] = next;
        d->st.computed++;
        if (step(d, &out[k - 1], 1, want_p, &next, &p, e)) {
            d->seq.n_tokens = 0;
            return err_wrap(e, "draft model");
        }
    }
    return k;
}
