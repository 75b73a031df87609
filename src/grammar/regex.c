/* regex.c - regular expressions into GBNF expressions (regex.h): a
 * recursive-descent reader that writes each piece as it reads it; character
 * classes become sets of code-point ranges, so negation, the escape classes
 * and a JSON string's escaping are set operations. */
#include "grammar/regex.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/parse.h"
#include "base/utf8.h"
#include "grammar/grammar.h"

#define CP_MAX 0x10FFFFu
#define MAX_DEPTH 64   /* nested groups */
#define MAX_COUNT 1000 /* {m,n} bounds: the grammar unrolls them */

struct rx {
    const char *s;
    size_t i, n;
    enum regex_target t;
    int depth;
    struct err *e;
};

__attribute__((format(printf, 2, 3))) static int fail(struct rx *x, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return err_set(x->e, "regular expression, at offset %zu: %s", x->i, msg);
}

static bool at(const struct rx *x, char c) { return x->i < x->n && x->s[x->i] == c; }

/* The next code point of the pattern (UTF-8). */
static int next_cp(struct rx *x, uint32_t *cp)
{
    int len = utf8_get(x->s + x->i, x->n - x->i, cp);
    if (len == 0)
        return fail(x, "not UTF-8 text");
    x->i += (size_t)len;
    return 0;
}

/* ---- sets of code points ---- */

#define CSET_MAX 256

struct cset {
    struct { uint32_t lo, hi; } r[CSET_MAX + 8]; /* room for what negating and cutting add */
    int n;
};

static int cset_add(struct rx *x, struct cset *c, uint32_t lo, uint32_t hi)
{
    if (c->n >= CSET_MAX)
        return fail(x, "a character class with more than %d ranges", CSET_MAX);
    c->r[c->n].lo = lo;
    c->r[c->n].hi = hi;
    c->n++;
    return 0;
}

static int by_lo(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorted, merged ranges. */
static void cset_norm(struct cset *c)
{
    qsort(c->r, (size_t)c->n, sizeof c->r[0], by_lo);
    int m = 0;
    for (int i = 0; i < c->n; i++) {
        if (m > 0 && c->r[i].lo <= c->r[m - 1].hi + 1) {
            if (c->r[i].hi > c->r[m - 1].hi)
                c->r[m - 1].hi = c->r[i].hi;
        } else {
            c->r[m++] = c->r[i];
        }
    }
    c->n = m;
}

/* Everything in [0, CP_MAX] that c is not. */
static void cset_negate(struct cset *c)
{
    cset_norm(c);
    struct cset o = {.n = 0};
    uint32_t from = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->r[i].lo > from) {
            o.r[o.n].lo = from;
            o.r[o.n++].hi = c->r[i].lo - 1;
        }
        from = c->r[i].hi + 1;
    }
    if (from <= CP_MAX) {
        o.r[o.n].lo = from;
        o.r[o.n++].hi = CP_MAX;
    }
    *c = o; /* at most one range more than c */
}

/* c without [lo, hi]; c normalized. Cutting adds at most one range. */
static void cset_sub(struct cset *c, uint32_t lo, uint32_t hi)
{
    struct cset o = {.n = 0};
    for (int i = 0; i < c->n; i++) {
        uint32_t a = c->r[i].lo, b = c->r[i].hi;
        if (b < lo || a > hi) {
            o.r[o.n++] = c->r[i];
            continue;
        }
        if (a < lo) {
            o.r[o.n].lo = a;
            o.r[o.n++].hi = lo - 1;
        }
        if (b > hi) {
            o.r[o.n].lo = hi + 1;
            o.r[o.n++].hi = b;
        }
    }
    *c = o;
}

static bool cset_has(const struct cset *c, uint32_t cp)
{
    for (int i = 0; i < c->n; i++)
        if (cp >= c->r[i].lo && cp <= c->r[i].hi)
            return true;
    return false;
}

