/* bpe_hf.c - Hugging Face tokenizer.json: BPE (SentencePiece-style with
 * byte fallback as in Llama 2/Mistral/Gemma, byte-level as in GPT-2,
 * Llama 3, Qwen, DeepSeek) and WordPiece models. Encoding follows HF's
 * pipeline: added tokens split off the raw text first (lstrip, rstrip,
 * single_word), the normalizer, added tokens with normalized=true split off
 * the normalized text, the pre-tokenizer, the model on each piece, the
 * post-processor's special tokens. Decoding precomputes each id's text by
 * running the decoder chain on its piece; the streaming detokenizer then
 * only concatenates bytes. GGUF vocabularies reach the same loader through
 * tok_load_hf_src. */
#include "tokenizer/tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- decoder ---- */

/* One step of the decoder chain, applied to every piece at load time. */
struct dec_step {
    enum { D_REPLACE, D_BYTELEVEL, D_METASPACE, D_STRIP, D_WORDPIECE } kind;
    const char *a, *b; /* Replace: pattern -> content; Metaspace: replacement */
    size_t alen, blen;
    struct tok_regex *re;
    int start, stop;   /* Strip: characters removed at each end */
    bool cleanup;      /* WordPiece */
};

struct hf_decoder {
    struct dec_step *steps;
    int n;
    bool byte_fallback;
    bool fused;      /* a Fuse step came: later steps see the whole text */
    int strip_start; /* leading spaces removed from the whole text */
    bool strip_first_all; /* Metaspace: every space of the first token goes */
    bool absent;     /* no decoder: HF joins the pieces with spaces */
};

static void decoder_free(struct hf_decoder *d)
{
    for (int i = 0; i < d->n; i++)
        tok_regex_free(d->steps[i].re);
    free(d->steps);
}

static int push_dec(struct tokenizer *t, struct hf_decoder *d, struct dec_step st, struct err *e)
{
    struct dec_step *p = realloc(d->steps, (size_t)(d->n + 1) * sizeof *p);
    if (!p) {
        tok_regex_free(st.re);
        return err_set(e, "%s: out of memory", t->path);
    }
    d->steps = p;
    d->steps[d->n++] = st;
    return 0;
}

static int parse_decoder(struct tokenizer *t, json_t *node, struct hf_decoder *d, struct err *e)
{
    if (!node || json_is_null(node))
        return 0;
    const char *ty = tok_json_str(node, "type");
    if (!ty)
        return err_set(e, "%s: decoder without a type", t->path);
    struct dec_step st = {0};
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
    if (strcmp(ty, "Fuse") == 0) {
        d->fused = true;
        return 0;
    }
    if (strcmp(ty, "ByteFallback") == 0) {
        d->byte_fallback = true;
        return 0;
    }
    if (strcmp(ty, "ByteLevel") == 0) {
        st.kind = D_BYTELEVEL;
        d->fused = true; /* it joins the tokens into one string */
        return push_dec(t, d, st, e);
    }
    if (strcmp(ty, "Replace") == 0) {
        st.kind = D_REPLACE;
        if (tok_parse_replace(t, node, "decoder", &st.a, &st.alen, &st.b, &st.blen, &st.re, e))
            return -1;
        return push_dec(t, d, st, e);
    }
    if (strcmp(ty, "Metaspace") == 0) {
        int prepend;
        st.kind = D_METASPACE;
        if (tok_parse_metaspace(t, node, &st.a, &st.alen, &prepend, e))
            return -1;
        if (prepend != TOK_PREPEND_NEVER)
            d->strip_first_all = true;
        return push_dec(t, d, st, e);
    }
    if (strcmp(ty, "Strip") == 0) {
        const char *c = tok_json_str(node, "content");
        st.kind = D_STRIP;
        st.start = (int)json_integer_value(json_object_get(node, "start"));
        st.stop = (int)json_integer_value(json_object_get(node, "stop"));
        if (!c || strcmp(c, " ") != 0)
            return err_set(e, "%s: decoder Strip of \"%s\" not supported", t->path, c ? c : "?");
        if (st.start < 0 || st.stop < 0)
            return err_set(e, "%s: decoder Strip with negative counts", t->path);
        if (d->fused) {
            /* after Fuse, Strip sees the whole text */
            if (st.stop > 0)
                return err_set(e, "%s: decoder Strip with stop > 0 after Fuse not supported",
                               t->path);
            d->strip_start = st.start;
            return 0;
        }
        return push_dec(t, d, st, e);
    }
    if (strcmp(ty, "WordPiece") == 0) {
        json_t *p = json_object_get(node, "prefix");
        st.kind = D_WORDPIECE;
        if (json_is_string(p)) {
            if (!(st.a = tok_arena_jstr(t, p, &st.alen)))
                return err_set(e, "%s: out of memory", t->path);
        } else {
            st.a = "##";
            st.alen = 2;
        }
        st.cleanup = tok_json_bool(node, "cleanup", true);
        d->strip_start = 1;
        return push_dec(t, d, st, e);
    }
    return err_set(e, "%s: decoder %s not supported", t->path, ty);
}

