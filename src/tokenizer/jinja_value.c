/* jinja_value.c - the Jinja interpreter's data layer: the arena and error
 * jump, strings and UTF-8, Python's notions of whitespace, case and
 * printable characters, lists and insertion-ordered dicts, and the Python
 * semantics of values: truthiness, ==, <, str(), repr(), json.dumps(). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer/jinja_internal.h"

/* ---- errors ---- */

_Noreturn void jfail(struct jfail *f, int line, const char *fmt, ...)
{
    char msg[sizeof f->e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line <= 0)
        line = f->line;
    if (f->e) {
        if (line > 0)
            err_set(f->e, "template line %d: %s", line, msg);
        else
            err_set(f->e, "template: %s", msg);
    }
    longjmp(*f->jb, 1);
}

/* ---- arena ---- */

#define JA_BLOCK (64 * 1024)

struct jblock {
    struct jblock *next;
    size_t size;
    _Alignas(16) char data[];
};

static void ja_oom(struct jarena *a)
{
    if (a->limit && a->used > a->limit)
        jfail(a->fail, 0, "rendering needs more than %zu MiB of memory", a->limit >> 20);
    jfail(a->fail, 0, "out of memory");
}

static struct jblock *ja_block(struct jarena *a, size_t size)
{
    if (size > SIZE_MAX / 2 || (a->limit && a->used + size > a->limit)) {
        a->used += size > SIZE_MAX / 2 ? SIZE_MAX / 2 : size;
        ja_oom(a);
    }
    struct jblock *b = malloc(sizeof *b + size);
    if (!b)
        ja_oom(a);
    a->used += size;
    b->size = size;
    return b;
}

void *ja_alloc_raw(struct jarena *a, size_t n)
{
    if (n > SIZE_MAX / 2) {
        a->used = SIZE_MAX / 2;
        ja_oom(a);
    }
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    if (n <= a->left) {
        void *p = a->cur;
        a->cur += n;
        a->left -= n;
        return p;
    }
    if (n > JA_BLOCK / 4) {
        /* a big object gets its own block, behind the current one */
        struct jblock *b = ja_block(a, n);
        if (a->blocks) {
            b->next = a->blocks->next;
            a->blocks->next = b;
        } else {
            b->next = NULL;
            a->blocks = b;
        }
        return b->data;
    }
    struct jblock *b = ja_block(a, JA_BLOCK);
    b->next = a->blocks;
    a->blocks = b;
    a->cur = b->data + n;
    a->left = JA_BLOCK - n;
    return b->data;
}

void *ja_alloc(struct jarena *a, size_t n)
{
    void *p = ja_alloc_raw(a, n);
    memset(p, 0, n);
    return p;
}

void *ja_grow(struct jarena *a, void *p, size_t old, size_t n)
{
    if (n <= old)
        return p;
    size_t old_al = (old + 15) & ~(size_t)15, n_al = (n + 15) & ~(size_t)15;
    if (p && (char *)p + old_al == a->cur && n_al - old_al <= a->left) {
        a->cur += n_al - old_al; /* the last allocation grows in place */
        a->left -= n_al - old_al;
        return p;
    }
    void *q = ja_alloc_raw(a, n);
    if (old)
        memcpy(q, p, old);
    return q;
}

void ja_free_all(struct jarena *a)
{
    struct jblock *b = a->blocks;
    while (b) {
        struct jblock *next = b->next;
        free(b);
        b = next;
    }
    a->blocks = NULL;
    a->cur = NULL;
    a->left = 0;
    a->used = 0;
}

/* ---- buffers ---- */

void jb_init(struct jbuf *b, struct jrender *r)
{
    b->r = r;
    b->p = NULL;
    b->n = b->cap = 0;
}

