/* bpe_hf.c - Hugging Face tokenizer.json with a BPE model in the
 * SentencePiece style (Mistral, Llama 2, TinyStories, Gemma): added tokens
 * split off first, then the normalizer (Prepend/Replace), the pre-tokenizer
 * (Metaspace, Split on a string), rank-ordered BPE with byte fallback, the
 * post-processor's BOS/EOS; decoding follows the decoder chain (Replace "▁",
 * ByteFallback, Fuse, Strip). Byte-level BPE (GPT-2 style) is refused with a
 * clear message until it is implemented. */
#include "tokenizer/tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the decoder chain says, gathered while parsing it. */
struct hf_decoder {
    struct tok_norm_step *repl; /* Replace steps, in order */
    int n_repl;
    bool byte_fallback;
    int strip_start; /* leading spaces removed from the whole text */
};

static const char *jstr(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool jbool(json_t *o, const char *key, bool dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static char *arena_jstr(struct tokenizer *t, json_t *s, size_t *len)
{
    *len = json_string_length(s);
    return tok_arena_strdup(&t->arena, json_string_value(s), *len);
}

/* Looks for a node of the given "type" anywhere in a JSON tree. */
static bool json_has_type(json_t *node, const char *type)
{
    if (json_is_object(node)) {
        const char *ty = jstr(node, "type");
        if (ty && strcmp(ty, type) == 0)
            return true;
        const char *key;
        json_t *v;
        json_object_foreach(node, key, v)
        {
            if (json_has_type(v, type))
                return true;
        }
    } else if (json_is_array(node)) {
        size_t i;
        json_t *v;
        json_array_foreach(node, i, v)
        {
            if (json_has_type(v, type))
                return true;
        }
    }
    return false;
}

/* A {"String": "..."} pattern; NULL (with a message) for Regex patterns. */
static json_t *string_pattern(struct tokenizer *t, json_t *node, const char *where,
                              struct err *e)
{
    json_t *pat = json_object_get(node, "pattern");
    json_t *s = json_object_get(pat, "String");
    if (json_is_string(s))
        return s;
    if (json_object_get(pat, "Regex"))
        err_set(e, "%s: %s with a Regex pattern not supported yet", t->path, where);
    else
        err_set(e, "%s: %s without a string pattern", t->path, where);
    return NULL;
}

/* ---- normalizer ---- */

static int push_norm(struct tokenizer *t, struct tok_norm_step st, struct err *e)
{
    struct tok_norm_step *p = realloc(t->norm, (size_t)(t->n_norm + 1) * sizeof *p);
    if (!p)
        return err_set(e, "%s: out of memory", t->path);
    t->norm = p;
    t->norm[t->n_norm++] = st;
    return 0;
}

static int parse_normalizer(struct tokenizer *t, json_t *node, struct err *e)
{
    if (!node || json_is_null(node))
        return 0;
    const char *ty = jstr(node, "type");
    if (!ty)
        return err_set(e, "%s: normalizer without a type", t->path);
    if (strcmp(ty, "Sequence") == 0) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(node, "normalizers"), i, v)
        {
            if (parse_normalizer(t, v, e))
                return -1;
        }
        return 0;
    }
    struct tok_norm_step st = {0};
    if (strcmp(ty, "Prepend") == 0) {
        json_t *p = json_object_get(node, "prepend");
        if (!json_is_string(p))
            return err_set(e, "%s: normalizer Prepend without a string", t->path);
        st.kind = TOK_NORM_PREPEND;
        if (!(st.a = arena_jstr(t, p, &st.alen)))
            return err_set(e, "%s: out of memory", t->path);
        return push_norm(t, st, e);
    }
    if (strcmp(ty, "Replace") == 0) {
        json_t *pat = string_pattern(t, node, "normalizer Replace", e);
        json_t *c = json_object_get(node, "content");
        if (!pat)
            return -1;
        if (!json_is_string(c))
            return err_set(e, "%s: normalizer Replace without content", t->path);
        st.kind = TOK_NORM_REPLACE;
        if (!(st.a = arena_jstr(t, pat, &st.alen)) || !(st.b = arena_jstr(t, c, &st.blen)))
            return err_set(e, "%s: out of memory", t->path);
        if (st.alen == 0)
            return err_set(e, "%s: normalizer Replace with an empty pattern", t->path);
        return push_norm(t, st, e);
    }
    return err_set(e, "%s: normalizer %s not supported yet", t->path, ty);
}

/* ---- pre-tokenizer ---- */

static int push_pre(struct tokenizer *t, struct tok_pre_step st, struct err *e)
{
    struct tok_pre_step *p = realloc(t->pre, (size_t)(t->n_pre + 1) * sizeof *p);
    if (!p)
        return err_set(e, "%s: out of memory", t->path);
    t->pre = p;
    t->pre[t->n_pre++] = st;
    return 0;
}

