/* jinja_methods.c - the Python methods templates call on values (str:
 * startswith, split, strip, replace, format...; dict: items, get...; list:
 * index, count) with the immutable sandbox's refusals, the global functions
 * (range, dict, namespace, joiner, raise_exception, strftime_now) and
 * Python's "%" and str.format() formatting. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/jinja_internal.h"

#define MAX_RANGE 100000 /* Jinja2's sandbox limit */

static struct jstr *need_str(struct jrender *r, int line, jv v, const char *what)
{
    if (v.k == JV_UNDEF)
        jv_undef_fail(r, line, v);
    if (v.k != JV_STR)
        jfail(&r->fail, line, "%s must be str, not %s", what, jv_type_name(v));
    return v.u.s;
}

int64_t jpy_int_arg(struct jrender *r, int line, jv v, const char *what)
{
    if (v.k == JV_INT)
        return v.u.i;
    if (v.k == JV_BOOL)
        return v.u.b;
    if (v.k == JV_UNDEF)
        jv_undef_fail(r, line, v);
    jfail(&r->fail, line, "%s: '%s' object cannot be interpreted as an integer", what,
          jv_type_name(v));
}

/* ---- case mapping and whitespace ---- */

static void add_cp(struct jbuf *b, uint32_t c)
{
    char tmp[4];
    jb_add(b, tmp, (size_t)ju_encode(c, tmp));
}

static void add_upper(struct jbuf *b, uint32_t c)
{
    if (c == 0xdf) /* sharp s: Python's full case mapping */
        jb_adds(b, "SS");
    else
        add_cp(b, ju_upper(c));
}

static void add_lower(struct jbuf *b, uint32_t c)
{
    if (c == 0x130) /* capital I with dot: i + combining dot */
        jb_adds(b, "i\xcc\x87");
    else
        add_cp(b, ju_lower(c));
}

/* Greek capital sigma lowers to final sigma at the end of a word: after a
 * cased letter and not before one (Python's Final_Sigma rule). */
static bool final_sigma(const char *start, const char *p, const char *end)
{
    if (p == start)
        return false;
    const char *q = p - 1;
    while (q > start && ((unsigned char)*q & 0xc0) == 0x80)
        q--;
    uint32_t c;
    ju_decode(q, p, &c);
    if (!ju_iscased(c))
        return false;
    const char *n = p + 2; /* U+03A3 is two bytes */
    if (n >= end)
        return true;
    ju_decode(n, end, &c);
    return !ju_iscased(c);
}

static void add_lower_at(struct jbuf *b, uint32_t c, const char *start, const char *p,
                         const char *end)
{
    if (c == 0x3a3 && final_sigma(start, p, end))
        jb_adds(b, "\xcf\x82");
    else
        add_lower(b, c);
}

struct jstr *jpy_case(struct jrender *r, struct jstr *s, int mode)
{
    struct jbuf b;
    jb_init(&b, r);
    const char *p = s->s, *end = s->s + s->len;
    bool first = true, prev_cased = false, word_start = true;
    while (p < end) {
        uint32_t c;
        int n = ju_decode(p, end, &c);
        switch (mode) {
        case 0: add_lower_at(&b, c, s->s, p, end); break;
        case 1: add_upper(&b, c); break;
        case 2: /* capitalize */
            if (first)
                add_upper(&b, c);
            else
                add_lower_at(&b, c, s->s, p, end);
            break;
        case 3: /* str.title() */
            if (prev_cased)
                add_lower_at(&b, c, s->s, p, end);
            else
                add_upper(&b, c);
            prev_cased = ju_iscased(c);
            break;
        case 4: /* swapcase */
            if (ju_isupper(c))
                add_lower(&b, c);
            else if (ju_islower(c))
                add_upper(&b, c);
            else
                jb_add(&b, p, (size_t)n);
            break;
        case 5: { /* Jinja2's title filter: words start after [-\s({[<] */
            bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || ju_isspace(c);
            if (sep) {
                jb_add(&b, p, (size_t)n);
                word_start = true;
            } else if (word_start) {
                add_upper(&b, c);
                word_start = false;
            } else {
                add_lower_at(&b, c, s->s, p, end);
            }
            break;
        }
        }
        first = false;
        p += n;
    }
    return jb_str(&b);
}

static bool in_chars(struct jstr *chars, uint32_t c)
{
    const char *p = chars->s, *end = chars->s + chars->len;
    while (p < end) {
        uint32_t d;
        p += ju_decode(p, end, &d);
        if (d == c)
            return true;
    }
    return false;
}

struct jstr *jpy_strip(struct jrender *r, struct jstr *s, struct jstr *chars, bool left, bool right)
{
    const char *p = s->s, *end = s->s + s->len;
    if (left)
        while (p < end) {
            uint32_t c;
            int n = ju_decode(p, end, &c);
            if (chars ? !in_chars(chars, c) : !ju_isspace(c))
                break;
            p += n;
        }
    if (right)
        while (end > p) {
            const char *q = end - 1;
            while (q > p && ((unsigned char)*q & 0xc0) == 0x80)
                q--;
            uint32_t c;
            ju_decode(q, end, &c);
            if (chars ? !in_chars(chars, c) : !ju_isspace(c))
                break;
            end = q;
        }
    if (p == s->s && end == s->s + s->len)
        return s;
    return js_new(&r->arena, p, (size_t)(end - p));
}

struct jstr *jpy_replace(struct jrender *r, int line, struct jstr *s, struct jstr *old,
                         struct jstr *new_, int64_t count)
{
    (void)line;
    struct jbuf b;
    jb_init(&b, r);
    if (count < 0)
        count = INT64_MAX;
    if (old->len == 0) {
        const char *p = s->s, *end = s->s + s->len;
        int64_t done = 0;
        if (done < count) {
            jb_add(&b, new_->s, new_->len);
            done++;
        }
        while (p < end) {
            uint32_t c;
            int n = ju_decode(p, end, &c);
            jb_add(&b, p, (size_t)n);
            p += n;
            if (done < count) {
                jstep(r, line);
                jb_add(&b, new_->s, new_->len);
                done++;
            }
        }
        return jb_str(&b);
    }
    const char *p = s->s, *end = s->s + s->len;
    int64_t done = 0;
    while (done < count) {
        const char *hit = memmem(p, (size_t)(end - p), old->s, old->len);
        if (!hit)
            break;
        jb_add(&b, p, (size_t)(hit - p));
        jb_add(&b, new_->s, new_->len);
        p = hit + old->len;
        done++;
    }
    if (done == 0)
        return s;
    jb_add(&b, p, (size_t)(end - p));
    return jb_str(&b);
}

/* ---- str methods ---- */

static struct jstr *S(jv self) { return self.u.s; }

/* Python's s[start:end] bounds for find/count/startswith, in bytes. */
static void sub_range(struct jrender *r, int line, struct jstr *s, jv start, jv end, size_t *b0,
                      size_t *b1, int64_t *cp0, bool *empty)
{
    int64_t len = js_ncp(s), a = 0, z = len;
    if (start.k != JV_MISSING && start.k != JV_NONE)
        a = jpy_int_arg(r, line, start, "slice index");
    if (end.k != JV_MISSING && end.k != JV_NONE)
        z = jpy_int_arg(r, line, end, "slice index");
    if (a < 0 && (a += len) < 0)
        a = 0;
    if (z < 0 && (z += len) < 0)
        z = 0;
    if (z > len)
        z = len;
    *empty = a > len || a > z;
    if (a > len)
        a = len;
    if (z < a)
        z = a;
    *cp0 = a;
    *b0 = js_offset(s, a);
    *b1 = js_offset(s, z);
}

