/* hf_pretok.c - tokenizer.json pre-tokenizers: parsing the "pre_tokenizer"
 * node into steps and cutting normalized text into the pieces the model
 * sees. Supported: Sequence, Split (string or regex, every behavior,
 * invert), ByteLevel (prefix space, GPT-2 regex), Metaspace, Digits,
 * Punctuation, Whitespace, WhitespaceSplit and BertPreTokenizer.
 *
 * Every splitting step works the way HF's does: the matcher lists the
 * segments of a piece (matches and the gaps between them, in order), invert
 * flips which are matches, and the behavior folds them into new pieces;
 * empty pieces disappear. With byte-level BPE the text stays raw bytes; a
 * step that comes after ByteLevel sees each byte as its byte-level
 * character (HF really transforms the text there), so its matcher runs on
 * a mapped copy whose offsets are translated back. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* GPT-2's pattern, which ByteLevel applies when use_regex is set. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Whitespace's pattern (words, or runs of other non-space characters). */
static const char WORDS_PATTERN[] = "\\w+|[^\\w\\s]+";

struct seg {
    size_t start, end;
    bool match;
};

/* ---- parsing ---- */

static int push_pre(struct tokenizer *t, struct tok_pre_step st, struct err *e)
{
    struct tok_pre_step *p = realloc(t->pre, (size_t)(t->n_pre + 1) * sizeof *p);
    if (!p) {
        tok_regex_free(st.re);
        return err_set(e, "%s: out of memory", t->path);
    }
    t->pre = p;
    st.mapped = t->byte_level && st.kind != TOK_PRE_BYTELEVEL;
    if (st.mapped && st.kind == TOK_PRE_METASPACE) {
        tok_regex_free(st.re);
        return err_set(e, "%s: pre_tokenizer Metaspace after ByteLevel not supported", t->path);
    }
    t->pre[t->n_pre++] = st;
    return 0;
}

int tok_parse_metaspace(struct tokenizer *t, json_t *node, const char **repl, size_t *rlen,
                        int *prepend, struct err *e)
{
    json_t *r = json_object_get(node, "replacement");
    if (json_is_string(r)) {
        *rlen = json_string_length(r);
        if (!(*repl = tok_arena_strdup(&t->arena, json_string_value(r), *rlen)))
            return err_set(e, "%s: out of memory", t->path);
    } else {
        *repl = "\xe2\x96\x81";
        *rlen = 3;
    }
    const char *scheme = tok_json_str(node, "prepend_scheme");
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
        *prepend = tok_json_bool(node, "add_prefix_space", true) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
    }
    if (*rlen == 0)
        return err_set(e, "%s: Metaspace with an empty replacement", t->path);
    return 0;
}

static int parse_behavior(struct tokenizer *t, json_t *node, enum tok_split_behavior dflt,
                          enum tok_split_behavior *out, struct err *e)
{
    const char *b = tok_json_str(node, "behavior");
    if (!b)
        *out = dflt;
    else if (strcmp(b, "Removed") == 0)
        *out = TOK_SPLIT_REMOVED;
    else if (strcmp(b, "Isolated") == 0)
        *out = TOK_SPLIT_ISOLATED;
    else if (strcmp(b, "MergedWithPrevious") == 0)
        *out = TOK_SPLIT_MERGED_PREV;
    else if (strcmp(b, "MergedWithNext") == 0)
        *out = TOK_SPLIT_MERGED_NEXT;
    else if (strcmp(b, "Contiguous") == 0)
        *out = TOK_SPLIT_CONTIGUOUS;
    else
        return err_set(e, "%s: Split behavior \"%s\" not known", t->path, b);
    return 0;
}

static int push_regex(struct tokenizer *t, const char *pat, size_t len, bool invert,
                      enum tok_split_behavior beh, const char *what, struct err *e)
{
    struct tok_pre_step st = {.kind = TOK_PRE_SPLIT, .invert = invert, .behavior = beh};
    if (!(st.re = tok_regex_new(pat, len, e)))
        return err_wrap(e, "%s: %s", t->path, what);
    t->needs_utf8 = true;
    return push_pre(t, st, e);
}

