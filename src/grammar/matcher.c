/* matcher.c - where a generation stands in a grammar, and which tokens may
 * come next.
 *
 * A position in a grammar is a set of stacks (several while the text so far
 * is ambiguous). A stack is a chain of nodes, each an element position and
 * the node to return to once that alternative ends; nodes are interned, so
 * equal stacks are one node id, and a state (a sorted set of top nodes) is
 * interned too. Each state keeps its transitions by byte as they are met,
 * which makes the matcher a DFA built lazily over the grammar's PDA: the
 * loop inside a JSON string, say, is one state whose byte transitions lead
 * back to itself.
 *
 * The tokens allowed in a state are found by one walk over the vocabulary
 * sorted by bytes: a token sharing k leading bytes with the one before
 * starts from the state after those k bytes, and a byte that cannot follow
 * skips every token that begins the same way. The result is kept per state.
 *
 * A continuation that would point at the end of an alternative is replaced
 * by the node it returns to, so right recursion (repetition) keeps stacks
 * from growing: the n-th item of a list is in the same state as the first. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/grammar_internal.h"
#include "tokenizer/tokenizer.h"

#define MAX_NODES (1 << 22)
#define MAX_STATES (1 << 16)
#define MAX_STACKS (1 << 14) /* stacks in one state: an ambiguity bound */
/* Stack steps (a node expanded or a stack advanced) one matcher may take
 * over its life: the engine thread works masks out between steps for every
 * sequence, so a grammar that is ambiguous enough to need more (~5 s of
 * work) fails its own request instead of stalling everyone's. A JSON
 * schema's generation takes a few million. */
#define MAX_WORK 500000000LL

enum { T_UNKNOWN = -2, T_DEAD = -1, T_ERROR = -3 };

struct grammar_vocab {
    int n_vocab;
    int n;         /* ids with bytes */
    int *order;    /* [n] those ids sorted by their bytes */
    int *lcp;      /* [n] leading bytes shared with the token before in order */
    size_t *off;   /* [n_vocab] where an id's bytes start in bytes */
    int *len;      /* [n_vocab] their number; 0: never allowed */
    char *bytes;
    int max_len;
};

struct gstate {
    int off, n;         /* its top nodes, in the matcher's pool, sorted */
    int32_t *next;      /* [256] state after a byte: T_UNKNOWN until met */
    uint64_t *allowed;  /* bit per token id, once worked out */
    int n_allowed;
};

struct ids {
    int *v;
    int n, cap;
};

struct grammar_matcher {
    const struct grammar *g;
    const struct grammar_vocab *v;
    int *npos, *npar; /* node 0: the empty stack (the sentence is complete) */
    int n_nodes, cap_nodes;
    int *nhash; /* open addressing, node id + 1; 0 empty */
    int nhash_cap;
    struct gstate *st;
    int n_states, cap_states;
    struct ids pool; /* the states' nodes */
    int *shash;
    int shash_cap;
    int cur;
    struct ids tmp, work; /* closure scratch */
    int *walk;            /* [max_len + 1] states along a token's bytes */
    long long steps;      /* stack steps so far, against MAX_WORK */
    char err[160];
};

static int ids_push(struct ids *a, int x)
{
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 64;
        int *v = realloc(a->v, sizeof *v * (size_t)cap);
        if (!v)
            return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

static uint32_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (uint32_t)x;
}

static int oom(struct grammar_matcher *m, const char *what)
{
    snprintf(m->err, sizeof m->err, "grammar: %s", what);
    return T_ERROR;
}

static int rehash_nodes(struct grammar_matcher *m, int cap)
{
    int *h = calloc((size_t)cap, sizeof *h);
    if (!h)
        return -1;
    for (int i = 1; i < m->n_nodes; i++) {
        uint32_t k = mix(((uint64_t)(uint32_t)m->npos[i] << 32) | (uint32_t)m->npar[i]);
        for (uint32_t j = k & (uint32_t)(cap - 1);; j = (j + 1) & (uint32_t)(cap - 1))
            if (!h[j]) {
                h[j] = i + 1;
                break;
            }
    }
    free(m->nhash);
    m->nhash = h;
    m->nhash_cap = cap;
    return 0;
}