void jb_add(struct jbuf *b, const void *p, size_t n)
{
    if (n == 0)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        if (b->n + n > b->r->max_output)
            jfail(&b->r->fail, 0, "rendered text is longer than %zu bytes", b->r->max_output);
        b->p = ja_grow(&b->r->arena, b->p, b->cap, cap);
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

void jb_addc(struct jbuf *b, char c) { jb_add(b, &c, 1); }
void jb_adds(struct jbuf *b, const char *s) { jb_add(b, s, strlen(s)); }

void jb_printf(struct jbuf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        jb_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

struct jstr *jb_str(struct jbuf *b) { return js_new(&b->r->arena, b->p ? b->p : "", b->n); }

/* ---- strings and UTF-8 ---- */

struct jstr *js_alloc(struct jarena *a, size_t len)
{
    if (len > SIZE_MAX / 4)
        jfail(a->fail, 0, "string too long");
    struct jstr *s = ja_alloc_raw(a, sizeof *s + len + 1);
    s->len = len;
    s->ncp = -1;
    s->s[len] = 0;
    return s;
}

struct jstr *js_new(struct jarena *a, const char *p, size_t len)
{
    struct jstr *s = js_alloc(a, len);
    if (len)
        memcpy(s->s, p, len);
    return s;
}

struct jstr *js_lit(struct jarena *a, const char *z) { return js_new(a, z, strlen(z)); }

jv jv_str(struct jrender *r, const char *p, size_t len) { return jv_s(js_new(&r->arena, p, len)); }
jv jv_strz(struct jrender *r, const char *z) { return jv_str(r, z, strlen(z)); }

bool js_eq(const struct jstr *s, const char *z)
{
    size_t n = strlen(z);
    return s->len == n && memcmp(s->s, z, n) == 0;
}

int ju_decode(const char *p, const char *end, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)p;
    ptrdiff_t left = end - p;
    if (u[0] < 0x80) {
        *cp = u[0];
        return 1;
    }
    if ((u[0] >> 5) == 6 && left >= 2) {
        *cp = ((uint32_t)(u[0] & 0x1f) << 6) | (u[1] & 0x3f);
        return 2;
    }
    if ((u[0] >> 4) == 14 && left >= 3) {
        *cp = ((uint32_t)(u[0] & 0x0f) << 12) | ((uint32_t)(u[1] & 0x3f) << 6) | (u[2] & 0x3f);
        return 3;
    }
    if ((u[0] >> 3) == 30 && left >= 4) {
        *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3f) << 12) |
              ((uint32_t)(u[2] & 0x3f) << 6) | (u[3] & 0x3f);
        return 4;
    }
    *cp = 0xfffd;
    return 1;
}