static int push_chars(struct tokenizer *t, int cls, enum tok_split_behavior beh, struct err *e)
{
    t->needs_utf8 = true;
    return push_pre(t, (struct tok_pre_step){.kind = TOK_PRE_CHARS, .cls = cls, .behavior = beh}, e);
}

int tok_parse_pre_tokenizer(struct tokenizer *t, json_t *node, struct err *e)
{
    if (!node || json_is_null(node))
        return 0;
    const char *ty = tok_json_str(node, "type");
    if (!ty)
        return err_set(e, "%s: pre_tokenizer without a type", t->path);
    if (strcmp(ty, "Sequence") == 0) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(node, "pretokenizers"), i, v)
        {
            if (tok_parse_pre_tokenizer(t, v, e))
                return -1;
        }
        return 0;
    }
    struct tok_pre_step st = {0};
    if (strcmp(ty, "Metaspace") == 0) {
        int prepend;
        st.kind = TOK_PRE_METASPACE;
        if (tok_parse_metaspace(t, node, &st.repl, &st.repl_len, &prepend, e))
            return -1;
        st.prepend = prepend;
        st.split = tok_json_bool(node, "split", true);
        return push_pre(t, st, e);
    }
    if (strcmp(ty, "Split") == 0) {
        json_t *pat = json_object_get(node, "pattern");
        json_t *str = json_object_get(pat, "String");
        json_t *rx = json_object_get(pat, "Regex");
        enum tok_split_behavior beh;
        if (parse_behavior(t, node, TOK_SPLIT_REMOVED, &beh, e))
            return -1;
        bool invert = tok_json_bool(node, "invert", false);
        if (json_is_string(rx))
            return push_regex(t, json_string_value(rx), json_string_length(rx), invert, beh,
                              "pre_tokenizer Split", e);
        if (!json_is_string(str))
            return err_set(e, "%s: pre_tokenizer Split without a pattern", t->path);
        st.kind = TOK_PRE_SPLIT;
        st.invert = invert;
        st.behavior = beh;
        st.pat_len = json_string_length(str);
        if (!(st.pat = tok_arena_strdup(&t->arena, json_string_value(str), st.pat_len)))
            return err_set(e, "%s: out of memory", t->path);
        if (st.pat_len == 0)
            return err_set(e, "%s: pre_tokenizer Split with an empty pattern", t->path);
        return push_pre(t, st, e);
    }
    if (strcmp(ty, "ByteLevel") == 0) {
        if (t->byte_level)
            return err_set(e, "%s: two ByteLevel pre_tokenizers", t->path);
        st.kind = TOK_PRE_BYTELEVEL;
        st.add_prefix_space = tok_json_bool(node, "add_prefix_space", true);
        if (tok_json_bool(node, "use_regex", true)) {
            if (!(st.re = tok_regex_new(GPT2_PATTERN, strlen(GPT2_PATTERN), e)))
                return err_wrap(e, "%s: ByteLevel", t->path);
            t->needs_utf8 = true;
        }
        st.behavior = TOK_SPLIT_ISOLATED;
        int rc = push_pre(t, st, e);
        t->byte_level = true;
        return rc;
    }
    if (strcmp(ty, "Digits") == 0)
        return push_chars(t, TOK_CC_DIGIT,
                          tok_json_bool(node, "individual_digits", false) ? TOK_SPLIT_ISOLATED
                                                                  : TOK_SPLIT_CONTIGUOUS,
                          e);
    if (strcmp(ty, "Punctuation") == 0) {
        enum tok_split_behavior beh;
        if (parse_behavior(t, node, TOK_SPLIT_ISOLATED, &beh, e))
            return -1;
        return push_chars(t, TOK_CC_PUNCT, beh, e);
    }
    if (strcmp(ty, "WhitespaceSplit") == 0)
        return push_chars(t, TOK_CC_SPACE, TOK_SPLIT_REMOVED, e);
    if (strcmp(ty, "Whitespace") == 0)
        return push_regex(t, WORDS_PATTERN, strlen(WORDS_PATTERN), true, TOK_SPLIT_REMOVED,
                          "pre_tokenizer Whitespace", e);
    if (strcmp(ty, "BertPreTokenizer") == 0)
        return push_chars(t, TOK_CC_SPACE, TOK_SPLIT_REMOVED, e) ||
               push_chars(t, TOK_CC_PUNCT, TOK_SPLIT_ISOLATED, e);
    return err_set(e, "%s: pre_tokenizer %s not supported", t->path, ty);
}

