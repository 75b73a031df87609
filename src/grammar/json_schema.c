/* json_schema.c - JSON Schema to GBNF (json_schema.h): one walk over the
 * schema that writes a rule per object, array and referenced definition, and
 * the shared JSON primitives (string, number, ws, value, ...) once at the end.
 *
 * Numeric bounds (minimum, maximum, exclusiveMinimum, exclusiveMaximum,
 * multipleOf) are accepted and ignored, for "integer" as for "number": a
 * range of decimal texts is expressible only digit by digit, which for an
 * arbitrary bound costs a rule per digit position and for multipleOf nothing
 * short of a divisibility automaton. The model is held to the type; the
 * bound stays the caller's to check. Every other keyword that constrains
 * values is either compiled exactly or refused with its path, never widened.
 *
 * Object keys are written in the order the schema's `properties` lists them:
 * jansson keeps insertion order when iterating objects since 2.8 (its
 * changelog), checked below. */
#include "grammar/json_schema.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "grammar/grammar.h"
#include "grammar/regex.h"

#if JANSSON_VERSION_HEX < 0x020800
#error "json_schema.c needs jansson >= 2.8 (object iteration in insertion order)"
#endif

enum {
    MAX_DEPTH = 64,     /* schema nesting: the walk is recursive */
    MAX_COUNT = 100000, /* largest minLength/maxLength/minItems/maxItems compiled */
    CHUNK = 1000,       /* grammar.c's largest {m,n} */
    MAX_DEFS = 4096,
};

/* n alternatives joined by " | " as one expression: parenthesized when
 * there are several. */
static void put_choice(struct buf *x, const struct buf *alts, int n)
{
    buf_puts(x, n > 1 ? "( " : "");
    buf_putb(x, alts);
    buf_puts(x, n > 1 ? " )" : "");
}

/* ---- shared primitives: written once each, with what they use */

enum prim {
    P_WS, P_VALUE, P_OBJECT, P_MEMBER, P_ARRAY, P_STRING, P_CHAR, P_ESCU, P_HEX,
    P_NUMBER, P_INTEGER, P_BOOLEAN, P_NULL, P_DATE, P_LEAP, P_TIME, P_DATETIME, P_UUID,
    P_COUNT
};

#define B(p) (1u << (p))
static const struct {
    const char *name, *body;
    unsigned uses;
} PRIMS[P_COUNT] = {
    /* Blanks are bounded so a model cannot stall on them; 20 covers a
     * newline and indentation nine levels deep. */
    [P_WS] = {"ws", "( [ \\t] | \"\\n\" [ \\t]{0,20} )?", 0},
    [P_VALUE] = {"value", "object | array | string | number | boolean | null",
                 B(P_OBJECT) | B(P_ARRAY) | B(P_STRING) | B(P_NUMBER) | B(P_BOOLEAN) |
                     B(P_NULL)},
    [P_OBJECT] = {"object", "\"{\" ws ( member ( ws \",\" ws member )* ws )? \"}\"",
                  B(P_WS) | B(P_MEMBER)},
    [P_MEMBER] = {"member", "string ws \":\" ws value", B(P_STRING) | B(P_WS) | B(P_VALUE)},
    [P_ARRAY] = {"array", "\"[\" ws ( value ( ws \",\" ws value )* ws )? \"]\"",
                 B(P_WS) | B(P_VALUE)},
    [P_STRING] = {"string", "\"\\\"\" char* \"\\\"\"", B(P_CHAR)},
    /* One character of the decoded string per `char`, so minLength and
     * maxLength count characters: a surrogate pair is one escape. */
    [P_CHAR] = {"char", "[^\\\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\\\"\\\\/bfnrt] | \"u\" esc-u )",
                B(P_ESCU)},
    /* \u0000 and lone surrogates are valid JSON syntax that common parsers
     * (jansson among them) refuse, so the model may not write them. */
    [P_ESCU] = {"esc-u",
                "[1-9a-cA-Ce-fE-F] hex{3} | \"0\" ( [1-9a-fA-F] hex{2} | \"0\" ( [1-9a-fA-F] hex"
                " | \"0\" [1-9a-fA-F] ) ) | [dD] [0-7] hex{2}"
                " | [dD] [89abAB] hex{2} \"\\\\u\" [dD] [c-fC-F] hex{2}",
                B(P_HEX)},
    [P_HEX] = {"hex", "[0-9a-fA-F]", 0},
    /* Digit runs are bounded so generation ends and every number is a
     * finite double: 16 + 16 digits and a two-digit exponent. */
    [P_NUMBER] = {"number", "integer ( \".\" [0-9]{1,16} )? ( [eE] [+\\-]? [0-9]{1,2} )?",
                  B(P_INTEGER)},
    [P_INTEGER] = {"integer", "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} )", 0},
    [P_BOOLEAN] = {"boolean", "\"true\" | \"false\"", 0},
    [P_NULL] = {"null", "\"null\"", 0},
    /* RFC 3339 full-date with each month's days and 29 February of leap
     * years only, so no impossible date passes. */
    [P_DATE] = {"date",
                "[0-9]{4} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9]"
                " | [12] [0-9] | \"3\" [01] ) | ( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9]"
                " | [12] [0-9] | \"30\" ) | \"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) )"
                " | leap-year \"-02-29\"",
                B(P_LEAP)},
    [P_LEAP] = {"leap-year",
                "[0-9]{2} ( [02468] [48] | [13579] [26] | [2468] \"0\" )"
                " | ( [02468] [048] | [13579] [26] ) \"00\"",
                0},
    /* RFC 3339 full-time: the offset is required; a leap second (:60) is
     * left out because it is valid only at particular instants. */
    [P_TIME] = {"time",
                "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9]"
                " ( \".\" [0-9]{1,9} )? ( [Zz] | [+\\-] ( [01] [0-9] | \"2\" [0-3] ) \":\""
                " [0-5] [0-9] )",
                0},
    [P_DATETIME] = {"date-time", "date [Tt] time", B(P_DATE) | B(P_TIME)},
    [P_UUID] = {"uuid", "hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12}", B(P_HEX)},
};

