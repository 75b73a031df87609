/* jinja_filters.c - Jinja2's built-in filters and tests with their 3.1
 * semantics (generators where Jinja2 returns generators, case-insensitive
 * sort/unique by default, attribute paths like "a.b.0"), plus transformers'
 * tojson (json.dumps with ensure_ascii=False). */
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja_internal.h"

#define P(...) static const char *const pn[] = {__VA_ARGS__}
#define BIND(fname, np)                                                                            \
    jv b[np];                                                                                      \
    jbind(r, line, fname, pn, np, a, b, NULL)

static jv arg_or(const jv *b, int i, jv dflt) { return b[i].k == JV_MISSING ? dflt : b[i]; }
static bool flag(const jv *b, int i) { return b[i].k != JV_MISSING && jv_truthy(b[i]); }
static struct jstr *soft_str(struct jrender *r, jv v) { return jv_to_str(r, v); }

/* ---- attribute paths ("user.name", "0") looked up with getitem rules ---- */

static jv attr_path(struct jrender *r, int line, jv item, jv attribute, const jv *dflt)
{
    if (attribute.k == JV_NONE || attribute.k == JV_MISSING)
        return item;
    if (attribute.k != JV_STR)
        return jgetitem(r, line, item, attribute);
    const char *p = attribute.u.s->s, *end = p + attribute.u.s->len;
    for (;;) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        const char *q = dot ? dot : end;
        bool digits = q > p;
        for (const char *d = p; d < q; d++)
            digits &= *d >= '0' && *d <= '9';
        jv key = digits ? jv_int(strtoll(p, NULL, 10)) : jv_str(r, p, (size_t)(q - p));
        item = jgetitem(r, line, item, key);
        if (dflt && item.k == JV_UNDEF)
            item = *dflt;
        if (!dot)
            break;
        p = dot + 1;
    }
    return item;
}

/* Jinja2's generator filters (select, map, items, unique, batch...) do
 * nothing until consumed: for an input they cannot iterate they return a
 * generator that fails only when something reads it. */
static bool iterable(jv v)
{
    return v.k == JV_STR || v.k == JV_LIST || v.k == JV_DICT || v.k == JV_UNDEF || v.k == JV_LOOP;
}

static jv poisoned(struct jrender *r, const char *fmt, const char *type)
{
    struct jlist *l = jl_new(r, JL_ITER, 0);
    char *msg = ja_alloc(&r->arena, strlen(fmt) + strlen(type) + 1);
    sprintf(msg, fmt, type);
    l->poison = msg;
    return jv_l(l);
}

static jv not_iterable(struct jrender *r, jv v)
{
    return poisoned(r, "'%s' object is not iterable", jv_type_name(v));
}

/* The error just caught, without its "template line N: " prefix. */
static const char *caught(struct jrender *r)
{
    const char *m = r->err.msg;
    if (!strncmp(m, "template line ", 14) && strstr(m, ": "))
        m = strstr(m, ": ") + 2;
    else if (!strncmp(m, "template: ", 10))
        m += 10;
    char *copy = ja_alloc(&r->arena, strlen(m) + 1);
    strcpy(copy, m);
    return copy;
}

/* Runs a generator filter's loop; an error inside becomes the poison of the
 * items made so far, raised when the generator is read past them. */
#define LAZY_LOOP(r, out, ...)                                                                     \
    do {                                                                                           \
        jmp_buf here_;                                                                             \
        jmp_buf *volatile outer_ = (r)->fail.jb;                                                   \
        int depth_ = (r)->depth, edepth_ = (r)->edepth, folding_ = (r)->folding;                   \
        (r)->fail.jb = &here_;                                                                     \
        if (setjmp(here_) == 0) {                                                                  \
            __VA_ARGS__;                                                                           \
            (r)->fail.jb = outer_;                                                                 \
        } else {                                                                                   \
            (r)->fail.jb = outer_;                                                                 \
            (r)->depth = depth_;                                                                   \
            (r)->edepth = edepth_;                                                                 \
            (r)->folding = folding_;                                                               \
            (out)->poison = caught(r);                                                             \
        }                                                                                          \
    } while (0)

static jv lower_if_str(struct jrender *r, jv v)
{
    return v.k == JV_STR ? jv_s(jpy_case(r, v.u.s, 0)) : v;
}

/* ---- string filters ---- */

static jv f_trim(struct jrender *r, int line, jv v, const struct jargs *a)
{
    P("chars");
    BIND("trim", 1);
    struct jstr *chars = NULL;
    if (b[0].k != JV_MISSING && b[0].k != JV_NONE)
        chars = soft_str(r, b[0]);
    return jv_s(jpy_strip(r, soft_str(r, v), chars, true, true));
}

static jv case_filter(struct jrender *r, int line, jv v, const struct jargs *a, int mode)
{
    jbind(r, line, "filter", NULL, 0, a, NULL, NULL);
    return jv_s(jpy_case(r, soft_str(r, v), mode));
}
static jv f_lower(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return case_filter(r, line, v, a, 0);
}
static jv f_upper(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return case_filter(r, line, v, a, 1);
}
static jv f_capitalize(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return case_filter(r, line, v, a, 2);
}
static jv f_title(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return case_filter(r, line, v, a, 5);
}

static jv f_replace(struct jrender *r, int line, jv v, const struct jargs *a)
{
    P("old", "new", "count");
    BIND("replace", 3);
    if (b[0].k == JV_MISSING || b[1].k == JV_MISSING)
        jfail(&r->fail, line, "replace() needs the old and the new string");
    int64_t count = -1;
    if (b[2].k != JV_MISSING && b[2].k != JV_NONE)
        count = jpy_int_arg(r, line, b[2], "replace");
    return jv_s(jpy_replace(r, line, soft_str(r, v), soft_str(r, b[0]), soft_str(r, b[1]), count));
}

static jv f_string(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "string", NULL, 0, a, NULL, NULL);
    return jv_s(soft_str(r, v));
}

static jv f_escape(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "escape", NULL, 0, a, NULL, NULL);
    struct jstr *s = soft_str(r, v);
    struct jbuf o;
    jb_init(&o, r);
    for (size_t i = 0; i < s->len; i++) {
        switch (s->s[i]) {
        case '&': jb_adds(&o, "&amp;"); break;
        case '<': jb_adds(&o, "&lt;"); break;
        case '>': jb_adds(&o, "&gt;"); break;
        case '"': jb_adds(&o, "&#34;"); break;
        case '\'': jb_adds(&o, "&#39;"); break;
        default: jb_addc(&o, s->s[i]);
        }
    }
    return jv_s(jb_str(&o));
}