void tok_free_steps(struct tokenizer *t)
{
    for (int i = 0; i < t->n_pre; i++)
        tok_regex_free(t->pre[i].re);
    for (int i = 0; i < t->n_norm; i++)
        tok_regex_free(t->norm[i].re);
    free(t->pre);
    free(t->norm);
    t->pre = NULL;
    t->norm = NULL;
    t->n_pre = t->n_norm = 0;
}

/* ---- applying ---- */

int tok_spans_push(struct tok_spans *s, size_t off, size_t len)
{
    if (len == 0)
        return 0; /* empty pieces produce nothing */
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        struct tok_span *p = realloc(s->p, cap * sizeof *p);
        if (!p)
            return -1;
        s->p = p;
        s->cap = cap;
    }
    s->p[s->n++] = (struct tok_span){off, len};
    return 0;
}

void tok_pre_ctx_free(struct tok_pre_ctx *c)
{
    free(c->buf.p);
    free(c->buf2.p);
    free(c->sp.p);
    free(c->sp2.p);
    free(c->segs);
    free(c->mapped.p);
    free(c->moff);
    tok_rx_scratch_free(&c->rx);
    memset(c, 0, sizeof *c);
}

struct segv {
    struct tok_pre_ctx *c;
    size_t n;
};

static int seg_push(struct segv *v, size_t start, size_t end, bool match)
{
    struct tok_pre_ctx *c = v->c;
    if (v->n == c->segs_cap) {
        size_t cap = c->segs_cap ? c->segs_cap * 2 : 256;
        void *p = realloc(c->segs, cap * sizeof(struct seg));
        if (!p)
            return -1;
        c->segs = p;
        c->segs_cap = cap;
    }
    ((struct seg *)c->segs)[v->n++] = (struct seg){start, end, match};
    return 0;
}

static bool char_in_class(int cls, uint32_t cp)
{
    switch (cls) {
    case TOK_CC_DIGIT:
        return tok_cp_is_numeric(cp);
    case TOK_CC_PUNCT:
        return tok_cp_is_punct(cp);
    default:
        return tok_cp_is_space(cp);
    }
}

/* The segments of s[0, n): matches and the gaps between them. */
static int find_segments(const struct tok_pre_step *st, const char *s, size_t n, bool bytes_as_chars,
                         struct segv *v, struct err *e)
{
    size_t prev = 0;
    if (st->kind == TOK_PRE_CHARS) {
        for (size_t i = 0; i < n;) {
            size_t len = 1;
            uint32_t cp = bytes_as_chars ? tok_bytelevel_cp((unsigned char)s[i])
                                         : tok_utf8_next(s + i, n - i, &len);
            if (char_in_class(st->cls, cp)) {
                if ((prev < i && seg_push(v, prev, i, false)) || seg_push(v, i, i + len, true))
                    return err_set(e, "out of memory");
                prev = i + len;
            }
            i += len;
        }
    } else if (st->re) {
        size_t pos = 0;
        while (pos <= n) {
            size_t ms, me;
            int r = tok_regex_next(st->re, s, n, pos, &ms, &me, &v->c->rx, e);
            if (r < 0)
                return -1;
            if (r == 0)
                break;
            if ((prev < ms && seg_push(v, prev, ms, false)) || seg_push(v, ms, me, true))
                return err_set(e, "out of memory");
            prev = me;
            if (me == ms) { /* an empty match: step over one character */
                if (me >= n)
                    break;
                size_t len;
                tok_utf8_next(s + me, n - me, &len);
                pos = me + len;
            } else {
                pos = me;
            }
        }
    } else {
        for (size_t pos = 0; pos + st->pat_len <= n;) {
            const char *hit = memmem(s + pos, n - pos, st->pat, st->pat_len);
            if (!hit)
                break;
            size_t ms = (size_t)(hit - s), me = ms + st->pat_len;
            if ((prev < ms && seg_push(v, prev, ms, false)) || seg_push(v, ms, me, true))
                return err_set(e, "out of memory");
            prev = pos = me;
        }
    }
    if (prev < n && seg_push(v, prev, n, false))
        return err_set(e, "out of memory");
    return 0;
}

