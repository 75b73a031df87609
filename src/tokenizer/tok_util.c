/* tok_util.c - the containers the tokenizer is built from: a string arena,
 * growable buffers, a string->id hash map, an (id,id)->merge hash map and a
 * byte trie for leftmost-longest matching of added tokens. */
#include <jansson.h>

#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- arena ---- */

struct tok_arena_blk {
    struct tok_arena_blk *next;
    size_t used, cap;
    char data[];
};

char *tok_arena_strdup(struct tok_arena *a, const char *s, size_t n)
{
    struct tok_arena_blk *b = a->head;
    if (!b || b->cap - b->used < n + 1) {
        size_t cap = n + 1 > (1u << 20) ? n + 1 : (1u << 20);
        b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->used = 0;
        b->cap = cap;
        b->next = a->head;
        a->head = b;
    }
    char *p = b->data + b->used;
    if (n)
        memcpy(p, s, n);
    p[n] = 0;
    b->used += n + 1;
    return p;
}

void tok_arena_free(struct tok_arena *a)
{
    struct tok_arena_blk *b = a->head;
    while (b) {
        struct tok_arena_blk *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
}

/* ---- buffers ---- */

int tok_buf_put(struct tok_buf *b, const void *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int tok_ivec_push(struct tok_ivec *v, int x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int *p = realloc(v->p, cap * sizeof *p);
        if (!p)
            return -1;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = x;
    return 0;
}

int tok_ids_push(int **ids, int *n, int id)
{
    int *p = realloc(*ids, (size_t)(*n + 1) * sizeof *p);
    if (!p)
        return -1;
    *ids = p;
    (*ids)[(*n)++] = id;
    return 0;
}

/* ---- string map ---- */

uint64_t tok_hash_bytes(const char *s, size_t n)
{
    /* FNV-1a, then a final mix so the low bits (the slot index) are good. */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

int tok_strmap_init(struct tok_strmap *m, size_t expected)
{
    m->cap = pow2_at_least(expected * 2 + 1);
    m->n = 0;
    m->slots = calloc(m->cap, sizeof *m->slots);
    return m->slots ? 0 : -1;
}

static int strmap_grow(struct tok_strmap *m)
{
    struct tok_strmap old = *m;
    m->cap = old.cap * 2;
    m->slots = calloc(m->cap, sizeof *m->slots);
    if (!m->slots) {
        *m = old;
        return -1;
    }
    for (size_t i = 0; i < old.cap; i++) {
        if (!old.slots[i].key)
            continue;
        size_t j = old.slots[i].hash & (m->cap - 1);
        while (m->slots[j].key)
            j = (j + 1) & (m->cap - 1);
        m->slots[j] = old.slots[i];
    }
    free(old.slots);
    return 0;
}

int tok_strmap_put(struct tok_strmap *m, const char *key, size_t len, int val)
{
    if ((m->n + 1) * 2 > m->cap && strmap_grow(m))
        return -1;
    uint64_t h = tok_hash_bytes(key, len);
    size_t j = h & (m->cap - 1);
    while (m->slots[j].key) {
        struct tok_strmap_slot *s = &m->slots[j];
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0)
            return 0; /* first id wins */
        j = (j + 1) & (m->cap - 1);
    }
    m->slots[j] = (struct tok_strmap_slot){key, (uint32_t)len, val, h};
    m->n++;
    return 0;
}

int tok_strmap_get(const struct tok_strmap *m, const char *key, size_t len)
{
    if (!m->slots)
        return -1;
    uint64_t h = tok_hash_bytes(key, len);
    size_t j = h & (m->cap - 1);
    while (m->slots[j].key) {
        const struct tok_strmap_slot *s = &m->slots[j];
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0)
            return s->val;
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

void tok_strmap_free(struct tok_strmap *m)
{
    free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}

/* ---- pair map ---- */

static uint64_t pair_key(int a, int b)
{
    return (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
}

static size_t pair_slot(uint64_t k, size_t cap)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k & (cap - 1);
}

int tok_pairmap_init(struct tok_pairmap *m, size_t expected)
{
    m->cap = pow2_at_least(expected * 2 + 1);
    m->n = 0;
    m->slots = calloc(m->cap, sizeof *m->slots);
    return m->slots ? 0 : -1;
}

int tok_pairmap_put(struct tok_pairmap *m, int a, int b, int rank, int id)
{
    if ((m->n + 1) * 2 > m->cap) {
        struct tok_pairmap old = *m;
        m->cap = old.cap * 2;
        m->slots = calloc(m->cap, sizeof *m->slots);
        if (!m->slots) {
            *m = old;
            return -1;
        }
        for (size_t i = 0; i < old.cap; i++) {
            if (!old.slots[i].key)
                continue;
            size_t j = pair_slot(old.slots[i].key, m->cap);
            while (m->slots[j].key)
                j = (j + 1) & (m->cap - 1);
            m->slots[j] = old.slots[i];
        }
        free(old.slots);
    }
    uint64_t k = pair_key(a, b);
    size_t j = pair_slot(k, m->cap);
    while (m->slots[j].key) {
        if (m->slots[j].key == k)
            return 0; /* a repeated merge keeps its first (best) rank */
        j = (j + 1) & (m->cap - 1);
    }
    m->slots[j] = (struct tok_pairmap_slot){k, rank, id};
    m->n++;
    return 0;
}

bool tok_pairmap_get(const struct tok_pairmap *m, int a, int b, int *rank, int *id)
{
    if (!m->slots)
        return false;
    uint64_t k = pair_key(a, b);
    size_t j = pair_slot(k, m->cap);
    while (m->slots[j].key) {
        if (m->slots[j].key == k) {
            *rank = m->slots[j].rank;
            *id = m->slots[j].id;
            return true;
        }
        j = (j + 1) & (m->cap - 1);
    }
    return false;
}

void tok_pairmap_free(struct tok_pairmap *m)
{
    free(m->slots);
    m->slots = NULL;
    m->cap = m->n = 0;
}

/* ---- trie ---- */

static int trie_new_node(struct tok_trie *tr, unsigned char byte)
{
    if (tr->n == tr->cap) {
        int cap = tr->cap ? tr->cap * 2 : 64;
        struct tok_trie_node *p = realloc(tr->nodes, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        tr->nodes = p;
        tr->cap = cap;
    }
    tr->nodes[tr->n] = (struct tok_trie_node){-1, -1, -1, byte};
    return tr->n++;
}

int tok_trie_init(struct tok_trie *tr)
{
    memset(tr, 0, sizeof *tr);
    return trie_new_node(tr, 0) < 0 ? -1 : 0; /* node 0: the root */
}

int tok_trie_add(struct tok_trie *tr, const char *s, size_t n, int value)
{
    if (n == 0)
        return 0; /* an empty key would match everywhere */
    int node = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int child = tr->nodes[node].first_child;
        while (child >= 0 && tr->nodes[child].byte != c)
            child = tr->nodes[child].next_sibling;
        if (child < 0) {
            child = trie_new_node(tr, c);
            if (child < 0)
                return -1;
            tr->nodes[child].next_sibling = tr->nodes[node].first_child;
            tr->nodes[node].first_child = child;
        }
        node = child;
    }
    if (tr->nodes[node].value < 0)
        tr->nodes[node].value = value; /* the first token with this text wins */
    tr->first_byte[(unsigned char)s[0]] = true;
    return 0;
}

long tok_trie_find(const struct tok_trie *tr, const char *s, size_t n, size_t from,
                   size_t *mlen, int *value)
{
    if (!tr->nodes || tr->nodes[0].first_child < 0)
        return -1;
    for (size_t pos = from; pos < n; pos++) {
        if (!tr->first_byte[(unsigned char)s[pos]])
            continue;
        int node = 0;
        size_t best = 0;
        int best_val = -1;
        for (size_t i = pos; i < n; i++) {
            int child = tr->nodes[node].first_child;
            while (child >= 0 && tr->nodes[child].byte != (unsigned char)s[i])
                child = tr->nodes[child].next_sibling;
            if (child < 0)
                break;
            node = child;
            if (tr->nodes[node].value >= 0) {
                best = i + 1 - pos;
                best_val = tr->nodes[node].value;
            }
        }
        if (best_val >= 0) {
            *mlen = best;
            *value = best_val;
            return (long)pos;
        }
    }
    return -1;
}

void tok_trie_free(struct tok_trie *tr)
{
    free(tr->nodes);
    memset(tr, 0, sizeof *tr);
}

/* ---- UTF-8 ---- */

size_t tok_utf8_seq_len(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t want = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                : (c & 0xF8) == 0xF0                ? 4
                                                    : 1;
    if (want > n)
        return 1;
    for (size_t i = 1; i < want; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 1;
    return want;
}

/* ---- tokenizer.json helpers ---- */

const char *tok_json_str(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

bool tok_json_bool(json_t *o, const char *key, bool dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

char *tok_arena_jstr(struct tokenizer *t, json_t *s, size_t *len)
{
    *len = json_string_length(s);
    return tok_arena_strdup(&t->arena, json_string_value(s), *len);
}

int tok_parse_replace(struct tokenizer *t, json_t *node, const char *what, const char **a,
                      size_t *alen, const char **b, size_t *blen, struct tok_regex **re,
                      struct err *e)
{
    json_t *pat = json_object_get(node, "pattern");
    json_t *str = json_object_get(pat, "String");
    json_t *rx = json_object_get(pat, "Regex");
    json_t *c = json_object_get(node, "content");
    if (!json_is_string(c))
        return err_set(e, "%s: %s Replace without content", t->path, what);
    if (!(*b = tok_arena_jstr(t, c, blen)))
        return err_set(e, "%s: out of memory", t->path);
    if (json_is_string(str)) {
        if (!(*a = tok_arena_jstr(t, str, alen)))
            return err_set(e, "%s: out of memory", t->path);
        if (*alen == 0)
            return err_set(e, "%s: %s Replace with an empty pattern", t->path, what);
    } else if (json_is_string(rx)) {
        if (!(*re = tok_regex_new(json_string_value(rx), json_string_length(rx), e)))
            return err_wrap(e, "%s: %s Replace", t->path, what);
    } else {
        return err_set(e, "%s: %s Replace without a pattern", t->path, what);
    }
    return 0;
}
