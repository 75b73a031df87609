/* tok_merge.c - the models that turn one word into ids: SentencePiece
 * merging (the adjacent pair whose concatenation has the best score), BPE
 * (the adjacent pair with the lowest merge rank, HF semantics) and
 * WordPiece (greedy longest match), plus a per-call cache of word -> ids.
 * The merge loops keep the symbols in a linked list and the candidate pairs
 * in a binary heap, so a word of n characters costs O(n log n) instead of
 * the O(n^2) of rescanning after every merge. Heap entries are checked when
 * popped. SentencePiece: a pair is still current when its left symbol is
 * alive, still points at the same right symbol and that right symbol has
 * not grown (a symbol only ever grows by absorbing its right neighbour, so
 * its start and length identify its content). BPE: exactly HF's test, the
 * pair now at that position must still merge into the queued id. Ties go to
 * the leftmost pair, which is what llama2.c's scan and HF's BPE both do. */
#include "tokenizer/tok_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

void tok_work_free(struct tok_work *w)
{
    free(w->syms);
    free(w->heap);
    free(w->cache.slots);
    free(w->cache.keys.p);
    free(w->cache.ids.p);
    free(w->key.p);
    memset(w, 0, sizeof *w);
}

static int work_reserve(struct tok_work *w, size_t nsyms)
{
    if (nsyms > w->syms_cap) {
        size_t cap = w->syms_cap ? w->syms_cap : 64;
        while (cap < nsyms)
            cap *= 2;
        struct tok_sym *p = realloc(w->syms, cap * sizeof *p);
        if (!p)
            return -1;
        w->syms = p;
        w->syms_cap = cap;
    }
    w->heap_n = 0;
    return 0;
}

/* Grows the symbol array keeping its contents (work_reserve resets). */
static int work_reserve_more(struct tok_work *w, size_t nsyms)
{
    if (nsyms <= w->syms_cap)
        return 0;
    size_t cap = w->syms_cap * 2 > nsyms ? w->syms_cap * 2 : nsyms;
    struct tok_sym *p = realloc(w->syms, cap * sizeof *p);
    if (!p)
        return -1;
    w->syms = p;
    w->syms_cap = cap;
    return 0;
}

static bool heap_less(const struct tok_heap_ent *a, const struct tok_heap_ent *b)
{
    return a->key < b->key; /* priority, then leftmost: one compare */
}

static uint64_t heap_key(uint32_t prio, int left)
{
    return (uint64_t)prio << 32 | (uint32_t)left;
}

/* Higher scores first: map the float's bits to a uint32 that sorts like the
 * float, then invert it. */
static uint32_t score_prio(float score)
{
    uint32_t u;
    memcpy(&u, &score, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~u;
}

static int heap_push(struct tok_work *w, struct tok_heap_ent ent)
{
    if (w->heap_n == w->heap_cap) {
        size_t cap = w->heap_cap ? w->heap_cap * 2 : 64;
        struct tok_heap_ent *p = realloc(w->heap, cap * sizeof *p);
        if (!p)
            return -1;
        w->heap = p;
        w->heap_cap = cap;
    }
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_less(&ent, &w->heap[parent]))
            break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i] = ent;
    return 0;
}