/* Folds segments into pieces (HF's SplitDelimiterBehavior), offset by base. */
static int fold_segments(const struct seg *sg, size_t n, bool invert, enum tok_split_behavior beh,
                         size_t base, struct tok_spans *out)
{
    bool have = false, prev_match = false;
    size_t ps = 0, pe = 0; /* the piece being built */
    for (size_t i = 0; i < n; i++) {
        bool m = sg[i].match != invert;
        size_t s = sg[i].start, en = sg[i].end;
        switch (beh) {
        case TOK_SPLIT_REMOVED:
            if (!m && tok_spans_push(out, base + s, en - s))
                return -1;
            break;
        case TOK_SPLIT_ISOLATED:
            if (tok_spans_push(out, base + s, en - s))
                return -1;
            break;
        case TOK_SPLIT_MERGED_PREV:
            /* a match joins the piece before it, unless that was a match */
            if (m && !prev_match && have) {
                pe = en;
            } else {
                if (have && tok_spans_push(out, base + ps, pe - ps))
                    return -1;
                ps = s;
                pe = en;
                have = true;
            }
            break;
        case TOK_SPLIT_MERGED_NEXT:
            /* a match joins the piece after it, unless that is a match */
            if (m && i + 1 < n && sg[i + 1].match == invert) {
                if (!have)
                    ps = s;
                have = true;
                continue; /* prev_match is irrelevant here */
            }
            if (tok_spans_push(out, base + (have ? ps : s), en - (have ? ps : s)))
                return -1;
            have = false;
            break;
        case TOK_SPLIT_CONTIGUOUS:
            if (m == prev_match && have) {
                pe = en;
            } else {
                if (have && tok_spans_push(out, base + ps, pe - ps))
                    return -1;
                ps = s;
                pe = en;
                have = true;
            }
            break;
        }
        prev_match = m;
    }
    if ((beh == TOK_SPLIT_MERGED_PREV || beh == TOK_SPLIT_CONTIGUOUS) && have &&
        tok_spans_push(out, base + ps, pe - ps))
        return -1;
    return 0;
}

/* One splitting step on one piece. */
static int split_span(const struct tok_pre_step *st, struct tok_pre_ctx *c, struct tok_span p,
                      struct err *e)
{
    const char *s = c->buf.p + p.off;
    struct segv v = {c, 0};
    if (!st->mapped || st->kind == TOK_PRE_CHARS) {
        if (find_segments(st, s, p.len, st->mapped, &v, e))
            return -1;
    } else {
        /* the piece as byte-level characters; moff maps back */
        if (p.len > 0xFFFFFFFFu / 2)
            return err_set(e, "piece of %zu bytes too long", p.len);
        size_t need = 2 * p.len + 1;
        if (c->moff_cap < need) {
            uint32_t *m = realloc(c->moff, need * sizeof *m);
            if (!m)
                return err_set(e, "out of memory");
            c->moff = m;
            c->moff_cap = need;
        }
        c->mapped.n = 0;
        for (size_t i = 0; i < p.len; i++) {
            char enc[4];
            size_t k = tok_utf8_put(tok_bytelevel_cp((unsigned char)s[i]), enc);
            for (size_t j = 0; j < k; j++)
                c->moff[c->mapped.n + j] = (uint32_t)i;
            if (tok_buf_put(&c->mapped, enc, k))
                return err_set(e, "out of memory");
        }
        c->moff[c->mapped.n] = (uint32_t)p.len;
        if (tok_buf_put(&c->mapped, "", 0))
            return err_set(e, "out of memory");
        if (find_segments(st, c->mapped.p, c->mapped.n, false, &v, e))
            return -1;
        struct seg *sg = c->segs;
        for (size_t i = 0; i < v.n; i++) {
            sg[i].start = c->moff[sg[i].start];
            sg[i].end = c->moff[sg[i].end];
        }
    }
    return fold_segments(c->segs, v.n, st->invert, st->behavior, p.off, &c->sp2)
               ? err_set(e, "out of memory")
               : 0;
}