/* ---- the conversion's state: one per call, nothing global */

struct def {
    const json_t *node; /* the schema a $ref reached: one rule each */
    char name[80];
    bool open; /* its body is being written */
    bool used; /* referenced (decides whether the root gets its own rule) */
    int guard; /* c->pos when opened: meeting it again there is left recursion */
};

struct conv {
    const json_t *root;
    struct err *e;
    struct buf rules; /* finished rules, inner first */
    unsigned prims;   /* P_ bits referenced */
    int n_rules;      /* numbers obj-N, arr-N */
    int depth;
    int pos, n_pos; /* which "{" or "[" the walk is inside (0: none yet) */
    struct def *defs;
    int n_defs, cap_defs;
};

/* Every message starts "schema: PATH: " (no path at the root). */
__attribute__((format(printf, 3, 4))) static int fail(struct conv *c, const char *path,
                                                      const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return err_set(c->e, "schema: %s%s%s", path, *path ? ": " : "", msg);
}

static void prim(struct conv *c, struct buf *x, enum prim p)
{
    c->prims |= B(p);
    buf_puts(x, PRIMS[p].name);
}

static void subpath(char *out, size_t n, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void subpath(char *out, size_t n, const char *path, const char *fmt, ...)
{
    char tail[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tail, sizeof tail, fmt, ap);
    va_end(ap);
    snprintf(out, n, "%s%s%s", path, *path ? "." : "", tail);
}

/* A GBNF literal of raw bytes (grammar_literal). */
static void put_lit(struct buf *x, const char *s, size_t n)
{
    char *q = malloc(4 * n + 3);
    if (!q) {
        x->oom = true;
        return;
    }
    buf_putn(x, q, grammar_literal(s, n, q));
    free(q);
}

/* A JSON value as the literal of its compact text. Reals take the fewest
 * digits that read back as the same value, so enum [0.1] asks for "0.1". */
static int put_json(struct conv *c, struct buf *x, const json_t *v, const char *path)
{
    for (int prec = 1; prec <= 17; prec++) {
        char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(prec));
        if (!s)
            return fail(c, path, "a value cannot be written as JSON");
        json_t *back = json_loads(s, JSON_DECODE_ANY, NULL);
        bool same = back && json_equal(back, (json_t *)v);
        json_decref(back);
        if (same || prec == 17) {
            put_lit(x, s, strlen(s));
            free(s);
            return 0;
        }
        free(s);
    }
    return 0;
}

/* "{m,n}" after an item; hi < 0: unbounded. */
static void put_rep(struct buf *x, long lo, long hi)
{
    if (lo == 0 && hi < 0)
        buf_puts(x, "*");
    else if (lo == 1 && hi < 0)
        buf_puts(x, "+");
    else if (lo == 0 && hi == 1)
        buf_puts(x, "?");
    else if (hi < 0)
        buf_printf(x, "{%ld,}", lo);
    else if (lo == hi)
        buf_printf(x, "{%ld}", lo);
    else
        buf_printf(x, "{%ld,%ld}", lo, hi);
}

/* item{lo,hi} (hi < 0: unbounded). Counts past CHUNK are spelled in chunks
 * with the same sentences: the fixed part as (item{CHUNK}){q}, the optional
 * part d as Y_q where Y_j ::= item{0,CHUNK-1} | item{CHUNK} Y_(j-1), which
 * reads each count one way only. */
static void put_count(struct conv *c, struct buf *x, const char *item, long lo, long hi)
{
    if (lo <= CHUNK && hi <= CHUNK) {
        buf_puts(x, item);
        put_rep(x, lo, hi);
        return;
    }
    long d = hi < 0 ? -1 : hi - lo;
    if (lo >= CHUNK) {
        buf_puts(x, "( ");
        buf_puts(x, item);
        buf_printf(x, "{%d} ){%ld}", CHUNK, lo / CHUNK);
    }
    if (lo % CHUNK) {
        buf_puts(x, " ");
        buf_puts(x, item);
        buf_printf(x, "{%ld}", lo % CHUNK);
    }
    if (d && d <= CHUNK) {
        buf_puts(x, " ");
        buf_puts(x, item);
        put_rep(x, 0, d);
    } else if (d > CHUNK) {
        int id = ++c->n_rules;
        for (long j = 1; j <= d / CHUNK; j++) {
            buf_printf(&c->rules, "cnt-%d-%ld ::= ", id, j);
            buf_puts(&c->rules, item);
            buf_printf(&c->rules, "{0,%d} | ", CHUNK - 1);
            buf_puts(&c->rules, item);
            buf_printf(&c->rules, "{%d}", CHUNK);
            if (j > 1) {
                buf_printf(&c->rules, " cnt-%d-%ld", id, j - 1);
            } else if (d % CHUNK) {
                buf_puts(&c->rules, " ");
                buf_puts(&c->rules, item);
                buf_printf(&c->rules, "{0,%ld}", d % CHUNK);
            }
            buf_puts(&c->rules, "\n");
        }
        buf_printf(x, " cnt-%d-%ld", id, d / CHUNK);
    }
}