static int64_t cp_count(const char *p, size_t n)
{
    int64_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)p[i] & 0xc0) != 0x80;
    return k;
}

static bool prefix_match(struct jrender *r, int line, jv self, const struct jargs *a, bool suffix)
{
    static const char *const pn[] = {"prefix", "start", "end"};
    jv b[3];
    jbind(r, line, suffix ? "endswith" : "startswith", pn, 3, a, b, NULL);
    if (b[0].k == JV_MISSING)
        jfail(&r->fail, line, "%s() takes at least 1 argument (0 given)",
              suffix ? "endswith" : "startswith");
    struct jstr *s = S(self);
    size_t b0, b1;
    int64_t cp0;
    bool empty;
    sub_range(r, line, s, b[1], b[2], &b0, &b1, &cp0, &empty);
    if (empty)
        return false;
    jv *cands = &b[0];
    size_t nc = 1;
    if (b[0].k == JV_LIST && b[0].u.l->kind == JL_TUPLE) {
        cands = b[0].u.l->v;
        nc = b[0].u.l->n;
    }
    for (size_t i = 0; i < nc; i++) {
        if (cands[i].k != JV_STR)
            jfail(&r->fail, line, "%s first arg must be str or a tuple of str, not %s",
                  suffix ? "endswith" : "startswith", jv_type_name(cands[i]));
        struct jstr *x = cands[i].u.s;
        if (x->len > b1 - b0)
            continue;
        const char *at = suffix ? s->s + b1 - x->len : s->s + b0;
        if (memcmp(at, x->s, x->len) == 0)
            return true;
    }
    return false;
}

static jv m_startswith(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return jv_bool(prefix_match(r, line, self, a, false));
}
static jv m_endswith(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return jv_bool(prefix_match(r, line, self, a, true));
}

static jv do_split(struct jrender *r, int line, jv self, const struct jargs *a, bool right)
{
    static const char *const pn[] = {"sep", "maxsplit"};
    jv b[2];
    jbind(r, line, right ? "rsplit" : "split", pn, 2, a, b, NULL);
    struct jstr *s = S(self);
    int64_t max = b[1].k == JV_MISSING ? -1 : jpy_int_arg(r, line, b[1], "maxsplit");
    if (max < 0)
        max = INT64_MAX;
    struct jlist *out = jl_new(r, JL_LIST, 0);
    const char *p = s->s, *end = s->s + s->len;
    if (b[0].k == JV_MISSING || b[0].k == JV_NONE) {
        /* runs of whitespace, ends ignored */
        if (!right) {
            const char *i = p;
            while (max-- > 0) {
                uint32_t c;
                int n;
                while (i < end && (n = ju_decode(i, end, &c)) && ju_isspace(c))
                    i += n;
                if (i == end)
                    break;
                const char *j = i;
                while (i < end && (n = ju_decode(i, end, &c)) && !ju_isspace(c))
                    i += n;
                jl_push(r, out, jv_str(r, j, (size_t)(i - j)));
            }
            if (i < end) {
                uint32_t c;
                int n;
                while (i < end && (n = ju_decode(i, end, &c)) && ju_isspace(c))
                    i += n;
                if (i < end)
                    jl_push(r, out, jv_str(r, i, (size_t)(end - i)));
            }
        } else {
            const char *i = end;
            struct jlist *rev = jl_new(r, JL_LIST, 0);
            /* walk backwards over code points */
#define PREV(q)                                                                                    \
    do {                                                                                           \
        (q)--;                                                                                     \
        while ((q) > p && ((unsigned char)*(q)&0xc0) == 0x80)                                      \
            (q)--;                                                                                 \
    } while (0)
            while (max-- > 0) {
                while (i > p) {
                    const char *q = i;
                    PREV(q);
                    uint32_t c;
                    ju_decode(q, i, &c);
                    if (!ju_isspace(c))
                        break;
                    i = q;
                }
                if (i == p)
                    break;
                const char *j = i;
                while (i > p) {
                    const char *q = i;
                    PREV(q);
                    uint32_t c;
                    ju_decode(q, i, &c);
                    if (ju_isspace(c))
                        break;
                    i = q;
                }
                jl_push(r, rev, jv_str(r, i, (size_t)(j - i)));
            }
            if (i > p) {
                while (i > p) {
                    const char *q = i;
                    PREV(q);
                    uint32_t c;
                    ju_decode(q, i, &c);
                    if (!ju_isspace(c))
                        break;
                    i = q;
                }
                if (i > p)
                    jl_push(r, rev, jv_str(r, p, (size_t)(i - p)));
            }
#undef PREV
            for (size_t k = rev->n; k > 0; k--)
                jl_push(r, out, rev->v[k - 1]);
        }
        return jv_l(out);
    }
    struct jstr *sep = need_str(r, line, b[0], "sep");
    if (sep->len == 0)
        jfail(&r->fail, line, "empty separator");
    if (!right) {
        while (max-- > 0) {
            const char *hit = memmem(p, (size_t)(end - p), sep->s, sep->len);
            if (!hit)
                break;
            jstep(r, line);
            jl_push(r, out, jv_str(r, p, (size_t)(hit - p)));
            p = hit + sep->len;
        }
        jl_push(r, out, jv_str(r, p, (size_t)(end - p)));
        return jv_l(out);
    }
    struct jlist *rev = jl_new(r, JL_LIST, 0);
    const char *e = end;
    while (max-- > 0) {
        const char *hit = NULL;
        for (const char *q = e - sep->len; q >= p && e - p >= (ptrdiff_t)sep->len; q--) {
            if (memcmp(q, sep->s, sep->len) == 0) {
                hit = q;
                break;
            }
            if (q == p)
                break;
        }
        if (!hit)
            break;
        jstep(r, line);
        jl_push(r, rev, jv_str(r, hit + sep->len, (size_t)(e - hit - sep->len)));
        e = hit;
    }
    jl_push(r, rev, jv_str(r, p, (size_t)(e - p)));
    for (size_t k = rev->n; k > 0; k--)
        jl_push(r, out, rev->v[k - 1]);
    return jv_l(out);
}

static jv m_split(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return do_split(r, line, self, a, false);
}
static jv m_rsplit(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return do_split(r, line, self, a, true);
}

static bool is_linebreak(uint32_t c)
{
    return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d ||
           c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
}

/* Python str.splitlines(keepends) */
static jv splitlines(struct jrender *r, struct jstr *s, bool keep)
{
    struct jlist *out = jl_new(r, JL_LIST, 0);
    const char *p = s->s, *end = s->s + s->len, *start = p;
    while (p < end) {
        uint32_t c;
        int n = ju_decode(p, end, &c);
        if (is_linebreak(c)) {
            const char *eol = p + n;
            if (c == '\r' && eol < end && *eol == '\n')
                eol++;
            jl_push(r, out, jv_str(r, start, (size_t)((keep ? eol : p) - start)));
            p = start = eol;
        } else {
            p += n;
        }
    }
    if (start < end)
        jl_push(r, out, jv_str(r, start, (size_t)(end - start)));
    return jv_l(out);
}

