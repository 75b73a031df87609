/* hf_norm.c - tokenizer.json normalizers: parsing the "normalizer" node
 * into a list of steps and applying them to text. Supported: Sequence,
 * Prepend, Replace (string or regex pattern), NFC, NFD, NFKC, NFKD,
 * Lowercase, Strip, StripAccents and BertNormalizer. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

static int push_norm(struct tokenizer *t, struct tok_norm_step st, struct err *e)
{
    struct tok_norm_step *p = realloc(t->norm, (size_t)(t->n_norm + 1) * sizeof *p);
    if (!p) {
        tok_regex_free(st.re);
        return err_set(e, "%s: out of memory", t->path);
    }
    t->norm = p;
    t->norm[t->n_norm++] = st;
    return 0;
}

int tok_parse_normalizer(struct tokenizer *t, json_t *node, struct err *e)
{
    if (!node || json_is_null(node))
        return 0;
    const char *ty = tok_json_str(node, "type");
    if (!ty)
        return err_set(e, "%s: normalizer without a type", t->path);
    if (strcmp(ty, "Sequence") == 0) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(node, "normalizers"), i, v)
        {
            if (tok_parse_normalizer(t, v, e))
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
        if (!(st.a = tok_arena_jstr(t, p, &st.alen)))
            return err_set(e, "%s: out of memory", t->path);
        return push_norm(t, st, e);
    }
    if (strcmp(ty, "Replace") == 0) {
        st.kind = TOK_NORM_REPLACE;
        if (tok_parse_replace(t, node, "normalizer", &st.a, &st.alen, &st.b, &st.blen, &st.re, e))
            return -1;
        if (st.re)
            t->needs_utf8 = true;
        return push_norm(t, st, e);
    }
    static const struct {
        const char *name;
        enum tok_nf nf;
    } forms[] = {{"NFC", TOK_NF_C}, {"NFD", TOK_NF_D}, {"NFKC", TOK_NF_KC}, {"NFKD", TOK_NF_KD}};
    for (size_t k = 0; k < sizeof forms / sizeof forms[0]; k++) {
        if (strcmp(ty, forms[k].name) == 0) {
            st.kind = TOK_NORM_NF;
            st.nf = forms[k].nf;
            t->needs_utf8 = true;
            return push_norm(t, st, e);
        }
    }
    if (strcmp(ty, "Lowercase") == 0) {
        st.kind = TOK_NORM_LOWERCASE;
        t->needs_utf8 = true;
        return push_norm(t, st, e);
    }
    if (strcmp(ty, "Strip") == 0) {
        st.kind = TOK_NORM_STRIP;
        st.left = tok_json_bool(node, "strip_left", true);
        st.right = tok_json_bool(node, "strip_right", true);
        t->needs_utf8 = true;
        return push_norm(t, st, e);
    }
    if (strcmp(ty, "StripAccents") == 0) {
        st.kind = TOK_NORM_STRIP_ACCENTS;
        t->needs_utf8 = true;
        return push_norm(t, st, e);
    }
    if (strcmp(ty, "BertNormalizer") == 0) {
        st.kind = TOK_NORM_BERT;
        st.clean_text = tok_json_bool(node, "clean_text", true);
        st.chinese_chars = tok_json_bool(node, "handle_chinese_chars", true);
        st.lowercase = tok_json_bool(node, "lowercase", true);
        /* strip_accents: null means "as lowercase" */
        st.strip_accents = tok_json_bool(node, "strip_accents", st.lowercase);
        t->needs_utf8 = true;
        return push_norm(t, st, e);
    }
    return err_set(e, "%s: normalizer %s not supported", t->path, ty);
}

/* ---- applying (each step appends to out; -1 on out of memory) ---- */