static jv f_indent(struct jrender *r, int line, jv v, const struct jargs *a)
{
    P("width", "first", "blank");
    BIND("indent", 3);
    if (v.k == JV_UNDEF) /* Jinja2 appends "\n" to the value before anything else */
        jv_undef_fail(r, line, v);
    if (v.k != JV_STR)
        jfail(&r->fail, line, "unsupported operand type(s) for +=: '%s' and 'str'",
              jv_type_name(v));
    struct jstr *s = v.u.s, *ind;
    jv w = arg_or(b, 0, jv_int(4));
    if (w.k == JV_STR) {
        ind = w.u.s;
    } else {
        int64_t n = jpy_int_arg(r, line, w, "indent width");
        if (n > 10000)
            jfail(&r->fail, line, "indent width too large");
        ind = js_alloc(&r->arena, n > 0 ? (size_t)n : 0);
        if (n > 0)
            memset(ind->s, ' ', (size_t)n);
    }
    /* s + "\n", split into lines the way str.splitlines() does */
    struct jstr *t = js_alloc(&r->arena, s->len + 1);
    memcpy(t->s, s->s, s->len);
    t->s[s->len] = '\n';
    struct jargs none = {0};
    bool unsafe;
    const struct jbuiltin *sl = jmethod_find(jv_s(t), "splitlines", &unsafe);
    struct jlist *lines = sl->fn(r, line, jv_s(t), &none).u.l;
    struct jbuf o;
    jb_init(&o, r);
    bool blank = flag(b, 2);
    for (size_t i = 0; i < lines->n; i++) {
        struct jstr *ln = lines->v[i].u.s;
        if (i) {
            jb_addc(&o, '\n');
            if (blank || ln->len)
                jb_add(&o, ind->s, ind->len);
        }
        jb_add(&o, ln->s, ln->len);
    }
    struct jstr *res = jb_str(&o);
    if (flag(b, 1)) {
        struct jstr *x = js_alloc(&r->arena, ind->len + res->len);
        memcpy(x->s, ind->s, ind->len);
        memcpy(x->s + ind->len, res->s, res->len);
        res = x;
    }
    return jv_s(res);
}

static jv f_wordcount(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "wordcount", NULL, 0, a, NULL, NULL);
    struct jstr *s = soft_str(r, v);
    const char *p = s->s, *end = s->s + s->len;
    int64_t n = 0;
    bool in = false;
    while (p < end) {
        uint32_t c;
        p += ju_decode(p, end, &c);
        bool w = c == '_' || ju_isalnum(c);
        if (w && !in)
            n++;
        in = w;
    }
    return jv_int(n);
}

static jv f_center(struct jrender *r, int line, jv v, const struct jargs *a)
{
    P("width");
    BIND("center", 1);

    struct jargs ma = {.npos = 1, .pos = b};
    if (b[0].k == JV_MISSING)
        b[0] = jv_int(80);
    bool unsafe;
    jv s = jv_s(soft_str(r, v));
    return jmethod_find(s, "center", &unsafe)->fn(r, line, s, &ma);
}

static jv f_truncate(struct jrender *r, int line, jv v, const struct jargs *a)
{
    P("length", "killwords", "end", "leeway");
    BIND("truncate", 4);
    int64_t length = jpy_int_arg(r, line, arg_or(b, 0, jv_int(255)), "truncate length");
    struct jstr *endm = b[2].k == JV_MISSING ? js_lit(&r->arena, "...") : soft_str(r, b[2]);
    int64_t leeway = b[3].k == JV_MISSING || b[3].k == JV_NONE
                         ? 5
                         : jpy_int_arg(r, line, b[3], "truncate leeway");
    int64_t elen = js_ncp(endm);
    if (length < elen)
        jfail(&r->fail, line, "expected length >= %lld, got %lld", (long long)elen,
              (long long)length);
    if (leeway < 0)
        jfail(&r->fail, line, "expected leeway >= 0, got %lld", (long long)leeway);
    if (jv_len(r, line, v) <= length + leeway)
        return v; /* returned as it is, not converted */
    if (v.k != JV_STR)
        jfail(&r->fail, line, "truncate needs a string, not %s", jv_type_name(v));
    struct jstr *s = v.u.s;
    size_t cut = js_offset(s, length - elen);
    struct jbuf o;
    jb_init(&o, r);
    if (flag(b, 1)) {
        jb_add(&o, s->s, cut);
    } else {
        /* s[:length - len(end)].rsplit(" ", 1)[0] */
        size_t k = cut;
        while (k > 0 && s->s[k - 1] != ' ')
            k--;
        jb_add(&o, s->s, k > 0 ? k - 1 : cut);
    }
    jb_add(&o, endm->s, endm->len);
    return jv_s(jb_str(&o));
}

static jv f_format(struct jrender *r, int line, jv v, const struct jargs *a)
{
    if (a->npos && a->nkw)
        jfail(&r->fail, line, "can't handle positional and keyword arguments at the same time");
    jv args;
    if (a->nkw) {
        struct jdict *d = jd_new(r, (size_t)a->nkw);
        for (int i = 0; i < a->nkw; i++)
            jd_set(r, d, jv_s(a->kwn[i]), a->kwv[i]);
        args = jv_d(d);
    } else {
        struct jlist *t = jl_new(r, JL_TUPLE, (size_t)a->npos);
        for (int i = 0; i < a->npos; i++)
            t->v[t->n++] = a->pos[i];
        args = jv_l(t);
    }
    return jpy_percent(r, line, soft_str(r, v), args);
}

/* ---- tojson: transformers' json.dumps(x, ensure_ascii=False, ...) ---- */