static jv m_splitlines(struct jrender *r, int line, jv self, const struct jargs *a)
{
    static const char *const pn[] = {"keepends"};
    jv b[1];
    jbind(r, line, "splitlines", pn, 1, a, b, NULL);
    return splitlines(r, S(self), jv_truthy(b[0]));
}

static jv do_strip(struct jrender *r, int line, jv self, const struct jargs *a, bool l, bool rr)
{
    static const char *const pn[] = {"chars"};
    jv b[1];
    jbind(r, line, "strip", pn, 1, a, b, NULL);
    struct jstr *chars = NULL;
    if (b[0].k != JV_MISSING && b[0].k != JV_NONE)
        chars = need_str(r, line, b[0], "strip arg");
    return jv_s(jpy_strip(r, S(self), chars, l, rr));
}
static jv m_strip(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return do_strip(r, line, self, a, true, true);
}
static jv m_lstrip(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return do_strip(r, line, self, a, true, false);
}
static jv m_rstrip(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return do_strip(r, line, self, a, false, true);
}

static jv case_method(struct jrender *r, int line, jv self, const struct jargs *a, int mode)
{
    jbind(r, line, "str method", NULL, 0, a, NULL, NULL);
    return jv_s(jpy_case(r, S(self), mode));
}
static jv m_lower(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return case_method(r, line, self, a, 0);
}
static jv m_upper(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return case_method(r, line, self, a, 1);
}
static jv m_capitalize(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return case_method(r, line, self, a, 2);
}
static jv m_title(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return case_method(r, line, self, a, 3);
}
static jv m_swapcase(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return case_method(r, line, self, a, 4);
}

static jv m_replace(struct jrender *r, int line, jv self, const struct jargs *a)
{
    static const char *const pn[] = {"old", "new", "count"};
    jv b[3];
    jbind(r, line, "replace", pn, 3, a, b, NULL);
    if (b[0].k == JV_MISSING || b[1].k == JV_MISSING)
        jfail(&r->fail, line, "replace() takes at least 2 arguments");
    int64_t count = b[2].k == JV_MISSING ? -1 : jpy_int_arg(r, line, b[2], "replace");
    return jv_s(jpy_replace(r, line, S(self), need_str(r, line, b[0], "replace() argument 1"),
                            need_str(r, line, b[1], "replace() argument 2"), count));
}

static int64_t find_impl(struct jrender *r, int line, jv self, const struct jargs *a, bool right,
                         const char *name)
{
    static const char *const pn[] = {"sub", "start", "end"};
    jv b[3];
    jbind(r, line, name, pn, 3, a, b, NULL);
    struct jstr *s = S(self), *sub = need_str(r, line, b[0], "substring");
    size_t b0, b1;
    int64_t cp0;
    bool empty;
    sub_range(r, line, s, b[1], b[2], &b0, &b1, &cp0, &empty);
    if (empty || sub->len > b1 - b0)
        return -1;
    const char *hit = NULL;
    if (!right) {
        hit = sub->len ? memmem(s->s + b0, b1 - b0, sub->s, sub->len) : s->s + b0;
    } else {
        for (size_t q = b1 - sub->len + 1; q-- > b0;)
            if (memcmp(s->s + q, sub->s, sub->len) == 0) {
                hit = s->s + q;
                break;
            }
    }
    if (!hit)
        return -1;
    return cp0 + cp_count(s->s + b0, (size_t)(hit - (s->s + b0)));
}

static jv m_find(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return jv_int(find_impl(r, line, self, a, false, "find"));
}
static jv m_rfind(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return jv_int(find_impl(r, line, self, a, true, "rfind"));
}
static jv m_index(struct jrender *r, int line, jv self, const struct jargs *a)
{
    int64_t i = find_impl(r, line, self, a, false, "index");
    if (i < 0)
        jfail(&r->fail, line, "substring not found");
    return jv_int(i);
}
static jv m_rindex(struct jrender *r, int line, jv self, const struct jargs *a)
{
    int64_t i = find_impl(r, line, self, a, true, "rindex");
    if (i < 0)
        jfail(&r->fail, line, "substring not found");
    return jv_int(i);
}

static jv m_count(struct jrender *r, int line, jv self, const struct jargs *a)
{
    static const char *const pn[] = {"sub", "start", "end"};
    jv b[3];
    jbind(r, line, "count", pn, 3, a, b, NULL);
    struct jstr *s = S(self), *sub = need_str(r, line, b[0], "substring");
    size_t b0, b1;
    int64_t cp0;
    bool empty;
    sub_range(r, line, s, b[1], b[2], &b0, &b1, &cp0, &empty);
    if (empty)
        return jv_int(0);
    if (sub->len == 0)
        return jv_int(cp_count(s->s + b0, b1 - b0) + 1);
    int64_t n = 0;
    const char *p = s->s + b0, *end = s->s + b1;
    const char *hit;
    while ((hit = memmem(p, (size_t)(end - p), sub->s, sub->len))) {
        n++;
        p = hit + sub->len;
    }
    return jv_int(n);
}

static jv m_join(struct jrender *r, int line, jv self, const struct jargs *a)
{
    static const char *const pn[] = {"iterable"};
    jv b[1];
    jbind(r, line, "join", pn, 1, a, b, NULL);
    jv *items;
    size_t n;
    jv_iterate(r, line, b[0], &items, &n);
    struct jbuf out;
    jb_init(&out, r);
    for (size_t i = 0; i < n; i++) {
        if (items[i].k != JV_STR)
            jfail(&r->fail, line, "sequence item %zu: expected str instance, %s found", i,
                  jv_type_name(items[i]));
        if (i)
            jb_add(&out, S(self)->s, S(self)->len);
        jb_add(&out, items[i].u.s->s, items[i].u.s->len);
    }
    return jv_s(jb_str(&out));
}

static jv char_class(struct jrender *r, int line, jv self, const struct jargs *a, int cls)
{
    jbind(r, line, "str method", NULL, 0, a, NULL, NULL);
    struct jstr *s = S(self);
    const char *p = s->s, *end = s->s + s->len;
    if (p == end)
        return jv_bool(false);
    bool any_cased = false;
    while (p < end) {
        uint32_t c;
        p += ju_decode(p, end, &c);
        switch (cls) {
        case 0:
            if (!ju_isdigit(c) && !(ju_isalnum(c) && !ju_isalpha(c)))
                return jv_bool(false);
            break;
        case 1:
            if (!ju_isalpha(c))
                return jv_bool(false);
            break;
        case 2:
            if (!ju_isalnum(c))
                return jv_bool(false);
            break;
        case 3:
            if (!ju_isspace(c))
                return jv_bool(false);
            break;
        case 4: /* islower */
            if (ju_isupper(c))
                return jv_bool(false);
            any_cased |= ju_islower(c);
            break;
        case 5: /* isupper */
            if (ju_islower(c))
                return jv_bool(false);
            any_cased |= ju_isupper(c);
            break;
        }
    }
    return jv_bool(cls >= 4 ? any_cased : true);
}
static jv m_isdigit(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return char_class(r, line, self, a, 0);
}
static jv m_isalpha(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return char_class(r, line, self, a, 1);
}
static jv m_isalnum(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return char_class(r, line, self, a, 2);
}
static jv m_isspace(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return char_class(r, line, self, a, 3);
}
static jv m_islower(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return char_class(r, line, self, a, 4);
}
static jv m_isupper(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return char_class(r, line, self, a, 5);
}