/* The interned node (pos, parent). */
static int node(struct grammar_matcher *m, int pos, int parent)
{
    uint32_t k = mix(((uint64_t)(uint32_t)pos << 32) | (uint32_t)parent);
    uint32_t mask = (uint32_t)m->nhash_cap - 1, j = k & mask;
    for (; m->nhash[j]; j = (j + 1) & mask) {
        int id = m->nhash[j] - 1;
        if (m->npos[id] == pos && m->npar[id] == parent)
            return id;
    }
    if (m->n_nodes >= MAX_NODES)
        return oom(m, "the text is nested too deeply for the matcher (node limit)");
    if (m->n_nodes == m->cap_nodes) {
        int cap = m->cap_nodes * 2;
        int *p = realloc(m->npos, sizeof *p * (size_t)cap);
        if (p)
            m->npos = p;
        int *q = p ? realloc(m->npar, sizeof *q * (size_t)cap) : NULL;
        if (!q)
            return oom(m, "out of memory");
        m->npar = q;
        m->cap_nodes = cap;
    }
    int id = m->n_nodes++;
    m->npos[id] = pos;
    m->npar[id] = parent;
    m->nhash[j] = id + 1;
    if ((size_t)m->n_nodes * 2 > (size_t)m->nhash_cap && rehash_nodes(m, m->nhash_cap * 2))
        return oom(m, "out of memory");
    return id;
}

/* The node that resumes at pos under parent; the parent itself when pos
 * ends an alternative. */
static int cont(struct grammar_matcher *m, int pos, int parent)
{
    enum gel_type t = m->g->el[pos].type;
    return t == GEL_END || t == GEL_ALT ? parent : node(m, pos, parent);
}

/* Adds to m->tmp the top nodes reachable from n by expanding rule
 * references and finished alternatives (no left recursion: it ends). */
