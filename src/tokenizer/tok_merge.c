/* tok_merge.c - the two merge loops: SentencePiece (merge the adjacent pair
 * whose concatenation has the best score) and BPE (merge the adjacent pair
 * with the lowest merge rank). Both keep the symbols in a linked list and the
 * candidate pairs in a binary heap, so a word of n characters costs
 * O(n log n) instead of the O(n^2) of rescanning after every merge. Heap
 * entries are checked when popped: a pair is still current when its left
 * symbol is alive, still points at the same right symbol and that right
 * symbol has not grown (a symbol only ever grows by absorbing its right
 * neighbour, so its start and length identify its content). Ties go to the
 * leftmost pair, which is what llama2.c's scan and HF's BPE both do. */
#include "tokenizer/tok_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

void tok_work_free(struct tok_work *w)
{
    free(w->syms);
    free(w->heap);
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
    return heap_push(w, (struct tok_heap_ent){heap_key((uint32_t)rank, left), l->next, r->len});
}

static int bpe_run(const struct tokenizer *t, const char *s, size_t n, struct tok_work *w,
                   struct tok_ivec *out, struct err *e)
{
    if (n == 0)
        return 0;
    if (n > INT_MAX / 2)
        return err_set(e, "%s: text of %zu bytes is too long to tokenize", t->path, n);
    if (t->ignore_merges) {
        int id = tok_strmap_get(&t->vocab, s, n);
        if (id >= 0)
            return tok_ivec_push(out, id) ? err_set(e, "out of memory tokenizing") : 0;
    }
    if (work_reserve(w, n))
        return err_set(e, "out of memory tokenizing %zu bytes", n);

    int nsym = 0;
    for (size_t i = 0; i < n;) {
        size_t clen = tok_utf8_seq_len((const unsigned char *)s + i, n - i);
        int id = tok_strmap_get(&t->vocab, s + i, clen);
        if (id >= 0) {
            w->syms[nsym] = (struct tok_sym){(int)i, (int)clen, nsym - 1, nsym + 1, id, false};
            nsym++;
            i += clen;
            continue;
        }
        bool all_bytes = t->byte_fallback;
        for (size_t k = 0; all_bytes && k < clen; k++)
            all_bytes = t->byte_id[(unsigned char)s[i + k]] >= 0;
        if (all_bytes) {
            for (size_t k = 0; k < clen; k++) {
                w->syms[nsym] = (struct tok_sym){(int)(i + k), 1, nsym - 1, nsym + 1,
                                                 t->byte_id[(unsigned char)s[i + k]], false};
                nsym++;
            }
        } else if (t->unk >= 0) {
            if (t->fuse_unk && nsym > 0 && w->syms[nsym - 1].id == t->unk) {
                w->syms[nsym - 1].len += (int)clen;
            } else {
                w->syms[nsym] = (struct tok_sym){(int)i, (int)clen, nsym - 1, nsym + 1, t->unk,
                                                 false};
                nsym++;
            }
        } else {
            return err_set(e, "%s: no token for the character at byte %zu of \"%.*s\" "
                              "(no byte fallback and no unk_token)",
                           t->path, i, (int)(n < 40 ? n : 40), s);
        }
        i += clen;
    }
    w->syms[nsym - 1].next = -1;

    for (int i = 0; i + 1 < nsym; i++)
        if (bpe_try_pair(t, w, i))
            return err_set(e, "out of memory tokenizing");
    while (w->heap_n) {
        struct tok_heap_ent h = heap_pop(w);
        if (!pair_current(w->syms, &h))
            continue;
        int left = heap_left(&h), rank, id;
        if (!tok_pairmap_get(&t->merges, w->syms[left].id, w->syms[h.right].id, &rank, &id))
            continue; /* cannot happen: the pair was found when pushed */
        sym_merge(w->syms, left, id);
        if (bpe_try_pair(t, w, w->syms[left].prev) || bpe_try_pair(t, w, left))
            return err_set(e, "out of memory tokenizing");
    }

    for (int i = 0; i >= 0; i = w->syms[i].next)
        if (tok_ivec_push(out, w->syms[i].id))
            return err_set(e, "out of memory tokenizing");
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
        return bpe_run(t, s, n, w, out, e);
    for (size_t start = 0; start < n;) {
        size_t end = next_cut(t, s, n, start);
        if (bpe_run(t, s + start, end - start, w, out, e))
            return -1;
        start = end;
    }
    return 0;
}