static jv pad(struct jrender *r, int line, jv self, const struct jargs *a, int how,
              const char *name)
{
    static const char *const pn[] = {"width", "fillchar"};
    jv b[2];
    jbind(r, line, name, pn, 2, a, b, NULL);
    struct jstr *s = S(self);
    int64_t width = jpy_int_arg(r, line, b[0], name);
    const char *fill = " ";
    size_t fl = 1;
    if (b[1].k != JV_MISSING) {
        struct jstr *f = need_str(r, line, b[1], "fillchar");
        if (js_ncp(f) != 1)
            jfail(&r->fail, line, "The fill character must be exactly one character long");
        fill = f->s;
        fl = f->len;
    }
    int64_t len = js_ncp(s);
    if (width <= len)
        return self;
    if ((uint64_t)width > r->max_output)
        jfail(&r->fail, line, "%s() width too large", name);
    int64_t marg = width - len, left;
    if (how == 0) /* ljust */
        left = 0;
    else if (how == 1) /* rjust */
        left = marg;
    else /* center */
        left = marg / 2 + (marg & width & 1);
    struct jbuf o;
    jb_init(&o, r);
    for (int64_t i = 0; i < left; i++)
        jb_add(&o, fill, fl);
    jb_add(&o, s->s, s->len);
    for (int64_t i = 0; i < marg - left; i++)
        jb_add(&o, fill, fl);
    return jv_s(jb_str(&o));
}
static jv m_ljust(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return pad(r, line, self, a, 0, "ljust");
}
static jv m_rjust(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return pad(r, line, self, a, 1, "rjust");
}
static jv m_center(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return pad(r, line, self, a, 2, "center");
}

static jv m_zfill(struct jrender *r, int line, jv self, const struct jargs *a)
{
    static const char *const pn[] = {"width"};
    jv b[1];
    jbind(r, line, "zfill", pn, 1, a, b, NULL);
    struct jstr *s = S(self);
    int64_t width = jpy_int_arg(r, line, b[0], "zfill"), len = js_ncp(s);
    if (width <= len)
        return self;
    if ((uint64_t)width > r->max_output)
        jfail(&r->fail, line, "zfill() width too large");
    struct jbuf o;
    jb_init(&o, r);
    size_t start = 0;
    if (s->len && (s->s[0] == '+' || s->s[0] == '-')) {
        jb_addc(&o, s->s[0]);
        start = 1;
    }
    for (int64_t i = 0; i < width - len; i++)
        jb_addc(&o, '0');
    jb_add(&o, s->s + start, s->len - start);
    return jv_s(jb_str(&o));
}

static jv affix(struct jrender *r, int line, jv self, const struct jargs *a, bool suffix)
{
    static const char *const pn[] = {"affix"};
    jv b[1];
    jbind(r, line, suffix ? "removesuffix" : "removeprefix", pn, 1, a, b, NULL);
    struct jstr *s = S(self), *x = need_str(r, line, b[0], "argument");
    if (x->len == 0 || x->len > s->len)
        return self;
    if (!suffix && memcmp(s->s, x->s, x->len) == 0)
        return jv_str(r, s->s + x->len, s->len - x->len);
    if (suffix && memcmp(s->s + s->len - x->len, x->s, x->len) == 0)
        return jv_str(r, s->s, s->len - x->len);
    return self;
}
static jv m_removeprefix(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return affix(r, line, self, a, false);
}
static jv m_removesuffix(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return affix(r, line, self, a, true);
}

static jv partition(struct jrender *r, int line, jv self, const struct jargs *a, bool right)
{
    static const char *const pn[] = {"sep"};
    jv b[1];
    jbind(r, line, right ? "rpartition" : "partition", pn, 1, a, b, NULL);
    struct jstr *s = S(self), *sep = need_str(r, line, b[0], "sep");
    if (sep->len == 0)
        jfail(&r->fail, line, "empty separator");
    const char *hit = NULL;
    if (!right) {
        hit = memmem(s->s, s->len, sep->s, sep->len);
    } else if (sep->len <= s->len) {
        for (size_t q = s->len - sep->len + 1; q-- > 0;)
            if (memcmp(s->s + q, sep->s, sep->len) == 0) {
                hit = s->s + q;
                break;
            }
    }
    struct jlist *t = jl_new(r, JL_TUPLE, 3);
    jv empty = jv_str(r, "", 0);
    if (!hit) {
        t->v[0] = right ? empty : self;
        t->v[1] = empty;
        t->v[2] = right ? self : empty;
    } else {
        t->v[0] = jv_str(r, s->s, (size_t)(hit - s->s));
        t->v[1] = jv_s(sep);
        t->v[2] = jv_str(r, hit + sep->len, s->len - (size_t)(hit - s->s) - sep->len);
    }
    t->n = 3;
    return jv_l(t);
}
static jv m_partition(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return partition(r, line, self, a, false);
}
static jv m_rpartition(struct jrender *r, int line, jv self, const struct jargs *a)
{
    return partition(r, line, self, a, true);
}

/* ---- formatting: str.format() and % ---- */

struct spec {
    uint32_t fill;
    char align, sign, type;
    bool alt, zero, grouping;
    int64_t width, prec;
};

static void parse_spec(struct jrender *r, int line, const char *p, const char *end, struct spec *sp)
{
    memset(sp, 0, sizeof *sp);
    sp->fill = ' ';
    sp->prec = -1;
    uint32_t c0 = 0;
    int n0 = p < end ? ju_decode(p, end, &c0) : 0;
    if (p + n0 < end && strchr("<>=^", p[n0]) && p[n0]) {
        sp->fill = c0;
        sp->align = p[n0];
        p += n0 + 1;
    } else if (p < end && strchr("<>=^", *p) && *p) {
        sp->align = *p++;
    }
    if (p < end && (*p == '+' || *p == '-' || *p == ' '))
        sp->sign = *p++;
    if (p < end && *p == '#') {
        sp->alt = true;
        p++;
    }
    if (p < end && *p == '0') {
        sp->zero = true;
        p++;
    }
    while (p < end && *p >= '0' && *p <= '9') {
        sp->width = sp->width * 10 + (*p++ - '0');
        if (sp->width > 100000)
            jfail(&r->fail, line, "format width too large");
    }
    if (p < end && (*p == ',' || *p == '_')) {
        sp->grouping = true;
        p++;
    }
    if (p < end && *p == '.') {
        p++;
        sp->prec = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            sp->prec = sp->prec * 10 + (*p++ - '0');
            if (sp->prec > 1000)
                jfail(&r->fail, line, "format precision too large");
        }
    }
    if (p < end)
        sp->type = *p++;
    if (p < end)
        jfail(&r->fail, line, "Invalid format specifier");
}

static void group_digits(struct jbuf *o, const char *digits, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (i && (n - i) % 3 == 0)
            jb_addc(o, ',');
        jb_addc(o, digits[i]);
    }
}