static jv f_tojson(struct jrender *r, int line, jv v, const struct jargs *a)
{
    P("ensure_ascii", "indent", "separators", "sort_keys");
    BIND("tojson", 4);
    struct jtojson o = {0};
    o.ensure_ascii = flag(b, 0);
    o.sort_keys = flag(b, 3);
    jv ind = b[1];
    if (ind.k == JV_STR) {
        o.indent = ind.u.s->s;
    } else if (ind.k == JV_INT || ind.k == JV_BOOL) {
        int64_t n = ind.k == JV_BOOL ? ind.u.b : ind.u.i;
        if (n > 1000)
            jfail(&r->fail, line, "tojson indent too large");
        char *sp = ja_alloc(&r->arena, (size_t)(n > 0 ? n : 0) + 1);
        if (n > 0)
            memset(sp, ' ', (size_t)n);
        o.indent = sp;
    } else if (ind.k != JV_MISSING && ind.k != JV_NONE) {
        jfail(&r->fail, line, "tojson indent must be an int or a string, not %s",
              jv_type_name(ind));
    }
    o.item_sep = o.indent ? "," : ", ";
    o.key_sep = ": ";
    if (b[2].k != JV_MISSING && b[2].k != JV_NONE) {
        jv *it;
        size_t n;
        jv_iterate(r, line, b[2], &it, &n);
        if (n != 2 || it[0].k != JV_STR || it[1].k != JV_STR)
            jfail(&r->fail, line, "tojson separators must be two strings");
        o.item_sep = it[0].u.s->s;
        o.key_sep = it[1].u.s->s;
    }
    struct jbuf out;
    jb_init(&out, r);
    jv_write_json(r, line, v, &o, &out);
    return jv_s(jb_str(&out));
}

/* ---- sequences ---- */

static jv f_length(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "length", NULL, 0, a, NULL, NULL);
    return jv_int(jv_len(r, line, v));
}

static jv f_list(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "list", NULL, 0, a, NULL, NULL);
    jv *items;
    size_t n;
    jv_iterate(r, line, v, &items, &n);
    struct jlist *l = jl_new(r, JL_LIST, n);
    if (n)
        memcpy(l->v, items, n * sizeof(jv));
    l->n = n;
    return jv_l(l);
}

static jv f_join(struct jrender *r, int line, jv v, const struct jargs *a)
{
    P("d", "attribute");
    BIND("join", 2);
    jv *items;
    size_t n;
    jv_iterate(r, line, v, &items, &n);
    struct jstr *sep = b[0].k == JV_MISSING ? js_lit(&r->arena, "") : soft_str(r, b[0]);
    struct jbuf o;
    jb_init(&o, r);
    for (size_t i = 0; i < n; i++) {
        jstep(r, line);
        if (i)
            jb_add(&o, sep->s, sep->len);
        jv item = b[1].k == JV_MISSING || b[1].k == JV_NONE
                      ? items[i]
                      : attr_path(r, line, items[i], b[1], NULL);
        jv_write_str(r, item, &o);
    }
    return jv_s(jb_str(&o));
}

static jv f_first(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "first", NULL, 0, a, NULL, NULL);
    if (v.k == JV_LIST && v.u.l->kind == JL_ITER) {
        struct jlist *l = v.u.l;
        if (l->pos < l->n)
            return l->v[l->pos++];
        jv_check_poison(r, line, v);
        return jv_undef_hint(r, "No first item, sequence was empty.");
    }
    if (v.k == JV_STR) {
        if (v.u.s->len == 0)
            return jv_undef_hint(r, "No first item, sequence was empty.");
        uint32_t c;
        int k = ju_decode(v.u.s->s, v.u.s->s + v.u.s->len, &c);
        return jv_str(r, v.u.s->s, (size_t)k);
    }
    jv *items;
    size_t n;
    jv_iterate(r, line, v, &items, &n);
    if (n == 0)
        return jv_undef_hint(r, "No first item, sequence was empty.");
    return items[0];
}

static jv f_last(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "last", NULL, 0, a, NULL, NULL);
    if (v.k == JV_LIST && v.u.l->kind == JL_ITER)
        jfail(&r->fail, line, "'generator' object is not reversible");
    if (v.k == JV_STR) {
        struct jstr *s = v.u.s;
        if (s->len == 0)
            return jv_undef_hint(r, "No last item, sequence was empty.");
        size_t k = s->len - 1;
        while (k > 0 && ((unsigned char)s->s[k] & 0xc0) == 0x80)
            k--;
        return jv_str(r, s->s + k, s->len - k);
    }
    if (v.k != JV_LIST && v.k != JV_DICT && v.k != JV_UNDEF)
        jfail(&r->fail, line, "'%s' object is not reversible", jv_type_name(v));
    jv *items;
    size_t n;
    jv_iterate(r, line, v, &items, &n);
    if (n == 0)
        return jv_undef_hint(r, "No last item, sequence was empty.");
    return items[n - 1];
}

static jv f_reverse(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "reverse", NULL, 0, a, NULL, NULL);
    if (v.k == JV_STR) {
        struct jstr *s = v.u.s, *o = js_alloc(&r->arena, s->len);
        const char *p = s->s, *end = s->s + s->len;
        char *w = o->s + s->len;
        while (p < end) {
            uint32_t c;
            int k = ju_decode(p, end, &c);
            w -= k;
            memcpy(w, p, (size_t)k);
            p += k;
        }
        return jv_s(o);
    }
    bool gen = v.k == JV_LIST && v.u.l->kind == JL_ITER;
    if (v.k != JV_LIST && v.k != JV_DICT && v.k != JV_UNDEF)
        jfail(&r->fail, line, "argument must be iterable");
    jv *items;
    size_t n;
    jv_iterate(r, line, v, &items, &n);
    /* reversed() gives an iterator; a generator becomes a reversed list */
    struct jlist *l = jl_new(r, gen ? JL_LIST : JL_ITER, n);
    for (size_t i = 0; i < n; i++)
        l->v[i] = items[n - 1 - i];
    l->n = n;
    return jv_l(l);
}

static jv f_items(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "items", NULL, 0, a, NULL, NULL);
    if (v.k == JV_UNDEF)
        return jv_l(jl_new(r, JL_ITER, 0));
    if (v.k != JV_DICT)
        return poisoned(r, "Can only get item pairs from a mapping.%s", "");
    const struct jdict *d = v.u.d;
    struct jlist *l = jl_new(r, JL_ITER, d->n);
    for (size_t i = 0; i < d->n; i++) {
        struct jlist *t = jl_new(r, JL_TUPLE, 2);
        t->v[0] = d->k[i];
        t->v[1] = d->v[i];
        t->n = 2;
        l->v[l->n++] = jv_l(t);
    }
    return jv_l(l);
}

static jv f_dictsort(struct jrender *r, int line, jv v, const struct jargs *a);
static jv f_sort(struct jrender *r, int line, jv v, const struct jargs *a);