static int parse_metaspace(struct tokenizer *t, json_t *node, const char **repl, size_t *rlen,
                           int *prepend, struct err *e)
{
    json_t *r = json_object_get(node, "replacement");
    if (json_is_string(r)) {
        if (!(*repl = arena_jstr(t, r, rlen)))
            return err_set(e, "%s: out of memory", t->path);
    } else {
        *repl = "\xe2\x96\x81";
        *rlen = 3;
    }
    const char *scheme = jstr(node, "prepend_scheme");
    if (scheme) {
        if (strcmp(scheme, "always") == 0)
            *prepend = TOK_PREPEND_ALWAYS;
        else if (strcmp(scheme, "first") == 0)
            *prepend = TOK_PREPEND_FIRST;
        else if (strcmp(scheme, "never") == 0)
            *prepend = TOK_PREPEND_NEVER;
        else
            return err_set(e, "%s: Metaspace prepend_scheme \"%s\" not known", t->path, scheme);
    } else {
        /* older files: add_prefix_space */
        *prepend = jbool(node, "add_prefix_space", true) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
    }
    if (*rlen == 0)
        return err_set(e, "%s: Metaspace with an empty replacement", t->path);
    return 0;
}

static int parse_pre_tokenizer(struct tokenizer *t, json_t *node, struct err *e)
{
    if (!node || json_is_null(node))
        return 0;
    const char *ty = jstr(node, "type");
    if (!ty)
        return err_set(e, "%s: pre_tokenizer without a type", t->path);
    if (strcmp(ty, "Sequence") == 0) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(node, "pretokenizers"), i, v)
        {
            if (parse_pre_tokenizer(t, v, e))
                return -1;
        }
        return 0;
    }
    struct tok_pre_step st = {0};
    if (strcmp(ty, "Metaspace") == 0) {
        int prepend;
        st.kind = TOK_PRE_METASPACE;
        if (parse_metaspace(t, node, &st.repl, &st.repl_len, &prepend, e))
            return -1;
        st.prepend = prepend;
        st.split = jbool(node, "split", true);
        return push_pre(t, st, e);
    }
    if (strcmp(ty, "Split") == 0) {
        json_t *pat = string_pattern(t, node, "pre_tokenizer Split", e);
        if (!pat)
            return -1;
        if (jbool(node, "invert", false))
            return err_set(e, "%s: pre_tokenizer Split with invert not supported yet", t->path);
        const char *b = jstr(node, "behavior");
        st.kind = TOK_PRE_SPLIT;
        if (!b || strcmp(b, "Removed") == 0)
            st.behavior = TOK_SPLIT_REMOVED;
        else if (strcmp(b, "Isolated") == 0)
            st.behavior = TOK_SPLIT_ISOLATED;
        else if (strcmp(b, "MergedWithPrevious") == 0)
            st.behavior = TOK_SPLIT_MERGED_PREV;
        else if (strcmp(b, "MergedWithNext") == 0)
            st.behavior = TOK_SPLIT_MERGED_NEXT;
        else if (strcmp(b, "Contiguous") == 0)
            st.behavior = TOK_SPLIT_CONTIGUOUS;
        else
            return err_set(e, "%s: Split behavior \"%s\" not known", t->path, b);
        if (!(st.pat = arena_jstr(t, pat, &st.pat_len)))
            return err_set(e, "%s: out of memory", t->path);
        if (st.pat_len == 0)
            return err_set(e, "%s: pre_tokenizer Split with an empty pattern", t->path);
        return push_pre(t, st, e);
    }
    return err_set(e, "%s: pre_tokenizer %s not supported yet", t->path, ty);
}

/* ---- decoder ---- */