static struct tok_heap_ent heap_pop(struct tok_work *w)
{
    struct tok_heap_ent top = w->heap[0];
    struct tok_heap_ent last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && heap_less(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!heap_less(&w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n)
        w->heap[i] = last;
    return top;
}

static int heap_left(const struct tok_heap_ent *h)
{
    return (int)(uint32_t)h->key;
}

static bool pair_current(const struct tok_sym *syms, const struct tok_heap_ent *h)
{
    const struct tok_sym *l = &syms[heap_left(h)];
    return l->len > 0 && l->next == h->right && syms[h->right].len == h->rlen;
}

/* Absorbs the right neighbour of `left` into it. */
static void sym_merge(struct tok_sym *syms, int left, int id)
{
    struct tok_sym *l = &syms[left];
    struct tok_sym *r = &syms[l->next];
    l->len += r->len;
    l->id = id;
    l->next = r->next;
    if (r->next >= 0)
        syms[r->next].prev = left;
    r->len = 0; /* dead */
}

static int push_out_byte(const struct tokenizer *t, unsigned char b, struct tok_ivec *out)
{
    int id = t->byte_id[b] >= 0 ? t->byte_id[b] : t->unk;
    if (id < 0)
        return 0; /* nothing to stand for it: the byte is dropped */
    return tok_ivec_push(out, id);
}

/* ---- SentencePiece: best score first ---- */

static int spm_try_pair(const struct tokenizer *t, const char *s, struct tok_work *w, int left)
{
    if (left < 0)
        return 0;
    const struct tok_sym *l = &w->syms[left];
    if (l->next < 0)
        return 0;
    const struct tok_sym *r = &w->syms[l->next];
    if (l->frozen || r->frozen)
        return 0;
    int id = tok_strmap_get(&t->vocab, s + l->start, (size_t)(l->len + r->len));
    if (id < 0)
        return 0;
    return heap_push(w, (struct tok_heap_ent){heap_key(score_prio(t->scores[id]), left), l->next,
                                              r->len});
}

static int spm_run(const struct tokenizer *t, const char *s, size_t n, bool bytes_first,
                   struct tok_work *w, struct tok_ivec *out, struct err *e)
{
    if (n == 0)
        return 0;
    if (n > INT_MAX / 2)
        return err_set(e, "%s: text of %zu bytes is too long to tokenize", t->path, n);
    if (work_reserve(w, n))
        return err_set(e, "out of memory tokenizing %zu bytes", n);

    int nsym = 0;
    for (size_t i = 0; i < n;) {
        size_t clen = tok_utf8_seq_len((const unsigned char *)s + i, n - i);
        int id = tok_strmap_get(&t->vocab, s + i, clen);
        if (id < 0 && bytes_first) {
            for (size_t k = 0; k < clen; k++) {
                unsigned char b = (unsigned char)s[i + k];
                w->syms[nsym] = (struct tok_sym){(int)(i + k), 1, nsym - 1, nsym + 1,
                                                 t->byte_id[b] >= 0 ? t->byte_id[b] : t->unk,
                                                 true};
                nsym++;
            }
        } else {
            w->syms[nsym] = (struct tok_sym){(int)i, (int)clen, nsym - 1, nsym + 1, id, false};
            nsym++;
        }
        i += clen;
    }
    w->syms[nsym - 1].next = -1;

    for (int i = 0; i + 1 < nsym; i++)
        if (spm_try_pair(t, s, w, i))
            return err_set(e, "out of memory tokenizing");
    while (w->heap_n) {
        struct tok_heap_ent h = heap_pop(w);
        if (!pair_current(w->syms, &h))
            continue;
        int left = heap_left(&h);
        int id = tok_strmap_get(&t->vocab, s + w->syms[left].start,
                                (size_t)(w->syms[left].len + h.rlen));
        sym_merge(w->syms, left, id);
        if (spm_try_pair(t, s, w, w->syms[left].prev) || spm_try_pair(t, s, w, left))
            return err_set(e, "out of memory tokenizing");
    }