/* \d \w \s and their complements. */
static int cset_class(struct rx *x, struct cset *c, char k)
{
    struct cset t = {.n = 0};
    switch (k | 0x20) {
    case 'd': cset_add(x, &t, '0', '9'); break;
    case 'w':
        cset_add(x, &t, '0', '9');
        cset_add(x, &t, 'A', 'Z');
        cset_add(x, &t, '_', '_');
        cset_add(x, &t, 'a', 'z');
        break;
    default: /* s */
        cset_add(x, &t, '\t', '\r'); /* \t \n \v \f \r */
        cset_add(x, &t, ' ', ' ');
    }
    if (k >= 'A' && k <= 'Z')
        cset_negate(&t);
    for (int i = 0; i < t.n; i++)
        if (cset_add(x, c, t.r[i].lo, t.r[i].hi))
            return -1;
    return 0;
}

/* ---- writing GBNF ---- */

static void put_cp(struct buf *o, uint32_t cp)
{
    if (cp <= 0xFFFF)
        buf_printf(o, "\\u%04X", (unsigned)cp);
    else
        buf_printf(o, "\\U%08X", (unsigned)cp);
}

/* The literal whose sentence is exactly text. */
static void put_lit(struct buf *o, const char *text, size_t n)
{
    char tmp[64];
    grammar_literal(text, n, tmp);
    buf_puts(o, tmp);
}

/* Characters a JSON string writes escaped. */
static bool json_special(uint32_t cp) { return cp < 0x20 || cp == '"' || cp == '\\'; }

/* One character as the target writes it. */
static void put_char(const struct rx *x, struct buf *o, uint32_t cp)
{
    char b[8];
    if (x->t == REGEX_JSON_STRING && json_special(cp)) {
        const char *short_form = cp == '"' ? "\\\"" : cp == '\\' ? "\\\\" : cp == '\n' ? "\\n"
                               : cp == '\t' ? "\\t" : cp == '\r' ? "\\r" : cp == '\b' ? "\\b"
                               : cp == '\f' ? "\\f" : NULL;
        if (short_form) {
            put_lit(o, short_form, strlen(short_form));
        } else {
            snprintf(b, sizeof b, "\\u%04x", (unsigned)cp);
            put_lit(o, b, 6);
        }
        return;
    }
    put_lit(o, b, utf8_put(cp, b));
}

/* A set as one GBNF item: a class of what the target writes as itself,
 * and the escaped forms of the rest (JSON); NUL is never written. */
static int put_set(struct rx *x, struct buf *o, struct cset *c)
{
    cset_norm(c);
    struct buf alts = {0};
    int n = 0;
    bool json = x->t == REGEX_JSON_STRING;
    if (json)
        for (uint32_t cp = 1; cp < 0x80; cp++)
            if (json_special(cp) && cset_has(c, cp)) {
                buf_puts(&alts, n++ ? " | " : "");
                put_char(x, &alts, cp);
            }
    /* NUL, the JSON specials (written above), and the surrogates that
     * UTF-8 text never holds */
    cset_sub(c, 0, json ? 0x1F : 0);
    if (json) {
        cset_sub(c, '"', '"');
        cset_sub(c, '\\', '\\');
    }
    cset_sub(c, 0xD800, 0xDFFF);
    struct buf cls = {0};
    for (int i = 0; i < c->n; i++) {
        put_cp(&cls, c->r[i].lo);
        if (c->r[i].hi > c->r[i].lo) {
            buf_puts(&cls, "-");
            put_cp(&cls, c->r[i].hi);
        }
    }
    if (cls.n) {
        buf_puts(&alts, n++ ? " | [" : "[");
        buf_putb(&alts, &cls);
        buf_puts(&alts, "]");
    }
    buf_free(&cls);
    if (n == 0) {
        buf_free(&alts);
        return fail(x, "a character class that matches nothing");
    }
    buf_puts(o, n > 1 ? "( " : "");
    buf_putb(o, &alts);
    buf_puts(o, n > 1 ? " )" : "");
    buf_free(&alts);
    return 0;
}

/* ---- reading ---- */

/* Each reader also says whether what it read can match the empty string:
 * a grammar cannot repeat such an item without bound (it would loop
 * without consuming), so (a*)* and the like are refused. */