static jv f_default(struct jrender *r, int line, jv v, const struct jargs *a)
{
    P("default_value", "boolean");
    BIND("default", 2);
    if (v.k == JV_UNDEF || (flag(b, 1) && !jv_truthy(v)))
        return arg_or(b, 0, jv_str(r, "", 0));
    return v;
}

static jv f_safe(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "safe", NULL, 0, a, NULL, NULL);
    return jv_s(soft_str(r, v));
}

/* select / reject / selectattr / rejectattr */
static jv select_impl(struct jrender *r, int line, jv v, const struct jargs *a, bool attr,
                      bool keep)
{
    struct jlist *out = jl_new(r, JL_ITER, 0);
    if (!jv_truthy(v))
        return jv_l(out);
    if (!iterable(v))
        return not_iterable(r, v);
    int off = 0;
    jv attribute = jv_none();
    if (attr) {
        if (a->npos < 1)
            jfail(&r->fail, line, "Missing parameter for attribute name");
        attribute = a->pos[0];
        off = 1;
    }
    const char *test = NULL;
    if (a->npos > off) {
        if (a->pos[off].k != JV_STR)
            jfail(&r->fail, line, "the test name must be a string");
        test = a->pos[off].u.s->s;
    }
    struct jargs rest = {.npos = test ? a->npos - off - 1 : 0,
                         .pos = a->pos + off + 1,
                         .nkw = a->nkw,
                         .kwn = a->kwn,
                         .kwv = a->kwv};
    LAZY_LOOP(r, out, {
        jv *items;
        size_t n;
        jv_iterate(r, line, v, &items, &n);
        for (size_t i = 0; i < n; i++) {
            jstep(r, line);
            jv x = attr ? attr_path(r, line, items[i], attribute, NULL) : items[i];
            bool t = test ? jcall_test(r, line, test, x, &rest) : jv_truthy(x);
            if (t == keep)
                jl_push(r, out, items[i]);
        }
    });
    return jv_l(out);
}
static jv f_select(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return select_impl(r, line, v, a, false, true);
}
static jv f_reject(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return select_impl(r, line, v, a, false, false);
}
static jv f_selectattr(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return select_impl(r, line, v, a, true, true);
}
static jv f_rejectattr(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return select_impl(r, line, v, a, true, false);
}

static jv f_map(struct jrender *r, int line, jv v, const struct jargs *a)
{
    struct jlist *out = jl_new(r, JL_ITER, 0);
    if (!jv_truthy(v))
        return jv_l(out);
    if (!iterable(v))
        return not_iterable(r, v);
    jv *items;
    size_t n;
    bool by_attr = a->npos == 0;
    jv attribute = jv_none(), dflt = jv_none();
    bool has_dflt = false;
    const char *filter = NULL;
    struct jargs rest = {0};
    if (by_attr) {
        bool have_attr = false;
        for (int k = 0; k < a->nkw; k++) {
            if (js_eq(a->kwn[k], "attribute")) {
                attribute = a->kwv[k];
                have_attr = true;
            } else if (js_eq(a->kwn[k], "default")) {
                dflt = a->kwv[k];
                has_dflt = dflt.k != JV_NONE;
            } else {
                jfail(&r->fail, line, "Unexpected keyword argument '%s'", a->kwn[k]->s);
            }
        }
        if (!have_attr)
            jfail(&r->fail, line, "map requires a filter argument");
    } else {
        if (a->pos[0].k != JV_STR)
            jfail(&r->fail, line, "the filter name must be a string");
        filter = a->pos[0].u.s->s;
        rest.npos = a->npos - 1;
        rest.pos = a->pos + 1;
        rest.nkw = a->nkw;
        rest.kwn = a->kwn;
        rest.kwv = a->kwv;
    }
    LAZY_LOOP(r, out, {
        jv_iterate(r, line, v, &items, &n);
        for (size_t i = 0; i < n; i++) {
            jstep(r, line);
            jl_push(r, out,
                    filter ? jcall_filter(r, line, filter, items[i], &rest)
                           : attr_path(r, line, items[i], attribute, has_dflt ? &dflt : NULL));
        }
    });
    return jv_l(out);
}

static jv f_unique(struct jrender *r, int line, jv v, const struct jargs *a)
{
    P("case_sensitive", "attribute");
    BIND("unique", 2);
    if (!iterable(v))
        return not_iterable(r, v);
    struct jlist *out = jl_new(r, JL_ITER, 0), *seen = jl_new(r, JL_LIST, 0);
    bool cs = flag(b, 0);
    LAZY_LOOP(r, out, {
        jv *items;
        size_t n;
        jv_iterate(r, line, v, &items, &n);
        for (size_t i = 0; i < n; i++) {
            jv key = attr_path(r, line, items[i], b[1], NULL);
            if (!cs)
                key = lower_if_str(r, key);
            if (!jv_hashable(key))
                jfail(&r->fail, line, "unhashable type: '%s'", jv_type_name(key));
            bool dup = false;
            for (size_t k = 0; k < seen->n && !dup; k++) {
                jstep(r, line);
                dup = jv_eq(r, seen->v[k], key);
            }
            if (!dup) {
                jl_push(r, seen, key);
                jl_push(r, out, items[i]);
            }
        }
    });
    return jv_l(out);
}

/* Stable merge sort of idx[] by keys[] (Python's sorted with key=). */
struct sorter {
    struct jrender *r;
    int line;
    jv *keys;
    bool reverse;
};

static bool sort_before(struct sorter *s, size_t x, size_t y)
{
    jstep(s->r, s->line);
    /* Jinja2's keys are one-item lists: equal items (even two Undefined)
     * compare equal before "<" is tried */
    if (jv_eq(s->r, s->keys[x], s->keys[y]))
        return false;
    int c = s->reverse ? jv_cmp(s->r, s->line, "<", s->keys[y], s->keys[x])
                       : jv_cmp(s->r, s->line, "<", s->keys[x], s->keys[y]);
    return c < 0;
}

static void merge_sort(struct sorter *s, size_t *idx, size_t *tmp, size_t n)
{
    if (n < 2)
        return;
    size_t h = n / 2;
    merge_sort(s, idx, tmp, h);
    merge_sort(s, idx + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        /* take from the right only when strictly smaller: stable */
        if (sort_before(s, idx[j], idx[i]))
            tmp[k++] = idx[j++];
        else
            tmp[k++] = idx[i++];
    }
    while (i < h)
        tmp[k++] = idx[i++];
    while (j < n)
        tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
}