/* ---- keywords */

enum kind {
    K_ANNOT, K_DEFS, K_TYPE, K_ENUM, K_CONST, K_REF, K_ANYOF, K_ONEOF, K_ALLOF,
    K_NULLABLE, K_OBJ, K_ARR, K_STR, K_NUM, K_FORMAT
};

static const struct {
    const char *name;
    enum kind kind;
} KEYWORDS[] = {
    {"title", K_ANNOT}, {"description", K_ANNOT}, {"$schema", K_ANNOT}, {"$id", K_ANNOT},
    {"examples", K_ANNOT}, {"default", K_ANNOT}, {"deprecated", K_ANNOT},
    {"readOnly", K_ANNOT}, {"writeOnly", K_ANNOT}, {"$comment", K_ANNOT}, {"strict", K_ANNOT},
    {"$defs", K_DEFS}, {"definitions", K_DEFS}, {"type", K_TYPE}, {"enum", K_ENUM},
    {"const", K_CONST}, {"$ref", K_REF}, {"anyOf", K_ANYOF}, {"oneOf", K_ONEOF},
    {"allOf", K_ALLOF}, {"nullable", K_NULLABLE}, {"properties", K_OBJ}, {"required", K_OBJ},
    {"additionalProperties", K_OBJ}, {"items", K_ARR}, {"prefixItems", K_ARR},
    {"additionalItems", K_ARR}, {"minItems", K_ARR}, {"maxItems", K_ARR},
    {"minLength", K_STR}, {"maxLength", K_STR}, {"pattern", K_STR}, {"minimum", K_NUM}, {"maximum", K_NUM},
    {"exclusiveMinimum", K_NUM}, {"exclusiveMaximum", K_NUM}, {"multipleOf", K_NUM},
    {"format", K_FORMAT},
};

static const char *const FORMATS[] = {"date", "time", "date-time", "uuid"};
static const enum prim FORMAT_PRIMS[] = {P_DATE, P_TIME, P_DATETIME, P_UUID};

enum { T_OBJ = 1, T_ARR = 2, T_STR = 4, T_NUM = 8, T_INT = 16, T_BOOL = 32, T_NULL = 64,
       T_ALL = 127 };
static const char *const TYPES[] = {"object", "array", "string", "number",
                                    "integer", "boolean", "null"};

static int format_of(const json_t *s)
{
    const char *f = json_string_value(json_object_get(s, "format"));
    for (size_t i = 0; f && i < sizeof FORMATS / sizeof *FORMATS; i++)
        if (!strcmp(f, FORMATS[i]))
            return (int)i;
    return -1; /* absent or unknown: an annotation */
}

/* The "type" keyword as T_ bits; 0 when absent. */
static int parse_type(struct conv *c, const json_t *s, const char *path, unsigned *t)
{
    const json_t *ty = json_object_get(s, "type");
    *t = 0;
    if (!ty)
        return 0;
    if (json_is_array(ty) && json_array_size(ty) == 0)
        return fail(c, path, "\"type\" is an empty list");
    for (size_t i = 0; i < (json_is_array(ty) ? json_array_size(ty) : 1); i++) {
        const json_t *one = json_is_array(ty) ? json_array_get(ty, i) : ty;
        const char *name = json_string_value(one);
        if (!name)
            return fail(c, path, "\"type\" must be a string or a list of strings");
        size_t k = 0;
        while (k < sizeof TYPES / sizeof *TYPES && strcmp(name, TYPES[k]))
            k++;
        if (k == sizeof TYPES / sizeof *TYPES)
            return fail(c, path, "unknown type \"%s\"", name);
        *t |= 1u << k;
    }
    return 0;
}

/* Whether d is a whole number (every double past 2^53 is). */
static bool whole(double d) { return d >= 0x1p53 || d <= -0x1p53 || d == (double)(long long)d; }

/* A count keyword into *v, left alone when absent. */
static int count_kw(struct conv *c, const json_t *s, const char *path, const char *kw, long *v)
{
    const json_t *j = json_object_get(s, kw);
    if (!j)
        return 0;
    double d = json_number_value(j);
    if (!json_is_number(j) || d < 0 || !whole(d))
        return fail(c, path, "\"%s\" must be a non-negative integer", kw);
    if (d > MAX_COUNT)
        return fail(c, path, "\"%s\" %.0f is over the %d this server compiles", kw, d, MAX_COUNT);
    *v = (long)d;
    return 0;
}

static int gen(struct conv *c, const json_t *s, const char *path, struct buf *x);

/* ---- $ref */

/* A JSON pointer inside the schema ("#", "#/a/b~1c"); NULL if it names
 * nothing. *last gets the final segment (the rule's name). */