    for (int i = 0; i >= 0; i = w->syms[i].next) {
        const struct tok_sym *sym = &w->syms[i];
        int rc = 0;
        if (sym->id >= 0) {
            rc = tok_ivec_push(out, sym->id);
        } else {
            /* a character with no piece of its own: its UTF-8 bytes */
            for (int k = 0; k < sym->len && !rc; k++)
                rc = push_out_byte(t, (unsigned char)s[sym->start + k], out);
        }
        if (rc)
            return err_set(e, "out of memory tokenizing");
    }
    return 0;
}

/* ---- BPE: lowest merge rank first ---- */

/* A heap entry of BPE carries the id the pair merges into in `rlen`: like
 * HF, an entry is stale when the pair now at its position no longer merges
 * into that id. */
static int bpe_try_pair(const struct tokenizer *t, struct tok_work *w, int left)
{
    if (left < 0)
        return 0;
    const struct tok_sym *l = &w->syms[left];
    if (l->next < 0)
        return 0;
    const struct tok_sym *r = &w->syms[l->next];
    int rank, id;
    if (!tok_pairmap_get(&t->merges, l->id, r->id, &rank, &id))
        return 0;
    return heap_push(w, (struct tok_heap_ent){heap_key((uint32_t)rank, left), l->next, id});
}

static const struct tok_strmap *model_vocab(const struct tokenizer *t)
{
    return t->byte_level ? &t->bvocab : &t->vocab;
}

/* The id of one character (or byte) of a word, with the continuing
 * prefix when it is not the first and the end-of-word suffix when it is
 * the last; -1 when the vocabulary lacks it, -2 on OOM. */
static int char_id(const struct tokenizer *t, struct tok_work *w, const char *c, size_t len,
                   bool first, bool last)
{
    bool pre = !first && t->cont_prefix_len, suf = last && t->eow_suffix_len;
    if (!pre && !suf) {
        if (t->byte_level && len == 1)
            return t->byte_tok[(unsigned char)c[0]];
        return tok_strmap_get(model_vocab(t), c, len);
    }
    w->key.n = 0;
    if ((pre && tok_buf_put(&w->key, t->cont_prefix, t->cont_prefix_len)) ||
        tok_buf_put(&w->key, c, len) ||
        (suf && tok_buf_put(&w->key, t->eow_suffix, t->eow_suffix_len)))
        return -2;
    return tok_strmap_get(model_vocab(t), w->key.p, w->key.n);
}

static int sym_add(struct tok_work *w, int *nsym, int start, int len, int id)
{
    int k = *nsym;
    w->syms[k] = (struct tok_sym){start, len, k - 1, k + 1, id, false};
    *nsym = k + 1;
    return 0;
}

static int bpe_run(const struct tokenizer *t, const char *s, size_t n, struct tok_work *w,
                   struct tok_ivec *out, struct err *e)
{
    if (n == 0)
        return 0;
    if (n > INT_MAX / 2)
        return err_set(e, "%s: text of %zu bytes is too long to tokenize", t->path, n);
    if (t->ignore_merges) {
        int id = tok_strmap_get(model_vocab(t), s, n);
        if (id >= 0)
            return tok_ivec_push(out, id) ? err_set(e, "out of memory tokenizing") : 0;
    }
    if (work_reserve(w, n))
        return err_set(e, "out of memory tokenizing %zu bytes", n);

    /* one symbol per character (per byte for byte-level BPE); a character
     * without a piece becomes its <0xXX> bytes (byte_fallback), else unk
     * (fused with a preceding unk when fuse_unk), else it is dropped -
     * exactly HF's BPE::merge_word */
    int nsym = 0;
    int unk_start = -1, unk_len = 0;
    for (size_t i = 0; i < n;) {
        size_t clen = t->byte_level ? 1 : tok_utf8_seq_len((const unsigned char *)s + i, n - i);
        int id = char_id(t, w, s + i, clen, i == 0, i + clen == n);
        if (id == -2)
            return err_set(e, "out of memory tokenizing");
        if (id >= 0) {
            if (unk_start >= 0) {
                sym_add(w, &nsym, unk_start, unk_len, t->unk);
                unk_start = -1;
            }
            sym_add(w, &nsym, (int)i, (int)clen, id);
            i += clen;
            continue;
        }
        /* the bytes looked up, prefix and suffix included (HF's quirk) */
        bool affixed = (i > 0 && t->cont_prefix_len) || (i + clen == n && t->eow_suffix_len);
        const char *fb = affixed ? w->key.p : s + i;
        size_t fbn = affixed ? w->key.n : clen;
        bool all_bytes = t->byte_fallback;
        for (size_t k = 0; all_bytes && k < fbn; k++)
            all_bytes = t->byte_id[(unsigned char)fb[k]] >= 0;
        if (all_bytes) {
            if (fbn > clen && work_reserve_more(w, (size_t)nsym + fbn + (n - i)))
                return err_set(e, "out of memory tokenizing");
            /* a pending unk stays pending: HF emits it after these bytes */
            for (size_t k = 0; k < fbn; k++)
                sym_add(w, &nsym, (int)i, 1, t->byte_id[(unsigned char)fb[k]]);
        } else if (t->unk >= 0) {
            if (unk_start >= 0 && t->fuse_unk) {
                unk_len += (int)clen;
            } else {
                if (unk_start >= 0)
                    sym_add(w, &nsym, unk_start, unk_len, t->unk);
                unk_start = (int)i;
                unk_len = (int)clen;
            }
        } else if (t->unk_missing) {
            return err_set(e, "%s: the unk_token is not in the vocabulary", t->path);
        }
        i += clen;
    }
    if (unk_start >= 0)
        sym_add(w, &nsym, unk_start, unk_len, t->unk);
    if (nsym == 0)
        return 0;
    w->syms[nsym - 1].next = -1;