static int parse_decoder(struct tokenizer *t, json_t *node, struct hf_decoder *d, struct err *e)
{
    if (!node || json_is_null(node))
        return 0;
    const char *ty = jstr(node, "type");
    if (!ty)
        return err_set(e, "%s: decoder without a type", t->path);
    if (strcmp(ty, "Sequence") == 0) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(node, "decoders"), i, v)
        {
            if (parse_decoder(t, v, d, e))
                return -1;
        }
        return 0;
    }
    if (strcmp(ty, "Fuse") == 0)
        return 0; /* the stream is already one string */
    if (strcmp(ty, "ByteFallback") == 0) {
        d->byte_fallback = true;
        return 0;
    }
    if (strcmp(ty, "Replace") == 0 || strcmp(ty, "Metaspace") == 0) {
        struct tok_norm_step st = {.kind = TOK_NORM_REPLACE, .b = " ", .blen = 1};
        if (strcmp(ty, "Replace") == 0) {
            json_t *pat = string_pattern(t, node, "decoder Replace", e);
            json_t *c = json_object_get(node, "content");
            if (!pat)
                return -1;
            if (!json_is_string(c))
                return err_set(e, "%s: decoder Replace without content", t->path);
            if (!(st.a = arena_jstr(t, pat, &st.alen)) || !(st.b = arena_jstr(t, c, &st.blen)))
                return err_set(e, "%s: out of memory", t->path);
            if (st.alen == 0)
                return err_set(e, "%s: decoder Replace with an empty pattern", t->path);
        } else {
            int prepend;
            if (parse_metaspace(t, node, &st.a, &st.alen, &prepend, e))
                return -1;
            if (prepend != TOK_PREPEND_NEVER)
                d->strip_start = 1;
        }
        struct tok_norm_step *p = realloc(d->repl, (size_t)(d->n_repl + 1) * sizeof *p);
        if (!p)
            return err_set(e, "%s: out of memory", t->path);
        d->repl = p;
        d->repl[d->n_repl++] = st;
        return 0;
    }
    if (strcmp(ty, "Strip") == 0) {
        const char *c = jstr(node, "content");
        json_t *start = json_object_get(node, "start");
        json_t *stop = json_object_get(node, "stop");
        if (!c || strcmp(c, " ") != 0)
            return err_set(e, "%s: decoder Strip of \"%s\" not supported", t->path, c ? c : "?");
        if (json_integer_value(stop) != 0)
            return err_set(e, "%s: decoder Strip with stop > 0 not supported", t->path);
        d->strip_start = (int)json_integer_value(start);
        return 0;
    }
    return err_set(e, "%s: decoder %s not supported yet", t->path, ty);
}

/* Replace every occurrence of st->a by st->b in s[0, n) into out. */
static int replace_all(const struct tok_norm_step *st, const char *s, size_t n, struct tok_buf *out)
{
    out->n = 0;
    if (tok_buf_put(out, "", 0))
        return -1;
    size_t i = 0;
    while (i < n) {
        const char *hit = n - i >= st->alen ? memmem(s + i, n - i, st->a, st->alen) : NULL;
        size_t stop = hit ? (size_t)(hit - s) : n;
        if (tok_buf_put(out, s + i, stop - i))
            return -1;
        if (!hit)
            break;
        if (tok_buf_put(out, st->b, st->blen))
            return -1;
        i = stop + st->alen;
    }
    return 0;
}

/* Decoded text of every non-byte id: the decoder's Replace steps applied. */
static int build_decoded(struct tokenizer *t, const struct hf_decoder *d)
{
    struct tok_buf a = {0}, b = {0};
    int rc = 0;
    for (int id = 0; id < t->n_vocab && rc == 0; id++) {
        if (!t->pieces[id] || (t->attr[id] & TOK_ATTR_BYTE) || d->n_repl == 0)
            continue;
        a.n = 0;
        if (tok_buf_put(&a, t->pieces[id], t->piece_len[id])) {
            rc = -1;
            break;
        }
        for (int k = 0; k < d->n_repl && rc == 0; k++) {
            rc = replace_all(&d->repl[k], a.p, a.n, &b);
            struct tok_buf tmp = a;
            a = b;
            b = tmp;
        }
        if (rc == 0 && (a.n != t->piece_len[id] || memcmp(a.p, t->pieces[id], a.n) != 0))
            rc = tok_set_dec(t, id, a.p, a.n);
    }
    free(a.p);
    free(b.p);
    return rc;
}

/* ---- post-processor ---- */

static int ids_append(int **ids, int *n, json_t *arr)
{
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        int *p = realloc(*ids, (size_t)(*n + 1) * sizeof *p);
        if (!p)
            return -1;
        *ids = p;
        (*ids)[(*n)++] = (int)json_integer_value(v);
    }
    return 0;
}