static int parse_alt(struct rx *x, struct buf *o, int *n_alts, bool *nullable);

static int hex_digits(struct rx *x, int k, uint32_t *out)
{
    uint32_t v = 0;
    for (int j = 0; j < k; j++, x->i++) {
        int d = x->i < x->n ? hex_value(x->s[x->i]) : -1;
        if (d < 0)
            return fail(x, "expected %d hexadecimal digits", k);
        v = v << 4 | (uint32_t)d;
    }
    *out = v;
    return 0;
}

/* After a backslash: a class escape into c (when c is set), or the one
 * character it stands for into *cp. Returns 1 for a class, 0 for a
 * character, -1 on error. in_class: \b is a backspace there. */
static int parse_escape(struct rx *x, struct cset *c, uint32_t *cp, bool in_class)
{
    if (x->i >= x->n)
        return fail(x, "the pattern ends with a backslash");
    char k = x->s[x->i++];
    switch (k) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        return cset_class(x, c, k) ? -1 : 1;
    case 't': *cp = '\t'; return 0;
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0': *cp = 0; return 0;
    case 'x': return hex_digits(x, 2, cp);
    case 'u': {
        if (hex_digits(x, 4, cp))
            return -1;
        if (*cp >= 0xD800 && *cp <= 0xDFFF)
            return fail(x, "\\u%04X is a surrogate, not a character", (unsigned)*cp);
        return 0;
    }
    case 'b':
        if (in_class) {
            *cp = '\b';
            return 0;
        }
        x->i--;
        return fail(x, "word boundaries (\\b) are not supported");
    default:
        break;
    }
    if ((k >= 'a' && k <= 'z') || (k >= 'A' && k <= 'Z') || (k >= '1' && k <= '9')) {
        x->i--;
        return fail(x, "the escape \\%c is not supported (backreferences, word boundaries, "
                       "Unicode properties and the like cannot be a grammar)", k);
    }
    x->i--;
    return next_cp(x, cp) ? -1 : 0; /* escaped punctuation: itself */
}

/* `[...]`, after the `[`. */
static int parse_class(struct rx *x, struct cset *c)
{
    bool neg = at(x, '^');
    x->i += neg;
    bool first = true;
    while (x->i < x->n && (first || x->s[x->i] != ']')) {
        first = false;
        uint32_t lo;
        if (at(x, '\\')) {
            x->i++;
            int r = parse_escape(x, c, &lo, true);
            if (r < 0)
                return -1;
            if (r == 1)
                continue;
        } else if (next_cp(x, &lo)) {
            return -1;
        }
        uint32_t hi = lo;
        if (at(x, '-') && x->i + 1 < x->n && x->s[x->i + 1] != ']') {
            x->i++;
            if (at(x, '\\')) {
                x->i++;
                struct cset dummy = {.n = 0};
                int r = parse_escape(x, &dummy, &hi, true);
                if (r < 0)
                    return -1;
                if (r == 1)
                    return fail(x, "a range cannot end in a class escape");
            } else if (next_cp(x, &hi)) {
                return -1;
            }
            if (hi < lo)
                return fail(x, "the range's end is below its start");
        }
        if (cset_add(x, c, lo, hi))
            return -1;
    }
    if (!at(x, ']'))
        return fail(x, "'[' without its ']'");
    x->i++;
    if (neg)
        cset_negate(c);
    return 0;
}