    for (int i = 0; i + 1 < nsym; i++)
        if (bpe_try_pair(t, w, i))
            return err_set(e, "out of memory tokenizing");
    while (w->heap_n) {
        struct tok_heap_ent h = heap_pop(w);
        int left = heap_left(&h), rank, id;
        const struct tok_sym *l = &w->syms[left];
        if (l->len == 0 || l->next < 0)
            continue;
        if (!tok_pairmap_get(&t->merges, l->id, w->syms[l->next].id, &rank, &id) || id != h.rlen)
            continue; /* stale: this pair changed since it was queued */
        sym_merge(w->syms, left, id);
        if (bpe_try_pair(t, w, w->syms[left].prev) || bpe_try_pair(t, w, left))
            return err_set(e, "out of memory tokenizing");
    }

    for (int i = 0; i >= 0; i = w->syms[i].next)
        if (tok_ivec_push(out, w->syms[i].id))
            return err_set(e, "out of memory tokenizing");
    return 0;
}

/* ---- WordPiece: greedy longest match ---- */

int tok_wordpiece_word(const struct tokenizer *t, const char *s, size_t n, struct tok_work *w,
                       struct tok_ivec *out, struct err *e)
{
    if (n == 0)
        return 0;
    size_t nchars = 0;
    for (size_t i = 0; i < n; nchars++)
        i += tok_utf8_seq_len((const unsigned char *)s + i, n - i);
    size_t mark = out->n;
    if ((int)nchars <= t->wp_max_chars) {
        size_t start = 0;
        while (start < n) {
            size_t end = n;
            int id = -1;
            while (end > start) {
                w->key.n = 0;
                if ((start > 0 && tok_buf_put(&w->key, t->cont_prefix, t->cont_prefix_len)) ||
                    tok_buf_put(&w->key, s + start, end - start))
                    return err_set(e, "out of memory tokenizing");
                id = tok_strmap_get(&t->vocab, w->key.p, w->key.n);
                if (id >= 0)
                    break;
                /* drop the last character */
                end--;
                while (end > start && ((unsigned char)s[end] & 0xC0) == 0x80)
                    end--;
            }
            if (id < 0)
                break;
            if (tok_ivec_push(out, id))
                return err_set(e, "out of memory tokenizing");
            start = end;
        }
        if (start >= n)
            return 0;
    }
    /* too long, or a part has no piece: the whole word is unk */
    out->n = mark;
    if (t->unk < 0)
        return err_set(e, "%s: WordPiece without an unk_token cannot encode \"%.*s\"", t->path,
                       (int)(n < 40 ? n : 40), s);
    return tok_ivec_push(out, t->unk) ? err_set(e, "out of memory tokenizing") : 0;
}

/* ---- a cache of encoded words, per encode call ---- */

enum { WCACHE_MAX_WORD = 256, WCACHE_MAX_SLOTS = 1 << 20 };

static void wcache_clear(struct tok_wcache *c)
{
    if (c->slots)
        memset(c->slots, 0, c->cap * sizeof *c->slots);
    c->n = 0;
    c->keys.n = 0;
    c->ids.n = 0;
}

static struct tok_wcache_slot *wcache_find(const struct tok_wcache *c, const char *s, size_t n,
                                           uint64_t h)
{
    size_t j = h & (c->cap - 1);
    for (;; j = (j + 1) & (c->cap - 1)) {
        struct tok_wcache_slot *sl = &c->slots[j];
        if (!sl->hash)
            return sl;
        if (sl->hash == h && sl->key_len == n && memcmp(c->keys.p + sl->key_off, s, n) == 0)
            return sl;
    }
}

/* Remembers the ids of a word; failure only means it is not cached. */
static void wcache_put(struct tok_wcache *c, const char *s, size_t n, uint64_t h, const int *ids,
                       size_t nids)
{
    if ((c->n + 1) * 2 > c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 4096;
        if (cap > WCACHE_MAX_SLOTS) {
            wcache_clear(c); /* full: start over rather than grow without bound */
            cap = c->cap;
        }
        if (cap != c->cap) {
            struct tok_wcache_slot *old = c->slots;
            size_t oldcap = c->cap;
            c->slots = calloc(cap, sizeof *c->slots);
            if (!c->slots) {
                c->slots = old;
                return;
            }
            c->cap = cap;
            for (size_t i = 0; i < oldcap; i++)
                if (old[i].hash)
                    *wcache_find(c, "", 0, old[i].hash) = old[i];
            free(old);
        }
    }
    size_t koff = c->keys.n, ioff = c->ids.n;
    if (koff + n > 0xFFFFFFFFu || ioff + nids > 0xFFFFFFFFu || tok_buf_put(&c->keys, s, n))
        return;
    for (size_t i = 0; i < nids; i++)
        if (tok_ivec_push(&c->ids, ids[i]))
            return;
    struct tok_wcache_slot *sl = wcache_find(c, s, n, h);
    *sl = (struct tok_wcache_slot){h, (uint32_t)koff, (uint32_t)n, (uint32_t)ioff, (uint32_t)nids};
    c->n++;
}

/* bpe_run through the cache. */
static int bpe_cached(const struct tokenizer *t, const char *s, size_t n, struct tok_work *w,
                      struct tok_ivec *out, struct err *e)
{
    if (n > WCACHE_MAX_WORD || n == 0)
        return bpe_run(t, s, n, w, out, e);
    uint64_t h = tok_hash_bytes(s, n) | 1;
    struct tok_wcache *c = &w->cache;
    if (c->cap) {
        const struct tok_wcache_slot *sl = wcache_find(c, s, n, h);
        if (sl->hash) {
            for (uint32_t i = 0; i < sl->n_ids; i++)
                if (tok_ivec_push(out, c->ids.p[sl->ids_off + i]))
                    return err_set(e, "out of memory tokenizing");
            return 0;
        }
    }
    size_t mark = out->n;
    if (bpe_run(t, s, n, w, out, e))
        return -1;
    /* a word may come out as no ids (a vocabulary without the pieces
     * and no unk), with out still unallocated */
    const size_t got = out->n - mark;
    wcache_put(c, s, n, h, got ? out->p + mark : NULL, got);
    return 0;
}

/* ---- cutting text where no merge can cross ---- */

void tok_check_split_mark(struct tokenizer *t, const char *mark, size_t len)
{
    t->split_mark = NULL;
    t->split_mark_len = 0;
    /* every string a merge can produce is a key of the vocab map */
    for (size_t k = 0; k < t->vocab.cap; k++) {
        const char *p = t->vocab.slots[k].key;
        size_t n = t->vocab.slots[k].len;
        if (!p || n <= len)
            continue;
        for (const char *q = p + 1; (q = memmem(q, n - (size_t)(q - p), mark, len));) {
            size_t at = (size_t)(q - p);
            if (at < len || memcmp(q - len, mark, len) != 0)
                return; /* e.g. "a▁b": a merge may join a word to the next */
            q++;
        }
    }
    t->split_mark = mark;
    t->split_mark_len = len;
}

/* The start of the next run of split marks after `from`, or n. A merge
 * joins two adjacent symbols into a vocabulary piece; if it crossed such a
 * cut, that piece would hold a mark right after another character, which
 * tok_check_split_mark ruled out. So the merges inside each word, and their
 * order, are exactly those of the whole text. */
static size_t next_cut(const struct tokenizer *t, const char *s, size_t n, size_t from)
{
    size_t ml = t->split_mark_len;
    if (ml == 0)
        return n;
    const char *mark = t->split_mark;
    for (size_t i = from + 1; i + ml <= n; i++) {
        if (s[i] != mark[0] || memcmp(s + i, mark, ml) != 0)
            continue;
        if (i >= ml && memcmp(s + i - ml, mark, ml) == 0)
            continue; /* inside a run of marks */
        return i;
    }
    return n;
}

int tok_spm_encode(const struct tokenizer *t, const char *s, size_t n, bool bytes_first,
                   struct tok_work *w, struct tok_ivec *out, struct err *e)
{
    for (size_t start = 0; start < n;) {
        size_t end = next_cut(t, s, n, start);
        if (spm_run(t, s + start, end - start, bytes_first, w, out, e))
            return -1;
        start = end;
    }
    return 0;
}

int tok_bpe_word(const struct tokenizer *t, const char *s, size_t n, struct tok_work *w,
                 struct tok_ivec *out, struct err *e)
{
    /* ignore_merges looks the whole pre-token up first: never cut then */
    if (t->ignore_merges)
        return bpe_cached(t, s, n, w, out, e);
    for (size_t start = 0; start < n;) {
        size_t end = next_cut(t, s, n, start);
        if (bpe_cached(t, s + start, end - start, w, out, e))
            return -1;
        start = end;
    }
    return 0;
}
