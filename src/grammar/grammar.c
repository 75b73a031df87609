/* grammar.c - compiles GBNF text (docs/grammar.md) into byte-level rules:
 * literals become byte sequences, character classes byte sets (or, past
 * ASCII, alternatives of UTF-8 byte-range sequences), groups and
 * repetitions rules of their own. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/parse.h"
#include "base/utf8.h"
#include "grammar/grammar.h"
#include "grammar/grammar_internal.h"

struct seq {
    struct gel *el;
    int n, cap;
};

struct brule {
    char *name; /* NULL for a rule the compiler made (group, repetition) */
    int line;   /* first reference or definition, for messages */
    bool defined;
    struct seq body; /* alternatives with GEL_ALT between, GEL_END last */
};

struct builder {
    struct brule *rules;
    int n_rules, cap_rules;
    struct byteset *sets;
    int n_sets, cap_sets;
    int single[256]; /* set index of each one-byte set, -1 until made */
    const char *p, *end;
    int line;
    int depth; /* group nesting, bounded so hostile text cannot blow the stack */
    struct err *e;
    bool failed;
};

#define MAX_DEPTH 64
#define MAX_REPEAT 1000
#define MAX_ELEMENTS (1 << 22)

static int fail(struct builder *b, const char *what)
{
    if (!b->failed)
        err_set(b->e, "grammar: line %d: %s", b->line, what);
    b->failed = true;
    return -1;
}

static int seq_push(struct builder *b, struct seq *s, enum gel_type t, int v)
{
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 16;
        if (cap > MAX_ELEMENTS)
            return fail(b, "the grammar is too large");
        struct gel *el = realloc(s->el, sizeof *el * (size_t)cap);
        if (!el)
            return fail(b, "out of memory");
        s->el = el;
        s->cap = cap;
    }
    s->el[s->n++] = (struct gel){.type = t, .v = (uint32_t)v};
    return 0;
}

static int seq_append(struct builder *b, struct seq *dst, const struct seq *src)
{
    for (int i = 0; i < src->n; i++)
        if (seq_push(b, dst, src->el[i].type, src->el[i].v))
            return -1;
    return 0;
}

static int add_set(struct builder *b, const struct byteset *s)
{
    if (b->n_sets == b->cap_sets) {
        int cap = b->cap_sets ? b->cap_sets * 2 : 64;
        struct byteset *n = realloc(b->sets, sizeof *n * (size_t)cap);
        if (!n)
            return fail(b, "out of memory");
        b->sets = n;
        b->cap_sets = cap;
    }
    b->sets[b->n_sets] = *s;
    return b->n_sets++;
}

static int byte_set(struct builder *b, unsigned char c)
{
    if (b->single[c] < 0) {
        struct byteset s = {{0}};
        s.w[c >> 6] |= 1ull << (c & 63);
        b->single[c] = add_set(b, &s);
    }
    return b->single[c];
}

static int range_set(struct builder *b, unsigned lo, unsigned hi)
{
    struct byteset s = {{0}};
    for (unsigned c = lo; c <= hi; c++)
        s.w[c >> 6] |= 1ull << (c & 63);
    return lo == hi ? byte_set(b, (unsigned char)lo) : add_set(b, &s);
}

/* A new rule; name NULL for one the compiler makes. */
static int new_rule(struct builder *b, const char *name, size_t n)
{
    if (b->n_rules == b->cap_rules) {
        int cap = b->cap_rules ? b->cap_rules * 2 : 32;
        struct brule *r = realloc(b->rules, sizeof *r * (size_t)cap);
        if (!r)
            return fail(b, "out of memory");
        b->rules = r;
        b->cap_rules = cap;
    }
    struct brule *r = &b->rules[b->n_rules];
    *r = (struct brule){.line = b->line, .defined = name == NULL};
    if (name && !(r->name = strndup(name, n)))
        return fail(b, "out of memory");
    return b->n_rules++;
}