/* Applies width/alignment to an already formatted body (sign separate). */
static void emit_padded(struct jbuf *o, const struct spec *sp, const char *sign, const char *body,
                        size_t blen, int64_t body_cps, char dflt_align)
{
    char align = sp->align ? sp->align : (sp->zero ? '=' : dflt_align);
    uint32_t fill = sp->align ? sp->fill : (sp->zero ? '0' : ' ');
    int64_t len = body_cps + (int64_t)strlen(sign);
    int64_t marg = sp->width > len ? sp->width - len : 0, left = 0;
    if (align == '>' || align == '=')
        left = marg;
    else if (align == '^')
        left = marg / 2;
    char f[4];
    int fl = ju_encode(fill, f);
    if (align == '=') {
        jb_adds(o, sign);
        for (int64_t i = 0; i < marg; i++)
            jb_add(o, f, (size_t)fl);
    } else {
        for (int64_t i = 0; i < left; i++)
            jb_add(o, f, (size_t)fl);
        jb_adds(o, sign);
    }
    jb_add(o, body, blen);
    if (align != '=')
        for (int64_t i = left; i < marg; i++)
            jb_add(o, f, (size_t)fl);
}

static void format_value(struct jrender *r, int line, jv v, const char *sp_p, const char *sp_end,
                         struct jbuf *o)
{
    if (sp_p == sp_end) {
        jv_write_str(r, v, o);
        return;
    }
    struct spec sp;
    parse_spec(r, line, sp_p, sp_end, &sp);
    struct jbuf body;
    jb_init(&body, r);
    char tmp[512];
    if (v.k == JV_STR || (sp.type == 's')) {
        if (v.k != JV_STR)
            jfail(&r->fail, line, "Unknown format code 's' for object of type '%s'",
                  jv_type_name(v));
        if (sp.type && sp.type != 's')
            jfail(&r->fail, line, "Unknown format code '%c' for object of type 'str'", sp.type);
        struct jstr *s = v.u.s;
        size_t len = s->len;
        int64_t cps = js_ncp(s);
        if (sp.prec >= 0 && sp.prec < cps) {
            len = js_offset(s, sp.prec);
            cps = sp.prec;
        }
        emit_padded(o, &sp, "", s->s, len, cps, '<');
        return;
    }
    bool is_int = v.k == JV_INT || v.k == JV_BOOL;
    if (!is_int && v.k != JV_FLOAT)
        jfail(&r->fail, line, "unsupported format string passed to %s.__format__", jv_type_name(v));
    char type = sp.type;
    if (is_int && (type == 0 || strchr("dxXobcn", type))) {
        int64_t i = v.k == JV_BOOL ? v.u.b : v.u.i;
        uint64_t mag = i < 0 ? (uint64_t)0 - (uint64_t)i : (uint64_t)i;
        const char *sign = i < 0 ? "-" : sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "";
        if (type == 'c') {
            char cbuf[4];
            int k = ju_encode((uint32_t)i, cbuf);
            emit_padded(o, &sp, "", cbuf, (size_t)k, 1, '<');
            return;
        }
        if (type == 'x' || type == 'X' || type == 'o' || type == 'b') {
            char digs[80];
            int nd = 0;
            unsigned base = type == 'o' ? 8 : type == 'b' ? 2 : 16;
            do {
                unsigned d = (unsigned)(mag % base);
                digs[nd++] = (char)(d < 10 ? '0' + d : (type == 'X' ? 'A' : 'a') + d - 10);
                mag /= base;
            } while (mag);
            if (sp.alt)
                jb_adds(&body, type == 'o' ? "0o" : type == 'b' ? "0b" : type == 'X' ? "0X" : "0x");
            for (int k = nd - 1; k >= 0; k--)
                jb_addc(&body, digs[k]);
        } else {
            int k = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)mag);
            if (sp.grouping)
                group_digits(&body, tmp, (size_t)k);
            else
                jb_add(&body, tmp, (size_t)k);
        }
        emit_padded(o, &sp, sign, body.p, body.n, (int64_t)body.n, '>');
        return;
    }
    double f = v.k == JV_FLOAT ? v.u.f : (double)(v.k == JV_BOOL ? v.u.b : v.u.i);
    if (type && !strchr("eEfFgG%", type))
        jfail(&r->fail, line, "Unknown format code '%c' for object of type '%s'", type,
              jv_type_name(v));
    const char *sign = signbit(f) && !isnan(f) ? "-"
                       : sp.sign == '+'        ? "+"
                       : sp.sign == ' '        ? " "
                                               : "";
    double mag = fabs(f);
    int prec = sp.prec >= 0 ? (int)sp.prec : 6;
    int k;
    if (type == 0 && sp.prec < 0) {
        jfmt_float(mag, false, tmp);
        k = (int)strlen(tmp);
    } else if (type == 0) {
        k = snprintf(tmp, sizeof tmp, "%.*g", prec ? prec : 1, mag);
        if (!strpbrk(tmp, ".einf"))
            k += snprintf(tmp + k, sizeof tmp - (size_t)k, ".0");
    } else if (type == '%') {
        k = snprintf(tmp, sizeof tmp, "%.*f%%", prec, mag * 100);
    } else {
        char fmt[8] = {'%', '.', '*', type == 'F' ? 'f' : type, 0};
        if (sp.alt) {
            fmt[1] = '#';
            fmt[2] = '.';
            fmt[3] = '*';
            fmt[4] = type == 'F' ? 'f' : type;
        }
        k = snprintf(tmp, sizeof tmp, fmt, prec, mag);
    }
    if (k < 0 || k >= (int)sizeof tmp)
        jfail(&r->fail, line, "formatted number too long");
    if (sp.grouping && isfinite(mag)) {
        size_t intlen = strspn(tmp, "0123456789");
        group_digits(&body, tmp, intlen);
        jb_adds(&body, tmp + intlen);
    } else {
        jb_add(&body, tmp, (size_t)k);
    }
    emit_padded(o, &sp, sign, body.p, body.n, (int64_t)body.n, '>');
}

static jv m_format(struct jrender *r, int line, jv self, const struct jargs *a)
{
    struct jstr *s = S(self);
    struct jbuf o;
    jb_init(&o, r);
    const char *p = s->s, *end = s->s + s->len;
    int auto_idx = 0;
    while (p < end) {
        if (*p == '{' && p + 1 < end && p[1] == '{') {
            jb_addc(&o, '{');
            p += 2;
            continue;
        }
        if (*p == '}' && p + 1 < end && p[1] == '}') {
            jb_addc(&o, '}');
            p += 2;
            continue;
        }
        if (*p == '}')
            jfail(&r->fail, line, "Single '}' encountered in format string");
        if (*p != '{') {
            jb_addc(&o, *p++);
            continue;
        }
        const char *q = ++p;
        int depth = 1;
        while (q < end && depth) {
            if (*q == '{')
                depth++;
            else if (*q == '}')
                depth--;
            if (depth)
                q++;
        }
        if (q >= end)
            jfail(&r->fail, line, "Single '{' encountered in format string");
        const char *field_end = p;
        while (field_end < q && *field_end != '!' && *field_end != ':')
            field_end++;
        /* the first part names the argument: empty, a number, or a keyword */
        const char *name_end = p;
        while (name_end < field_end && *name_end != '.' && *name_end != '[')
            name_end++;
        jv v;
        if (name_end == p) {
            if (auto_idx >= a->npos)
                jfail(&r->fail, line, "Replacement index %d out of range for positional args tuple",
                      auto_idx);
            v = a->pos[auto_idx++];
        } else if (*p >= '0' && *p <= '9') {
            long idx = strtol(p, NULL, 10);
            if (idx >= a->npos)
                jfail(&r->fail, line,
                      "Replacement index %ld out of range for positional args tuple", idx);
            v = a->pos[idx];
        } else {
            bool found = false;
            for (int k = 0; k < a->nkw; k++)
                if (a->kwn[k]->len == (size_t)(name_end - p) &&
                    !memcmp(a->kwn[k]->s, p, (size_t)(name_end - p))) {
                    v = a->kwv[k];
                    found = true;
                }
            if (!found)
                jfail(&r->fail, line, "format(): missing keyword argument '%.*s'",
                      (int)(name_end - p), p);
        }
        /* .attr and [key] parts */
        const char *t = name_end;
        while (t < field_end) {
            if (*t == '.') {
                const char *u = ++t;
                while (u < field_end && *u != '.' && *u != '[')
                    u++;
                v = jgetattr(r, line, v, js_new(&r->arena, t, (size_t)(u - t)));
                t = u;
            } else {
                const char *u = ++t;
                while (u < field_end && *u != ']')
                    u++;
                bool digits = u > t;
                for (const char *d = t; d < u; d++)
                    digits &= *d >= '0' && *d <= '9';
                jv key = digits ? jv_int(strtoll(t, NULL, 10)) : jv_str(r, t, (size_t)(u - t));
                v = jgetitem(r, line, v, key);
                t = u + 1;
            }
        }
        const char *spec = field_end;
        if (spec < q && *spec == '!') {
            char conv = spec + 1 < q ? spec[1] : 0;
            struct jbuf cb;
            jb_init(&cb, r);
            if (conv == 'r' || conv == 'a')
                jv_write_repr(r, v, &cb);
            else if (conv == 's')
                jv_write_str(r, v, &cb);
            else
                jfail(&r->fail, line, "Unknown conversion specifier %c", conv ? conv : '?');
            v = jv_s(jb_str(&cb));
            spec += 2;
        }
        if (spec < q && *spec == ':')
            spec++;
        if (v.k == JV_UNDEF && spec < q)
            jv_undef_fail(r, line, v);
        format_value(r, line, v, spec, q, &o);
        p = q + 1;
    }
    return jv_s(jb_str(&o));
}