static const json_t *resolve(const json_t *root, const char *ref, char *last, size_t n_last)
{
    snprintf(last, n_last, "root");
    if (ref[0] != '#' || (ref[1] && ref[1] != '/'))
        return NULL;
    const json_t *at = root;
    for (const char *p = ref + 1; *p == '/';) {
        char seg[256];
        size_t n = 0;
        for (p++; *p && *p != '/'; p++) {
            char ch = *p;
            if (ch == '~') {
                ch = p[1] == '0' ? '~' : p[1] == '1' ? '/' : 0;
                if (!ch)
                    return NULL;
                p++;
            }
            if (n + 1 >= sizeof seg)
                return NULL;
            seg[n++] = ch;
        }
        seg[n] = 0;
        if (json_is_object(at)) {
            at = json_object_get(at, seg);
        } else if (json_is_array(at) && n && strspn(seg, "0123456789") == n) {
            at = json_array_get(at, strtoul(seg, NULL, 10));
        } else {
            return NULL;
        }
        if (!at)
            return NULL;
        snprintf(last, n_last, "%s", seg);
    }
    return at;
}

/* A new definition entry named def-<seg>, made unique and GBNF-safe. */
static int def_add(struct conv *c, const json_t *node, const char *seg, const char *path)
{
    if (c->n_defs == c->cap_defs) {
        if (c->n_defs >= MAX_DEFS)
            return fail(c, path, "more than %d referenced definitions", MAX_DEFS);
        int cap = c->cap_defs ? 2 * c->cap_defs : 16;
        struct def *d = realloc(c->defs, (size_t)cap * sizeof *d);
        if (!d)
            return fail(c, path, "out of memory");
        c->defs = d;
        c->cap_defs = cap;
    }
    struct def *d = &c->defs[c->n_defs];
    char base[64];
    size_t n = 0;
    for (const char *p = seg; *p && n < 40; p++)
        base[n++] = (isalnum((unsigned char)*p) || *p == '-' || *p == '_') ? *p : '_';
    base[n] = 0;
    snprintf(d->name, sizeof d->name, "def-%s", base);
    for (int k = 2, clash = 1; clash; k++) {
        clash = 0;
        for (int i = 0; i < c->n_defs && !clash; i++)
            clash = !strcmp(c->defs[i].name, d->name);
        if (clash)
            snprintf(d->name, sizeof d->name, "def-%s-%d", base, k);
    }
    d->node = node;
    d->open = true;
    d->used = false;
    d->guard = c->pos;
    return c->n_defs++;
}

static int gen_ref(struct conv *c, const json_t *ref, const char *path, struct buf *x)
{
    const char *r = json_string_value(ref);
    if (!r)
        return fail(c, path, "\"$ref\" must be a string");
    if (r[0] != '#')
        return fail(c, path, "$ref \"%s\" is not supported: only references inside the schema "
                    "(\"#...\")", r);
    char seg[256];
    const json_t *node = resolve(c->root, r, seg, sizeof seg);
    if (!node)
        return fail(c, path, "$ref \"%s\" does not resolve", r);
    for (int i = 0; i < c->n_defs; i++) {
        struct def *d = &c->defs[i];
        if (d->node != node)
            continue;
        if (d->open && d->guard == c->pos)
            return fail(c, path, "$ref \"%s\" comes back to itself before any value is written",
                        r);
        d->used = true;
        buf_puts(x, d->name);
        return 0;
    }
    int i = def_add(c, node, seg, path);
    if (i < 0)
        return -1;
    char where[256];
    snprintf(where, sizeof where, "%s", r[1] ? r + 2 : "");
    for (char *p = where; *p; p++)
        if (*p == '/')
            *p = '.';
    struct buf body = {0};
    int rc = gen(c, node, where, &body);
    c->defs[i].open = false;
    c->defs[i].used = true;
    if (rc == 0) {
        buf_printf(&c->rules, "%s ::= ", c->defs[i].name);
        buf_putb(&c->rules, &body);
        buf_puts(&c->rules, "\n");
        buf_puts(x, c->defs[i].name);
    }
    free(body.p);
    return rc;
}

/* ---- objects */

struct prop {
    struct buf kv; /* "\"key\"" ws ":" ws VALUE */
    bool req;
};

static bool listed(const json_t *arr, const char *key)
{
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const char *s = json_string_value(json_array_get(arr, i));
        if (s && !strcmp(s, key))
            return true;
    }
    return false;
}

/* A member's text; its value from schema, or val when already written. */
static int add_prop(struct conv *c, struct prop **props, int *n, const char *key,
                    const json_t *schema, const struct buf *val, bool req, const char *path)
{
    struct prop *p = realloc(*props, (size_t)(*n + 1) * sizeof *p);
    if (!p)
        return fail(c, path, "out of memory");
    *props = p;
    p += (*n)++;
    memset(p, 0, sizeof *p);
    p->req = req;
    json_t *k = json_string(key);
    int rc = k ? put_json(c, &p->kv, k, path) : fail(c, path, "out of memory");
    json_decref(k);
    if (rc)
        return rc;
    buf_puts(&p->kv, " ws \":\" ws ");
    c->prims |= B(P_WS);
    if (val) {
        buf_putb(&p->kv, val);
        return 0;
    }
    return gen(c, schema, path, &p->kv);
}

/* After a member: `, KV`, optional unless required. */
static void put_next(struct buf *b, const struct prop *p)
{
    buf_puts(b, p->req ? " ws \",\" ws " : " ( ws \",\" ws ");
    buf_putb(b, &p->kv);
    if (!p->req)
        buf_puts(b, " )?");
}