static int parse_post_processor(struct tokenizer *t, json_t *node, struct err *e)
{
    if (!node || json_is_null(node))
        return 0;
    const char *ty = jstr(node, "type");
    if (!ty)
        return err_set(e, "%s: post_processor without a type", t->path);
    if (strcmp(ty, "Sequence") == 0) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(node, "processors"), i, v)
        {
            if (parse_post_processor(t, v, e))
                return -1;
        }
        return 0;
    }
    if (strcmp(ty, "ByteLevel") == 0)
        return 0; /* only touches offsets */
    if (strcmp(ty, "TemplateProcessing") != 0)
        return err_set(e, "%s: post_processor %s not supported yet", t->path, ty);
    json_t *specials = json_object_get(node, "special_tokens");
    bool seen_seq = false;
    size_t i;
    json_t *item;
    json_array_foreach(json_object_get(node, "single"), i, item)
    {
        json_t *sp = json_object_get(item, "SpecialToken");
        if (json_object_get(item, "Sequence")) {
            seen_seq = true;
            continue;
        }
        if (!sp)
            continue;
        const char *name = jstr(sp, "id");
        json_t *def = name ? json_object_get(specials, name) : NULL;
        json_t *ids = json_object_get(def, "ids");
        if (!json_is_array(ids))
            return err_set(e, "%s: post_processor special token \"%s\" has no ids", t->path,
                           name ? name : "?");
        size_t k;
        json_t *v;
        json_array_foreach(ids, k, v)
        {
            json_int_t id = json_integer_value(v);
            if (!json_is_integer(v) || id < 0 || id >= t->n_vocab)
                return err_set(e, "%s: post_processor special token \"%s\" has a bad id",
                               t->path, name);
        }
        if (seen_seq ? ids_append(&t->suffix_ids, &t->n_suffix, ids)
                     : ids_append(&t->prefix_ids, &t->n_prefix, ids))
            return err_set(e, "%s: out of memory", t->path);
    }
    return 0;
}

/* ---- added tokens, special ids, tokenizer_config.json ---- */

static int added_id(const struct tokenizer *t, const char *s)
{
    size_t n = strlen(s);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && memcmp(t->added[i].content, s, n) == 0)
            return t->added[i].id;
    return tok_strmap_get(&t->vocab, s, n);
}

/* "bos_token": "<s>" or {"content": "<s>", ...} */
static const char *config_token(json_t *cfg, const char *key)
{
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int ivec_remove(int *ids, int *n, int x)
{
    int k = 0;
    for (int i = 0; i < *n; i++)
        if (ids[i] != x)
            ids[k++] = ids[i];
    *n = k;
    return 0;
}

static int ids_insert(int **ids, int *n, int at, int x)
{
    int *p = realloc(*ids, (size_t)(*n + 1) * sizeof *p);
    if (!p)
        return -1;
    memmove(p + at + 1, p + at, (size_t)(*n - at) * sizeof *p);
    p[at] = x;
    *ids = p;
    (*n)++;
    return 0;
}

static bool ids_contains(const int *ids, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == x)
            return true;
    return false;
}

/* tokenizer_config.json beside tokenizer.json: bos/eos names and whether
 * transformers adds them (add_bos_token overrides the post-processor, as
 * LlamaTokenizerFast does). A missing file is fine; a broken one is not. */
static int apply_tokenizer_config(struct tokenizer *t, const char *json_path, struct err *e)
{
    char path[1100];
    snprintf(path, sizeof path, "%s", json_path);
    char *slash = strrchr(path, '/');
    if (slash)
        snprintf(slash + 1, sizeof path - (size_t)(slash + 1 - path), "tokenizer_config.json");
    else
        snprintf(path, sizeof path, "tokenizer_config.json");
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    fclose(f);
    json_error_t je;
    /* model_max_length is often 1e30: read big integers as reals */
    json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
    if (!cfg)
        return err_set(e, "%s: line %d: %s", path, je.line, je.text);
    const char *bos = config_token(cfg, "bos_token");
    const char *eos = config_token(cfg, "eos_token");
    if (bos && added_id(t, bos) >= 0)
        t->bos = added_id(t, bos);
    if (eos && added_id(t, eos) >= 0)
        t->eos = added_id(t, eos);
    json_t *ab = json_object_get(cfg, "add_bos_token");
    json_t *ae = json_object_get(cfg, "add_eos_token");
    int rc = 0;
    if (json_is_boolean(ab) && t->bos >= 0) {
        if (!json_is_true(ab))
            ivec_remove(t->prefix_ids, &t->n_prefix, t->bos);
        else if (!ids_contains(t->prefix_ids, t->n_prefix, t->bos))
            rc = ids_insert(&t->prefix_ids, &t->n_prefix, 0, t->bos);
    }
    if (json_is_boolean(ae) && t->eos >= 0 && rc == 0) {
        if (!json_is_true(ae))
            ivec_remove(t->suffix_ids, &t->n_suffix, t->eos);
        else if (!ids_contains(t->suffix_ids, t->n_suffix, t->eos))
            rc = ids_insert(&t->suffix_ids, &t->n_suffix, t->n_suffix, t->eos);
    }
    json_decref(cfg);
    return rc ? err_set(e, "%s: out of memory", path) : 0;
}