/* Python's printf-style "fmt % args". */
jv jpy_percent(struct jrender *r, int line, struct jstr *fmt, jv args)
{
    jv *items = &args;
    size_t n = 1;
    const struct jdict *map = NULL;
    if (args.k == JV_LIST && args.u.l->kind == JL_TUPLE) {
        items = args.u.l->v;
        n = args.u.l->n;
    } else if (args.k == JV_DICT) {
        map = args.u.d;
    }
    /* Python treats any non-tuple, non-str argument with __getitem__ (dict,
     * list) as a mapping: unused, it is not an error */
    bool mapping = args.k == JV_DICT ||
                   (args.k == JV_LIST && args.u.l->kind != JL_TUPLE && args.u.l->kind != JL_ITER);
    size_t next = 0;
    struct jbuf o;
    jb_init(&o, r);
    const char *p = fmt->s, *end = fmt->s + fmt->len;
    while (p < end) {
        if (*p != '%') {
            jb_addc(&o, *p++);
            continue;
        }
        p++;
        if (p >= end)
            jfail(&r->fail, line, "incomplete format");
        if (*p == '%') {
            jb_addc(&o, '%');
            p++;
            continue;
        }
        jv v;
        bool have = false;
        if (*p == '(') {
            const char *k = ++p;
            while (p < end && *p != ')')
                p++;
            if (p >= end)
                jfail(&r->fail, line, "incomplete format key");
            if (!map)
                jfail(&r->fail, line, "format requires a mapping");
            if (!jd_get_str(map, k, (size_t)(p - k), &v))
                jfail(&r->fail, line, "KeyError: '%.*s'", (int)(p - k), k);
            have = true;
            p++;
        }
        char flags[8];
        int nf = 0;
        while (p < end && strchr("-+ #0", *p) && *p && nf < 7)
            flags[nf++] = *p++;
        flags[nf] = 0;
        int64_t width = -1, prec = -1;
        if (p < end && *p == '*') {
            if (next >= n)
                jfail(&r->fail, line, "not enough arguments for format string");
            width = jpy_int_arg(r, line, items[next++], "* wants int");
            p++;
        } else {
            while (p < end && *p >= '0' && *p <= '9') {
                width = (width < 0 ? 0 : width) * 10 + (*p++ - '0');
                if (width > 100000)
                    jfail(&r->fail, line, "format width too large");
            }
        }
        if (p < end && *p == '.') {
            p++;
            prec = 0;
            while (p < end && *p >= '0' && *p <= '9') {
                prec = prec * 10 + (*p++ - '0');
                if (prec > 1000)
                    jfail(&r->fail, line, "format precision too large");
            }
        }
        while (p < end && strchr("hlL", *p) && *p)
            p++;
        if (p >= end)
            jfail(&r->fail, line, "incomplete format");
        char conv = *p++;
        if (!have) {
            if (map && !(args.k == JV_LIST))
                v = args;
            else if (next < n)
                v = items[next++];
            else
                jfail(&r->fail, line, "not enough arguments for format string");
        }
        struct jbuf body;
        jb_init(&body, r);
        char tmp[512], cf[24];
        bool left = strchr(flags, '-') != NULL;
        switch (conv) {
        case 's':
        case 'r':
        case 'a': {
            if (conv == 's')
                jv_write_str(r, v, &body);
            else
                jv_write_repr(r, v, &body);
            struct jstr *s = jb_str(&body);
            size_t len = s->len;
            int64_t cps = js_ncp(s);
            if (prec >= 0 && prec < cps) {
                len = js_offset(s, prec);
                cps = prec;
            }
            if (!left)
                for (int64_t i = cps; i < width; i++)
                    jb_addc(&o, ' ');
            jb_add(&o, s->s, len);
            if (left)
                for (int64_t i = cps; i < width; i++)
                    jb_addc(&o, ' ');
            continue;
        }
        case 'd':
        case 'i':
        case 'u':
        case 'x':
        case 'X':
        case 'o': {
            long long i;
            if (v.k == JV_INT || v.k == JV_BOOL)
                i = v.k == JV_BOOL ? v.u.b : v.u.i;
            else if (v.k == JV_FLOAT && (conv == 'd' || conv == 'i' || conv == 'u') &&
                     isfinite(v.u.f)) {
                if (fabs(v.u.f) >= 9.2e18)
                    jfail(&r->fail, line, "integer overflow");
                i = (long long)v.u.f;
            } else
                jfail(&r->fail, line, "%%%c format: a%s number is required, not %s", conv,
                      conv == 'd' || conv == 'i' || conv == 'u' ? " real" : "n integer",
                      jv_type_name(v));
            bool neg = i < 0;
            unsigned long long mag = neg ? 0ULL - (unsigned long long)i : (unsigned long long)i;
            unsigned base = conv == 'x' || conv == 'X' ? 16 : conv == 'o' ? 8 : 10;
            char digs[96];
            int nd = 0;
            do {
                unsigned d = (unsigned)(mag % base);
                digs[nd++] = (char)(d < 10 ? '0' + d : (conv == 'X' ? 'A' : 'a') + d - 10);
                mag /= base;
            } while (mag);
            while (prec > nd && nd < (int)sizeof digs)
                digs[nd++] = '0';
            const char *prefix = !strchr(flags, '#') ? ""
                                 : conv == 'x'       ? "0x"
                                 : conv == 'X'       ? "0X"
                                 : conv == 'o'       ? "0o"
                                                     : "";
            const char *sign = neg ? "-" : strchr(flags, '+') ? "+" : strchr(flags, ' ') ? " " : "";
            int64_t total = (int64_t)(strlen(sign) + strlen(prefix)) + nd;
            int64_t padn = width > total ? width - total : 0;
            bool zero = strchr(flags, '0') && !left;
            if (!left && !zero)
                for (int64_t k = 0; k < padn; k++)
                    jb_addc(&o, ' ');
            jb_adds(&o, sign);
            jb_adds(&o, prefix);
            if (zero)
                for (int64_t k = 0; k < padn; k++)
                    jb_addc(&o, '0');
            for (int k = nd - 1; k >= 0; k--)
                jb_addc(&o, digs[k]);
            if (left)
                for (int64_t k = 0; k < padn; k++)
                    jb_addc(&o, ' ');
            continue;
        }
        case 'e':
        case 'E':
        case 'f':
        case 'F':
        case 'g':
        case 'G': {
            if (!jv_is_num(v))
                jfail(&r->fail, line, "must be real number, not %s", jv_type_name(v));
            double f = v.k == JV_FLOAT ? v.u.f : (double)(v.k == JV_BOOL ? v.u.b : v.u.i);
            snprintf(cf, sizeof cf, "%%%s%s.*%c", flags, width >= 0 ? "*" : "", conv);
            int k = width >= 0
                        ? snprintf(tmp, sizeof tmp, cf, (int)width, (int)(prec >= 0 ? prec : 6), f)
                        : snprintf(tmp, sizeof tmp, cf, (int)(prec >= 0 ? prec : 6), f);
            if (k < 0 || k >= (int)sizeof tmp)
                jfail(&r->fail, line, "formatted number too long");
            jb_add(&o, tmp, (size_t)k);
            continue;
        }
        case 'c': {
            if (v.k == JV_STR && js_ncp(v.u.s) == 1)
                jb_add(&o, v.u.s->s, v.u.s->len);
            else if (v.k == JV_INT && v.u.i >= 0 && v.u.i <= 0x10ffff)
                add_cp(&o, (uint32_t)v.u.i);
            else
                jfail(&r->fail, line, "%%c requires int or char");
            continue;
        }
        default: jfail(&r->fail, line, "unsupported format character '%c'", conv);
        }
    }
    if (!mapping && next < n)
        jfail(&r->fail, line, "not all arguments converted during string formatting");
    return jv_s(jb_str(&o));
}