static int rule_named(struct builder *b, const char *name, size_t n)
{
    for (int i = 0; i < b->n_rules; i++)
        if (b->rules[i].name && strlen(b->rules[i].name) == n &&
            memcmp(b->rules[i].name, name, n) == 0)
            return i;
    return new_rule(b, name, n);
}

/* A rule made of the alternatives given as sequences (a NULL sequence is
 * the empty alternative). */
static int make_rule(struct builder *b, struct seq *const *alts, int n_alts)
{
    int r = new_rule(b, NULL, 0);
    if (r < 0)
        return -1;
    struct seq body = {0};
    for (int i = 0; i < n_alts; i++) {
        if ((alts[i] && seq_append(b, &body, alts[i])) ||
            seq_push(b, &body, i + 1 < n_alts ? GEL_ALT : GEL_END, 0)) {
            free(body.el);
            return -1;
        }
    }
    b->rules[r].body = body;
    return r;
}

/* ---- lexing ---- */

static bool is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
}

static void skip_space(struct builder *b)
{
    while (b->p < b->end) {
        char c = *b->p;
        if (c == '#') {
            while (b->p < b->end && *b->p != '\n')
                b->p++;
        } else if (c == '\n') {
            b->line++;
            b->p++;
        } else if (c == ' ' || c == '\t' || c == '\r') {
            b->p++;
        } else {
            break;
        }
    }
}

/* Whether the text at p is `name ::=`: the start of the next rule. */
static bool at_rule_start(const struct builder *b)
{
    const char *q = b->p;
    if (q >= b->end || !is_name_char(*q))
        return false;
    while (q < b->end && is_name_char(*q))
        q++;
    while (q < b->end && (*q == ' ' || *q == '\t' || *q == '\r' || *q == '\n'))
        q++;
    return b->end - q >= 3 && memcmp(q, "::=", 3) == 0;
}

/* One character of a literal or class (escapes decoded, UTF-8 read), as a
 * code point; -1 on a malformed one. */
static long read_char(struct builder *b)
{
    const unsigned char *p = (const unsigned char *)b->p, *end = (const unsigned char *)b->end;
    if (p >= end)
        return fail(b, "unexpected end of text");
    if (*p == '\\') {
        if (p + 1 >= end)
            return fail(b, "unexpected end of text after '\\'");
        char c = (char)p[1];
        int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
        if (digits) {
            long v = 0;
            for (int i = 0; i < digits; i++) {
                int h = p + 2 + i < end ? hex_value((char)p[2 + i]) : -1;
                if (h < 0)
                    return fail(b, "bad hexadecimal escape");
                v = v * 16 + h;
            }
            if (v > 0x10FFFF)
                return fail(b, "escape past U+10FFFF");
            b->p += 2 + digits;
            return v;
        }
        b->p += 2;
        switch (c) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '\'':
            return c;
        default:
            return fail(b, "unknown escape");
        }
    }
    /* UTF-8: overlong forms, surrogates and values past U+10FFFF are not
     * (a literal must match the very bytes it was written with) */
    uint32_t v;
    int n = utf8_get((const char *)p, (size_t)(end - p), &v);
    if (n == 0)
        return fail(b, "invalid UTF-8");
    if (*p == '\n')
        b->line++;
    b->p += n;
    return v;
}

/* ---- character classes ---- */

struct cp_range {
    unsigned long lo, hi;
};

/* Appends the UTF-8 byte-range sequences of code points [lo, hi] (none of
 * them surrogates) as alternatives: a range whose ends encode to different
 * lengths, or differ before a position that is not whole, is split until
 * every byte position is a plain range. */