/* One atom (a character, a set, a group) as one GBNF item. */
static int parse_atom(struct rx *x, struct buf *o, bool *nullable)
{
    char ch = x->s[x->i];
    *nullable = false;
    if (ch == '(') {
        x->i++;
        if (at(x, '?')) {
            x->i++;
            if (at(x, ':')) {
                x->i++;
            } else if ((at(x, 'P') && x->i + 1 < x->n && x->s[x->i + 1] == '<') ||
                       (at(x, '<') && x->i + 1 < x->n && x->s[x->i + 1] != '=' &&
                        x->s[x->i + 1] != '!')) {
                const char *gt = memchr(x->s + x->i, '>', x->n - x->i);
                if (!gt)
                    return fail(x, "a group name without its '>'");
                x->i = (size_t)(gt - x->s) + 1;
            } else {
                char k = x->i < x->n ? x->s[x->i] : ' ';
                x->i -= 2; /* point at the group */
                return fail(x, "lookaround and inline flags ('(?%c') are not supported", k);
            }
        }
        if (++x->depth > MAX_DEPTH)
            return fail(x, "groups nested deeper than %d", MAX_DEPTH);
        int n;
        if (parse_alt(x, o, &n, nullable))
            return -1;
        x->depth--;
        if (!at(x, ')'))
            return fail(x, "'(' without its ')'");
        x->i++;
        return 0;
    }
    struct cset c = {.n = 0};
    if (ch == '[') {
        x->i++;
        return parse_class(x, &c) ? -1 : put_set(x, o, &c);
    }
    if (ch == '.') {
        x->i++;
        cset_add(x, &c, '\n', '\n');
        cset_negate(&c);
        return put_set(x, o, &c);
    }
    if (ch == '^' || ch == '$')
        return fail(x, "'%c' is supported only at the pattern's start ('^') or end ('$')", ch);
    if (ch == ')')
        return fail(x, "')' without its '('");
    if (ch == '*' || ch == '+' || ch == '?')
        return fail(x, "'%c' with nothing to repeat", ch);
    uint32_t cp;
    if (ch == '\\') {
        x->i++;
        int r = parse_escape(x, &c, &cp, false);
        if (r < 0)
            return -1;
        if (r == 1)
            return put_set(x, o, &c);
    } else if (next_cp(x, &cp)) {
        return -1;
    }
    if (cp == 0)
        return fail(x, "a NUL character cannot be matched");
    put_char(x, o, cp);
    return 0;
}

static int read_count(struct rx *x, long *v)
{
    if (x->i >= x->n || x->s[x->i] < '0' || x->s[x->i] > '9')
        return -1;
    long n = 0;
    while (x->i < x->n && x->s[x->i] >= '0' && x->s[x->i] <= '9' && n <= MAX_COUNT)
        n = n * 10 + (x->s[x->i++] - '0');
    *v = n;
    return 0;
}

/* A quantifier after an item, if there is one: appended to o. A '{' that
 * does not start a well-formed count is a literal (both dialects agree). */
static int parse_quant(struct rx *x, struct buf *o, bool *nullable)
{
    if (x->i >= x->n)
        return 0;
    char ch = x->s[x->i];
    size_t at_quant = x->i;
    bool unbounded = false, can_be_none = false;
    if (ch == '*' || ch == '+' || ch == '?') {
        x->i++;
        buf_printf(o, "%c", ch);
        unbounded = ch != '?';
        can_be_none = ch != '+';
    } else if (ch == '{') {
        size_t save = x->i++;
        long lo, hi = -2;
        if (read_count(x, &lo) == 0) {
            if (at(x, ',')) {
                x->i++;
                if (read_count(x, &hi))
                    hi = -1; /* {m,} */
            } else {
                hi = lo;
            }
        }
        if (hi == -2 || !at(x, '}')) { /* not a count: the next atom */
            x->i = save;
            return 0;
        }
        x->i++;
        if (lo > MAX_COUNT || hi > MAX_COUNT)
            return fail(x, "a repeat count over %d", MAX_COUNT);
        if (hi >= 0 && hi < lo)
            return fail(x, "{%ld,%ld}: the maximum is below the minimum", lo, hi);
        unbounded = hi < 0;
        can_be_none = lo == 0;
        if (hi == lo)
            buf_printf(o, "{%ld}", lo);
        else if (hi < 0)
            buf_printf(o, "{%ld,}", lo);
        else
            buf_printf(o, "{%ld,%ld}", lo, hi);
    } else {
        return 0;
    }
    if (unbounded && *nullable) {
        x->i = at_quant;
        return fail(x, "repeating without bound what can match nothing (as in (a*)* or "
                       "(a|)+) is not supported");
    }
    *nullable = *nullable || can_be_none;
    if (at(x, '?')) /* lazy: the same strings */
        x->i++;
    else if (at(x, '+'))
        return fail(x, "possessive quantifiers are not supported");
    if (x->i < x->n && (x->s[x->i] == '*' || x->s[x->i] == '+' || x->s[x->i] == '?' ||
                        (x->s[x->i] == '{' && x->i + 1 < x->n && x->s[x->i + 1] >= '0' &&
                         x->s[x->i + 1] <= '9')))
        return fail(x, "a quantifier after a quantifier");
    return 0;
}