/* ---- dict and list methods ---- */

static jv dict_view(struct jrender *r, jv self, int kind)
{
    const struct jdict *d = self.u.d;
    struct jlist *l = jl_new(r, kind, d->n);
    for (size_t i = 0; i < d->n; i++) {
        if (kind == JL_ITEMS) {
            struct jlist *t = jl_new(r, JL_TUPLE, 2);
            t->v[0] = d->k[i];
            t->v[1] = d->v[i];
            t->n = 2;
            l->v[i] = jv_l(t);
        } else {
            l->v[i] = kind == JL_KEYS ? d->k[i] : d->v[i];
        }
    }
    l->n = d->n;
    return jv_l(l);
}

static jv m_items(struct jrender *r, int line, jv self, const struct jargs *a)
{
    jbind(r, line, "items", NULL, 0, a, NULL, NULL);
    return dict_view(r, self, JL_ITEMS);
}
static jv m_keys(struct jrender *r, int line, jv self, const struct jargs *a)
{
    jbind(r, line, "keys", NULL, 0, a, NULL, NULL);
    return dict_view(r, self, JL_KEYS);
}
static jv m_values(struct jrender *r, int line, jv self, const struct jargs *a)
{
    jbind(r, line, "values", NULL, 0, a, NULL, NULL);
    return dict_view(r, self, JL_VALUES);
}

static jv m_get(struct jrender *r, int line, jv self, const struct jargs *a)
{
    if (a->nkw)
        jfail(&r->fail, line, "get() takes no keyword arguments");
    if (a->npos < 1 || a->npos > 2)
        jfail(&r->fail, line, "get expected 1 or 2 arguments, got %d", a->npos);
    jv key = a->pos[0], v;
    if (!jv_hashable(key))
        jfail(&r->fail, line, "unhashable type: '%s'", jv_type_name(key));
    if (jd_get(r, self.u.d, key, &v))
        return v;
    return a->npos > 1 ? a->pos[1] : jv_none();
}

static jv m_copy(struct jrender *r, int line, jv self, const struct jargs *a)
{
    jbind(r, line, "copy", NULL, 0, a, NULL, NULL);
    if (self.k == JV_DICT) {
        struct jdict *d = jd_new(r, self.u.d->n);
        for (size_t i = 0; i < self.u.d->n; i++) {
            d->k[i] = self.u.d->k[i];
            d->v[i] = self.u.d->v[i];
        }
        d->n = self.u.d->n;
        return jv_d(d);
    }
    struct jlist *l = jl_new(r, JL_LIST, self.u.l->n);
    if (self.u.l->n)
        memcpy(l->v, self.u.l->v, self.u.l->n * sizeof(jv));
    l->n = self.u.l->n;
    return jv_l(l);
}

static jv m_list_index(struct jrender *r, int line, jv self, const struct jargs *a)
{
    if (a->npos < 1 || a->nkw)
        jfail(&r->fail, line, "index() takes at least 1 argument");
    const struct jlist *l = self.u.l;
    for (size_t i = 0; i < l->n; i++)
        if (jv_eq(r, l->v[i], a->pos[0]))
            return jv_int((int64_t)i);
    jfail(&r->fail, line, "value is not in list");
}

static jv m_list_count(struct jrender *r, int line, jv self, const struct jargs *a)
{
    if (a->npos != 1 || a->nkw)
        jfail(&r->fail, line, "count() takes exactly one argument");
    const struct jlist *l = self.u.l;
    int64_t n = 0;
    for (size_t i = 0; i < l->n; i++)
        n += jv_eq(r, l->v[i], a->pos[0]);
    return jv_int(n);
}

static const struct jbuiltin str_methods[] = {
    {"startswith", m_startswith},
    {"endswith", m_endswith},
    {"split", m_split},
    {"rsplit", m_rsplit},
    {"splitlines", m_splitlines},
    {"strip", m_strip},
    {"lstrip", m_lstrip},
    {"rstrip", m_rstrip},
    {"lower", m_lower},
    {"upper", m_upper},
    {"capitalize", m_capitalize},
    {"title", m_title},
    {"swapcase", m_swapcase},
    {"casefold", m_lower},
    {"replace", m_replace},
    {"find", m_find},
    {"rfind", m_rfind},
    {"index", m_index},
    {"rindex", m_rindex},
    {"count", m_count},
    {"join", m_join},
    {"isdigit", m_isdigit},
    {"isdecimal", m_isdigit},
    {"isnumeric", m_isdigit},
    {"isalpha", m_isalpha},
    {"isalnum", m_isalnum},
    {"isspace", m_isspace},
    {"islower", m_islower},
    {"isupper", m_isupper},
    {"ljust", m_ljust},
    {"rjust", m_rjust},
    {"center", m_center},
    {"zfill", m_zfill},
    {"removeprefix", m_removeprefix},
    {"removesuffix", m_removesuffix},
    {"partition", m_partition},
    {"rpartition", m_rpartition},
    {"format", m_format},
    {NULL, NULL},
};
static const struct jbuiltin dict_methods[] = {
    {"items", m_items}, {"keys", m_keys}, {"values", m_values},
    {"get", m_get},     {"copy", m_copy}, {NULL, NULL},
};
static const struct jbuiltin list_methods[] = {
    {"index", m_list_index},
    {"count", m_list_count},
    {"copy", m_copy},
    {NULL, NULL},
};
static const struct jbuiltin tuple_methods[] = {
    {"index", m_list_index},
    {"count", m_list_count},
    {NULL, NULL},
};
static const char *const dict_unsafe[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};
static const char *const list_unsafe[] = {"append", "clear",  "pop",    "reverse", "insert",
                                          "sort",   "extend", "remove", NULL};