static int utf8_ranges(struct builder *b, unsigned long lo, unsigned long hi, struct seq *alts)
{
    static const unsigned long len_end[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= len_end[i] && hi > len_end[i])
            return utf8_ranges(b, lo, len_end[i], alts) ||
                   utf8_ranges(b, len_end[i] + 1, hi, alts);
    char lc[4], hc[4];
    int n = (int)utf8_put((uint32_t)lo, lc);
    utf8_put((uint32_t)hi, hc);
    const unsigned char *l = (const unsigned char *)lc, *h = (const unsigned char *)hc;
    for (int i = 1; i < n; i++) {
        unsigned long m = (1ul << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m)
                return utf8_ranges(b, lo, lo | m, alts) || utf8_ranges(b, (lo | m) + 1, hi, alts);
            if ((hi & m) != m)
                return utf8_ranges(b, lo, (hi & ~m) - 1, alts) ||
                       utf8_ranges(b, hi & ~m, hi, alts);
        }
    }
    if (alts->n && seq_push(b, alts, GEL_ALT, 0))
        return -1;
    for (int i = 0; i < n; i++) {
        int s = range_set(b, l[i], h[i]);
        if (s < 0 || seq_push(b, alts, GEL_SET, s))
            return -1;
    }
    return 0;
}

static int cmp_range(const void *a, const void *b)
{
    const struct cp_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The elements of a class given as code point ranges (negated: their
 * complement): one byte set when it is all ASCII, else a rule. */
static int class_elements(struct builder *b, struct cp_range *r, int n, bool negate,
                          struct seq *out)
{
    qsort(r, (size_t)n, sizeof *r, cmp_range);
    /* merged, then complemented, then surrogates cut out */
    struct cp_range m[2 * 256 + 4];
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (k && r[i].lo <= m[k - 1].hi + 1) {
            if (r[i].hi > m[k - 1].hi)
                m[k - 1].hi = r[i].hi;
        } else {
            m[k++] = r[i];
        }
    }
    if (negate) {
        struct cp_range c[256 + 2];
        int kc = 0;
        unsigned long next = 0;
        for (int i = 0; i < k; i++) {
            if (m[i].lo > next)
                c[kc++] = (struct cp_range){next, m[i].lo - 1};
            next = m[i].hi + 1;
        }
        if (next <= 0x10FFFF)
            c[kc++] = (struct cp_range){next, 0x10FFFF};
        memcpy(m, c, sizeof *c * (size_t)kc);
        k = kc;
    }
    struct cp_range f[2 * 256 + 4];
    int kf = 0;
    for (int i = 0; i < k; i++) {
        if (m[i].lo < 0xD800 && m[i].hi > 0xDFFF) {
            f[kf++] = (struct cp_range){m[i].lo, 0xD7FF};
            f[kf++] = (struct cp_range){0xE000, m[i].hi};
        } else if (m[i].hi < 0xD800 || m[i].lo > 0xDFFF) {
            f[kf++] = m[i];
        } else if (m[i].lo < 0xD800) {
            f[kf++] = (struct cp_range){m[i].lo, 0xD7FF};
        } else if (m[i].hi > 0xDFFF) {
            f[kf++] = (struct cp_range){0xE000, m[i].hi};
        }
    }
    if (kf == 0)
        return fail(b, "character class matches nothing");
    struct byteset ascii = {{0}};
    bool any_ascii = false, wide = false;
    for (int i = 0; i < kf; i++) {
        for (unsigned long c = f[i].lo; c <= f[i].hi && c < 0x80; c++) {
            ascii.w[c >> 6] |= 1ull << (c & 63);
            any_ascii = true;
        }
        wide |= f[i].hi >= 0x80;
    }
    int as = -1;
    if (any_ascii && (as = add_set(b, &ascii)) < 0)
        return -1;
    if (!wide)
        return seq_push(b, out, GEL_SET, as);
    struct seq alts = {0};
    if (any_ascii && seq_push(b, &alts, GEL_SET, as))
        goto fail;
    for (int i = 0; i < kf; i++) {
        if (f[i].hi < 0x80)
            continue;
        if (utf8_ranges(b, f[i].lo < 0x80 ? 0x80 : f[i].lo, f[i].hi, &alts))
            goto fail;
    }
    if (seq_push(b, &alts, GEL_END, 0))
        goto fail;
    int rule = new_rule(b, NULL, 0);
    if (rule < 0)
        goto fail;
    b->rules[rule].body = alts;
    return seq_push(b, out, GEL_REF, rule);
fail:
    free(alts.el);
    return -1;
}