static int closure(struct grammar_matcher *m, int n)
{
    const struct grammar *g = m->g;
    m->work.n = 0;
    if (ids_push(&m->work, n))
        return oom(m, "out of memory");
    while (m->work.n) {
        if (++m->steps > MAX_WORK)
            return oom(m, "the grammar is too ambiguous to follow (work limit)");
        n = m->work.v[--m->work.n];
        if (n == 0 || g->el[m->npos[n]].type == GEL_SET) {
            if (m->tmp.n >= MAX_STACKS)
                return oom(m, "the grammar is too ambiguous here (stack limit)");
            if (ids_push(&m->tmp, n))
                return oom(m, "out of memory");
            continue;
        }
        /* a rule reference */
        int c = cont(m, m->npos[n] + 1, m->npar[n]);
        if (c < 0)
            return c;
        int a = g->rule_start[g->el[m->npos[n]].v];
        for (;;) {
            enum gel_type t = g->el[a].type;
            int x = t == GEL_END || t == GEL_ALT ? c : node(m, a, c);
            if (x < 0)
                return x;
            if (ids_push(&m->work, x))
                return oom(m, "out of memory");
            int e = grammar_alt_end(g, a);
            if (g->el[e].type == GEL_END)
                break;
            a = e + 1;
        }
    }
    return 0;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static uint32_t hash_ids(const int *v, int n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    for (int i = 0; i < n; i++)
        h = (h ^ (uint32_t)v[i]) * 0x100000001b3ull;
    return mix(h);
}

static int rehash_states(struct grammar_matcher *m, int cap)
{
    int *h = calloc((size_t)cap, sizeof *h);
    if (!h)
        return -1;
    for (int i = 0; i < m->n_states; i++) {
        uint32_t k = hash_ids(m->pool.v + m->st[i].off, m->st[i].n);
        for (uint32_t j = k & (uint32_t)(cap - 1);; j = (j + 1) & (uint32_t)(cap - 1))
            if (!h[j]) {
                h[j] = i + 1;
                break;
            }
    }
    free(m->shash);
    m->shash = h;
    m->shash_cap = cap;
    return 0;
}

/* The state whose top nodes are m->tmp (sorted and deduplicated here). */
static int intern_tmp(struct grammar_matcher *m)
{
    qsort(m->tmp.v, (size_t)m->tmp.n, sizeof *m->tmp.v, cmp_int);
    int n = 0;
    for (int i = 0; i < m->tmp.n; i++)
        if (n == 0 || m->tmp.v[i] != m->tmp.v[n - 1])
            m->tmp.v[n++] = m->tmp.v[i];
    m->tmp.n = n;
    uint32_t k = hash_ids(m->tmp.v, n), mask = (uint32_t)m->shash_cap - 1, j = k & mask;
    for (; m->shash[j]; j = (j + 1) & mask) {
        struct gstate *s = &m->st[m->shash[j] - 1];
        if (s->n == n && memcmp(m->pool.v + s->off, m->tmp.v, sizeof(int) * (size_t)n) == 0)
            return m->shash[j] - 1;
    }
    if (m->n_states >= MAX_STATES)
        return oom(m, "the grammar has too many states for the matcher");
    if (m->n_states == m->cap_states) {
        int cap = m->cap_states ? m->cap_states * 2 : 64;
        struct gstate *s = realloc(m->st, sizeof *s * (size_t)cap);
        if (!s)
            return oom(m, "out of memory");
        m->st = s;
        m->cap_states = cap;
    }
    int off = m->pool.n;
    for (int i = 0; i < n; i++)
        if (ids_push(&m->pool, m->tmp.v[i]))
            return oom(m, "out of memory");
    int id = m->n_states++;
    m->st[id] = (struct gstate){.off = off, .n = n};
    m->shash[j] = id + 1;
    if ((size_t)m->n_states * 2 > (size_t)m->shash_cap && rehash_states(m, m->shash_cap * 2))
        return oom(m, "out of memory");
    return id;
}

/* The state after byte b in state s: a state id, T_DEAD, or T_ERROR. */
static int advance(struct grammar_matcher *m, int s, unsigned char b)
{
    if (!m->st[s].next) {
        int32_t *t = malloc(sizeof *t * 256);
        if (!t)
            return oom(m, "out of memory");
        for (int i = 0; i < 256; i++)
            t[i] = T_UNKNOWN;
        m->st[s].next = t;
    }
    int32_t r = m->st[s].next[b];
    if (r != T_UNKNOWN)
        return r;
    const struct grammar *g = m->g;
    m->tmp.n = 0;
    if ((m->steps += m->st[s].n) > MAX_WORK)
        return oom(m, "the grammar is too ambiguous to follow (work limit)");
    for (int i = 0; i < m->st[s].n; i++) {
        int n = m->pool.v[m->st[s].off + i];
        if (n == 0 || !byteset_has(&g->sets[g->el[m->npos[n]].v], b))
            continue;
        int c = cont(m, m->npos[n] + 1, m->npar[n]);
        if (c < 0 || closure(m, c) < 0)
            return T_ERROR;
    }
    r = m->tmp.n ? intern_tmp(m) : T_DEAD;
    if (r != T_ERROR)
        m->st[s].next[b] = r;
    return r;
}

struct grammar_matcher *grammar_matcher_new(const struct grammar *g,
                                            const struct grammar_vocab *v, struct err *e)
{
    struct grammar_matcher *m = calloc(1, sizeof *m);
    if (!m)
        goto oom;
    m->g = g;
    m->v = v;
    m->cap_nodes = 1024;
    m->npos = malloc(sizeof *m->npos * (size_t)m->cap_nodes);
    m->npar = malloc(sizeof *m->npar * (size_t)m->cap_nodes);
    m->nhash_cap = 4096;
    m->nhash = calloc((size_t)m->nhash_cap, sizeof *m->nhash);
    m->shash_cap = 256;
    m->shash = calloc((size_t)m->shash_cap, sizeof *m->shash);
    m->walk = malloc(sizeof *m->walk * (size_t)((v ? v->max_len : 0) + 1));
    if (!m->npos || !m->npar || !m->nhash || !m->shash || !m->walk)
        goto oom;
    m->npos[0] = -1;
    m->npar[0] = -1;
    m->n_nodes = 1;
    /* the start: root's alternatives, returning to the empty stack */
    int a = g->rule_start[g->root];
    for (;;) {
        enum gel_type t = g->el[a].type;
        int x = t == GEL_END || t == GEL_ALT ? 0 : node(m, a, 0);
        if (x < 0 || closure(m, x) < 0)
            goto fail;
        int end = grammar_alt_end(g, a);
        if (g->el[end].type == GEL_END)
            break;
        a = end + 1;
    }
    if ((m->cur = intern_tmp(m)) < 0)
        goto fail;
    return m;
oom:
    if (m)
        snprintf(m->err, sizeof m->err, "grammar: out of memory");
fail:
    err_set(e, "%s", m ? m->err : "grammar: out of memory");
    grammar_matcher_free(m);
    return NULL;
}

void grammar_matcher_free(struct grammar_matcher *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_states; i++) {
        free(m->st[i].next);
        free(m->st[i].allowed);
    }
    free(m->st);
    free(m->npos);
    free(m->npar);
    free(m->nhash);
    free(m->shash);
    free(m->pool.v);
    free(m->tmp.v);
    free(m->work.v);
    free(m->walk);
    free(m);
}