static int parse_added_tokens(struct tokenizer *t, json_t *arr, struct err *e)
{
    size_t n = json_array_size(arr);
    if (tok_trie_init(&t->trie_raw) || tok_trie_init(&t->trie_norm))
        return err_set(e, "%s: out of memory", t->path);
    if (n == 0)
        return 0;
    t->added = calloc(n, sizeof *t->added);
    if (!t->added)
        return err_set(e, "%s: out of memory", t->path);
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        json_t *c = json_object_get(v, "content");
        json_t *id = json_object_get(v, "id");
        if (!json_is_string(c) || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= t->n_vocab)
            return err_set(e, "%s: added_tokens[%zu] needs a content string and an id", t->path,
                           i);
        struct tok_added *a = &t->added[t->n_added];
        a->id = (int)json_integer_value(id);
        if (!(a->content = arena_jstr(t, c, &a->len)))
            return err_set(e, "%s: out of memory", t->path);
        a->special = jbool(v, "special", false);
        a->lstrip = jbool(v, "lstrip", false);
        a->rstrip = jbool(v, "rstrip", false);
        a->normalized = jbool(v, "normalized", !a->special);
        if (tok_trie_add(a->normalized ? &t->trie_norm : &t->trie_raw, a->content, a->len,
                         t->n_added))
            return err_set(e, "%s: out of memory", t->path);
        if (!t->pieces[a->id] && tok_set_piece(t, a->id, a->content, a->len))
            return err_set(e, "%s: out of memory", t->path);
        if (a->special)
            t->attr[a->id] |= TOK_ATTR_SPECIAL;
        t->n_added++;
    }
    return 0;
}

/* ---- loading ---- */

static int max_id(json_t *vocab, json_t *added)
{
    json_int_t m = -1;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v)
    {
        if (json_integer_value(v) > m)
            m = json_integer_value(v);
    }
    size_t i;
    json_array_foreach(added, i, v)
    {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        if (id > m)
            m = id;
    }
    return m < (1 << 26) ? (int)m : -2;
}

/* One merge: "a b" or ["a", "b"]. */
static int parse_merge(struct tokenizer *t, json_t *m, int rank, struct tok_buf *tmp)
{
    const char *a, *b;
    size_t alen, blen;
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        const char *sp = strchr(s, ' ');
        if (!sp)
            return -1;
        a = s;
        alen = (size_t)(sp - s);
        b = sp + 1;
        blen = json_string_length(m) - alen - 1;
    } else if (json_is_array(m) && json_array_size(m) == 2 &&
               json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
        a = json_string_value(json_array_get(m, 0));
        alen = json_string_length(json_array_get(m, 0));
        b = json_string_value(json_array_get(m, 1));
        blen = json_string_length(json_array_get(m, 1));
    } else {
        return -1;
    }
    int ia = tok_strmap_get(&t->vocab, a, alen);
    int ib = tok_strmap_get(&t->vocab, b, blen);
    tmp->n = 0;
    if (tok_buf_put(tmp, a, alen) || tok_buf_put(tmp, b, blen))
        return -2;
    int ic = tok_strmap_get(&t->vocab, tmp->p, tmp->n);
    if (ia < 0 || ib < 0 || ic < 0)
        return 0; /* a merge outside the vocabulary can never apply */
    return tok_pairmap_put(&t->merges, ia, ib, rank, ic) ? -2 : 0;
}