static int parse_class(struct builder *b, struct seq *out)
{
    b->p++; /* [ */
    bool negate = b->p < b->end && *b->p == '^';
    if (negate)
        b->p++;
    struct cp_range r[256];
    int n = 0;
    while (b->p < b->end && *b->p != ']') {
        long lo = read_char(b), hi = lo;
        if (lo < 0)
            return -1;
        if (b->end - b->p >= 2 && b->p[0] == '-' && b->p[1] != ']') {
            b->p++;
            if ((hi = read_char(b)) < 0)
                return -1;
            if (hi < lo)
                return fail(b, "character range out of order");
        }
        if (n == 256)
            return fail(b, "more than 256 ranges in a character class");
        r[n++] = (struct cp_range){(unsigned long)lo, (unsigned long)hi};
    }
    if (b->p >= b->end)
        return fail(b, "unterminated character class");
    b->p++;
    return class_elements(b, r, n, negate, out);
}

static int parse_literal(struct builder *b, struct seq *out)
{
    b->p++; /* " */
    while (b->p < b->end && *b->p != '"') {
        long c = read_char(b);
        if (c < 0)
            return -1;
        char u[4];
        int n = (int)utf8_put((uint32_t)c, u);
        for (int i = 0; i < n; i++)
            if (seq_push(b, out, GEL_SET, byte_set(b, (unsigned char)u[i])))
                return -1;
    }
    if (b->p >= b->end)
        return fail(b, "unterminated string literal");
    b->p++;
    return 0;
}

/* ---- structure ---- */

static int parse_alternatives(struct builder *b, int rule, bool nested);

/* {m}, {m,}, {m,n}: -1 for n means unbounded. */
static int parse_braces(struct builder *b, int *m, int *n)
{
    b->p++;
    long v[2] = {0, -1};
    int k = 0;
    bool comma = false;
    for (;;) {
        skip_space(b);
        if (b->p >= b->end)
            return fail(b, "unterminated repetition");
        char c = *b->p;
        if (c >= '0' && c <= '9') {
            long x = 0;
            while (b->p < b->end && *b->p >= '0' && *b->p <= '9') {
                x = x * 10 + (*b->p++ - '0');
                if (x > MAX_REPEAT)
                    return fail(b, "repetition count over 1000");
            }
            v[k] = x;
        } else if (c == ',' && !comma) {
            comma = true;
            k = 1;
            b->p++;
        } else if (c == '}') {
            b->p++;
            break;
        } else {
            return fail(b, "malformed repetition");
        }
    }
    *m = (int)v[0];
    *n = comma ? (int)v[1] : (int)v[0];
    if (*n >= 0 && *n < *m)
        return fail(b, "repetition {m,n} with n < m");
    return 0;
}

/* item repeated m to n times (n < 0: unbounded) onto out. */
static int repeat(struct builder *b, struct gel item, int m, int n, struct seq *out)
{
    for (int i = 0; i < m; i++)
        if (seq_push(b, out, item.type, item.v))
            return -1;
    if (n == m)
        return 0;
    struct seq one = {0};
    int r;
    if (n < 0) { /* R ::= item R | "" */
        r = new_rule(b, NULL, 0);
        if (r < 0 || seq_push(b, &one, item.type, item.v) || seq_push(b, &one, GEL_REF, r) ||
            seq_push(b, &one, GEL_ALT, 0) || seq_push(b, &one, GEL_END, 0)) {
            free(one.el);
            return -1;
        }
        b->rules[r].body = one;
    } else { /* R_k ::= item R_(k-1) | "", innermost R_1 ::= item | "" */
        r = -1;
        for (int k = 0; k < n - m; k++) {
            struct seq s = {0};
            if (seq_push(b, &s, item.type, item.v) || (r >= 0 && seq_push(b, &s, GEL_REF, r))) {
                free(s.el);
                return -1;
            }
            struct seq *alts[2] = {&s, NULL};
            r = make_rule(b, alts, 2);
            free(s.el);
            if (r < 0)
                return -1;
        }
    }
    return seq_push(b, out, GEL_REF, r);
}