int grammar_matcher_feed(struct grammar_matcher *m, const char *s, size_t n, struct err *e)
{
    int st = m->cur;
    for (size_t i = 0; i < n; i++) {
        st = advance(m, st, (unsigned char)s[i]);
        if (st == T_ERROR)
            return err_set(e, "%s", m->err);
        if (st == T_DEAD)
            return err_set(e, "grammar: the text cannot continue with byte %zu", i);
    }
    m->cur = st;
    return 0;
}

int grammar_matcher_feed_token(struct grammar_matcher *m, int id, struct err *e)
{
    const struct grammar_vocab *v = m->v;
    if (!v || id < 0 || id >= v->n_vocab || v->len[id] <= 0)
        return err_set(e, "grammar: token %d has no text to match", id);
    return grammar_matcher_feed(m, v->bytes + v->off[id], (size_t)v->len[id], e);
}

bool grammar_matcher_can_end(const struct grammar_matcher *m)
{
    const struct gstate *s = &m->st[m->cur];
    return m->pool.v[s->off] == 0; /* sorted: the empty stack comes first */
}

bool grammar_matcher_must_end(const struct grammar_matcher *m)
{
    const struct gstate *s = &m->st[m->cur];
    return s->n == 1 && m->pool.v[s->off] == 0;
}

/* Works out state s's allowed tokens (see the file comment). */
static int allowed_of(struct grammar_matcher *m, int s)
{
    const struct grammar_vocab *v = m->v;
    uint64_t *bits = calloc((size_t)(v->n_vocab + 63) / 64, sizeof *bits);
    if (!bits)
        return oom(m, "out of memory");
    int *w = m->walk, valid = 0, count = 0;
    w[0] = s;
    for (int i = 0; i < v->n; i++) {
        int id = v->order[i], len = v->len[id];
        const unsigned char *b = (const unsigned char *)v->bytes + v->off[id];
        int d = v->lcp[i] < valid ? v->lcp[i] : valid;
        while (d < len) {
            int t = advance(m, w[d], b[d]);
            if (t == T_ERROR) {
                free(bits);
                return T_ERROR;
            }
            if (t == T_DEAD)
                break;
            w[++d] = t;
        }
        valid = d;
        if (d == len) {
            bits[id >> 6] |= 1ull << (id & 63);
            count++;
        } else {
            while (i + 1 < v->n && v->lcp[i + 1] > d)
                i++;
        }
    }
    m->st[s].allowed = bits;
    m->st[s].n_allowed = count;
    return 0;
}

