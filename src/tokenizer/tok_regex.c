/* tok_regex.c - the regular expressions of tokenizer.json (written for
 * Oniguruma, which HF tokenizers uses) run by PCRE2 in UTF + UCP mode with
 * the JIT. The pattern is translated first where the two engines disagree:
 * \s and \S become Unicode White_Space exactly (PCRE2 also counts U+180E),
 * \w/\W become Oniguruma's word class (letters, marks, decimal digits,
 * connector punctuation), \h/\H are hex digits as in Ruby syntax, \uHHHH is
 * \x{HHHH}, and ^/$ match at line breaks (Ruby semantics). Matching state
 * (match data, an on-demand bigger JIT stack) lives in a per-call scratch,
 * so one compiled tokenizer serves many threads. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

struct tok_regex {
    pcre2_code *code;
    bool jit;
};

static const char SPACE_SET[] =
    "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}"
    "\\x{205f}\\x{3000}";
static const char WORD_SET[] = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}\\x{200c}\\x{200d}";
static const char HEX_SET[] = "0-9A-Fa-f";

static int put_set(struct tok_buf *b, bool in_class, bool negate, const char *set)
{
    if (in_class)
        return tok_buf_put(b, set, strlen(set));
    return tok_buf_put(b, negate ? "[^" : "[", negate ? 2 : 1) ||
           tok_buf_put(b, set, strlen(set)) || tok_buf_put(b, "]", 1);
}

/* Rewrites an Oniguruma pattern into PCRE2 syntax; -1 with a message. */
static int translate(const char *p, size_t n, struct tok_buf *b, struct err *e)
{
    bool in_class = false;
    size_t class_start = 0; /* index just past "[" or "[^" */
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        int rc = 0;
        if (c == '\\' && i + 1 < n) {
            char d = p[++i];
            switch (d) {
            case 's':
            case 'S':
            case 'w':
            case 'W':
            case 'h':
            case 'H': {
                bool neg = d == 'S' || d == 'W' || d == 'H';
                const char *set = d == 's' || d == 'S' ? SPACE_SET : d == 'w' || d == 'W' ? WORD_SET
                                                                                         : HEX_SET;
                if (neg && in_class)
                    return err_set(e, "\\%c inside a character class is not supported", d);
                rc = put_set(b, in_class, neg, set);
                break;
            }
            case 'u':
                if (i + 4 < n) {
                    rc = tok_buf_put(b, "\\x{", 3) || tok_buf_put(b, p + i + 1, 4) ||
                         tok_buf_put(b, "}", 1);
                    i += 4;
                    break;
                }
                /* fall through */
            default:
                rc = tok_buf_put(b, p + i - 1, 2);
            }
        } else if (!in_class && c == '[') {
            in_class = true;
            rc = tok_buf_put(b, "[", 1);
            if (i + 1 < n && p[i + 1] == '^') {
                rc = rc || tok_buf_put(b, "^", 1);
                i++;
            }
            class_start = i + 1;
        } else if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') {
            /* POSIX class [:alpha:]: copy through its closing ":]" */
            const char *end = memmem(p + i, n - i, ":]", 2);
            size_t stop = end ? (size_t)(end - p) + 2 : n;
            rc = tok_buf_put(b, p + i, stop - i);
            i = stop - 1;
        } else if (in_class && c == ']' && i != class_start) {
            in_class = false;
            rc = tok_buf_put(b, "]", 1);
        } else {
            rc = tok_buf_put(b, &c, 1);
        }
        if (rc)
            return err_set(e, "out of memory");
    }
    return 0;
}

struct tok_regex *tok_regex_new(const char *pat, size_t len, struct err *e)
{
    struct tok_buf b = {0};
    if (tok_buf_put(&b, "", 0)) {
        err_set(e, "out of memory");
        return NULL;
    }
    if (translate(pat, len, &b, e)) {
        free(b.p);
        return NULL;
    }
    int ec;
    PCRE2_SIZE eoff;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)b.p, b.n, PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE,
                                     &ec, &eoff, NULL);
    free(b.p);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        err_set(e, "regex /%.*s/: %s", (int)(len < 120 ? len : 120), pat, (const char *)msg);
        return NULL;
    }
    struct tok_regex *re = calloc(1, sizeof *re);
    if (!re) {
        pcre2_code_free(code);
        err_set(e, "out of memory");
        return NULL;
    }
    re->code = code;
    re->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    return re;
}

void tok_regex_free(struct tok_regex *re)
{
    if (!re)
        return;
    pcre2_code_free(re->code);
    free(re);
}

void tok_rx_scratch_free(struct tok_rx_scratch *sc)
{
    pcre2_match_data_free(sc->md);
    pcre2_match_context_free(sc->mctx);
    pcre2_jit_stack_free(sc->jit_stack);
    memset(sc, 0, sizeof *sc);
}

int tok_regex_next(const struct tok_regex *re, const char *s, size_t n, size_t from, size_t *ms,
                   size_t *me, struct tok_rx_scratch *sc, struct err *e)
{
    if (!sc->md && !(sc->md = pcre2_match_data_create(1, NULL)))
        return err_set(e, "out of memory");
    for (;;) {
        int rc;
        /* the subject is valid UTF-8 (callers sanitize it once): no
         * per-call check, which would make a scan over n bytes O(n^2) */
        if (re->jit)
            rc = pcre2_jit_match(re->code, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, sc->md,
                                 sc->mctx);
        else
            rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, sc->md,
                             sc->mctx);
        if (rc == PCRE2_ERROR_NOMATCH)
            return 0;
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !sc->jit_stack) {
            /* a pathological input: retry once with a big JIT stack */
            sc->mctx = pcre2_match_context_create(NULL);
            sc->jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
            if (!sc->mctx || !sc->jit_stack)
                return err_set(e, "out of memory");
            pcre2_jit_stack_assign(sc->mctx, NULL, sc->jit_stack);
            continue;
        }
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return err_set(e, "regex match failed: %s", (const char *)msg);
        }
        /* rc == 0 only says the ovector holds fewer pairs than groups;
         * pair 0, the whole match, is always there */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
        *ms = ov[0];
        *me = ov[1];
        return 1;
    }
}