/* After a member: any number of `, EXTRA`. */
static void put_extras(struct buf *b, const struct buf *ekv)
{
    buf_puts(b, " ( ws \",\" ws ");
    buf_putb(b, ekv);
    buf_puts(b, " )*");
}

/* Keys in schema order, required ones present, each at most once, then any
 * extra members additionalProperties allows. With the first required
 * property at r, the object begins with one of properties 0..r; what may
 * follow property j is the same whichever came first, so with several
 * beginnings it is one rule per j (tails) and the text stays linear. */
static int gen_object(struct conv *c, const json_t *s, const char *path, struct buf *x)
{
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *add = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return fail(c, path, "\"properties\" must be an object");
    if (req && !json_is_array(req))
        return fail(c, path, "\"required\" must be a list of strings");
    if (add && !json_is_boolean(add) && !json_is_object(add))
        return fail(c, path, "\"additionalProperties\" must be a boolean or a schema");
    bool extras = !json_is_false(add);
    const json_t *add_schema = json_is_object(add) && json_object_size(add) ? add : NULL;
    if (!json_object_size(props) && !json_array_size(req) && extras && !add_schema) {
        prim(c, x, P_OBJECT);
        return 0;
    }

    int saved = c->pos;
    c->pos = ++c->n_pos;
    struct prop *pr = NULL;
    int n = 0, rc = 0;
    struct buf addval = {0}, ekv = {0}, body = {0};
    char sub[256], addpath[256];
    subpath(addpath, sizeof addpath, path, "additionalProperties");
    /* Written once: unlisted required keys and extra members share it. */
    if (add_schema)
        rc = gen(c, add_schema, addpath, &addval);
    else if (extras)
        prim(c, &addval, P_VALUE);
    if (rc)
        goto out;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)props, key, v) {
        bool r = req && listed(req, key);
        if (json_is_false(v)) { /* the key may not appear */
            if (r) {
                rc = fail(c, path, "required property \"%s\" has the schema false", key);
                goto out;
            }
            continue;
        }
        subpath(sub, sizeof sub, path, "properties.%s", key);
        if ((rc = add_prop(c, &pr, &n, key, v, NULL, r, sub)))
            goto out;
    }
    for (size_t i = 0; i < json_array_size(req); i++) {
        const char *k = json_string_value(json_array_get(req, i));
        if (!k) {
            rc = fail(c, path, "\"required\" must be a list of strings");
            goto out;
        }
        bool seen = json_object_get(props, k) != NULL;
        for (size_t j = 0; j < i && !seen; j++)
            seen = !strcmp(json_string_value(json_array_get(req, j)), k);
        if (seen)
            continue;
        if (!extras) {
            rc = fail(c, path,
                      "required property \"%s\" is not in properties and additionalProperties "
                      "is false",
                      k);
            goto out;
        }
        /* An unlisted required key holds what additionalProperties allows. */
        if ((rc = add_prop(c, &pr, &n, k, NULL, &addval, true, addpath)))
            goto out;
    }
    if (extras) {
        prim(c, &ekv, P_STRING);
        buf_puts(&ekv, " ws \":\" ws ");
        buf_putb(&ekv, &addval);
    }

    int id = ++c->n_rules, r = 0;
    while (r < n && !pr[r].req)
        r++;
    /* The beginnings: property j for j <= r, or, with nothing required, an
     * extra member (j == n). */
    int n_alt = (r < n ? r + 1 : n) + (r == n && extras);
    bool tails = n_alt > 1;
    buf_printf(&body, "obj-%d ::= \"{\" ws ", id);
    if (n_alt == 0) {
        buf_puts(&body, "\"}\"\n");
    } else {
        if (r == n)
            buf_puts(&body, "( ");
        if (tails)
            buf_puts(&body, "( ");
        for (int j = 0; j < n_alt; j++) {
            if (j)
                buf_puts(&body, " | ");
            if (j == n) {
                buf_putb(&body, &ekv);
                put_extras(&body, &ekv);
                continue;
            }
            buf_putb(&body, &pr[j].kv);
            if (tails) {
                if (j + 1 < n || extras)
                    buf_printf(&body, " obj-%d-t%d", id, j + 1);
                continue;
            }
            for (int i = j + 1; i < n; i++)
                put_next(&body, &pr[i]);
            if (extras)
                put_extras(&body, &ekv);
        }
        if (tails)
            buf_puts(&body, " )");
        buf_puts(&body, r == n ? " ws )? \"}\"\n" : " ws \"}\"\n");
        for (int k = 1; tails && k <= n; k++) {
            if (k == n && !extras)
                break;
            buf_printf(&body, "obj-%d-t%d ::=", id, k);
            if (k == n) {
                put_extras(&body, &ekv);
            } else {
                put_next(&body, &pr[k]);
                if (k + 1 < n || extras)
                    buf_printf(&body, " obj-%d-t%d", id, k + 1);
            }
            buf_puts(&body, "\n");
        }
    }
    buf_putb(&c->rules, &body);
    buf_printf(x, "obj-%d", id);
out:
    for (int i = 0; i < n; i++)
        free(pr[i].kv.p);
    free(pr);
    free(addval.p);
    free(ekv.p);
    free(body.p);
    c->pos = saved;
    return rc;
}