/* One item and its repetition suffix onto out. */
static int parse_item(struct builder *b, struct seq *out)
{
    struct seq it = {0};
    char c = *b->p;
    int rc;
    if (c == '"') {
        rc = parse_literal(b, &it);
    } else if (c == '[') {
        rc = parse_class(b, &it);
    } else if (c == '.') {
        b->p++;
        struct cp_range none[1];
        rc = class_elements(b, none, 0, true, &it);
    } else if (c == '(') {
        if (++b->depth > MAX_DEPTH)
            return fail(b, "groups nested too deeply");
        b->p++;
        int r = new_rule(b, NULL, 0);
        rc = r < 0 ? -1 : parse_alternatives(b, r, true);
        if (rc == 0) {
            skip_space(b);
            if (b->p >= b->end || *b->p != ')')
                rc = fail(b, "missing ')'");
            else
                b->p++;
        }
        if (rc == 0)
            rc = seq_push(b, &it, GEL_REF, r);
        b->depth--;
    } else if (is_name_char(c)) {
        const char *s = b->p;
        while (b->p < b->end && is_name_char(*b->p))
            b->p++;
        int r = rule_named(b, s, (size_t)(b->p - s));
        rc = r < 0 ? -1 : seq_push(b, &it, GEL_REF, r);
    } else {
        char msg[64];
        snprintf(msg, sizeof msg, "unexpected '%c'", c);
        return fail(b, msg);
    }
    if (rc)
        goto done;
    int m = 1, n = 1;
    if (b->p < b->end) {
        c = *b->p;
        if (c == '*' || c == '+' || c == '?') {
            b->p++;
            m = c == '+';
            n = c == '?' ? 1 : -1;
        } else if (c == '{') {
            if ((rc = parse_braces(b, &m, &n)))
                goto done;
        }
    }
    if (m == 1 && n == 1) {
        rc = seq_append(b, out, &it);
    } else {
        struct gel one = it.n == 1 ? it.el[0] : (struct gel){0};
        if (it.n != 1) { /* a multi-byte literal repeats as a rule of its own */
            struct seq *alts[1] = {&it};
            int r = make_rule(b, alts, 1);
            if (r < 0) {
                rc = -1;
                goto done;
            }
            one = (struct gel){.type = GEL_REF, .v = (uint32_t)r};
        }
        rc = repeat(b, one, m, n, out);
    }
done:
    free(it.el);
    return rc;
}

/* The alternatives of rule, up to the next rule (top level) or ')'. */
static int parse_alternatives(struct builder *b, int rule, bool nested)
{
    struct seq body = {0};
    for (;;) {
        for (;;) {
            skip_space(b);
            if (b->p >= b->end || *b->p == '|' || (nested && *b->p == ')') ||
                (!nested && at_rule_start(b)))
                break;
            if (*b->p == ')')
                return free(body.el), fail(b, "unmatched ')'");
            if (parse_item(b, &body))
                return free(body.el), -1;
        }
        bool more = b->p < b->end && *b->p == '|';
        if (seq_push(b, &body, more ? GEL_ALT : GEL_END, 0))
            return free(body.el), -1;
        if (!more)
            break;
        b->p++;
    }
    free(b->rules[rule].body.el);
    b->rules[rule].body = body;
    return 0;
}