int grammar_matcher_mask(struct grammar_matcher *m, float *logits, const int *end_ids,
                         int n_end, struct err *e)
{
    const struct grammar_vocab *v = m->v;
    if (!v)
        return err_set(e, "grammar: the matcher has no vocabulary");
    if (!m->st[m->cur].allowed && allowed_of(m, m->cur) < 0)
        return err_set(e, "%s", m->err);
    const struct gstate *s = &m->st[m->cur];
    bool end = grammar_matcher_can_end(m);
    float *kept = NULL;
    if (end && n_end > 0) {
        if (!(kept = malloc(sizeof *kept * (size_t)n_end)))
            return err_set(e, "grammar: out of memory");
        for (int k = 0; k < n_end; k++)
            kept[k] = end_ids[k] >= 0 && end_ids[k] < v->n_vocab ? logits[end_ids[k]] : 0;
    }
    for (int w = 0; w < (v->n_vocab + 63) / 64; w++) {
        uint64_t bits = s->allowed[w];
        if (bits == ~0ull)
            continue;
        int top = w * 64 + 64 < v->n_vocab ? 64 : v->n_vocab - w * 64;
        for (int i = 0; i < top; i++)
            if (!((bits >> i) & 1))
                logits[w * 64 + i] = -INFINITY;
    }
    int count = s->n_allowed;
    for (int k = 0; kept && k < n_end; k++) {
        int id = end_ids[k];
        if (id < 0 || id >= v->n_vocab || ((s->allowed[id >> 6] >> (id & 63)) & 1) ||
            logits[id] != -INFINITY)
            continue; /* out of range, allowed anyway, or already restored */
        logits[id] = kept[k];
        count++;
    }
    free(kept);
    return count;
}

/* ---- vocabulary ---- */

static int cmp_tokens(const void *a, const void *b, void *ctx)
{
    const struct grammar_vocab *v = ctx;
    int x = *(const int *)a, y = *(const int *)b;
    int lx = v->len[x], ly = v->len[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], (size_t)(lx < ly ? lx : ly));
    if (c)
        return c;
    return lx != ly ? (lx > ly) - (lx < ly) : (x > y) - (x < y);
}

struct grammar_vocab *grammar_vocab_new(const struct tokenizer *t, int n_vocab, struct err *e)
{
    struct grammar_vocab *v = calloc(1, sizeof *v);
    if (!v)
        goto oom;
    v->n_vocab = n_vocab;
    v->off = calloc((size_t)n_vocab, sizeof *v->off);
    v->len = calloc((size_t)n_vocab, sizeof *v->len);
    v->order = malloc(sizeof *v->order * (size_t)n_vocab);
    v->lcp = malloc(sizeof *v->lcp * (size_t)n_vocab);
    if (!v->off || !v->len || !v->order || !v->lcp)
        goto oom;
    int tv = tok_vocab_size(t);
    for (int pass = 0; pass < 2; pass++) {
        size_t at = 0;
        for (int id = 0; id < n_vocab && id < tv; id++) {
            const char *s;
            char byte;
            int n = tok_id_bytes(t, id, &s, &byte);
            if (n <= 0)
                continue;
            if (pass == 1) {
                memcpy(v->bytes + at, s, (size_t)n);
                v->off[id] = at;
                v->len[id] = n;
                v->order[v->n++] = id;
                if (n > v->max_len)
                    v->max_len = n;
            }
            at += (size_t)n;
        }
        if (pass == 0 && !(v->bytes = malloc(at ? at : 1)))
            goto oom;
    }
    qsort_r(v->order, (size_t)v->n, sizeof *v->order, cmp_tokens, v);
    for (int i = 0; i < v->n; i++) {
        int l = 0;
        if (i > 0) {
            int x = v->order[i - 1], y = v->order[i];
            int n = v->len[x] < v->len[y] ? v->len[x] : v->len[y];
            while (l < n && v->bytes[v->off[x] + l] == v->bytes[v->off[y] + l])
                l++;
        }
        v->lcp[i] = l;
    }
    return v;
oom:
    grammar_vocab_free(v);
    err_set(e, "grammar: out of memory for the vocabulary (%d tokens)", n_vocab);
    return NULL;
}

void grammar_vocab_free(struct grammar_vocab *v)
{
    if (!v)
        return;
    free(v->order);
    free(v->lcp);
    free(v->off);
    free(v->len);
    free(v->bytes);
    free(v);
}