/* ---- arrays */

/* prefixItems (or draft-7 items: [...]) first, then items; the count held
 * to [minItems, maxItems]. A prefix item past minItems makes the rest of
 * the array optional from there: P0 ( , P1 ( , P2 REST )? )?. */
static int gen_array(struct conv *c, const json_t *s, const char *path, struct buf *x)
{
    const json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    const char *items_kw = "items", *prefix_kw = "prefixItems";
    if (json_is_array(items)) {
        if (prefix)
            return fail(c, path, "\"items\" as a list next to \"prefixItems\"");
        prefix = items, prefix_kw = "items";
        items = json_object_get(s, "additionalItems"), items_kw = "additionalItems";
    }
    if (prefix && !json_is_array(prefix))
        return fail(c, path, "\"%s\" must be a list of schemas", prefix_kw);
    if (items && !json_is_boolean(items) && !json_is_object(items))
        return fail(c, path, "\"%s\" must be a schema", items_kw);
    long lo = 0, hi = -1; /* hi < 0: unbounded */
    if (count_kw(c, s, path, "minItems", &lo) || count_kw(c, s, path, "maxItems", &hi))
        return -1;
    if (hi >= 0 && lo > hi)
        return fail(c, path, "minItems %ld is over maxItems %ld", lo, hi);
    long k = (long)json_array_size(prefix);
    if (hi >= 0 && k > hi)
        k = hi;
    bool any_items = !items || json_is_true(items) || !json_object_size(items);
    long rest_lo = lo > k ? lo - k : 0, rest_hi = json_is_false(items) ? 0 : hi < 0 ? -1 : hi - k;
    if (rest_hi >= 0 && rest_lo > rest_hi)
        return fail(c, path, "minItems %ld needs more items than \"%s\" allows", lo, prefix_kw);
    if (k == 0 && any_items && lo == 0 && hi < 0) {
        prim(c, x, P_ARRAY);
        return 0;
    }

    int saved = c->pos, rc = 0;
    c->pos = ++c->n_pos;
    struct buf item = {0}, body = {0};
    char sub[256];
    if (rest_hi != 0) {
        if (any_items) {
            prim(c, &item, P_VALUE);
        } else {
            subpath(sub, sizeof sub, path, "%s", items_kw);
            if ((rc = gen(c, items, sub, &item)))
                goto out;
        }
    }
    int id = ++c->n_rules;
    buf_printf(&body, "arr-%d ::= \"[\" ws ", id);
    if (k == 0 && rest_hi == 0) {
        buf_puts(&body, "\"]\"\n");
    } else {
        if (lo == 0)
            buf_puts(&body, "( ");
        int open = 0;
        for (long i = 0; i < k; i++) {
            if (i)
                buf_puts(&body, i < lo ? " ws \",\" ws " : " ( ws \",\" ws ");
            open += i && i >= lo;
            subpath(sub, sizeof sub, path, "%s[%ld]", prefix_kw, i);
            if ((rc = gen(c, json_array_get(prefix, (size_t)i), sub, &body)))
                goto out;
        }
        if (rest_hi != 0) {
            long first = k == 0; /* with no prefix the first item has no comma */
            if (first) {
                buf_putb(&body, &item);
                rest_lo = rest_lo ? rest_lo - 1 : 0;
                rest_hi = rest_hi < 0 ? -1 : rest_hi - 1;
            }
            if (rest_hi != 0) {
                struct buf more = {0};
                buf_puts(&more, "( ws \",\" ws ");
                buf_putb(&more, &item);
                buf_puts(&more, " )");
                buf_puts(&body, " ");
                if (more.oom)
                    body.oom = true;
                else
                    put_count(c, &body, more.p, rest_lo, rest_hi);
                free(more.p);
            }
        }
        for (; open; open--)
            buf_puts(&body, " )?");
        buf_puts(&body, lo == 0 ? " ws )? \"]\"\n" : " ws \"]\"\n");
    }
    buf_putb(&c->rules, &body);
    buf_printf(x, "arr-%d", id);
out:
    free(item.p);
    free(body.p);
    c->pos = saved;
    return rc;
}

/* ---- strings */

static int gen_string(struct conv *c, const json_t *s, const char *path, struct buf *x)
{
    int f = format_of(s);
    bool lengths = json_object_get(s, "minLength") || json_object_get(s, "maxLength");
    const json_t *pat = json_object_get(s, "pattern");
    if (pat) { /* the string's characters as the expression's (regex.h) */
        if (!json_is_string(pat))
            return fail(c, path, "\"pattern\" must be a string");
        if (lengths || f >= 0)
            return fail(c, path, "\"pattern\" with %s is not supported",
                        lengths ? "minLength/maxLength" : "format");
        struct err re = {{0}};
        char *expr = regex_gbnf(json_string_value(pat), REGEX_JSON_STRING, true, &re);
        if (!expr)
            return fail(c, path, "pattern: %s", re.msg);
        buf_puts(x, "\"\\\"\" ");
        buf_puts(x, expr);
        buf_puts(x, " \"\\\"\"");
        free(expr);
        return 0;
    }
    if (f >= 0) {
        if (lengths)
            return fail(c, path, "format \"%s\" with minLength/maxLength is not supported",
                        FORMATS[f]);
        buf_puts(x, "\"\\\"\" ");
        prim(c, x, FORMAT_PRIMS[f]);
        buf_puts(x, " \"\\\"\"");
        return 0;
    }
    long lo = 0, hi = -1;
    if (count_kw(c, s, path, "minLength", &lo) || count_kw(c, s, path, "maxLength", &hi))
        return -1;
    if (hi >= 0 && lo > hi)
        return fail(c, path, "minLength %ld is over maxLength %ld", lo, hi);
    if (lo == 0 && hi < 0) {
        prim(c, x, P_STRING);
        return 0;
    }
    buf_puts(x, "\"\\\"\" ");
    if (hi != 0) {
        c->prims |= B(P_CHAR);
        put_count(c, x, "char", lo, hi);
        buf_puts(x, " ");
    }
    buf_puts(x, "\"\\\"\"");
    return 0;
}