/* Replaces every occurrence of a[0,alen) in s by b (into out). */
static int replace_all(const char *s, size_t n, const char *a, size_t alen, const char *b,
                       size_t blen, struct tok_buf *out)
{
    size_t i = 0;
    while (i < n) {
        const char *hit = n - i >= alen ? memmem(s + i, n - i, a, alen) : NULL;
        size_t stop = hit ? (size_t)(hit - s) : n;
        if (tok_buf_put(out, s + i, stop - i))
            return -1;
        if (!hit)
            break;
        if (tok_buf_put(out, b, blen))
            return -1;
        i = stop + alen;
    }
    return 0;
}

/* The WordPiece decoder's cleanup (transformers' clean_up_tokenization). */
static int cleanup_text(const char *s, size_t n, struct tok_buf *out, struct tok_buf *tmp)
{
    static const char *const pairs[][2] = {
        {" .", "."},    {" ?", "?"},     {" !", "!"},       {" ,", ","},   {" ' ", "'"},
        {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"},     {" 've", "'ve"}, {" 're", "'re"},
    };
    out->n = 0;
    if (tok_buf_put(out, s, n))
        return -1;
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        if (!memmem(out->p, out->n, pairs[k][0], strlen(pairs[k][0])))
            continue;
        tmp->n = 0;
        if (tok_buf_put(tmp, "", 0) || replace_all(out->p, out->n, pairs[k][0], strlen(pairs[k][0]),
                                                  pairs[k][1], strlen(pairs[k][1]), tmp))
            return -1;
        struct tok_buf x = *out;
        *out = *tmp;
        *tmp = x;
    }
    return 0;
}