static struct tokenizer *load_bpe(json_t *root, const char *path, struct err *e)
{
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab) || !json_is_array(merges)) {
        err_set(e, "%s: BPE model without a vocab object and a merges list", path);
        return NULL;
    }
    for (const char **k = (const char *[]){"continuing_subword_prefix", "end_of_word_suffix", NULL};
         *k; k++) {
        const char *s = jstr(model, *k);
        if (s && *s) {
            err_set(e, "%s: BPE %s \"%s\" not supported yet", path, *k, s);
            return NULL;
        }
    }
    int top = max_id(vocab, added);
    if (top < 0) {
        err_set(e, "%s: empty or oversized vocabulary", path);
        return NULL;
    }
    struct tokenizer *t = tok_alloc(TOK_KIND_HF_BPE, top + 1, path, e);
    if (!t)
        return NULL;
    struct hf_decoder dec = {0};
    struct tok_buf tmp = {0};
    bool dup_ids = false;

    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v)
    {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0) {
            err_set(e, "%s: vocab entry \"%s\" has a bad id", path, key);
            goto fail;
        }
        if (t->pieces[id]) {
            dup_ids = true; /* handled below */
            continue;
        }
        if (tok_set_piece(t, (int)id, key, strlen(key)))
            goto oom;
    }
    /* BPE sees the model vocabulary only; added tokens come after */
    if (tok_build_vocab_map(t))
        goto oom;
    if (dup_ids) {
        /* two strings for one id: both encode to it, the first one decodes */
        json_object_foreach(vocab, key, v)
        {
            int id = (int)json_integer_value(v);
            size_t n = strlen(key);
            if (t->piece_len[id] == n && memcmp(t->pieces[id], key, n) == 0)
                continue;
            char *k = tok_arena_strdup(&t->arena, key, n);
            if (!k || tok_strmap_put(&t->vocab, k, n, id))
                goto oom;
        }
    }
    tok_mark_byte_pieces(t);
    if (tok_pairmap_init(&t->merges, json_array_size(merges)))
        goto oom;
    size_t i;
    json_array_foreach(merges, i, v)
    {
        int rc = parse_merge(t, v, (int)i, &tmp);
        if (rc == -2)
            goto oom;
        if (rc < 0) {
            err_set(e, "%s: merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", path, i);
            goto fail;
        }
    }
    t->byte_fallback = jbool(model, "byte_fallback", false);
    t->ignore_merges = jbool(model, "ignore_merges", false);
    t->fuse_unk = jbool(model, "fuse_unk", false);
    const char *unk = jstr(model, "unk_token");
    if (unk) {
        t->unk = tok_strmap_get(&t->vocab, unk, strlen(unk));
        if (t->unk < 0) {
            err_set(e, "%s: unk_token \"%s\" is not in the vocabulary", path, unk);
            goto fail;
        }
    }

    if (parse_added_tokens(t, added, e) || parse_normalizer(t, json_object_get(root, "normalizer"), e) ||
        parse_pre_tokenizer(t, json_object_get(root, "pre_tokenizer"), e) ||
        parse_post_processor(t, json_object_get(root, "post_processor"), e) ||
        parse_decoder(t, json_object_get(root, "decoder"), &dec, e))
        goto fail;

    /* ids whose piece is <0xXX> decode to that byte only under ByteFallback */
    if (!dec.byte_fallback)
        for (int id = 0; id < t->n_vocab; id++)
            t->attr[id] &= (uint8_t)~TOK_ATTR_BYTE;
    if (build_decoded(t, &dec))
        goto oom;
    t->strip = dec.strip_start > 0 ? TOK_STRIP_AT_START : TOK_STRIP_NONE;
    tok_check_split_mark(t, "\xe2\x96\x81", 3);

    /* BOS/EOS: tokenizer_config.json names them; otherwise the template's
     * leading special token is BOS and a conventional name is EOS */
    if (t->n_prefix > 0)
        t->bos = t->prefix_ids[0];
    else
        for (const char **k = (const char *[]){"<s>", "<bos>", "<|begin_of_text|>", NULL}; *k && t->bos < 0; k++)
            t->bos = added_id(t, *k);
    for (const char **k = (const char *[]){"</s>", "<eos>", "<|end_of_text|>", "<|endoftext|>", NULL};
         *k && t->eos < 0; k++)
        t->eos = added_id(t, *k);
    if (apply_tokenizer_config(t, path, e))
        goto fail;
    if (t->bos >= 0)
        t->attr[t->bos] |= TOK_ATTR_SPECIAL;
    if (t->eos >= 0)
        t->attr[t->eos] |= TOK_ATTR_SPECIAL;
    tok_finish(t);
    free(dec.repl);
    free(tmp.p);
    return t;
oom:
    err_set(e, "%s: out of memory", path);
fail:
    free(dec.repl);
    free(tmp.p);
    tok_free(t);
    return NULL;
}

struct tokenizer *tok_load_hf_json(const char *tokenizer_json_path, struct err *e)
{
    const char *path = tokenizer_json_path;
    json_error_t je;
    json_t *root = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!root) {
        if (je.line <= 0)
            err_set(e, "%s: %s", path, je.text);
        else
            err_set(e, "%s: line %d: %s", path, je.line, je.text);
        return NULL;
    }
    struct tokenizer *t = NULL;
    json_t *model = json_object_get(root, "model");
    const char *type = jstr(model, "type");
    if (!json_is_object(model)) {
        err_set(e, "%s: no \"model\" object (not a tokenizer.json?)", path);
    } else if (type && strcmp(type, "BPE") != 0) {
        err_set(e, "%s: model type %s not supported yet (only BPE)", path, type);
    } else if (!type && !json_object_get(model, "merges")) {
        err_set(e, "%s: model without a type and without merges (only BPE is supported)", path);
    } else if (json_has_type(json_object_get(root, "pre_tokenizer"), "ByteLevel") ||
               json_has_type(json_object_get(root, "decoder"), "ByteLevel")) {
        err_set(e, "%s: pre_tokenizer ByteLevel not supported yet (byte-level BPE)", path);
    } else {
        t = load_bpe(root, path, e);
    }
    json_decref(root);
    return t;
}

/* ---- encoding ---- */

struct span {
    size_t off, len;
};