static int replace_str(const struct tok_norm_step *st, const char *s, size_t n, struct tok_buf *out)
{
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

static int replace_re(const struct tok_norm_step *st, const char *s, size_t n, struct tok_buf *out,
                      struct tok_rx_scratch *rx, struct err *e)
{
    size_t pos = 0, copied = 0;
    while (pos <= n) {
        size_t ms, me;
        int r = tok_regex_next(st->re, s, n, pos, &ms, &me, rx, e);
        if (r < 0)
            return -2;
        if (r == 0)
            break;
        if (tok_buf_put(out, s + copied, ms - copied) || tok_buf_put(out, st->b, st->blen))
            return -1;
        copied = me;
        if (me == ms) { /* empty match: step over one character */
            if (me >= n)
                break;
            size_t len;
            tok_utf8_next(s + me, n - me, &len);
            if (tok_buf_put(out, s + me, len))
                return -1;
            copied = pos = me + len;
        } else {
            pos = me;
        }
    }
    return tok_buf_put(out, s + copied, n - copied);
}

static int strip_ws(const struct tok_norm_step *st, const char *s, size_t n, struct tok_buf *out)
{
    size_t a = 0, b = n, len;
    while (st->left && a < b && tok_cp_is_space(tok_utf8_next(s + a, b - a, &len)))
        a += len;
    while (st->right && b > a && tok_cp_is_space(tok_utf8_prev(s + a, b - a, &len)))
        b -= len;
    return tok_buf_put(out, s + a, b - a);
}

static int drop_marks(const char *s, size_t n, bool nonspacing_only, struct tok_buf *out)
{
    size_t i = 0, copied = 0;
    while (i < n) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp = tok_utf8_next(s + i, n - i, &len);
        if (tok_cp_is_mark(cp, nonspacing_only)) {
            if (tok_buf_put(out, s + copied, i - copied))
                return -1;
            copied = i + len;
        }
        i += len;
    }
    return tok_buf_put(out, s + copied, n - copied);
}

/* BertNormalizer: clean text (drop NUL, U+FFFD and control characters,
 * whitespace becomes " "), pad CJK ideographs with spaces, then optionally
 * strip accents (NFD, drop Mn) and lowercase. */
static int bert(const struct tok_norm_step *st, const char *s, size_t n, struct tok_buf *out)
{
    struct tok_buf a = {0}, tmp = {0};
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0;) {
        size_t len;
        uint32_t cp = tok_utf8_next(s + i, n - i, &len);
        if (st->clean_text) {
            bool ws = cp == '\t' || cp == '\n' || cp == '\r' || tok_cp_is_space(cp);
            if (cp == 0 || cp == 0xFFFD || (!ws && tok_cp_is_other(cp))) {
                i += len;
                continue;
            }
            if (ws) {
                rc = tok_buf_put(&a, " ", 1);
                i += len;
                continue;
            }
        }
        if (st->chinese_chars && tok_cp_is_cjk(cp))
            rc = tok_buf_put(&a, " ", 1) || tok_buf_put(&a, s + i, len) || tok_buf_put(&a, " ", 1);
        else
            rc = tok_buf_put(&a, s + i, len);
        i += len;
    }
    if (rc == 0 && st->strip_accents) {
        rc = tok_nf_apply(TOK_NF_D, a.p ? a.p : "", a.n, &tmp);
        a.n = 0;
        rc = rc || drop_marks(tmp.p ? tmp.p : "", tmp.n, true, &a);
    }
    if (rc == 0) {
        if (st->lowercase)
            rc = tok_lower_apply(a.p ? a.p : "", a.n, out);
        else
            rc = tok_buf_put(out, a.p ? a.p : "", a.n);
    }
    free(a.p);
    free(tmp.p);
    return rc ? -1 : 0;
}

int tok_normalize(const struct tokenizer *t, const char *s, size_t n, struct tok_buf *out,
                  struct tok_buf *tmp, struct tok_rx_scratch *rx, struct err *e)
{
    out->n = 0;
    if (tok_buf_put(out, s, n))
        return err_set(e, "out of memory");
    for (int k = 0; k < t->n_norm; k++) {
        const struct tok_norm_step *st = &t->norm[k];
        const struct tok_buf *in = out;
        struct tok_buf nb = *tmp; /* the step writes here, then the two swap */
        nb.n = 0;
        int rc = tok_buf_put(&nb, "", 0); /* -1: out of memory, -2: message set */
        if (rc == 0) {
            switch (st->kind) {
            case TOK_NORM_PREPEND:
                if (in->n > 0)
                    rc = tok_buf_put(&nb, st->a, st->alen);
                rc = rc || tok_buf_put(&nb, in->p, in->n) ? -1 : 0;
                break;
            case TOK_NORM_REPLACE:
                rc = st->re ? replace_re(st, in->p, in->n, &nb, rx, e)
                            : replace_str(st, in->p, in->n, &nb);
                break;
            case TOK_NORM_NF:
                rc = tok_nf_apply(st->nf, in->p, in->n, &nb);
                break;
            case TOK_NORM_LOWERCASE:
                rc = tok_lower_apply(in->p, in->n, &nb);
                break;
            case TOK_NORM_STRIP:
                rc = strip_ws(st, in->p, in->n, &nb);
                break;
            case TOK_NORM_STRIP_ACCENTS:
                rc = drop_marks(in->p, in->n, false, &nb);
                break;
            case TOK_NORM_BERT:
                rc = bert(st, in->p, in->n, &nb);
                break;
            }
        }
        *tmp = *out;
        *out = nb;
        if (rc == -1)
            return err_set(e, "out of memory");
        if (rc)
            return -1;
    }
    return 0;
}