/* The decoder chain on one piece (a into b, swapped after each step). */
static int decode_piece(const struct hf_decoder *d, struct tok_buf *a, struct tok_buf *b,
                        struct tok_rx_scratch *rx, struct err *e)
{
    for (int k = 0; k < d->n; k++) {
        const struct dec_step *st = &d->steps[k];
        b->n = 0;
        if (tok_buf_put(b, "", 0))
            return -1;
        switch (st->kind) {
        case D_REPLACE:
            if (st->re) {
                size_t pos = 0, copied = 0, ms, me;
                while (pos < a->n) {
                    int r = tok_regex_next(st->re, a->p, a->n, pos, &ms, &me, rx, e);
                    if (r < 0)
                        return -1;
                    if (r == 0)
                        break;
                    if (tok_buf_put(b, a->p + copied, ms - copied) || tok_buf_put(b, st->b, st->blen))
                        return -1;
                    copied = me;
                    pos = me > ms ? me : me + 1;
                }
                if (tok_buf_put(b, a->p + copied, a->n - copied))
                    return -1;
            } else if (replace_all(a->p, a->n, st->a, st->alen, st->b, st->blen, b)) {
                return -1;
            }
            break;
        case D_METASPACE:
            if (replace_all(a->p, a->n, st->a, st->alen, " ", 1, b))
                return -1;
            break;
        case D_BYTELEVEL: {
            /* each character back to its byte; a piece with a character
             * outside the alphabet (an added token) stays as it is */
            bool all = true;
            for (size_t i = 0; i < a->n && all;) {
                size_t len;
                int byte = tok_bytelevel_byte(tok_utf8_next(a->p + i, a->n - i, &len));
                if (byte < 0) {
                    all = false;
                } else {
                    char c = (char)byte;
                    if (tok_buf_put(b, &c, 1))
                        return -1;
                }
                i += len;
            }
            if (!all) {
                b->n = 0;
                if (tok_buf_put(b, a->p, a->n))
                    return -1;
            }
            break;
        }
        case D_STRIP: {
            size_t s = 0, n = a->n;
            for (int i = 0; i < st->start && s < n && a->p[s] == ' '; i++)
                s++;
            for (int i = 0; i < st->stop && n > s && a->p[n - 1] == ' '; i++)
                n--;
            if (tok_buf_put(b, a->p + s, n - s))
                return -1;
            break;
        }
        case D_WORDPIECE: {
            bool cont = a->n >= st->alen && memcmp(a->p, st->a, st->alen) == 0;
            struct tok_buf tmp = {0};
            int rc = cont ? tok_buf_put(&tmp, a->p + st->alen, a->n - st->alen)
                          : tok_buf_put(&tmp, " ", 1) || tok_buf_put(&tmp, a->p, a->n);
            if (rc == 0 && st->cleanup) {
                struct tok_buf tmp2 = {0};
                rc = cleanup_text(tmp.p, tmp.n, b, &tmp2);
                free(tmp2.p);
            } else if (rc == 0) {
                rc = tok_buf_put(b, tmp.p, tmp.n);
            }
            free(tmp.p);
            if (rc)
                return -1;
            break;
        }
        }
        struct tok_buf x = *a;
        *a = *b;
        *b = x;
    }
    return 0;
}

/* Decoded text of every non-byte id. */
static int build_decoded(struct tokenizer *t, const struct hf_decoder *d, struct err *e)
{
    if (d->n == 0 && !d->absent)
        return 0;
    struct tok_buf a = {0}, b = {0};
    struct tok_rx_scratch rx = {0};
    int rc = 0;
    for (int id = 0; id < t->n_vocab && rc == 0; id++) {
        if (!t->pieces[id] || (t->attr[id] & TOK_ATTR_BYTE))
            continue;
        a.n = 0;
        rc = (d->absent && tok_buf_put(&a, " ", 1)) ||
             tok_buf_put(&a, t->pieces[id], t->piece_len[id]) || decode_piece(d, &a, &b, &rx, e);
        if (rc == 0 && (a.n != t->piece_len[id] || memcmp(a.p, t->pieces[id], a.n) != 0))
            rc = tok_set_dec(t, id, a.p, a.n);
    }
    free(a.p);
    free(b.p);
    tok_rx_scratch_free(&rx);
    return rc ? err_set(e, "%s: out of memory decoding the vocabulary", t->path) : 0;
}

/* ---- post-processor ---- */

/* ["[CLS]", 101] of BertProcessing / RobertaProcessing */
static int special_pair(struct tokenizer *t, json_t *node, const char *key, int *id, struct err *e)
{
    json_t *v = json_object_get(node, key);
    json_t *x = json_array_get(v, 1);
    json_int_t k = json_integer_value(x);
    if (!json_is_integer(x) || k < 0 || k >= t->n_vocab)
        return err_set(e, "%s: post_processor %s needs [\"token\", id]", t->path, key);
    *id = (int)k;
    return 0;
}