struct spans {
    struct span *p;
    size_t n, cap;
};

static int spans_push(struct spans *s, size_t off, size_t len)
{
    if (len == 0)
        return 0; /* empty pieces produce nothing */
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        struct span *p = realloc(s->p, cap * sizeof *p);
        if (!p)
            return -1;
        s->p = p;
        s->cap = cap;
    }
    s->p[s->n++] = (struct span){off, len};
    return 0;
}

/* Scratch of one tok_hf_encode call. */
struct hf_ctx {
    const struct tokenizer *t;
    struct tok_buf norm, norm2, pre, pre2;
    struct spans sp, sp2;
    struct tok_work w;
    struct tok_ivec *out;
    struct err *e;
};

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Splits one piece of buf at the occurrences of the pattern. */
static int split_piece(const struct tok_pre_step *st, const char *buf, struct span p,
                       struct spans *out)
{
    size_t pos = p.off, end = p.off + p.len, piece = p.off;
    while (pos < end) {
        const char *hit = memmem(buf + pos, end - pos, st->pat, st->pat_len);
        if (!hit)
            break;
        size_t ms = (size_t)(hit - buf), me = ms + st->pat_len;
        if (st->behavior == TOK_SPLIT_CONTIGUOUS)
            while (me + st->pat_len <= end && memcmp(buf + me, st->pat, st->pat_len) == 0)
                me += st->pat_len;
        int rc = 0;
        switch (st->behavior) {
        case TOK_SPLIT_REMOVED:
            rc = spans_push(out, piece, ms - piece);
            piece = me;
            break;
        case TOK_SPLIT_ISOLATED:
        case TOK_SPLIT_CONTIGUOUS:
            rc = spans_push(out, piece, ms - piece) || spans_push(out, ms, me - ms);
            piece = me;
            break;
        case TOK_SPLIT_MERGED_PREV:
            rc = spans_push(out, piece, me - piece);
            piece = me;
            break;
        case TOK_SPLIT_MERGED_NEXT:
            rc = spans_push(out, piece, ms - piece);
            piece = ms;
            break;
        }
        if (rc)
            return -1;
        pos = me;
    }
    return spans_push(out, piece, end - piece);
}

/* Metaspace on one piece: spaces -> replacement, maybe a prefix, maybe split
 * before each replacement. Writes the new text to nb and its pieces to out. */
static int metaspace_piece(const struct tok_pre_step *st, const char *buf, struct span p,
                           bool first, struct tok_buf *nb, struct spans *out)
{
    size_t start = nb->n;
    const char *s = buf + p.off;
    bool starts = p.len >= st->repl_len && memcmp(s, st->repl, st->repl_len) == 0;
    starts = starts || (p.len > 0 && s[0] == ' '); /* the space becomes the replacement */
    bool prepend = !starts && (st->prepend == TOK_PREPEND_ALWAYS ||
                               (st->prepend == TOK_PREPEND_FIRST && first));
    if (prepend && tok_buf_put(nb, st->repl, st->repl_len))
        return -1;
    for (size_t i = 0; i < p.len; i++) {
        int rc = s[i] == ' ' ? tok_buf_put(nb, st->repl, st->repl_len) : tok_buf_put(nb, s + i, 1);
        if (rc)
            return -1;
    }
    struct span whole = {start, nb->n - start};
    if (!st->split)
        return spans_push(out, whole.off, whole.len);
    struct tok_pre_step sp = {.pat = st->repl, .pat_len = st->repl_len,
                              .behavior = TOK_SPLIT_MERGED_NEXT};
    return split_piece(&sp, nb->p, whole, out);
}

/* Pre-tokenizes s[0, n) and runs BPE on every piece. */
static int pretok_and_bpe(struct hf_ctx *c, const char *s, size_t n, bool first)
{
    const struct tokenizer *t = c->t;
    if (n == 0)
        return 0;
    if (t->n_pre == 0)
        return tok_bpe_word(t, s, n, &c->w, c->out, c->e);
    c->pre.n = 0;
    c->sp.n = 0;
    if (tok_buf_put(&c->pre, s, n) || spans_push(&c->sp, 0, n))
        goto oom;
    for (int k = 0; k < t->n_pre; k++) {
        const struct tok_pre_step *st = &t->pre[k];
        c->sp2.n = 0;
        if (st->kind == TOK_PRE_SPLIT) {
            for (size_t i = 0; i < c->sp.n; i++)
                if (split_piece(st, c->pre.p, c->sp.p[i], &c->sp2))
                    goto oom;
        } else {
            c->pre2.n = 0;
            if (tok_buf_put(&c->pre2, "", 0))
                goto oom;
            for (size_t i = 0; i < c->sp.n; i++)
                if (metaspace_piece(st, c->pre.p, c->sp.p[i], first && i == 0, &c->pre2, &c->sp2))
                    goto oom;
            struct tok_buf tb = c->pre;
            c->pre = c->pre2;
            c->pre2 = tb;
        }
        struct spans ts = c->sp;
        c->sp = c->sp2;
        c->sp2 = ts;
    }
    for (size_t i = 0; i < c->sp.n; i++)
        if (tok_bpe_word(t, c->pre.p + c->sp.p[i].off, c->sp.p[i].len, &c->w, c->out, c->e))
            return -1;
    return 0;
oom:
    return err_set(c->e, "out of memory tokenizing");
}