static jv sorted(struct jrender *r, int line, jv *items, size_t n, jv *keys, bool reverse, int kind)
{
    size_t *idx = ja_alloc_raw(&r->arena, (n ? n : 1) * sizeof *idx);
    size_t *tmp = ja_alloc_raw(&r->arena, (n ? n : 1) * sizeof *tmp);
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    struct sorter s = {r, line, keys, reverse};
    merge_sort(&s, idx, tmp, n);
    struct jlist *l = jl_new(r, kind, n);
    for (size_t i = 0; i < n; i++)
        l->v[i] = items[idx[i]];
    l->n = n;
    return jv_l(l);
}

static jv multi_key(struct jrender *r, int line, jv item, jv attribute, bool cs)
{
    /* "a,b" sorts by a list of attributes */
    if (attribute.k == JV_STR && memchr(attribute.u.s->s, ',', attribute.u.s->len)) {
        struct jlist *l = jl_new(r, JL_LIST, 0);
        const char *p = attribute.u.s->s, *end = p + attribute.u.s->len;
        for (;;) {
            const char *c = memchr(p, ',', (size_t)(end - p));
            const char *q = c ? c : end;
            jv k = attr_path(r, line, item, jv_str(r, p, (size_t)(q - p)), NULL);
            jl_push(r, l, cs ? k : lower_if_str(r, k));
            if (!c)
                break;
            p = c + 1;
        }
        return jv_l(l);
    }
    jv k = attr_path(r, line, item, attribute, NULL);
    return cs ? k : lower_if_str(r, k);
}

static jv f_sort(struct jrender *r, int line, jv v, const struct jargs *a)
{
    P("reverse", "case_sensitive", "attribute");
    BIND("sort", 3);
    jv *items;
    size_t n;
    jv_iterate(r, line, v, &items, &n);
    jv *keys = ja_alloc_raw(&r->arena, (n ? n : 1) * sizeof(jv));
    for (size_t i = 0; i < n; i++)
        keys[i] = multi_key(r, line, items[i], b[2], flag(b, 1));
    return sorted(r, line, items, n, keys, flag(b, 0), JL_LIST);
}

static jv f_dictsort(struct jrender *r, int line, jv v, const struct jargs *a)
{
    P("case_sensitive", "by", "reverse");
    BIND("dictsort", 3);
    if (v.k != JV_DICT)
        jfail(&r->fail, line, "dictsort needs a mapping, not %s", jv_type_name(v));
    int pos = 0;
    if (b[1].k != JV_MISSING) {
        struct jstr *by = soft_str(r, b[1]);
        if (js_eq(by, "value"))
            pos = 1;
        else if (!js_eq(by, "key"))
            jfail(&r->fail, line, "You can only sort by either \"key\" or \"value\"");
    }
    const struct jdict *d = v.u.d;
    jv *items = ja_alloc_raw(&r->arena, (d->n ? d->n : 1) * sizeof(jv));
    jv *keys = ja_alloc_raw(&r->arena, (d->n ? d->n : 1) * sizeof(jv));
    for (size_t i = 0; i < d->n; i++) {
        struct jlist *t = jl_new(r, JL_TUPLE, 2);
        t->v[0] = d->k[i];
        t->v[1] = d->v[i];
        t->n = 2;
        items[i] = jv_l(t);
        keys[i] = flag(b, 0) ? t->v[pos] : lower_if_str(r, t->v[pos]);
    }
    return sorted(r, line, items, d->n, keys, flag(b, 2), JL_LIST);
}

static jv min_max(struct jrender *r, int line, jv v, const struct jargs *a, bool max)
{
    P("case_sensitive", "attribute");
    BIND(max ? "max" : "min", 2);
    jv *items;
    size_t n;
    jv_iterate(r, line, v, &items, &n);
    if (n == 0)
        return jv_undef_hint(r, "No aggregated item, sequence was empty.");
    size_t best = 0;
    jv bk = multi_key(r, line, items[0], b[1], flag(b, 0));
    for (size_t i = 1; i < n; i++) {
        jv k = multi_key(r, line, items[i], b[1], flag(b, 0));
        int c = jv_cmp(r, line, max ? ">" : "<", k, bk);
        if (max ? c > 0 && c != 2 : c < 0) {
            best = i;
            bk = k;
        }
    }
    return items[best];
}
static jv f_min(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return min_max(r, line, v, a, false);
}
static jv f_max(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return min_max(r, line, v, a, true);
}

static jv f_sum(struct jrender *r, int line, jv v, const struct jargs *a)
{
    P("attribute", "start");
    BIND("sum", 2);
    jv *items;
    size_t n;
    jv_iterate(r, line, v, &items, &n);
    jv total = arg_or(b, 1, jv_int(0));
    if (total.k == JV_STR)
        jfail(&r->fail, line, "sum() can't sum strings [use ''.join(seq) instead]");
    for (size_t i = 0; i < n; i++) {
        jv x = b[0].k == JV_MISSING || b[0].k == JV_NONE ? items[i]
                                                         : attr_path(r, line, items[i], b[0], NULL);
        total = jbinop(r, line, OP_ADD, total, x);
    }
    return total;
}

static jv chunks(struct jrender *r, int line, jv v, const struct jargs *a, bool slice)
{
    P("count", "fill_with");
    BIND(slice ? "slice" : "batch", 2);
    if (!iterable(v))
        return not_iterable(r, v);
    struct jlist *out = jl_new(r, JL_ITER, 0);
    bool fill = b[1].k != JV_MISSING && b[1].k != JV_NONE;
    LAZY_LOOP(r, out, {
        int64_t count = jpy_int_arg(r, line, b[0], slice ? "slice" : "batch");
        jv *items;
        size_t n;
        jv_iterate(r, line, v, &items, &n);
        if (!slice) {
            if (count <= 0)
                jfail(&r->fail, line, "batch size must be positive");
            for (size_t i = 0; i < n; i += (size_t)count) {
                struct jlist *l = jl_new(r, JL_LIST, (size_t)count);
                for (size_t k = i; k < n && k < i + (size_t)count; k++)
                    l->v[l->n++] = items[k];
                if (fill)
                    while ((int64_t)l->n < count)
                        l->v[l->n++] = b[1];
                jl_push(r, out, jv_l(l));
            }
        } else {
            if (count <= 0)
                jfail(&r->fail, line, "slice count must be positive");
            if (count > 100000)
                jfail(&r->fail, line, "slice count too large");
            size_t per = n / (size_t)count, extra = n % (size_t)count, offset = 0;
            for (size_t s = 0; s < (size_t)count; s++) {
                size_t start = offset + s * per;
                if (s < extra)
                    offset++;
                size_t end = offset + (s + 1) * per;
                struct jlist *l = jl_new(r, JL_LIST, end - start + 1);
                for (size_t k = start; k < end; k++)
                    l->v[l->n++] = items[k];
                if (fill && s >= extra)
                    l->v[l->n++] = b[1];
                jl_push(r, out, jv_l(l));
            }
        }
    });
    return jv_l(out);
}
static jv f_batch(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return chunks(r, line, v, a, false);
}
static jv f_slice(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return chunks(r, line, v, a, true);
}