static int parse_seq(struct rx *x, struct buf *o, bool *nullable)
{
    int items = 0;
    *nullable = true;
    while (x->i < x->n && x->s[x->i] != '|' && x->s[x->i] != ')') {
        struct buf item = {0};
        bool item_nullable = false;
        int rc = 0;
        if (x->s[x->i] == '{') { /* a brace that starts no count is itself */
            x->i++;
            put_char(x, &item, '{');
        } else {
            rc = parse_atom(x, &item, &item_nullable);
        }
        if (!rc)
            rc = parse_quant(x, &item, &item_nullable);
        if (!rc) {
            buf_puts(o, items++ ? " " : "");
            buf_putb(o, &item);
            *nullable = *nullable && item_nullable;
        }
        buf_free(&item);
        if (rc)
            return -1;
    }
    if (!items)
        buf_puts(o, "\"\"");
    return 0;
}

static int parse_alt(struct rx *x, struct buf *o, int *n_alts, bool *nullable)
{
    struct buf alts = {0};
    int n = 0;
    *nullable = false;
    for (;;) {
        bool seq_nullable;
        buf_puts(&alts, n++ ? " | " : "");
        if (parse_seq(x, &alts, &seq_nullable)) {
            buf_free(&alts);
            return -1;
        }
        *nullable = *nullable || seq_nullable;
        if (!at(x, '|'))
            break;
        x->i++;
    }
    buf_puts(o, "( ");
    buf_putb(o, &alts);
    buf_puts(o, " )");
    buf_free(&alts);
    *n_alts = n;
    return 0;
}

char *regex_gbnf(const char *re, enum regex_target t, bool search, struct err *e)
{
    size_t n = strlen(re);
    bool a0 = n > 0 && re[0] == '^';
    size_t bs = 0; /* backslashes before a final '$': an even count leaves it an anchor */
    while (n >= 2 + bs && re[n - 2 - bs] == '\\')
        bs++;
    bool a1 = n > (size_t)a0 && re[n - 1] == '$' && bs % 2 == 0;
    struct rx x = {.s = re, .i = a0, .n = n - a1, .t = t, .e = e};
    struct buf body = {0}, out = {0};
    int n_alts;
    bool nullable;
    if (parse_alt(&x, &body, &n_alts, &nullable)) {
        buf_free(&body);
        return NULL;
    }
    if (x.i < x.n) {
        buf_free(&body);
        fail(&x, "')' without its '('");
        return NULL;
    }
    if (search && n_alts > 1 && (a0 || a1)) {
        buf_free(&body);
        err_set(e, "regular expression: an anchor beside a top-level '|' is not supported; "
                   "group the alternatives, as in ^(a|b)$");
        return NULL;
    }
    /* any text: in a JSON string, its characters as they are written */
    const char *any = t == REGEX_JSON_STRING
                          ? "( [^\"\\\\\\x00-\\x1F] | \"\\\\\" [\"\\\\/bfnrt] )*"
                          : "[^\\x00]*";
    buf_puts(&out, "( ");
    if (search && !a0) {
        buf_puts(&out, any);
        buf_puts(&out, " ");
    }
    buf_putb(&out, &body);
    if (search && !a1) {
        buf_puts(&out, " ");
        buf_puts(&out, any);
    }
    buf_puts(&out, " )");
    buf_free(&body);
    if (out.oom) {
        buf_free(&out);
        err_set(e, "out of memory");
        return NULL;
    }
    return out.p;
}