static int parse_rules(struct builder *b)
{
    for (;;) {
        skip_space(b);
        if (b->p >= b->end)
            return 0;
        const char *s = b->p;
        while (b->p < b->end && is_name_char(*b->p))
            b->p++;
        if (b->p == s)
            return fail(b, "expected a rule name");
        size_t n = (size_t)(b->p - s);
        skip_space(b);
        if (b->end - b->p < 3 || memcmp(b->p, "::=", 3) != 0)
            return fail(b, "expected '::=' after the rule name");
        b->p += 3;
        int r = rule_named(b, s, n);
        if (r < 0)
            return -1;
        if (b->rules[r].defined) {
            char msg[160];
            snprintf(msg, sizeof msg, "rule '%.*s' defined twice", (int)(n > 64 ? 64 : n), s);
            return fail(b, msg);
        }
        b->rules[r].defined = true;
        b->rules[r].line = b->line;
        if (parse_alternatives(b, r, false))
            return -1;
    }
}

/* ---- checks ---- */

static bool alt_all_nullable(const struct gel *a, const bool *nullable)
{
    for (; a->type != GEL_ALT && a->type != GEL_END; a++)
        if (a->type == GEL_SET || !nullable[a->v])
            return false;
    return true;
}

/* Depth-first over "r may begin with s" edges; 1 on a cycle. */
static int first_cycle(const struct builder *b, int r, const bool *nullable, char *color, int *at)
{
    color[r] = 1;
    const struct gel *el = b->rules[r].body.el;
    bool lead = true;
    for (int i = 0; i < b->rules[r].body.n; i++) {
        if (el[i].type == GEL_ALT || el[i].type == GEL_END) {
            lead = true;
            continue;
        }
        if (!lead)
            continue;
        if (el[i].type == GEL_SET) {
            lead = false;
            continue;
        }
        int s = (int)el[i].v;
        if (color[s] == 1 || (color[s] == 0 && first_cycle(b, s, nullable, color, at))) {
            if (*at < 0)
                *at = s;
            return 1;
        }
        lead = nullable[s];
    }
    color[r] = 2;
    return 0;
}

static int check(struct builder *b, int *root)
{
    *root = -1;
    for (int i = 0; i < b->n_rules; i++) {
        struct brule *r = &b->rules[i];
        if (!r->defined) {
            b->line = r->line;
            char msg[160];
            snprintf(msg, sizeof msg, "rule '%.64s' is used but not defined", r->name);
            return fail(b, msg);
        }
        if (r->name && strcmp(r->name, "root") == 0)
            *root = i;
    }
    if (*root < 0) {
        err_set(b->e, "grammar: no rule named 'root' (the start rule)");
        return -1;
    }
    bool *nullable = calloc((size_t)b->n_rules, sizeof *nullable);
    char *color = calloc((size_t)b->n_rules, 1);
    if (!nullable || !color) {
        free(nullable);
        free(color);
        return fail(b, "out of memory");
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (int i = 0; i < b->n_rules; i++) {
            if (nullable[i])
                continue;
            const struct gel *el = b->rules[i].body.el;
            for (int a = 0; a < b->rules[i].body.n; a++) {
                if (alt_all_nullable(el + a, nullable)) {
                    nullable[i] = changed = true;
                    break;
                }
                while (el[a].type != GEL_ALT && el[a].type != GEL_END)
                    a++;
            }
        }
    }
    int at = -1, rc = 0;
    for (int i = 0; i < b->n_rules && !rc; i++)
        if (color[i] == 0 && first_cycle(b, i, nullable, color, &at)) {
            /* name the named rule on the cycle (made rules have none) */
            int named = at;
            for (int k = 0; k < b->n_rules && !b->rules[named].name; k++)
                if (color[k] == 1 && b->rules[k].name)
                    named = k;
            b->line = b->rules[named].line;
            char msg[200];
            snprintf(msg, sizeof msg,
                     "rule '%.64s' can reach itself without consuming a byte (left recursion)",
                     b->rules[named].name ? b->rules[named].name : "(group)");
            rc = fail(b, msg);
        }
    free(nullable);
    free(color);
    return rc;
}