static jv f_attr(struct jrender *r, int line, jv v, const struct jargs *a)
{
    P("name");
    BIND("attr", 1);
    struct jstr *name = soft_str(r, b[0]);
    if (v.k == JV_UNDEF)
        jv_undef_fail(r, line, v);
    /* attributes only: a dict's keys are not attributes */
    bool unsafe = false;
    bool method = v.k == JV_DICT && (jmethod_find(v, name->s, &unsafe) || unsafe);
    if (v.k == JV_NS || v.k == JV_LOOP || v.k == JV_STR || v.k == JV_LIST || method)
        return jgetattr(r, line, v, name);
    return jv_undef_attr(r, v, jv_s(name));
}

/* ---- numbers ---- */

/* Python float(str): surrounding whitespace, underscores between digits,
 * inf/nan spellings. */
static bool parse_float(const struct jstr *s, double *out)
{
    char buf[128];
    size_t i = 0, n = 0;
    while (i < s->len && (s->s[i] == ' ' || (s->s[i] >= 9 && s->s[i] <= 13)))
        i++;
    size_t end = s->len;
    while (end > i && (s->s[end - 1] == ' ' || (s->s[end - 1] >= 9 && s->s[end - 1] <= 13)))
        end--;
    if (end == i || end - i >= sizeof buf)
        return false;
    for (; i < end; i++) {
        char c = s->s[i];
        if (c == '_') {
            if (!n || !(buf[n - 1] >= '0' && buf[n - 1] <= '9') || i + 1 >= end ||
                !(s->s[i + 1] >= '0' && s->s[i + 1] <= '9'))
                return false;
            continue;
        }
        if (!strchr("0123456789+-.eEinfatyINFATY", c) || !c)
            return false;
        buf[n++] = c;
    }
    buf[n] = 0;
    char *e;
    *out = strtod(buf, &e);
    return *e == 0;
}

static bool parse_int(const struct jstr *s, int64_t base, int64_t *out)
{
    size_t i = 0, end = s->len;
    while (i < end && (s->s[i] == ' ' || (s->s[i] >= 9 && s->s[i] <= 13)))
        i++;
    while (end > i && (s->s[end - 1] == ' ' || (s->s[end - 1] >= 9 && s->s[end - 1] <= 13)))
        end--;
    bool neg = false;
    if (i < end && (s->s[i] == '+' || s->s[i] == '-'))
        neg = s->s[i++] == '-';
    if (base == 0 || base == 16 || base == 8 || base == 2) {
        if (end - i > 2 && s->s[i] == '0') {
            char p = (char)(s->s[i + 1] | 32);
            int64_t b2 = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
            if (b2 && (base == 0 || base == b2)) {
                base = b2;
                i += 2;
                if (i < end && s->s[i] == '_')
                    i++;
            }
        }
        if (base == 0)
            base = 10;
    }
    if (base < 2 || base > 36 || i >= end)
        return false;
    int64_t v = 0;
    for (size_t k = i; k < end; k++) {
        char c = s->s[k];
        if (c == '_' && k > i && k + 1 < end && s->s[k + 1] != '_')
            continue;
        int d = c >= '0' && c <= '9'                 ? c - '0'
                : (c | 32) >= 'a' && (c | 32) <= 'z' ? (c | 32) - 'a' + 10
                                                     : 99;
        if (d >= base)
            return false;
        if (v > (INT64_MAX - d) / base)
            return false;
        v = v * base + d;
    }
    *out = neg ? -v : v;
    return true;
}

static jv f_int(struct jrender *r, int line, jv v, const struct jargs *a)
{
    P("default", "base");
    BIND("int", 2);
    jv dflt = arg_or(b, 0, jv_int(0));
    int64_t base = b[1].k == JV_MISSING ? 10 : jpy_int_arg(r, line, b[1], "int base");
    if (v.k == JV_UNDEF) /* int(Undefined) raises, it is not a ValueError */
        jv_undef_fail(r, line, v);
    int64_t i;
    double f;
    switch (v.k) {
    case JV_INT: return v;
    case JV_BOOL: return jv_int(v.u.b);
    case JV_FLOAT:
        if (!isfinite(v.u.f) || fabs(v.u.f) >= 9.2e18)
            return isnan(v.u.f)
                       ? dflt
                       : (jfail(&r->fail, line, "cannot convert float infinity to integer"), dflt);
        return jv_int((int64_t)v.u.f);
    case JV_STR:
        if (parse_int(v.u.s, base, &i))
            return jv_int(i);
        if (parse_float(v.u.s, &f) && isfinite(f) && fabs(f) < 9.2e18)
            return jv_int((int64_t)f);
        return dflt;
    default: return dflt;
    }
}

static jv f_float(struct jrender *r, int line, jv v, const struct jargs *a)
{
    P("default");
    BIND("float", 1);
    if (v.k == JV_UNDEF)
        jv_undef_fail(r, line, v);
    double f;
    switch (v.k) {
    case JV_FLOAT: return v;
    case JV_INT: return jv_float((double)v.u.i);
    case JV_BOOL: return jv_float(v.u.b);
    case JV_STR:
        if (parse_float(v.u.s, &f))
            return jv_float(f);
        break;
    default: break;
    }
    return arg_or(b, 0, jv_float(0.0));
}

static jv f_abs(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "abs", NULL, 0, a, NULL, NULL);
    if (v.k == JV_FLOAT)
        return jv_float(fabs(v.u.f));
    if (v.k == JV_INT || v.k == JV_BOOL) {
        int64_t i = v.k == JV_BOOL ? v.u.b : v.u.i;
        if (i == INT64_MIN)
            jfail(&r->fail, line, "integer overflow");
        return jv_int(i < 0 ? -i : i);
    }
    if (v.k == JV_UNDEF)
        jv_undef_fail(r, line, v);
    jfail(&r->fail, line, "bad operand type for abs(): '%s'", jv_type_name(v));
}