/* ---- enum, const, types, combinators */

static bool has_type(const json_t *v, unsigned t)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return t & T_OBJ;
    case JSON_ARRAY: return t & T_ARR;
    case JSON_STRING: return t & T_STR;
    case JSON_INTEGER: return t & (T_NUM | T_INT);
    case JSON_REAL: /* 1.0 is an integer to JSON Schema */
        return (t & T_NUM) || ((t & T_INT) && whole(json_real_value(v)));
    case JSON_TRUE:
    case JSON_FALSE: return t & T_BOOL;
    default: return t & T_NULL;
    }
}

static int gen_enum(struct conv *c, const json_t *s, const char *path, bool nul, struct buf *x)
{
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en && cn)
        return fail(c, path, "\"enum\" and \"const\" together are not supported");
    if (en && (!json_is_array(en) || !json_array_size(en)))
        return fail(c, path, "\"enum\" must be a non-empty list");
    unsigned t;
    if (parse_type(c, s, path, &t))
        return -1;
    if (!t)
        t = T_ALL;
    struct buf alts = {0};
    int n = 0, rc = 0;
    bool has_null = false;
    for (size_t i = 0; i < (en ? json_array_size(en) : 1) && !rc; i++) {
        const json_t *v = en ? json_array_get(en, i) : cn;
        if (!has_type(v, t) && !(nul && json_is_null(v)))
            continue;
        has_null |= json_is_null(v);
        buf_puts(&alts, n++ ? " | " : "");
        rc = put_json(c, &alts, v, path);
    }
    if (!rc && nul && !has_null) {
        buf_puts(&alts, n++ ? " | " : "");
        prim(c, &alts, P_NULL);
    }
    if (!rc && !n)
        rc = fail(c, path, "no value of \"%s\" has the type the schema allows",
                  en ? "enum" : "const");
    if (!rc)
        put_choice(x, &alts, n);
    free(alts.p);
    return rc;
}

/* The alternatives of the types the schema allows; without "type", the
 * types its keywords are about (what its author meant), else any value. */
static int gen_types(struct conv *c, const json_t *s, const char *path, unsigned kinds, bool nul,
                     struct buf *x)
{
    unsigned t;
    if (parse_type(c, s, path, &t))
        return -1;
    bool fmt = format_of(s) >= 0;
    if (!t) {
        t |= (kinds & (1u << K_OBJ)) ? T_OBJ : 0;
        t |= (kinds & (1u << K_ARR)) ? T_ARR : 0;
        t |= (kinds & (1u << K_STR)) || fmt ? T_STR : 0;
        t |= (kinds & (1u << K_NUM)) ? T_NUM : 0;
        if (!t)
            t = T_ALL;
    }
    if (nul)
        t |= T_NULL;
    if (t == T_ALL && !(kinds & ((1u << K_OBJ) | (1u << K_ARR) | (1u << K_STR))) && !fmt) {
        prim(c, x, P_VALUE);
        return 0;
    }
    if (t & T_NUM)
        t &= ~(unsigned)T_INT; /* every integer is a number */
    int n = __builtin_popcount(t);
    buf_puts(x, n > 1 ? "( " : "");
    int rc = 0, k = 0;
    for (unsigned bit = 1; bit <= T_NULL && !rc; bit <<= 1) {
        if (!(t & bit))
            continue;
        buf_puts(x, k++ ? " | " : "");
        switch (bit) {
        case T_OBJ: rc = gen_object(c, s, path, x); break;
        case T_ARR: rc = gen_array(c, s, path, x); break;
        case T_STR: rc = gen_string(c, s, path, x); break;
        case T_NUM: prim(c, x, P_NUMBER); break;
        case T_INT: prim(c, x, P_INTEGER); break;
        case T_BOOL: prim(c, x, P_BOOLEAN); break;
        default: prim(c, x, P_NULL); break;
        }
    }
    buf_puts(x, n > 1 ? " )" : "");
    return rc;
}

static int gen_comb(struct conv *c, const json_t *s, const char *path, const char *kw, bool nul,
                    struct buf *x)
{
    const json_t *v = json_object_get(s, kw);
    struct buf alts = {0};
    int n = 0, rc = 0;
    if (!strcmp(kw, "$ref")) {
        rc = gen_ref(c, v, path, &alts);
        n = 1;
    } else if (!json_is_array(v) || !json_array_size(v)) {
        rc = fail(c, path, "\"%s\" must be a non-empty list of schemas", kw);
    } else if (!strcmp(kw, "allOf") && json_array_size(v) > 1) {
        rc = fail(c, path, "allOf with %zu schemas is not supported (only one)",
                  json_array_size(v));
    } else {
        for (size_t i = 0; i < json_array_size(v) && !rc; i++, n++) {
            char sub[256];
            subpath(sub, sizeof sub, path, "%s[%zu]", kw, i);
            buf_puts(&alts, i ? " | " : "");
            rc = gen(c, json_array_get(v, i), sub, &alts);
        }
    }
    if (!rc && nul) {
        buf_puts(&alts, " | ");
        prim(c, &alts, P_NULL);
        n++;
    }
    if (!rc)
        put_choice(x, &alts, n);
    free(alts.p);
    return rc;
}