/* Metaspace on one piece: spaces -> replacement, maybe a prefix, maybe a
 * split before each replacement. Writes the text to nb and pieces to out. */
static int metaspace_piece(const struct tok_pre_step *st, const char *buf, struct tok_span p,
                           bool first, struct tok_buf *nb, struct tok_spans *out)
{
    size_t start = nb->n;
    const char *s = buf + p.off;
    bool starts = p.len >= st->repl_len && memcmp(s, st->repl, st->repl_len) == 0;
    starts = starts || (p.len > 0 && s[0] == ' '); /* the space becomes the replacement */
    bool prepend = !starts && (st->prepend == TOK_PREPEND_ALWAYS ||
                               (st->prepend == TOK_PREPEND_FIRST && first));
    if (prepend && tok_buf_put(nb, st->repl, st->repl_len))
        return -1;
    size_t run = 0;
    for (size_t i = 0; i <= p.len; i++) {
        if (i == p.len || s[i] == ' ') {
            if (tok_buf_put(nb, s + run, i - run))
                return -1;
            if (i < p.len && tok_buf_put(nb, st->repl, st->repl_len))
                return -1;
            run = i + 1;
        }
    }
    size_t len = nb->n - start;
    if (!st->split)
        return tok_spans_push(out, start, len);
    /* MergedWithNext on the replacement */
    size_t piece = start, end = start + len;
    for (size_t pos = start; pos + st->repl_len <= end;) {
        const char *hit = memmem(nb->p + pos, end - pos, st->repl, st->repl_len);
        if (!hit)
            break;
        size_t ms = (size_t)(hit - nb->p);
        if (tok_spans_push(out, piece, ms - piece))
            return -1;
        piece = ms;
        pos = ms + st->repl_len;
    }
    return tok_spans_push(out, piece, end - piece);
}

static void swap_spans(struct tok_pre_ctx *c)
{
    struct tok_spans t = c->sp;
    c->sp = c->sp2;
    c->sp2 = t;
}

static void swap_bufs(struct tok_pre_ctx *c)
{
    struct tok_buf t = c->buf;
    c->buf = c->buf2;
    c->buf2 = t;
}

int tok_pretokenize(const struct tokenizer *t, const char *s, size_t n, bool first,
                    struct tok_pre_ctx *c, struct err *e)
{
    c->buf.n = 0;
    c->sp.n = 0;
    if (tok_buf_put(&c->buf, s, n) || tok_spans_push(&c->sp, 0, n))
        return err_set(e, "out of memory");
    for (int k = 0; k < t->n_pre && c->sp.n > 0; k++) {
        const struct tok_pre_step *st = &t->pre[k];
        c->sp2.n = 0;
        if (st->kind == TOK_PRE_METASPACE || (st->kind == TOK_PRE_BYTELEVEL && st->add_prefix_space)) {
            /* these rewrite the text: build it anew in buf2 */
            c->buf2.n = 0;
            if (tok_buf_put(&c->buf2, "", 0))
                return err_set(e, "out of memory");
            for (size_t i = 0; i < c->sp.n; i++) {
                struct tok_span p = c->sp.p[i];
                int rc;
                if (st->kind == TOK_PRE_METASPACE) {
                    rc = metaspace_piece(st, c->buf.p, p, first && p.off == 0, &c->buf2, &c->sp2);
                } else {
                    size_t at = c->buf2.n;
                    bool space = c->buf.p[p.off] == ' ';
                    rc = (!space && tok_buf_put(&c->buf2, " ", 1)) ||
                         tok_buf_put(&c->buf2, c->buf.p + p.off, p.len) ||
                         tok_spans_push(&c->sp2, at, c->buf2.n - at);
                }
                if (rc)
                    return err_set(e, "out of memory");
            }
            swap_bufs(c);
            swap_spans(c);
            if (st->kind == TOK_PRE_METASPACE || !st->re)
                continue;
            c->sp2.n = 0;
        } else if (st->kind == TOK_PRE_BYTELEVEL && !st->re) {
            continue; /* bytes are already what the model sees */
        }
        for (size_t i = 0; i < c->sp.n; i++)
            if (split_span(st, c, c->sp.p[i], e))
                return -1;
        swap_spans(c);
    }
    return 0;
}