static jv f_round(struct jrender *r, int line, jv v, const struct jargs *a)
{
    P("precision", "method");
    BIND("round", 2);
    int64_t prec = b[0].k == JV_MISSING ? 0 : jpy_int_arg(r, line, b[0], "round precision");
    const char *method = "common";
    if (b[1].k != JV_MISSING)
        method = soft_str(r, b[1])->s;
    if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
        jfail(&r->fail, line, "method must be common, ceil or floor");
    if (v.k == JV_UNDEF)
        jv_undef_fail(r, line, v);
    if (!jv_is_num(v))
        jfail(&r->fail, line, "type %s doesn't define __round__ method", jv_type_name(v));
    double f = v.k == JV_FLOAT ? v.u.f : (double)(v.k == JV_BOOL ? v.u.b : v.u.i);
    if (!strcmp(method, "common")) {
        if (v.k != JV_FLOAT) { /* round(int, n) stays an int */
            int64_t i = v.k == JV_BOOL ? v.u.b : v.u.i;
            if (prec >= 0)
                return jv_int(i);
            int64_t p10 = 1;
            for (int64_t k = 0; k < -prec && p10 < INT64_MAX / 10; k++)
                p10 *= 10;
            int64_t q = i / p10, rem = i % p10;
            if (rem < 0) {
                rem += p10;
                q--;
            }
            if (rem * 2 > p10 || (rem * 2 == p10 && (q & 1)))
                q++;
            return jv_int(q * p10);
        }
        if (!isfinite(f))
            return jv_float(f);
        if (prec > 300)
            return jv_float(f);
        if (prec >= 0) {
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec,
                     f); /* correctly rounded, half-even on ties */
            return jv_float(strtod(buf, NULL));
        }
        double p10 = pow(10.0, (double)-prec);
        double y = f / p10, z = nearbyint(y);
        return jv_float(z * p10);
    }
    double p10 = pow(10.0, (double)prec);
    double y = !strcmp(method, "ceil") ? ceil(f * p10) : floor(f * p10);
    return jv_float(y / p10);
}

/* ---- the filter table ---- */

static const struct jbuiltin filters[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"batch", f_batch},
    {"capitalize", f_capitalize},
    {"center", f_center},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"e", f_escape},
    {"escape", f_escape},
    {"first", f_first},
    {"float", f_float},
    {"forceescape", f_escape},
    {"format", f_format},
    {"indent", f_indent},
    {"int", f_int},
    {"items", f_items},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"map", f_map},
    {"max", f_max},
    {"min", f_min},
    {"reject", f_reject},
    {"rejectattr", f_rejectattr},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_select},
    {"selectattr", f_selectattr},
    {"slice", f_slice},
    {"sort", f_sort},
    {"string", f_string},
    {"sum", f_sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"truncate", f_truncate},
    {"unique", f_unique},
    {"upper", f_upper},
    {"wordcount", f_wordcount},
    {NULL, NULL},
};

const struct jbuiltin *jfilter_find(const char *name) { return jbuiltin_find(filters, name); }

jv jcall_filter(struct jrender *r, int line, const char *name, jv v, const struct jargs *a)
{
    const struct jbuiltin *f = jfilter_find(name);
    if (!f)
        jfail(&r->fail, line, "No filter named '%s'.", name);
    return f->fn(r, line, v, a);
}

/* ---- tests ---- */

static jv t_defined(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "defined", NULL, 0, a, NULL, NULL);
    return jv_bool(v.k != JV_UNDEF);
}
static jv t_undefined(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "undefined", NULL, 0, a, NULL, NULL);
    return jv_bool(v.k == JV_UNDEF);
}
static jv t_none(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "none", NULL, 0, a, NULL, NULL);
    return jv_bool(v.k == JV_NONE);
}
static jv t_boolean(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "boolean", NULL, 0, a, NULL, NULL);
    return jv_bool(v.k == JV_BOOL);
}
static jv t_true(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "true", NULL, 0, a, NULL, NULL);
    return jv_bool(v.k == JV_BOOL && v.u.b);
}
static jv t_false(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "false", NULL, 0, a, NULL, NULL);
    return jv_bool(v.k == JV_BOOL && !v.u.b);
}
static jv t_integer(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "integer", NULL, 0, a, NULL, NULL);
    return jv_bool(v.k == JV_INT);
}
static jv t_float(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "float", NULL, 0, a, NULL, NULL);
    return jv_bool(v.k == JV_FLOAT);
}
static jv t_number(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "number", NULL, 0, a, NULL, NULL);
    return jv_bool(jv_is_num(v));
}
static jv t_string(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "string", NULL, 0, a, NULL, NULL);
    return jv_bool(v.k == JV_STR);
}
static jv t_mapping(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "mapping", NULL, 0, a, NULL, NULL);
    return jv_bool(v.k == JV_DICT);
}
static jv t_iterable(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "iterable", NULL, 0, a, NULL, NULL);
    return jv_bool(v.k == JV_STR || v.k == JV_LIST || v.k == JV_DICT || v.k == JV_UNDEF ||
                   v.k == JV_LOOP);
}
static jv t_sequence(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "sequence", NULL, 0, a, NULL, NULL);
    bool seq = v.k == JV_STR || v.k == JV_DICT || v.k == JV_UNDEF ||
               (v.k == JV_LIST &&
                (v.u.l->kind == JL_LIST || v.u.l->kind == JL_TUPLE || v.u.l->kind == JL_RANGE));
    return jv_bool(seq);
}
static jv t_callable(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "callable", NULL, 0, a, NULL, NULL);
    return jv_bool(v.k == JV_FUNC || v.k == JV_LOOP || v.k == JV_UNDEF);
}
static jv t_escaped(struct jrender *r, int line, jv v, const struct jargs *a)
{
    (void)v;
    jbind(r, line, "escaped", NULL, 0, a, NULL, NULL);
    return jv_bool(false);
}

static jv case_test(struct jrender *r, int line, jv v, const struct jargs *a, const char *m)
{
    jbind(r, line, m, NULL, 0, a, NULL, NULL);
    bool unsafe;
    jv s = jv_s(soft_str(r, v));
    struct jargs none = {0};
    return jmethod_find(s, m, &unsafe)->fn(r, line, s, &none);
}
static jv t_lower(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return case_test(r, line, v, a, "islower");
}
static jv t_upper(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return case_test(r, line, v, a, "isupper");
}