/* One schema as a GBNF expression appended to x (a name, a literal, a
 * sequence or a parenthesized choice: never a bare "a | b"). */
static int gen(struct conv *c, const json_t *s, const char *path, struct buf *x)
{
    if (json_is_true(s)) {
        prim(c, x, P_VALUE);
        return 0;
    }
    if (json_is_false(s))
        return fail(c, path, "the schema false accepts no value");
    if (!json_is_object(s))
        return fail(c, path, "a schema must be an object or a boolean");
    if (c->depth >= MAX_DEPTH)
        return fail(c, path, "nested deeper than %d levels", MAX_DEPTH);
    unsigned kinds = 0;
    const char *comb = NULL, *valkw = NULL;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)s, key, v) {
        size_t i = 0;
        while (i < sizeof KEYWORDS / sizeof *KEYWORDS && strcmp(KEYWORDS[i].name, key))
            i++;
        if (i == sizeof KEYWORDS / sizeof *KEYWORDS) {
            if (!strcmp(key, "patternProperties"))
                return fail(c, path, "patternProperties is not supported");
            return fail(c, path, "unsupported keyword \"%s\"", key);
        }
        enum kind k = KEYWORDS[i].kind;
        kinds |= 1u << k;
        if (k == K_REF || k == K_ANYOF || k == K_ONEOF || k == K_ALLOF) {
            if (comb)
                return fail(c, path, "\"%s\" next to \"%s\" is not supported", key, comb);
            comb = key;
        }
        bool constrains = k == K_TYPE || k == K_ENUM || k == K_CONST || k == K_OBJ ||
                          k == K_ARR || k == K_STR || (k == K_FORMAT && format_of(s) >= 0);
        if (constrains && !valkw)
            valkw = key;
    }
    const json_t *nv = json_object_get(s, "nullable");
    if (nv && !json_is_boolean(nv))
        return fail(c, path, "\"nullable\" must be true or false");
    bool nul = json_is_true(nv);
    c->depth++;
    int rc;
    if (comb && valkw) {
        rc = fail(c, path, "\"%s\" next to \"%s\" is not supported", valkw, comb);
    } else if (comb) {
        rc = gen_comb(c, s, path, comb, nul, x);
    } else if (kinds & ((1u << K_ENUM) | (1u << K_CONST))) {
        /* Members are the author's literals; a length or shape keyword
         * beside them would have to be checked member by member. */
        unsigned shape = (1u << K_OBJ) | (1u << K_ARR) | (1u << K_STR);
        if ((kinds & shape) || format_of(s) >= 0)
            rc = fail(c, path, "length, shape or format keywords next to \"enum\"/\"const\" "
                               "are not supported");
        else
            rc = gen_enum(c, s, path, nul, x);
    } else {
        rc = gen_types(c, s, path, kinds, nul, x);
    }
    c->depth--;
    return rc;
}

char *json_schema_gbnf(const json_t *schema, struct err *e)
{
    struct conv c = {.root = schema, .e = e};
    struct buf top = {0}, out = {0};
    int rc = 0;
    /* The root is a definition like any other so "$ref": "#" finds it; it
     * gets a rule of its own only when something refers to it. */
    if (schema) {
        rc = def_add(&c, schema, "root", "");
        if (rc == 0)
            rc = gen(&c, schema, "", &top);
    } else {
        prim(&c, &top, P_VALUE);
    }
    if (rc == 0) {
        bool root_used = c.n_defs && c.defs[0].used;
        /* no blanks around the whole text: a model would pad it to the limit */
        buf_puts(&out, "root ::= ");
        if (root_used)
            buf_printf(&out, "%s\n%s ::= ", c.defs[0].name, c.defs[0].name);
        buf_putb(&out, &top);
        buf_puts(&out, "\n");
        buf_putb(&out, &c.rules);
        c.prims |= B(P_WS);
        for (bool grew = true; grew;) { /* what the primitives use, transitively */
            grew = false;
            for (int p = 0; p < P_COUNT; p++)
                if ((c.prims & B(p)) && (c.prims | PRIMS[p].uses) != c.prims) {
                    c.prims |= PRIMS[p].uses;
                    grew = true;
                }
        }
        for (int p = 0; p < P_COUNT; p++) {
            if (c.prims & B(p)) {
                buf_puts(&out, PRIMS[p].name);
                buf_puts(&out, " ::= ");
                buf_puts(&out, PRIMS[p].body);
                buf_puts(&out, "\n");
            }
        }
        if (out.oom || c.rules.oom || top.oom)
            rc = err_set(e, "schema: out of memory writing the grammar");
    }
    free(top.p);
    free(c.rules.p);
    free(c.defs);
    if (rc) {
        free(out.p);
        return NULL;
    }
    return out.p;
}