/* Finds the next added token in s[from, n) from the trie, with its
 * lstrip/rstrip reach. Returns false when there is none. */
static bool next_added(const struct tokenizer *t, const struct tok_trie *tr, const char *s,
                       size_t n, size_t from, size_t *ms, size_t *me, int *id)
{
    size_t mlen;
    int idx;
    long m = tok_trie_find(tr, s, n, from, &mlen, &idx);
    if (m < 0)
        return false;
    const struct tok_added *a = &t->added[idx];
    *ms = (size_t)m;
    *me = (size_t)m + mlen;
    if (a->lstrip)
        while (*ms > from && is_ws(s[*ms - 1]))
            (*ms)--;
    if (a->rstrip)
        while (*me < n && is_ws(s[*me]))
            (*me)++;
    *id = a->id;
    return true;
}

/* A piece of input between raw added tokens: normalize, split off the
 * normalized added tokens, pre-tokenize and BPE the rest. */
static int encode_chunk(struct hf_ctx *c, const char *s, size_t n, bool first)
{
    const struct tokenizer *t = c->t;
    if (n == 0)
        return 0;
    c->norm.n = 0;
    if (tok_buf_put(&c->norm, s, n))
        goto oom;
    for (int k = 0; k < t->n_norm; k++) {
        const struct tok_norm_step *st = &t->norm[k];
        if (st->kind == TOK_NORM_PREPEND) {
            if (c->norm.n == 0)
                continue;
            c->norm2.n = 0;
            if (tok_buf_put(&c->norm2, st->a, st->alen) ||
                tok_buf_put(&c->norm2, c->norm.p, c->norm.n))
                goto oom;
        } else if (replace_all(st, c->norm.p, c->norm.n, &c->norm2)) {
            goto oom;
        }
        struct tok_buf tb = c->norm;
        c->norm = c->norm2;
        c->norm2 = tb;
    }
    /* pretok_and_bpe works in c->pre, so c->norm stays valid here */
    const char *ns = c->norm.p;
    size_t nn = c->norm.n, pos = 0;
    int rc = 0;
    while (pos < nn && rc == 0) {
        size_t ms, me;
        int id;
        if (!next_added(t, &t->trie_norm, ns, nn, pos, &ms, &me, &id)) {
            rc = pretok_and_bpe(c, ns + pos, nn - pos, first && pos == 0);
            break;
        }
        rc = pretok_and_bpe(c, ns + pos, ms - pos, first && pos == 0);
        if (rc == 0 && tok_ivec_push(c->out, id))
            rc = err_set(c->e, "out of memory tokenizing");
        pos = me;
    }
    return rc;
oom:
    return err_set(c->e, "out of memory tokenizing");
}

int tok_hf_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
                  struct tok_ivec *out, struct err *e)
{
    struct hf_ctx c = {.t = t, .out = out, .e = e};
    int rc = 0;
    for (int i = 0; add_special && i < t->n_prefix && rc == 0; i++)
        rc = tok_ivec_push(out, t->prefix_ids[i]) ? err_set(e, "out of memory tokenizing") : 0;
    size_t pos = 0;
    while (pos < len && rc == 0) {
        size_t ms, me;
        int id;
        if (!next_added(t, &t->trie_raw, text, len, pos, &ms, &me, &id)) {
            rc = encode_chunk(&c, text + pos, len - pos, pos == 0);
            break;
        }
        rc = encode_chunk(&c, text + pos, ms - pos, pos == 0);
        if (rc == 0 && tok_ivec_push(out, id))
            rc = err_set(e, "out of memory tokenizing");
        pos = me;
    }
    for (int i = 0; add_special && i < t->n_suffix && rc == 0; i++)
        rc = tok_ivec_push(out, t->suffix_ids[i]) ? err_set(e, "out of memory tokenizing") : 0;
    free(c.norm.p);
    free(c.norm2.p);
    free(c.pre.p);
    free(c.pre2.p);
    free(c.sp.p);
    free(c.sp2.p);
    tok_work_free(&c.w);
    return rc ? -1 : 0;
}