static int parse_post_processor(struct tokenizer *t, json_t *node, struct err *e)
{
    if (!node || json_is_null(node))
        return 0;
    const char *ty = tok_json_str(node, "type");
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
    if (strcmp(ty, "BertProcessing") == 0 || strcmp(ty, "RobertaProcessing") == 0) {
        int cls, sep;
        if (special_pair(t, node, "cls", &cls, e) || special_pair(t, node, "sep", &sep, e))
            return -1;
        if (tok_ids_push(&t->prefix_ids, &t->n_prefix, cls) ||
            tok_ids_push(&t->suffix_ids, &t->n_suffix, sep))
            return err_set(e, "%s: out of memory", t->path);
        return 0;
    }
    if (strcmp(ty, "TemplateProcessing") != 0)
        return err_set(e, "%s: post_processor %s not supported", t->path, ty);
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
        const char *name = tok_json_str(sp, "id");
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
            if (seen_seq ? tok_ids_push(&t->suffix_ids, &t->n_suffix, (int)id)
                         : tok_ids_push(&t->prefix_ids, &t->n_prefix, (int)id))
                return err_set(e, "%s: out of memory", t->path);
        }
    }
    return 0;
}

/* ---- added tokens, special ids, tokenizer_config.json ---- */

static int added_only_id(const struct tokenizer *t, const char *s)
{
    size_t n = strlen(s);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && memcmp(t->added[i].content, s, n) == 0)
            return t->added[i].id;
    return -1;
}

static int added_id(const struct tokenizer *t, const char *s)
{
    int id = added_only_id(t, s);
    return id >= 0 ? id : tok_strmap_get(&t->vocab, s, strlen(s));
}

/* "bos_token": "<s>" or {"content": "<s>", ...} */
static const char *config_token(json_t *cfg, const char *key)
{
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static void ivec_remove(int *ids, int *n, int x)
{
    int k = 0;
    for (int i = 0; i < *n; i++)
        if (ids[i] != x)
            ids[k++] = ids[i];
    *n = k;
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
 * LlamaTokenizerFast does). A missing file is fine; a broken one is not.
 * clean_up_tokenization_spaces is not applied: decoding follows the
 * tokenizers library (transformers 5 ignores it for BPE too). */
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

/* Added tokens go into one of two tries: normalized=false ones are
 * matched in the raw text, normalized=true ones in the normalized text
 * (so their own text is normalized first, as HF does). */
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
    struct tok_buf nb = {0}, tmp = {0};
    struct tok_rx_scratch rx = {0};
    int rc = 0;
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        json_t *c = json_object_get(v, "content");
        json_t *id = json_object_get(v, "id");
        if (!json_is_string(c) || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= t->n_vocab) {
            rc = err_set(e, "%s: added_tokens[%zu] needs a content string and an id", t->path, i);
            break;
        }
        struct tok_added *a = &t->added[t->n_added];
        a->id = (int)json_integer_value(id);
        if (!(a->content = tok_arena_jstr(t, c, &a->len))) {
            rc = err_set(e, "%s: out of memory", t->path);
            break;
        }
        a->special = tok_json_bool(v, "special", false);
        a->lstrip = tok_json_bool(v, "lstrip", false);
        a->rstrip = tok_json_bool(v, "rstrip", false);
        a->single_word = tok_json_bool(v, "single_word", false);
        a->normalized = tok_json_bool(v, "normalized", !a->special);
        const char *key = a->content;
        size_t klen = a->len;
        if (a->normalized && t->n_norm > 0) {
            if (tok_normalize(t, a->content, a->len, &nb, &tmp, &rx, e)) {
                rc = -1;
                break;
            }
            key = nb.p;
            klen = nb.n;
        }
        /* a normalized token's text is its normalized content (HF decodes
         * "HELLO" under Lowercase as "hello") */
        if (tok_trie_add(a->normalized ? &t->trie_norm : &t->trie_raw, key, klen, t->n_added) ||
            (!t->pieces[a->id] && tok_set_piece(t, a->id, key, klen))) {
            rc = err_set(e, "%s: out of memory", t->path);
            break;
        }
        if (a->special)
            t->attr[a->id] |= TOK_ATTR_SPECIAL;
        t->n_added++;
    }
    free(nb.p);
    free(tmp.p);
    tok_rx_scratch_free(&rx);
    return rc;
}

/* ---- loading ---- */