static void builder_free(struct builder *b)
{
    for (int i = 0; i < b->n_rules; i++) {
        free(b->rules[i].name);
        free(b->rules[i].body.el);
    }
    free(b->rules);
    free(b->sets);
}

struct grammar *grammar_parse(const char *text, size_t len, struct err *e)
{
    struct builder b = {.p = text, .end = text + len, .line = 1, .e = e};
    memset(b.single, -1, sizeof b.single);
    int root;
    struct grammar *g = NULL;
    if (parse_rules(&b) || check(&b, &root))
        goto out;
    g = calloc(1, sizeof *g);
    size_t n_el = 0;
    for (int i = 0; i < b.n_rules; i++)
        n_el += (size_t)b.rules[i].body.n;
    if (!g || !(g->el = malloc(sizeof *g->el * n_el)) ||
        !(g->rule_start = malloc(sizeof *g->rule_start * (size_t)b.n_rules))) {
        grammar_free(g);
        g = NULL;
        err_set(e, "grammar: out of memory");
        goto out;
    }
    for (int i = 0; i < b.n_rules; i++) {
        g->rule_start[i] = g->n_el;
        memcpy(g->el + g->n_el, b.rules[i].body.el, sizeof *g->el * (size_t)b.rules[i].body.n);
        g->n_el += b.rules[i].body.n;
    }
    g->n_rules = b.n_rules;
    g->sets = b.sets;
    g->n_sets = b.n_sets;
    b.sets = NULL;
    g->root = root;
out:
    builder_free(&b);
    return g;
}

void grammar_free(struct grammar *g)
{
    if (!g)
        return;
    free(g->el);
    free(g->rule_start);
    free(g->sets);
    free(g);
}

size_t grammar_literal(const char *s, size_t n, char *out)
{
    char *o = out;
    *o++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
        } else if (c == '\n') {
            *o++ = '\\';
            *o++ = 'n';
        } else if (c < 0x20 || c == 0x7f) {
            o += sprintf(o, "\\x%02X", c);
        } else {
            *o++ = (char)c; /* UTF-8 passes through */
        }
    }
    *o++ = '"';
    *o = 0;
    return (size_t)(o - out);
}

char *grammar_prefix_rules(const char *text, const char *prefix, struct err *e)
{
    size_t n = strlen(text), np = strlen(prefix), names = 0;
    for (size_t i = 0; i < n; i++) /* an upper bound: every name start */
        names += is_name_char(text[i]) && (i == 0 || !is_name_char(text[i - 1]));
    char *out = malloc(n + names * np + 1), *o = out;
    if (!out) {
        err_set(e, "grammar: out of memory");
        return NULL;
    }
    for (size_t i = 0; i < n;) {
        char c = text[i];
        if (c == '"' || c == '[') { /* a literal or class, escapes and all */
            char close = c == '"' ? '"' : ']';
            *o++ = text[i++];
            while (i < n && text[i] != close) {
                if (text[i] == '\\' && i + 1 < n)
                    *o++ = text[i++];
                *o++ = text[i++];
            }
            if (i >= n) {
                free(out);
                err_set(e, "grammar: unterminated %s", close == '"' ? "literal" : "class");
                return NULL;
            }
            *o++ = text[i++];
        } else if (c == '#' || c == '{') { /* a comment, a repetition count */
            char end = c == '#' ? '\n' : '}';
            while (i < n && text[i] != end)
                *o++ = text[i++];
        } else if (is_name_char(c)) {
            memcpy(o, prefix, np);
            o += np;
            while (i < n && is_name_char(text[i]))
                *o++ = text[i++];
        } else {
            *o++ = text[i++];
        }
    }
    *o = 0;
    return out;
}

bool grammar_accepts(const struct grammar *g, const char *s, size_t n)
{
    struct err e;
    struct grammar_matcher *m = grammar_matcher_new(g, NULL, &e);
    bool ok = m && grammar_matcher_feed(m, s, n, &e) == 0 && grammar_matcher_can_end(m);
    grammar_matcher_free(m);
    return ok;
}