const struct jbuiltin *jbuiltin_find(const struct jbuiltin *t, const char *name)
{
    for (; t->name; t++)
        if (!strcmp(t->name, name))
            return t;
    return NULL;
}

static bool in_list(const char *const *l, const char *name)
{
    for (; *l; l++)
        if (!strcmp(*l, name))
            return true;
    return false;
}

const struct jbuiltin *jmethod_find(jv recv, const char *name, bool *unsafe)
{
    *unsafe = false;
    switch (recv.k) {
    case JV_STR: return jbuiltin_find(str_methods, name);
    case JV_DICT:
        if (in_list(dict_unsafe, name)) {
            *unsafe = true;
            return NULL;
        }
        return jbuiltin_find(dict_methods, name);
    case JV_LIST:
        if (recv.u.l->kind == JL_LIST) {
            if (in_list(list_unsafe, name)) {
                *unsafe = true;
                return NULL;
            }
            return jbuiltin_find(list_methods, name);
        }
        if (recv.u.l->kind == JL_TUPLE)
            return jbuiltin_find(tuple_methods, name);
        return NULL;
    default: return NULL;
    }
}

/* ---- global functions ---- */

static jv g_range(struct jrender *r, int line, jv self, const struct jargs *a)
{
    (void)self;
    if (a->nkw)
        jfail(&r->fail, line, "range() takes no keyword arguments");
    if (a->npos < 1 || a->npos > 3)
        jfail(&r->fail, line, "range expected at least 1 argument, got %d", a->npos);
    int64_t start = 0, stop, step = 1;
    for (int i = 0; i < a->npos; i++)
        if (a->pos[i].k != JV_INT && a->pos[i].k != JV_BOOL) {
            if (a->pos[i].k == JV_UNDEF)
                jv_undef_fail(r, line, a->pos[i]);
            jfail(&r->fail, line, "'%s' object cannot be interpreted as an integer",
                  jv_type_name(a->pos[i]));
        }
    if (a->npos == 1) {
        stop = jpy_int_arg(r, line, a->pos[0], "range");
    } else {
        start = jpy_int_arg(r, line, a->pos[0], "range");
        stop = jpy_int_arg(r, line, a->pos[1], "range");
        if (a->npos == 3)
            step = jpy_int_arg(r, line, a->pos[2], "range");
    }
    if (step == 0)
        jfail(&r->fail, line, "range() arg 3 must not be zero");
    double count = 0;
    if (step > 0 && start < stop)
        count = ((double)stop - (double)start - 1) / (double)step + 1;
    else if (step < 0 && stop < start)
        count = ((double)start - (double)stop - 1) / -(double)step + 1;
    if (count > MAX_RANGE)
        jfail(&r->fail, line,
              "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", MAX_RANGE);
    size_t n = (size_t)count;
    struct jlist *l = jl_new(r, JL_RANGE, n);
    for (size_t i = 0; i < n; i++)
        l->v[i] = jv_int(start + (int64_t)i * step);
    l->n = n;
    l->r[0] = start;
    l->r[1] = stop;
    l->r[2] = step;
    return jv_l(l);
}

static struct jdict *build_dict(struct jrender *r, int line, const struct jargs *a,
                                const char *fname)
{
    if (a->npos > 1)
        jfail(&r->fail, line, "%s expected at most 1 argument, got %d", fname, a->npos);
    struct jdict *d = jd_new(r, 0);
    if (a->npos == 1) {
        jv src = a->pos[0];
        if (src.k == JV_DICT || src.k == JV_NS) {
            for (size_t i = 0; i < src.u.d->n; i++)
                jd_set(r, d, src.u.d->k[i], src.u.d->v[i]);
        } else {
            jv *items;
            size_t n;
            jv_iterate(r, line, src, &items, &n);
            for (size_t i = 0; i < n; i++) {
                jv *kv;
                size_t m;
                jv_iterate(r, line, items[i], &kv, &m);
                if (m != 2)
                    jfail(&r->fail, line,
                          "dictionary update sequence element #%zu has length %zu; 2 is required",
                          i, m);
                if (!jv_hashable(kv[0]))
                    jfail(&r->fail, line, "unhashable type: '%s'", jv_type_name(kv[0]));
                jd_set(r, d, kv[0], kv[1]);
            }
        }
    }
    for (int k = 0; k < a->nkw; k++)
        jd_set(r, d, jv_s(a->kwn[k]), a->kwv[k]);
    return d;
}

static jv g_dict(struct jrender *r, int line, jv self, const struct jargs *a)
{
    (void)self;
    return jv_d(build_dict(r, line, a, "dict"));
}

static jv g_namespace(struct jrender *r, int line, jv self, const struct jargs *a)
{
    (void)self;
    jv v = {.k = JV_NS, .u.d = build_dict(r, line, a, "namespace")};
    return v;
}

static jv g_joiner(struct jrender *r, int line, jv self, const struct jargs *a)
{
    (void)self;
    static const char *const pn[] = {"sep"};
    jv b[1];
    jbind(r, line, "joiner", pn, 1, a, b, NULL);
    struct jfunc *fn = ja_alloc(&r->arena, sizeof *fn);
    fn->kind = JF_JOINER;
    fn->self = b[0].k == JV_MISSING ? jv_str(r, ", ", 2) : b[0];
    jv v = {.k = JV_FUNC, .u.fn = fn};
    return v;
}

static jv g_raise_exception(struct jrender *r, int line, jv self, const struct jargs *a)
{
    (void)self;
    static const char *const pn[] = {"message"};
    jv b[1];
    jbind(r, line, "raise_exception", pn, 1, a, b, NULL);
    struct jstr *msg = jv_to_str(r, b[0].k == JV_MISSING ? jv_undef() : b[0]);
    jfail(&r->fail, line, "%s", msg->s);
}

static jv g_strftime_now(struct jrender *r, int line, jv self, const struct jargs *a)
{
    (void)self;
    static const char *const pn[] = {"format"};
    jv b[1];
    jbind(r, line, "strftime_now", pn, 1, a, b, NULL);
    struct jstr *fmt = need_str(r, line, b[0], "strftime_now() format");
    time_t now = r->now ? r->now : time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    if (fmt->len == 0)
        return jv_str(r, "", 0);
    char out[1024];
    size_t n = strftime(out, sizeof out, fmt->s, &tm);
    if (n == 0)
        jfail(&r->fail, line, "strftime_now(): the formatted date is empty or too long");
    return jv_str(r, out, n);
}

static const struct jbuiltin globals[] = {
    {"range", g_range},
    {"dict", g_dict},
    {"namespace", g_namespace},
    {"joiner", g_joiner},
    {"raise_exception", g_raise_exception},
    {"strftime_now", g_strftime_now},
    {NULL, NULL},
};

const struct jbuiltin *jglobal_find(const char *name) { return jbuiltin_find(globals, name); }