static int max_id(json_t *vocab, json_t *added, int n_tokens)
{
    json_int_t m = n_tokens - 1;
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

/* One merge: "a b" or ["a", "b"]. Returns 0, -1 (malformed), -2 (OOM). */
static int add_merge(struct tokenizer *t, const char *a, size_t alen, const char *b, size_t blen,
                     int rank, struct tok_buf *tmp)
{
    int ia = tok_strmap_get(&t->vocab, a, alen);
    int ib = tok_strmap_get(&t->vocab, b, blen);
    /* with a continuing prefix, "a ##b" makes "ab" */
    if (t->cont_prefix_len && blen >= t->cont_prefix_len &&
        memcmp(b, t->cont_prefix, t->cont_prefix_len) == 0) {
        b += t->cont_prefix_len;
        blen -= t->cont_prefix_len;
    }
    tmp->n = 0;
    if (tok_buf_put(tmp, a, alen) || tok_buf_put(tmp, b, blen))
        return -2;
    int ic = tok_strmap_get(&t->vocab, tmp->p, tmp->n);
    if (ia < 0 || ib < 0 || ic < 0)
        return 0; /* a merge outside the vocabulary can never apply */
    /* a pair listed twice: the later rank wins, as in HF's merge map */
    return tok_pairmap_put(&t->merges, ia, ib, rank, ic) ? -2 : 0;
}

static int parse_merge_str(struct tokenizer *t, const char *s, size_t n, int rank,
                           struct tok_buf *tmp)
{
    const char *sp = memchr(s, ' ', n);
    if (!sp)
        return -1;
    size_t alen = (size_t)(sp - s);
    return add_merge(t, s, alen, sp + 1, n - alen - 1, rank, tmp);
}

static int parse_merge(struct tokenizer *t, json_t *m, int rank, struct tok_buf *tmp)
{
    if (json_is_string(m))
        return parse_merge_str(t, json_string_value(m), json_string_length(m), rank, tmp);
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1)))
        return add_merge(t, json_string_value(json_array_get(m, 0)),
                         json_string_length(json_array_get(m, 0)),
                         json_string_value(json_array_get(m, 1)),
                         json_string_length(json_array_get(m, 1)), rank, tmp);
    return -1;
}

/* A "prefix"/"suffix" option of the model; empty means none. */
static int model_affix(struct tokenizer *t, json_t *model, const char *key, const char **s,
                       size_t *len, struct err *e)
{
    json_t *v = json_object_get(model, key);
    *s = NULL;
    *len = 0;
    if (!json_is_string(v) || json_string_length(v) == 0)
        return 0;
    if (!(*s = tok_arena_jstr(t, v, len)))
        return err_set(e, "%s: out of memory", t->path);
    return 0;
}

/* Byte-level BPE: the byte string each piece stands for, as the key the
 * model looks words up by. */
static int build_byte_vocab(struct tokenizer *t)
{
    if (tok_strmap_init(&t->bvocab, (size_t)t->n_vocab))
        return -1;
    struct tok_buf b = {0};
    int rc = 0;
    for (int k = 0; k < 256; k++)
        t->byte_tok[k] = -1;
    for (int id = 0; id < t->n_vocab && rc == 0; id++) {
        const char *p = t->pieces[id];
        if (!p)
            continue;
        b.n = 0;
        size_t n = t->piece_len[id];
        bool ok = true;
        for (size_t i = 0; i < n && ok && rc == 0;) {
            size_t len;
            int byte = tok_bytelevel_byte(tok_utf8_next(p + i, n - i, &len));
            if (byte < 0) {
                ok = false;
            } else {
                char c = (char)byte;
                rc = tok_buf_put(&b, &c, 1);
            }
            i += len;
        }
        if (!ok || rc || b.n == 0)
            continue; /* no byte string: byte-level input can never produce it */
        char *k = tok_arena_strdup(&t->arena, b.p, b.n);
        if (!k || tok_strmap_put(&t->bvocab, k, b.n, id)) {
            rc = -1;
            break;
        }
    }
    free(b.p);
    for (int k = 0; k < 256 && rc == 0; k++) {
        char c = (char)k;
        t->byte_tok[k] = tok_strmap_get(&t->bvocab, &c, 1);
    }
    return rc;
}