static jv one_arg(struct jrender *r, int line, const struct jargs *a, const char *name)
{
    P("other");
    BIND(name, 1);
    if (b[0].k == JV_MISSING)
        jfail(&r->fail, line, "%s() missing 1 required positional argument", name);
    return b[0];
}

static jv t_odd(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "odd", NULL, 0, a, NULL, NULL);
    return jv_bool(jv_eq(r, jbinop(r, line, OP_MOD, v, jv_int(2)), jv_int(1)));
}
static jv t_even(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "even", NULL, 0, a, NULL, NULL);
    return jv_bool(jv_eq(r, jbinop(r, line, OP_MOD, v, jv_int(2)), jv_int(0)));
}
static jv t_divisibleby(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jv n = one_arg(r, line, a, "divisibleby");
    return jv_bool(jv_eq(r, jbinop(r, line, OP_MOD, v, n), jv_int(0)));
}
static jv t_sameas(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jv o = one_arg(r, line, a, "sameas");
    if (v.k != o.k)
        return jv_bool(false);
    switch (v.k) {
    case JV_NONE: return jv_bool(true);
    case JV_BOOL: return jv_bool(v.u.b == o.u.b);
    case JV_INT:
        return jv_bool(v.u.i == o.u.i && v.u.i >= -5 && v.u.i <= 256); /* small-int cache */
    case JV_FLOAT: return jv_bool(false);
    case JV_STR: return jv_bool(v.u.s == o.u.s);
    case JV_LIST: return jv_bool(v.u.l == o.u.l);
    case JV_DICT:
    case JV_NS: return jv_bool(v.u.d == o.u.d);
    case JV_FUNC: return jv_bool(v.u.fn == o.u.fn);
    case JV_LOOP: return jv_bool(v.u.loop == o.u.loop);
    default: return jv_bool(false);
    }
}

static jv cmp_test(struct jrender *r, int line, jv v, const struct jargs *a, int op,
                   const char *name)
{
    jv o = one_arg(r, line, a, name);
    if (op == OP_IN) {
        /* "x is in seq" is "x in seq" */
        if (o.k == JV_STR) {
            if (v.k != JV_STR)
                jfail(&r->fail, line, "'in <string>' requires string as left operand, not %s",
                      jv_type_name(v));
            return jv_bool(v.u.s->len == 0 || memmem(o.u.s->s, o.u.s->len, v.u.s->s, v.u.s->len));
        }
        if (o.k == JV_DICT)
            return jv_bool(jv_hashable(v) && jd_get(r, o.u.d, v, NULL));
        if (o.k == JV_UNDEF)
            return jv_bool(false);
        if (o.k != JV_LIST)
            jfail(&r->fail, line, "argument of type '%s' is not iterable", jv_type_name(o));
        for (size_t i = o.u.l->kind == JL_ITER ? o.u.l->pos : 0; i < o.u.l->n; i++)
            if (jv_eq(r, o.u.l->v[i], v))
                return jv_bool(true);
        jv_check_poison(r, line, o);
        return jv_bool(false);
    }
    if (op == OP_EQ)
        return jv_bool(jv_eq(r, v, o));
    if (op == OP_NE)
        return jv_bool(!jv_eq(r, v, o));
    int c = jv_cmp(r, line, jop_text(op), v, o);
    if (c == 2)
        return jv_bool(false);
    switch (op) {
    case OP_LT: return jv_bool(c < 0);
    case OP_LTEQ: return jv_bool(c <= 0);
    case OP_GT: return jv_bool(c > 0);
    default: return jv_bool(c >= 0);
    }
}
static jv t_in(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return cmp_test(r, line, v, a, OP_IN, "in");
}
static jv t_eq(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return cmp_test(r, line, v, a, OP_EQ, "eq");
}
static jv t_ne(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return cmp_test(r, line, v, a, OP_NE, "ne");
}
static jv t_lt(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return cmp_test(r, line, v, a, OP_LT, "lt");
}
static jv t_le(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return cmp_test(r, line, v, a, OP_LTEQ, "le");
}
static jv t_gt(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return cmp_test(r, line, v, a, OP_GT, "gt");
}
static jv t_ge(struct jrender *r, int line, jv v, const struct jargs *a)
{
    return cmp_test(r, line, v, a, OP_GTEQ, "ge");
}

static jv t_filter(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "filter", NULL, 0, a, NULL, NULL);
    return jv_bool(v.k == JV_STR && jfilter_find(v.u.s->s));
}
static jv t_test(struct jrender *r, int line, jv v, const struct jargs *a)
{
    jbind(r, line, "test", NULL, 0, a, NULL, NULL);
    return jv_bool(v.k == JV_STR && jtest_find(v.u.s->s));
}

static const struct jbuiltin tests[] = {
    {"odd", t_odd},
    {"even", t_even},
    {"divisibleby", t_divisibleby},
    {"defined", t_defined},
    {"undefined", t_undefined},
    {"filter", t_filter},
    {"test", t_test},
    {"none", t_none},
    {"boolean", t_boolean},
    {"false", t_false},
    {"true", t_true},
    {"integer", t_integer},
    {"float", t_float},
    {"lower", t_lower},
    {"upper", t_upper},
    {"string", t_string},
    {"mapping", t_mapping},
    {"number", t_number},
    {"sequence", t_sequence},
    {"iterable", t_iterable},
    {"callable", t_callable},
    {"sameas", t_sameas},
    {"escaped", t_escaped},
    {"in", t_in},
    {"==", t_eq},
    {"eq", t_eq},
    {"equalto", t_eq},
    {"!=", t_ne},
    {"ne", t_ne},
    {">", t_gt},
    {"gt", t_gt},
    {"greaterthan", t_gt},
    {"ge", t_ge},
    {">=", t_ge},
    {"<", t_lt},
    {"lt", t_lt},
    {"lessthan", t_lt},
    {"<=", t_le},
    {"le", t_le},
    {NULL, NULL},
};

const struct jbuiltin *jtest_find(const char *name) { return jbuiltin_find(tests, name); }

bool jcall_test(struct jrender *r, int line, const char *name, jv v, const struct jargs *a)
{
    const struct jbuiltin *t = jtest_find(name);
    if (!t)
        jfail(&r->fail, line, "No test named '%s'.", name);
    return jv_truthy(t->fn(r, line, v, a));
}