int ju_encode(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xc0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xe0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (unsigned char)(0xf0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

bool ju_valid(const char *p, size_t n)
{
    const unsigned char *u = (const unsigned char *)p, *end = u + n;
    while (u < end) {
        unsigned c = *u;
        if (c < 0x80) {
            u++;
            continue;
        }
        int len;
        uint32_t cp, min;
        if ((c >> 5) == 6) {
            len = 2, cp = c & 0x1f, min = 0x80;
        } else if ((c >> 4) == 14) {
            len = 3, cp = c & 0x0f, min = 0x800;
        } else if ((c >> 3) == 30) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return false;
        }
        if (end - u < len)
            return false;
        for (int i = 1; i < len; i++) {
            if ((u[i] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (u[i] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        u += len;
    }
    return true;
}

int64_t js_ncp(struct jstr *s)
{
    if (s->ncp < 0) {
        int64_t n = 0;
        for (size_t i = 0; i < s->len; i++)
            n += ((unsigned char)s->s[i] & 0xc0) != 0x80;
        s->ncp = n;
    }
    return s->ncp;
}

size_t js_offset(struct jstr *s, int64_t i)
{
    if (js_ncp(s) == (int64_t)s->len)
        return (size_t)i;
    size_t off = 0;
    for (int64_t k = 0; k < i && off < s->len; k++) {
        off++;
        while (off < s->len && ((unsigned char)s->s[off] & 0xc0) == 0x80)
            off++;
    }
    return off;
}

bool ju_isspace(uint32_t c)
{
    if (c < 0x80)
        return (c >= 9 && c <= 13) || (c >= 28 && c <= 32);
    return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
           c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Case mapping and character classes come from utf8proc's Unicode tables
 * (simple case mappings; jpy_case adds Python's few one-to-many ones). */
uint32_t ju_upper(uint32_t c)
{
    if (c < 0x80)
        return c >= 'a' && c <= 'z' ? c - 32 : c;
    return (uint32_t)utf8proc_toupper((utf8proc_int32_t)c);
}

uint32_t ju_lower(uint32_t c)
{
    if (c < 0x80)
        return c >= 'A' && c <= 'Z' ? c + 32 : c;
    return (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
}

static utf8proc_category_t category(uint32_t c) { return utf8proc_category((utf8proc_int32_t)c); }

bool ju_isalpha(uint32_t c)
{
    if (c < 0x80)
        return (c | 32) >= 'a' && (c | 32) <= 'z';
    utf8proc_category_t k = category(c);
    return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}

bool ju_isdigit(uint32_t c) { return c >= '0' && c <= '9'; }

bool ju_isalnum(uint32_t c)
{
    if (c < 0x80)
        return ju_isdigit(c) || ju_isalpha(c);
    utf8proc_category_t k = category(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
           (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

bool ju_islower(uint32_t c)
{
    return c < 0x80 ? c >= 'a' && c <= 'z' : category(c) == UTF8PROC_CATEGORY_LL;
}
bool ju_isupper(uint32_t c)
{
    return c < 0x80 ? c >= 'A' && c <= 'Z' : category(c) == UTF8PROC_CATEGORY_LU;
}

bool ju_iscased(uint32_t c)
{
    if (c < 0x80)
        return (c | 32) >= 'a' && (c | 32) <= 'z';
    utf8proc_category_t k = category(c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

/* Python's str.isprintable(): not a control, format, surrogate, private,
 * unassigned, line/paragraph separator or space other than ' '. */
bool ju_isprintable(uint32_t c)
{
    if (c < 0x80)
        return c >= 0x20 && c < 0x7f;
    switch (category(c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
    }
}

/* Shortest digits that read back as f, laid out the way Python's repr()
 * does: positional for 1e-4 <= |f| < 1e16, else d.ddde+XX. */
void jfmt_float(double f, bool json, char out[40])
{
    if (isnan(f)) {
        strcpy(out, json ? "NaN" : "nan");
        return;
    }
    if (isinf(f)) {
        strcpy(out, f > 0 ? (json ? "Infinity" : "inf") : (json ? "-Infinity" : "-inf"));
        return;
    }
    if (f == 0) {
        strcpy(out, signbit(f) ? "-0.0" : "0.0");
        return;
    }
    char buf[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f)
            break;
    }
    char digits[24];
    int nd = 0, exp10 = 0;
    const char *p = buf;
    bool neg = *p == '-';
    if (neg)
        p++;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && nd < 20)
            digits[nd++] = *p;
    if (*p == 'e')
        exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    int decpt = exp10 + 1;
    char *o = out;
    if (neg)
        *o++ = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -decpt; i++)
                *o++ = '0';
            for (int i = 0; i < nd; i++)
                *o++ = digits[i];
        } else if (decpt >= nd) {
            for (int i = 0; i < nd; i++)
                *o++ = digits[i];
            for (int i = nd; i < decpt; i++)
                *o++ = '0';
            *o++ = '.';
            *o++ = '0';
        } else {
            for (int i = 0; i < nd; i++) {
                if (i == decpt)
                    *o++ = '.';
                *o++ = digits[i];
            }
        }
        *o = 0;
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            for (int i = 1; i < nd; i++)
                *o++ = digits[i];
        }
        int e = decpt - 1;
        sprintf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
}

/* ---- containers ---- */

struct jlist *jl_new(struct jrender *r, int kind, size_t cap)
{
    struct jlist *l = ja_alloc(&r->arena, sizeof *l);
    l->kind = kind;
    if (cap) {
        if (cap > SIZE_MAX / sizeof(jv) / 4)
            jfail(&r->fail, 0, "list too long");
        l->v = ja_alloc_raw(&r->arena, cap * sizeof(jv));
        l->cap = cap;
    }
    return l;
}

void jl_push(struct jrender *r, struct jlist *l, jv v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        l->v = ja_grow(&r->arena, l->v, l->cap * sizeof(jv), cap * sizeof(jv));
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

struct jdict *jd_new(struct jrender *r, size_t cap)
{
    struct jdict *d = ja_alloc(&r->arena, sizeof *d);
    if (cap) {
        d->k = ja_alloc_raw(&r->arena, cap * sizeof(jv));
        d->v = ja_alloc_raw(&r->arena, cap * sizeof(jv));
        d->cap = cap;
    }
    return d;
}

bool jd_get_str(const struct jdict *d, const char *k, size_t len, jv *out)
{
    for (size_t i = 0; i < d->n; i++) {
        const jv *key = &d->k[i];
        if (key->k == JV_STR && key->u.s->len == len && memcmp(key->u.s->s, k, len) == 0) {
            if (out)
                *out = d->v[i];
            return true;
        }
    }
    return false;
}

static bool jd_find(struct jrender *r, const struct jdict *d, jv key, size_t *idx)
{
    if (key.k == JV_STR) {
        for (size_t i = 0; i < d->n; i++) {
            const jv *k = &d->k[i];
            if (k->k == JV_STR && k->u.s->len == key.u.s->len &&
                memcmp(k->u.s->s, key.u.s->s, key.u.s->len) == 0) {
                *idx = i;
                return true;
            }
        }
        return false;
    }
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(r, d->k[i], key)) {
            *idx = i;
            return true;
        }
    return false;
}

bool jd_get(struct jrender *r, const struct jdict *d, jv key, jv *out)
{
    size_t i;
    if (!jd_find(r, d, key, &i))
        return false;
    if (out)
        *out = d->v[i];
    return true;
}

void jd_set(struct jrender *r, struct jdict *d, jv key, jv val)
{
    size_t i;
    if (jd_find(r, d, key, &i)) {
        d->v[i] = val;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        d->k = ja_grow(&r->arena, d->k, d->cap * sizeof(jv), cap * sizeof(jv));
        d->v = ja_grow(&r->arena, d->v, d->cap * sizeof(jv), cap * sizeof(jv));
        d->cap = cap;
    }
    d->k[d->n] = key;
    d->v[d->n] = val;
    d->n++;
}

jv jv_from_json(struct jrender *r, const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        struct jdict *d = jd_new(r, json_object_size(j));
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v)
        {
            /* jansson keeps insertion order and has no duplicate keys */
            d->k[d->n] = jv_strz(r, k);
            d->v[d->n] = jv_from_json(r, v);
            d->n++;
        }
        jv out = {.k = JV_DICT, .u.d = d};
        return out;
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        struct jlist *l = jl_new(r, JL_LIST, n);
        for (size_t i = 0; i < n; i++)
            l->v[l->n++] = jv_from_json(r, json_array_get(j, i));
        return jv_l(l);
    }
    case JSON_STRING: return jv_str(r, json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return jv_int(json_integer_value(j));
    case JSON_REAL: return jv_float(json_real_value(j));
    case JSON_TRUE: return jv_bool(true);
    case JSON_FALSE: return jv_bool(false);
    default: return jv_none();
    }
}

/* ---- undefined ---- */

jv jv_undef_name(struct jrender *r, struct jstr *name)
{
    struct jundef *u = ja_alloc(&r->arena, sizeof *u);
    u->name = jv_s(name);
    jv v = {.k = JV_UNDEF, .u.u = u};
    return v;
}

jv jv_undef_attr(struct jrender *r, jv obj, jv name)
{
    struct jundef *u = ja_alloc(&r->arena, sizeof *u);
    u->objtype = jv_obj_repr(obj);
    u->name = name;
    jv v = {.k = JV_UNDEF, .u.u = u};
    return v;
}

jv jv_undef_hint(struct jrender *r, const char *hint)
{
    struct jundef *u = ja_alloc(&r->arena, sizeof *u);
    u->hint = hint;
    jv v = {.k = JV_UNDEF, .u.u = u};
    return v;
}

_Noreturn void jv_undef_fail(struct jrender *r, int line, jv v)
{
    struct jundef *u = v.u.u;
    if (!u)
        jfail(&r->fail, line, "None is undefined");
    if (u->hint)
        jfail(&r->fail, line, "%s", u->hint);
    struct jbuf b;
    jb_init(&b, r);
    jv_write_repr(r, u->name, &b);
    jb_addc(&b, 0);
    if (!u->objtype)
        jfail(&r->fail, line, "%s is undefined", b.p);
    if (u->name.k != JV_STR)
        jfail(&r->fail, line, "%s has no element %s", u->objtype, b.p);
    jfail(&r->fail, line, "'%s' has no attribute %s", u->objtype, b.p);
}

/* ---- type names ---- */

const char *jv_type_name(jv v)
{
    switch (v.k) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST:
        switch (v.u.l->kind) {
        case JL_TUPLE: return "tuple";
        case JL_ITER: return "generator";
        case JL_ITEMS: return "dict_items";
        case JL_KEYS: return "dict_keys";
        case JL_VALUES: return "dict_values";
        case JL_RANGE: return "range";
        default: return "list";
        }
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_FUNC:
        return v.u.fn->kind == JF_MACRO    ? "Macro"
               : v.u.fn->kind == JF_JOINER ? "Joiner"
                                           : "builtin_function_or_method";
    case JV_LOOP: return "LoopContext";
    default: return "object";
    }
}

const char *jv_obj_repr(jv v)
{
    switch (v.k) {
    case JV_NONE: return "None";
    case JV_UNDEF: return "jinja2.runtime.Undefined object";
    case JV_BOOL: return "bool object";
    case JV_INT: return "int object";
    case JV_FLOAT: return "float object";
    case JV_STR: return "str object";
    case JV_LIST:
        switch (v.u.l->kind) {
        case JL_TUPLE: return "tuple object";
        case JL_ITER: return "generator object";
        case JL_ITEMS: return "dict_items object";
        case JL_KEYS: return "dict_keys object";
        case JL_VALUES: return "dict_values object";
        case JL_RANGE: return "range object";
        default: return "list object";
        }
    case JV_DICT: return "dict object";
    case JV_NS: return "jinja2.utils.Namespace object";
    case JV_LOOP: return "jinja2.runtime.LoopContext object";
    case JV_FUNC:
        return v.u.fn->kind == JF_MACRO ? "jinja2.runtime.Macro object"
                                        : "builtin_function_or_method object";
    default: return "object";
    }
}

/* ---- truthiness, equality, ordering ---- */

bool jv_truthy(jv v)
{
    switch (v.k) {
    case JV_UNDEF:
    case JV_NONE:
    case JV_MISSING: return false;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0;
    case JV_STR: return v.u.s->len > 0;
    case JV_LIST: return v.u.l->kind == JL_ITER || v.u.l->n > 0;
    case JV_DICT: return v.u.d->n > 0;
    case JV_LOOP: return v.u.loop->n > 0;
    default: return true;
    }
}

static int num_cmp(jv a, jv b)
{
    if (a.k != JV_FLOAT && b.k != JV_FLOAT) {
        int64_t x = a.k == JV_BOOL ? a.u.b : a.u.i, y = b.k == JV_BOOL ? b.u.b : b.u.i;
        return x < y ? -1 : x > y;
    }
    double x = a.k == JV_FLOAT ? a.u.f : (double)(a.k == JV_BOOL ? a.u.b : a.u.i);
    double y = b.k == JV_FLOAT ? b.u.f : (double)(b.k == JV_BOOL ? b.u.b : b.u.i);
    if (isnan(x) || isnan(y))
        return 2; /* unordered */
    return x < y ? -1 : x > y;
}

static int seq_family(const struct jlist *l)
{
    switch (l->kind) {
    case JL_LIST: return 1;
    case JL_TUPLE: return 2;
    case JL_RANGE: return 3;
    case JL_ITER: return 0; /* compared by identity */
    default: return 4 + l->kind;
    }
}

static bool eq_depth(struct jrender *r, jv a, jv b, int depth)
{
    if (depth > 200)
        jfail(&r->fail, 0, "values nest too deeply to compare");
    if (jv_is_num(a) && jv_is_num(b))
        return num_cmp(a, b) == 0;
    if (a.k != b.k)
        return false;
    switch (a.k) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_STR:
        return a.u.s == b.u.s ||
               (a.u.s->len == b.u.s->len && memcmp(a.u.s->s, b.u.s->s, a.u.s->len) == 0);
    case JV_LIST: {
        const struct jlist *x = a.u.l, *y = b.u.l;
        if (x == y)
            return true;
        int fx = seq_family(x), fy = seq_family(y);
        if (!fx || fx != fy || x->n != y->n)
            return false;
        for (size_t i = 0; i < x->n; i++)
            if (!eq_depth(r, x->v[i], y->v[i], depth + 1))
                return false;
        return true;
    }
    case JV_DICT: {
        const struct jdict *x = a.u.d, *y = b.u.d;
        if (x == y)
            return true;
        if (x->n != y->n)
            return false;
        for (size_t i = 0; i < x->n; i++) {
            jv other;
            if (!jd_get(r, y, x->k[i], &other) || !eq_depth(r, x->v[i], other, depth + 1))
                return false;
        }
        return true;
    }
    case JV_NS: return a.u.d == b.u.d;
    case JV_FUNC: return a.u.fn == b.u.fn;
    case JV_LOOP: return a.u.loop == b.u.loop;
    default: return false;
    }
}

bool jv_eq(struct jrender *r, jv a, jv b) { return eq_depth(r, a, b, 0); }

static int cmp_depth(struct jrender *r, int line, const char *op, jv a, jv b, int depth)
{
    if (depth > 200)
        jfail(&r->fail, line, "values nest too deeply to compare");
    if (jv_is_num(a) && jv_is_num(b))
        return num_cmp(a, b);
    if (a.k == JV_STR && b.k == JV_STR) {
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int c = memcmp(a.u.s->s, b.u.s->s, n);
        if (c)
            return c < 0 ? -1 : 1;
        return a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len;
    }
    if (a.k == JV_LIST && b.k == JV_LIST) {
        int fa = seq_family(a.u.l), fb = seq_family(b.u.l);
        if (fa && fa == fb && fa <= 2) {
            const struct jlist *x = a.u.l, *y = b.u.l;
            for (size_t i = 0; i < x->n && i < y->n; i++)
                if (!eq_depth(r, x->v[i], y->v[i], depth + 1))
                    return cmp_depth(r, line, op, x->v[i], y->v[i], depth + 1);
            return x->n < y->n ? -1 : x->n > y->n;
        }
    }
    if (a.k == JV_UNDEF)
        jv_undef_fail(r, line, a);
    if (b.k == JV_UNDEF)
        jv_undef_fail(r, line, b);
    jfail(&r->fail, line, "'%s' not supported between instances of '%s' and '%s'", op,
          jv_type_name(a), jv_type_name(b));
}

int jv_cmp(struct jrender *r, int line, const char *op, jv a, jv b)
{
    return cmp_depth(r, line, op, a, b, 0);
}

bool jv_hashable(jv v)
{
    if (v.k == JV_DICT || v.k == JV_NS)
        return false;
    if (v.k == JV_LIST) {
        if (v.u.l->kind != JL_TUPLE)
            return v.u.l->kind == JL_ITER || v.u.l->kind == JL_RANGE;
        for (size_t i = 0; i < v.u.l->n; i++)
            if (!jv_hashable(v.u.l->v[i]))
                return false;
    }
    return true;
}

/* ---- str(), repr() ---- */

static void write_str_repr(const struct jstr *s, struct jbuf *b)
{
    char q = '\'';
    if (memchr(s->s, '\'', s->len) && !memchr(s->s, '"', s->len))
        q = '"';
    jb_addc(b, q);
    const char *p = s->s, *end = s->s + s->len;
    while (p < end) {
        uint32_t c;
        int n = ju_decode(p, end, &c);
        if (c == (uint32_t)q || c == '\\') {
            jb_addc(b, '\\');
            jb_addc(b, (char)c);
        } else if (c == '\n') {
            jb_adds(b, "\\n");
        } else if (c == '\r') {
            jb_adds(b, "\\r");
        } else if (c == '\t') {
            jb_adds(b, "\\t");
        } else if (c >= 0x20 && c < 0x7f) {
            jb_addc(b, (char)c);
        } else if (ju_isprintable(c)) {
            jb_add(b, p, (size_t)n);
        } else if (c <= 0xff) {
            jb_printf(b, "\\x%02x", c);
        } else if (c <= 0xffff) {
            jb_printf(b, "\\u%04x", c);
        } else {
            jb_printf(b, "\\U%08x", c);
        }
        p += n;
    }
    jb_addc(b, q);
}

static void repr_depth(struct jrender *r, jv v, struct jbuf *b, int depth);

static void repr_items(struct jrender *r, const struct jlist *l, struct jbuf *b, int depth)
{
    for (size_t i = 0; i < l->n; i++) {
        if (i)
            jb_adds(b, ", ");
        repr_depth(r, l->v[i], b, depth + 1);
    }
}

static void repr_dict(struct jrender *r, const struct jdict *d, struct jbuf *b, int depth)
{
    jb_addc(b, '{');
    for (size_t i = 0; i < d->n; i++) {
        if (i)
            jb_adds(b, ", ");
        repr_depth(r, d->k[i], b, depth + 1);
        jb_adds(b, ": ");
        repr_depth(r, d->v[i], b, depth + 1);
    }
    jb_addc(b, '}');
}

static void repr_depth(struct jrender *r, jv v, struct jbuf *b, int depth)
{
    if (depth > 200)
        jfail(&r->fail, 0, "value nests too deeply to print");
    char tmp[40];
    switch (v.k) {
    case JV_STR: write_str_repr(v.u.s, b); return;
    case JV_UNDEF: jb_adds(b, "Undefined"); return;
    case JV_NONE: jb_adds(b, "None"); return;
    case JV_BOOL: jb_adds(b, v.u.b ? "True" : "False"); return;
    case JV_INT: jb_printf(b, "%lld", (long long)v.u.i); return;
    case JV_FLOAT:
        jfmt_float(v.u.f, false, tmp);
        jb_adds(b, tmp);
        return;
    case JV_LIST: {
        const struct jlist *l = v.u.l;
        switch (l->kind) {
        case JL_TUPLE:
            jb_addc(b, '(');
            repr_items(r, l, b, depth);
            if (l->n == 1)
                jb_addc(b, ',');
            jb_addc(b, ')');
            return;
        case JL_ITER: jb_adds(b, "<generator object>"); return;
        case JL_RANGE:
            if (l->r[2] == 1)
                jb_printf(b, "range(%lld, %lld)", (long long)l->r[0], (long long)l->r[1]);
            else
                jb_printf(b, "range(%lld, %lld, %lld)", (long long)l->r[0], (long long)l->r[1],
                          (long long)l->r[2]);
            return;
        case JL_ITEMS: jb_adds(b, "dict_items(["); break;
        case JL_KEYS: jb_adds(b, "dict_keys(["); break;
        case JL_VALUES: jb_adds(b, "dict_values(["); break;
        default: jb_addc(b, '['); break;
        }
        repr_items(r, l, b, depth);
        jb_adds(b, l->kind == JL_LIST ? "]" : "])");
        return;
    }
    case JV_DICT: repr_dict(r, v.u.d, b, depth); return;
    case JV_NS:
        jb_adds(b, "<Namespace ");
        repr_dict(r, v.u.d, b, depth);
        jb_addc(b, '>');
        return;
    case JV_FUNC:
        if (v.u.fn->kind == JF_MACRO) {
            const struct jnode *n = v.u.fn->node;
            if (n->name)
                jb_printf(b, "<Macro '%s'>", n->name->s);
            else
                jb_adds(b, "<Macro 'caller'>");
        } else if (v.u.fn->kind == JF_JOINER) {
            jb_adds(b, "<jinja2.utils.Joiner object>");
        } else {
            jb_printf(b, "<built-in function %s>", v.u.fn->bi->name);
        }
        return;
    case JV_LOOP: jb_printf(b, "<LoopContext %zu/%zu>", v.u.loop->i + 1, v.u.loop->n); return;
    default: return;
    }
}

void jv_write_repr(struct jrender *r, jv v, struct jbuf *b) { repr_depth(r, v, b, 0); }

void jv_write_str(struct jrender *r, jv v, struct jbuf *b)
{
    switch (v.k) {
    case JV_STR: jb_add(b, v.u.s->s, v.u.s->len); return;
    case JV_UNDEF:
    case JV_MISSING: return;
    default: repr_depth(r, v, b, 0);
    }
}

struct jstr *jv_to_str(struct jrender *r, jv v)
{
    if (v.k == JV_STR)
        return v.u.s;
    struct jbuf b;
    jb_init(&b, r);
    jv_write_str(r, v, &b);
    return jb_str(&b);
}

/* ---- json.dumps ---- */

static void json_str_out(struct jbuf *b, const char *p, size_t n, bool ascii)
{
    jb_addc(b, '"');
    const char *end = p + n, *run = p;
    while (p < end) {
        unsigned char c = (unsigned char)*p;
        const char *esc = NULL;
        char tmp[16];
        int len = 1;
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(tmp, sizeof tmp, "\\u%04x", c);
                esc = tmp;
            } else if (c >= 0x80 && ascii) {
                uint32_t cp;
                len = ju_decode(p, end, &cp);
                if (cp >= 0x10000) {
                    cp -= 0x10000;
                    snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xd800 + (cp >> 10),
                             0xdc00 + (cp & 0x3ff));
                } else {
                    snprintf(tmp, sizeof tmp, "\\u%04x", cp);
                }
                esc = tmp;
            }
        }
        if (esc) {
            jb_add(b, run, (size_t)(p - run));
            jb_adds(b, esc);
            p += len;
            run = p;
        } else {
            p++;
        }
    }
    jb_add(b, run, (size_t)(p - run));
    jb_addc(b, '"');
}

static void json_newline(struct jbuf *b, const char *indent, int level)
{
    jb_addc(b, '\n');
    for (int i = 0; i < level; i++)
        jb_adds(b, indent);
}

static int json_key_cmp(const void *x, const void *y)
{
    const struct jstr *a = *(struct jstr *const *)x, *b = *(struct jstr *const *)y;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->s, b->s, n);
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

static void json_value(struct jrender *r, int line, jv v, const struct jtojson *o, struct jbuf *b,
                       int level)
{
    if (level > 200)
        jfail(&r->fail, line, "value nests too deeply for tojson");
    char tmp[40];
    switch (v.k) {
    case JV_NONE: jb_adds(b, "null"); return;
    case JV_BOOL: jb_adds(b, v.u.b ? "true" : "false"); return;
    case JV_INT: jb_printf(b, "%lld", (long long)v.u.i); return;
    case JV_FLOAT:
        jfmt_float(v.u.f, true, tmp);
        jb_adds(b, tmp);
        return;
    case JV_STR: json_str_out(b, v.u.s->s, v.u.s->len, o->ensure_ascii); return;
    case JV_LIST:
        if (v.u.l->kind == JL_LIST || v.u.l->kind == JL_TUPLE) {
            const struct jlist *l = v.u.l;
            if (l->n == 0) {
                jb_adds(b, "[]");
                return;
            }
            jb_addc(b, '[');
            for (size_t i = 0; i < l->n; i++) {
                if (i)
                    jb_adds(b, o->item_sep);
                if (o->indent)
                    json_newline(b, o->indent, level + 1);
                json_value(r, line, l->v[i], o, b, level + 1);
            }
            if (o->indent)
                json_newline(b, o->indent, level);
            jb_addc(b, ']');
            return;
        }
        break;
    case JV_DICT: {
        const struct jdict *d = v.u.d;
        if (d->n == 0) {
            jb_adds(b, "{}");
            return;
        }
        /* keys become strings the way json.dumps converts them */
        struct jstr **keys = ja_alloc_raw(&r->arena, d->n * sizeof *keys);
        size_t *order = ja_alloc_raw(&r->arena, d->n * sizeof *order);
        for (size_t i = 0; i < d->n; i++) {
            jv k = d->k[i];
            switch (k.k) {
            case JV_STR: keys[i] = k.u.s; break;
            case JV_INT: keys[i] = jv_to_str(r, k); break;
            case JV_FLOAT:
                jfmt_float(k.u.f, true, tmp);
                keys[i] = js_lit(&r->arena, tmp);
                break;
            case JV_BOOL: keys[i] = js_lit(&r->arena, k.u.b ? "true" : "false"); break;
            case JV_NONE: keys[i] = js_lit(&r->arena, "null"); break;
            default:
                jfail(&r->fail, line, "keys must be str, int, float, bool or None, not %s",
                      jv_type_name(k));
            }
            order[i] = i;
        }
        if (o->sort_keys) {
            /* sort (key, index) pairs; keys are unique so ties cannot happen */
            struct jstr **sorted = ja_alloc_raw(&r->arena, d->n * sizeof *sorted);
            memcpy(sorted, keys, d->n * sizeof *sorted);
            qsort(sorted, d->n, sizeof *sorted, json_key_cmp);
            for (size_t i = 0; i < d->n; i++)
                for (size_t j = 0; j < d->n; j++)
                    if (keys[j] == sorted[i]) {
                        order[i] = j;
                        break;
                    }
        }
        jb_addc(b, '{');
        for (size_t i = 0; i < d->n; i++) {
            size_t j = order[i];
            if (i)
                jb_adds(b, o->item_sep);
            if (o->indent)
                json_newline(b, o->indent, level + 1);
            json_str_out(b, keys[j]->s, keys[j]->len, o->ensure_ascii);
            jb_adds(b, o->key_sep);
            json_value(r, line, d->v[j], o, b, level + 1);
        }
        if (o->indent)
            json_newline(b, o->indent, level);
        jb_addc(b, '}');
        return;
    }
    default: break;
    }
    jfail(&r->fail, line, "Object of type %s is not JSON serializable", jv_type_name(v));
}

void jv_write_json(struct jrender *r, int line, jv v, const struct jtojson *o, struct jbuf *b)
{
    json_value(r, line, v, o, b, 0);
}

/* ---- iteration and len() ---- */

void jv_check_poison(struct jrender *r, int line, jv v)
{
    if (v.k == JV_LIST && v.u.l->poison)
        jfail(&r->fail, line, "%s", v.u.l->poison);
}

void jv_iterate(struct jrender *r, int line, jv v, jv **items, size_t *n)
{
    switch (v.k) {
    case JV_LIST: {
        struct jlist *l = v.u.l;
        if (l->kind == JL_ITER) {
            jv_check_poison(r, line, v);
            *items = l->v ? l->v + l->pos : NULL;
            *n = l->n - l->pos;
            l->pos = l->n; /* a generator runs once */
        } else {
            *items = l->v;
            *n = l->n;
        }
        return;
    }
    case JV_DICT:
        *items = v.u.d->k;
        *n = v.u.d->n;
        return;
    case JV_STR: {
        struct jstr *s = v.u.s;
        int64_t cnt = js_ncp(s);
        jv *out = ja_alloc_raw(&r->arena, (size_t)(cnt ? cnt : 1) * sizeof(jv));
        const char *p = s->s, *end = s->s + s->len;
        size_t k = 0;
        while (p < end) {
            uint32_t c;
            int len = ju_decode(p, end, &c);
            out[k++] = jv_str(r, p, (size_t)len);
            p += len;
        }
        *items = out;
        *n = k;
        return;
    }
    case JV_UNDEF:
        *items = NULL;
        *n = 0;
        return;
    case JV_LOOP:
        *items = v.u.loop->items;
        *n = v.u.loop->n;
        return;
    default: jfail(&r->fail, line, "'%s' object is not iterable", jv_type_name(v));
    }
}

int64_t jv_len(struct jrender *r, int line, jv v)
{
    switch (v.k) {
    case JV_STR: return js_ncp(v.u.s);
    case JV_LIST:
        if (v.u.l->kind != JL_ITER)
            return (int64_t)v.u.l->n;
        break;
    case JV_DICT: return (int64_t)v.u.d->n;
    case JV_UNDEF: return 0;
    case JV_LOOP: return (int64_t)v.u.loop->n;
    default: break;
    }
    jfail(&r->fail, line, "object of type '%s' has no len()", jv_type_name(v));
}