struct tokenizer *tok_load_hf_src(const struct tok_hf_src *src, const char *path, struct err *e)
{
    json_t *root = src->root;
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    const char *mtype = tok_json_str(model, "type");
    bool wordpiece = mtype && strcmp(mtype, "WordPiece") == 0;
    if (!src->tokens && !json_is_object(vocab)) {
        err_set(e, "%s: %s model without a vocab object", path, wordpiece ? "WordPiece" : "BPE");
        return NULL;
    }
    if (!wordpiece && !src->merges && !json_is_array(merges)) {
        err_set(e, "%s: BPE model without a merges list", path);
        return NULL;
    }
    int top = max_id(src->tokens ? NULL : vocab, added, src->tokens ? src->n_tokens : 0);
    if (top < 0) {
        err_set(e, "%s: empty or oversized vocabulary", path);
        return NULL;
    }
    struct tokenizer *t = tok_alloc(TOK_KIND_HF_BPE, top + 1, path, e);
    if (!t)
        return NULL;
    t->wordpiece = wordpiece;
    struct hf_decoder dec = {0};
    struct tok_buf tmp = {0};
    bool dup_ids = false;

    if (src->tokens) {
        for (int id = 0; id < src->n_tokens; id++)
            if (src->tokens[id] && tok_set_piece(t, id, src->tokens[id], strlen(src->tokens[id])))
                goto oom;
    } else {
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
    }
    /* the model sees its own vocabulary only; added tokens come after */
    if (tok_build_vocab_map(t))
        goto oom;
    if (dup_ids) {
        /* two strings for one id: both encode to it, the first one decodes */
        const char *key;
        json_t *v;
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
    if (wordpiece) {
        if (model_affix(t, model, "continuing_subword_prefix", &t->cont_prefix,
                        &t->cont_prefix_len, e))
            goto fail;
        if (!json_is_string(json_object_get(model, "continuing_subword_prefix"))) {
            t->cont_prefix = "##";
            t->cont_prefix_len = 2;
        }
        json_t *mx = json_object_get(model, "max_input_chars_per_word");
        t->wp_max_chars = json_is_integer(mx) ? (int)json_integer_value(mx) : 100;
    } else {
        if (model_affix(t, model, "continuing_subword_prefix", &t->cont_prefix,
                        &t->cont_prefix_len, e) ||
            model_affix(t, model, "end_of_word_suffix", &t->eow_suffix, &t->eow_suffix_len, e))
            goto fail;
        size_t nm = src->merges ? (size_t)src->n_merges : json_array_size(merges);
        if (tok_pairmap_init(&t->merges, nm))
            goto oom;
        for (size_t i = 0; i < nm; i++) {
            int rc = src->merges ? parse_merge_str(t, src->merges[i], strlen(src->merges[i]),
                                                   (int)i, &tmp)
                                 : parse_merge(t, json_array_get(merges, i), (int)i, &tmp);
            if (rc == -2)
                goto oom;
            if (rc < 0) {
                err_set(e, "%s: merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", path, i);
                goto fail;
            }
        }
        t->byte_fallback = tok_json_bool(model, "byte_fallback", false);
        t->ignore_merges = tok_json_bool(model, "ignore_merges", false);
        t->fuse_unk = tok_json_bool(model, "fuse_unk", false);
    }
    const char *unk = tok_json_str(model, "unk_token");
    if (unk) {
        t->unk = tok_strmap_get(&t->vocab, unk, strlen(unk));
        if (t->unk < 0 && wordpiece) {
            err_set(e, "%s: unk_token \"%s\" is not in the vocabulary", path, unk);
            goto fail;
        }
        t->unk_missing = t->unk < 0; /* HF fails only when a word needs it */
    }

    if (tok_parse_normalizer(t, json_object_get(root, "normalizer"), e) ||
        tok_parse_pre_tokenizer(t, json_object_get(root, "pre_tokenizer"), e))
        goto fail;
    /* before the added tokens: the model's own pieces only */
    if (t->byte_level && build_byte_vocab(t))
        goto oom;
    if (parse_added_tokens(t, added, e) ||
        parse_post_processor(t, json_object_get(root, "post_processor"), e) ||
        parse_decoder(t, json_object_get(root, "decoder"), &dec, e))
        goto fail;

    /* ids whose piece is <0xXX> decode to that byte only under ByteFallback */
    if (!dec.byte_fallback)
        for (int id = 0; id < t->n_vocab; id++)
            t->attr[id] &= (uint8_t)~TOK_ATTR_BYTE;
    json_t *dnode = json_object_get(root, "decoder");
    if (!dnode || json_is_null(dnode)) {
        /* no decoder: HF joins the pieces with " " */
        dec.absent = true;
        dec.strip_start = 1;
    }
    if (build_decoded(t, &dec, e))
        goto fail;
    t->strip = dec.strip_first_all ? TOK_STRIP_FIRST_ALL
             : dec.strip_start > 0 ? TOK_STRIP_AT_START
                                   : TOK_STRIP_NONE;
    if (!t->byte_level && !t->wordpiece)
        tok_check_split_mark(t, "\xe2\x96\x81", 3);

    /* BOS/EOS: tokenizer_config.json names them; otherwise the template's
     * leading special token is BOS and a conventional name is EOS */
    if (src->bos >= 0 || src->eos >= 0) {
        t->bos = src->bos < t->n_vocab ? src->bos : -1;
        t->eos = src->eos < t->n_vocab ? src->eos : -1;
    } else {
        if (t->n_prefix > 0)
            t->bos = t->prefix_ids[0];
        else
            for (const char **k = (const char *[]){"<s>", "<bos>", "<|begin_of_text|>", NULL};
                 *k && t->bos < 0; k++)
                t->bos = added_only_id(t, *k);
        for (const char **k =
                 (const char *[]){"</s>", "<eos>", "<|end_of_text|>", "<|endoftext|>", NULL};
             *k && t->eos < 0; k++)
            t->eos = added_only_id(t, *k);
    }
    if (src->read_config && apply_tokenizer_config(t, path, e))
        goto fail;
    if (t->bos >= 0)
        t->attr[t->bos] |= TOK_ATTR_SPECIAL;
    if (t->eos >= 0)
        t->attr[t->eos] |= TOK_ATTR_SPECIAL;
    tok_finish(t);
    decoder_free(&dec);
    free(tmp.p);
    return t;
oom:
    err_set(e, "%s: out of memory", path);
fail:
    decoder_free(&dec);
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
    const char *type = tok_json_str(model, "type");
    if (!json_is_object(model)) {
        err_set(e, "%s: no \"model\" object (not a tokenizer.json?)", path);
    } else if (type && strcmp(type, "BPE") != 0 && strcmp(type, "WordPiece") != 0) {
        err_set(e, "%s: model type %s not supported (BPE and WordPiece are)", path, type);
    } else if (!type && !json_object_get(model, "merges")) {
        err_set(e, "%s: model without a type and without merges (BPE and WordPiece are supported)",
                path);
    } else {
        struct tok_hf_src src = {.root = root, .read_config = true, .bos = -1, .eos = -1};
        t = tok_load_hf_src(&src, path, e);
    }
    json_decref(root);
    return t;
}

/* ---- encoding ---- */

/* Scratch of one tok_hf_encode call. */
struct hf_ctx {
    const struct tokenizer *t;
    struct tok_buf san, norm, norm2;
    struct tok_pre_ctx pre;
    struct tok_work w;
    struct tok_rx_scratch rx;
    struct tok_ivec *out;
    struct err *e;
};

static int model_word(struct hf_ctx *c, const char *s, size_t n)
{
    if (c->t->wordpiece)
        return tok_wordpiece_word(c->t, s, n, &c->w, c->out, c->e);
    return tok_bpe_word(c->t, s, n, &c->w, c->out, c->e);
}

/* Pre-tokenizes s[0, n) and runs the model on every piece. */
static int pretok_and_model(struct hf_ctx *c, const char *s, size_t n, bool first)
{
    const struct tokenizer *t = c->t;
    if (n == 0)
        return 0;
    if (t->n_pre == 0)
        return model_word(c, s, n);
    if (tok_pretokenize(t, s, n, first, &c->pre, c->e))
        return -1;
    /* model_word never touches c->pre, so the spans stay valid */
    for (size_t i = 0; i < c->pre.sp.n; i++)
        if (model_word(c, c->pre.buf.p + c->pre.sp.p[i].off, c->pre.sp.p[i].len))
            return -1;
    return 0;
}

static bool ws_before(const char *s, size_t at, size_t *len)
{
    return at > 0 && tok_cp_is_space(tok_utf8_prev(s, at, len));
}

static bool ws_after(const char *s, size_t n, size_t at, size_t *len)
{
    return at < n && tok_cp_is_space(tok_utf8_next(s + at, n - at, len));
}

/* Finds the next added token in s[from, n) from the trie, with its
 * lstrip/rstrip reach; single_word tokens inside a word do not count.
 * Returns false when there is none. */
static bool next_added(const struct tokenizer *t, const struct tok_trie *tr, const char *s,
                       size_t n, size_t from, size_t *ms, size_t *me, int *id)
{
    for (size_t pos = from;;) {
        size_t mlen, len;
        int idx;
        long m = tok_trie_find(tr, s, n, pos, &mlen, &idx);
        if (m < 0)
            return false;
        const struct tok_added *a = &t->added[idx];
        size_t st = (size_t)m, en = (size_t)m + mlen;
        if (a->single_word) {
            bool word_before = st > 0 && tok_cp_is_word(tok_utf8_prev(s, st, &len));
            bool word_after = en < n && tok_cp_is_word(tok_utf8_next(s + en, n - en, &len));
            if (word_before || word_after) {
                pos = en; /* matching goes on after this one */
                continue;
            }
        }
        if (a->lstrip)
            while (st > from && ws_before(s, st, &len))
                st -= len;
        if (a->rstrip)
            while (ws_after(s, n, en, &len))
                en += len;
        *ms = st;
        *me = en;
        *id = a->id;
        return true;
    }
}

/* A piece of input between raw added tokens: normalize, split off the
 * normalized added tokens, pre-tokenize and run the model on the rest. */
static int encode_chunk(struct hf_ctx *c, const char *s, size_t n, bool first)
{
    const struct tokenizer *t = c->t;
    if (n == 0)
        return 0;
    const char *ns = s;
    size_t nn = n;
    if (t->n_norm > 0) {
        if (tok_normalize(t, s, n, &c->norm, &c->norm2, &c->rx, c->e))
            return -1;
        ns = c->norm.p;
        nn = c->norm.n;
    }
    /* pretok_and_model works in c->pre, so ns stays valid here */
    size_t pos = 0;
    int rc = 0;
    while (pos < nn && rc == 0) {
        size_t ms, me;
        int id;
        if (!next_added(t, &t->trie_norm, ns, nn, pos, &ms, &me, &id)) {
            rc = pretok_and_model(c, ns + pos, nn - pos, first && pos == 0);
            break;
        }
        rc = pretok_and_model(c, ns + pos, ms - pos, first && pos == 0);
        if (rc == 0 && tok_ivec_push(c->out, id))
            rc = err_set(c->e, "out of memory tokenizing");
        pos = me;
    }
    return rc;
}

int tok_hf_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
                  struct tok_ivec *out, struct err *e)
{
    struct hf_ctx c = {.t = t, .out = out, .e = e};
    int rc = 0;
    /* regexes and Unicode normalization need well-formed UTF-8: invalid
     * bytes become U+FFFD (text from Python can never hold them) */
    if (t->needs_utf8 && !tok_utf8_valid(text, len)) {
        if (tok_utf8_sanitize(text, len, &c.san))
            return err_set(e, "out of memory tokenizing");
        text = c.san.p;
        len = c.san.n;
    }
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
    free(c.san.p);
    free(c.norm.p);
    free(c.norm2.p);
    tok_pre_ctx_free(&c.pre);
    tok_work_free(&c.w);
    tok_rx_scratch_free(&c.rx);
    return rc ? -1 : 0;
}
